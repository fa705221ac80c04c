"""The fast path's kernels, one module each (``kernel_entry()``: the kernels suite's view).

Under Triton's CPU interpreter the kernels run with the interpreter's per-call scan cached
(``interpreter.py``: same semantics, about a quarter less time per interpreted program)."""

from . import interpreter as _interpreter

_interpreter.enable()
