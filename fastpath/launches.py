"""Kernel launches as evidence that does not rest on the trace.

The trace is what the fast path says about itself; a second, independent source says what
actually ran. On a GPU that source is ``torch.profiler`` (the coverage suite's profiler case).
On CPU the fast path's Triton kernels run in Triton's interpreter, and every launch of one
passes through ``triton.runtime.interpreter.InterpretedFunction.run`` with the ``@triton.jit``
function as ``self.fn``: ``recording()`` intercepts that entry and keeps the kernel's name, in
launch order, whatever the model code reports. (A device function called from a kernel goes
through ``InterpretedFunction.__call__`` instead and is not a launch.)

The hook is installed on first use and stays: with no recorder open it costs one list test
per launch. Launches from every thread are kept (the kernels suite's jitter runs kernels on
worker threads). The harness imports Triton only here, lazily, and only to look.
"""

from __future__ import annotations

import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterable, Iterator

__all__ = ["Launches", "available", "recording", "matching", "source_for", "observing"]

_open: list["Launches"] = []
_install_lock = threading.Lock()
_installed = False


@dataclass
class Launches:
    """The kernel names launched while the recorder was open, in order."""

    names: list[str] = field(default_factory=list)

    def count(self, patterns: Iterable[str]) -> int:
        """Launches whose kernel name matches any of ``patterns`` (regexes, ``re.search``)."""
        return len(matching(self.names, patterns))


def matching(names: Iterable[str], patterns: Iterable[str]) -> list[str]:
    pats = [re.compile(p) for p in patterns]
    return [n for n in names if any(p.search(n) for p in pats)]


def available() -> tuple[bool, str]:
    """(True, "") when Triton's interpreter is on (``TRITON_INTERPRET=1``) and its launch entry
    can be intercepted; else (False, why) — e.g. a GPU run (the profiler is the source there)
    or an engine whose fast path is not Triton at all."""
    import os

    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False, "Triton's interpreter is off (TRITON_INTERPRET unset): no interpreted launch to intercept"
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except Exception as exc:  # triton missing or reorganised
        return False, f"triton's interpreter is not importable ({type(exc).__name__}: {exc})"
    if not callable(getattr(InterpretedFunction, "run", None)):
        return False, "this Triton's InterpretedFunction has no run(): the launch entry moved; update fastpath.launches"
    return True, ""


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        from triton.runtime.interpreter import InterpretedFunction

        original = InterpretedFunction.run

        def run(self, *args, **kwargs):
            if _open and not kwargs.get("warmup"):
                name = getattr(getattr(self, "fn", None), "__name__", None) or type(self).__name__
                for rec in list(_open):
                    rec.names.append(name)
            return original(self, *args, **kwargs)

        run.__wrapped__ = original  # type: ignore[attr-defined]
        InterpretedFunction.run = run
        _installed = True


@contextmanager
def recording() -> Iterator[Launches]:
    """Record the Triton interpreter's kernel launches in the block. Raises RuntimeError (the
    reason from ``available()``) when there is nothing to intercept."""
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    _install()
    rec = Launches()
    _open.append(rec)
    try:
        yield rec
    finally:
        _open.remove(rec)


def source_for(device: str, engine_info: dict) -> tuple[str | None, str]:
    """The second source on this machine: ("torch_profiler", "") on a GPU,
    ("triton_interpreter", "") on CPU when the engine's fast path runs in Triton's interpreter,
    else (None, why not)."""
    if str(device).startswith("cuda"):
        return "torch_profiler", ""
    if not engine_info.get("triton_interpreter"):
        return None, "the engine runs no Triton kernel in the interpreter (info()['triton_interpreter'] is false)"
    ok, why = available()
    return ("triton_interpreter", "") if ok else (None, why)


@contextmanager
def observing(source: str | None) -> Iterator[Launches | None]:
    """The kernels launched in the block, from ``source`` (``source_for``); None yields None
    (nothing observed). The profiler's names are CUDA kernels (CuTe DSL ones included)."""
    if source is None:
        yield None
        return
    if source == "triton_interpreter":
        with recording() as rec:
            yield rec
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    rec = Launches()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        yield rec
        torch.cuda.synchronize()
    for ev in prof.events():
        dt = getattr(ev, "device_type", None)
        if dt is not None and "CUDA" in str(dt):
            rec.names.append(ev.name)
