"""Helpers of the GPU sweep scripts (scripts/gpu_*_sweep.py), run as ``python3 scripts/X.py``."""

from __future__ import annotations

import importlib.util
import sys
import time
from types import ModuleType
from typing import Callable


def load_module(path: str, name: str) -> ModuleType:
    """Import a copy of a module from a file (e.g. the committed kernel, to time a candidate
    change beside it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # registered first, as an import would (dataclasses look it up)
    spec.loader.exec_module(mod)
    return mod


def stopwatch_log() -> Callable[[str], None]:
    """A print that prefixes the seconds since it was made and flushes (logs read live)."""
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    return log
