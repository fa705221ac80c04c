"""CPU compile checks for sm_90 (Triton + ptxas, no GPU, no interpreter), run in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_without_interpreter(*argv: str, timeout: int = 300) -> str:
    """``python ARGV`` from the repository root without TRITON_INTERPRET; its stdout (asserts
    exit 0). Skips where the triton wheel has no ptxas."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        pytest.skip(f"no ptxas in the triton wheel ({ptxas}): cannot compile for sm_90 here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=timeout, cwd=root)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout
