"""The fast path's kernels, one module each (``kernel_entry()``: the kernels suite's view).

Under Triton's CPU interpreter three of the interpreter's wasted costs are removed first
(``interpreter.py``: same semantics, under half the time of an interpreted program)."""

from . import interpreter as _interpreter

_interpreter.enable()
