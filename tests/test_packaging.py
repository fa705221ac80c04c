"""fastpath pip-installed into someone else's repository: the suites verify runs, the eval tasks
and the report templates ship inside the wheel (package data), not as folders of this checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fastpath import verify

REPO = Path(__file__).resolve().parents[1]
SUITES = ("coverage", "kernels", "parity", "features", "evals", "perf")


def test_verify_runs_the_suites_inside_the_package():
    assert verify.SUITES_DIR == REPO / "fastpath" / "suites"
    assert sorted(p.stem for p in verify.SUITES_DIR.glob("test_*.py")) == sorted(f"test_{s}" for s in SUITES)


def test_the_wheel_carries_suites_tasks_and_templates(tmp_path):
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in this venv")
    src = tmp_path / "src"
    for part in ("fastpath", "optimized_model"):  # a copy: the build writes build/ and egg-info beside it
        shutil.copytree(REPO / part, src / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / f, src / f)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("fastpath-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"fastpath/suites/test_{s}.py" for s in SUITES} <= names
    tasks = {Path(n).name for n in names if n.startswith("fastpath/evals/tasks/")}
    assert {p.name for p in (REPO / "fastpath/evals/tasks").glob("*.yaml")} <= tasks and tasks
    templates = {Path(n).name for n in names if n.startswith("fastpath/templates/")}
    assert {p.name for p in (REPO / "fastpath/templates").iterdir() if p.suffix in (".j2", ".js")} <= templates
