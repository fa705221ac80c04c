"""CPU checks of the real Triton JIT (sm_90 compiles with ptxas, launch logs; no GPU, no interpreter),
run in a fresh process."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def head_tree():
    """A temporary git worktree of HEAD with this checkout's ``lab/`` tools copied in: a tool
    that compares the tree with ``--rev HEAD`` run there must find no difference, whatever this
    checkout's uncommitted changes to the model are (and it is this checkout's tool that runs)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "head"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), "HEAD"], cwd=ROOT, check=True)
        shutil.rmtree(tree / "lab")
        shutil.copytree(ROOT / "lab", tree / "lab", ignore=shutil.ignore_patterns("__pycache__"))
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def run_without_interpreter(*argv: str, timeout: int = 300, needs_ptxas: bool = True, cwd: Path = ROOT) -> str:
    """``python ARGV`` from ``cwd`` (default the repository root; its packages imported from there)
    without TRITON_INTERPRET; its stdout (asserts exit 0). Skips where the triton wheel has no
    ptxas (``needs_ptxas``: the command compiles)."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if needs_ptxas and not ptxas.exists():
        pytest.skip(f"no ptxas in the triton wheel ({ptxas}): cannot compile for sm_90 here")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(cwd)
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout
