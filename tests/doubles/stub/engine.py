"""A scripted test-double engine: just enough of the Engine protocol for the stub suites.

The fast path is on only when ``load("fast", additional_config=...)`` carries the stub's own
switch (``SWITCH``, its spec's [switch]); otherwise "fast" is the standard path, which reports
nothing.

``mode`` (an engine option, set in the tier) plants behaviours the harness must handle:
  "good"             the fast path fires for in-scope decode and falls back elsewhere;
  "broken_fast"      the fast path silently does not fire at batch 4 (the PR #53396 trap);
  "kernel_raises"    the kernel's fast call raises (an error row, not a crash);
Set FASTPATH_DOUBLE_INTERRUPT=1 to make the kernel's fast call raise KeyboardInterrupt (Ctrl-C
mid-run), =term to send this process SIGTERM, or =die to end it at once (exit 9, no clean-up: a
suite worker that crashes), or =decode-b4 to press Ctrl-C inside the fast decode step at batch 4
(mid-suite: the coverage cases before it have finished); an environment variable, not a mode, so
the same spec can be resumed afterwards.
Set FASTPATH_DOUBLE_OOM=always to make the fast decode step at batch 4 raise an out-of-memory
error (``OutOfMemoryError``, torch's class name) every time, or =once:DIR only the first time
(a flag file in DIR): a case that fails beside other workers and passes alone.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastpath import trace

IN_SCOPE_BATCHES = (1, 2, 4)
SWITCH = {"key": "decode_backend", "value": "double"}


@dataclass
class DoubleKernel:
    name: str
    component: str
    mode: str

    def fast(self, x: list[float]) -> list[float]:
        if self.mode == "kernel_raises":
            raise RuntimeError("planted: fast kernel crashed")
        interrupt = os.environ.get("FASTPATH_DOUBLE_INTERRUPT")
        if interrupt == "1":
            raise KeyboardInterrupt
        if interrupt == "term":  # a time limit killing the run
            os.kill(os.getpid(), signal.SIGTERM)
        if interrupt == "die":
            os._exit(9)
        return [2.0 * v for v in x]

    def oracle(self, x: list[float]) -> list[float]:
        return [v + v for v in x]


class OutOfMemoryError(RuntimeError):
    """Named like torch's: the harness knows an out-of-memory error by its class's name."""


def _planted_oom(batch: int, context: int) -> None:
    how = os.environ.get("FASTPATH_DOUBLE_OOM", "")
    if batch != 4 or not how:
        return
    if how.startswith("once:"):
        flag = Path(how.removeprefix("once:")) / f"oom-b{batch}-c{context}"
        if flag.exists():
            return
        flag.touch()
    raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (planted)")


class DoubleModel:
    def __init__(self, path: str, mode: str) -> None:
        self.path, self.mode, self.device = path, mode, "cpu"

    def decode_step(self, batch: int, context: int, draft: int = 0) -> Callable[[], None]:
        def step() -> None:
            if self.path != "fast":
                return
            _planted_oom(batch, context)
            if batch == 4 and os.environ.get("FASTPATH_DOUBLE_INTERRUPT") == "decode-b4":
                raise KeyboardInterrupt
            if batch not in IN_SCOPE_BATCHES:
                trace.refused("double_gemv", "batch_out_of_scope", batch=batch)
            elif self.mode == "broken_fast" and batch == 4:
                return  # silently ran the standard path
            else:
                trace.engaged("double_gemv", "small_m", batch=batch, context=context)

        return step

    def prefill_step(self, batch: int, context: int) -> Callable[[], None]:
        return lambda: trace.refused("double_gemv", "prefill") if self.path == "fast" else None

    def mixed_step(self, batch: int, context: int) -> Callable[[], None]:
        return lambda: trace.refused("double_gemv", "mixed_batch") if self.path == "fast" else None

    def close(self) -> None:
        pass


class StubEngine:
    name = "double"

    def __init__(self, mode: str = "good", **options: Any) -> None:
        self.mode, self.options = mode, options
        self.loads: list[str] = []

    def info(self) -> dict[str, Any]:
        return {"device": "cpu", "arch": "cpu", "device_name": "double", "model_config": "none",
                "dtype": self.options.get("dtype", "float32"), "triton_interpreter": False,
                "switch": dict(SWITCH)}

    def load(self, path: str, *, additional_config: Any = None) -> DoubleModel:
        self.loads.append(path)
        if path == "fast" and (additional_config or {}).get(SWITCH["key"]) != SWITCH["value"]:
            path = "standard"  # switch off: the standard path, which reports nothing
        return DoubleModel(path, self.mode)

    def kernels(self) -> list[DoubleKernel]:
        return [DoubleKernel("double_scale", "double_gemv", self.mode)]

    def components(self) -> list[Any]:
        return []

    def fast_path_available(self) -> tuple[bool, str]:
        return True, ""


def document_ids(tokenizer: Any, seed: int, n_tokens: int) -> list[int]:
    """A parity ``sequences`` provider (suite_helpers.sequence_prompt_ids): document ``seed``, which
    is 1000 words long (a longer prompt cannot be had from it)."""
    return tokenizer.encode(f"document {seed}: " + "lorem " * 1000)[:n_tokens]
