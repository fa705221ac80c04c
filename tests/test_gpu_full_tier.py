"""lab/gpu_full_tier.sh: on a machine without the carried packages it stops at once, naming the
fix, instead of starting a verify whose every case would fail on an import."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "lab" / "gpu_full_tier.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to run the script")


def _run(home: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    # a stand-in `fastpath` on PATH records whether verify was started
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    marker = tmp_path / "verify-started"
    stub = bin_dir / "fastpath"
    stub.write_text(f"#!/bin/sh\ntouch {marker}\n")
    stub.chmod(0o755)
    env = {**os.environ, "HOME": str(home), "OUT": str(tmp_path / "out"),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", str(SCRIPT), "5", "perf"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_machine_without_the_carried_packages_is_refused_before_verify(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    result = _run(home, tmp_path)
    assert result.returncode == 2
    assert "~/carry/env.sh missing" in result.stderr and ".carry/part-00" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "verify-started").exists()
    assert not (tmp_path / "out" / "full.tar.gz").exists()


def test_with_the_carried_packages_it_goes_on_to_verify(tmp_path):
    home = tmp_path / "home"
    (home / "carry").mkdir(parents=True)
    (home / "carry" / "env.sh").write_text("")
    # the script runs lab/gpu_steps.sh relative to the checkout it is called from
    shutil.copytree(ROOT / "lab", tmp_path / "lab", ignore=shutil.ignore_patterns("__pycache__", "train"))
    result = _run(home, tmp_path)
    assert "carried packages are not on this machine" not in result.stderr
    assert "a fresh run in ~/full" in result.stdout
    assert (tmp_path / "verify-started").exists()
