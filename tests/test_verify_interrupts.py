"""verify under interruption: a torn or hand-edited run state is a one-line usage error (exit 2),
SIGTERM at any point exits 3 and leaves no temp files and no signed bundle directory without its
archive; bundles are named <spec name>.<tier>.fastpath."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastpath.cli import app
from test_verify import SUITES, make_project, run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory):
    """A run with only the kernels suite done (the cheaper one), to corrupt copies of."""
    tmp = tmp_path_factory.mktemp("partial")
    result = run(make_project(tmp / "p"), out=tmp / "run", only=["kernels"])
    assert result.exit_code == 3
    assert result.archive.name == "double.smoke.fastpath.tar.gz"  # <spec name>.<tier>.fastpath.tar.gz
    return tmp / "run"


def _torn(run_dir, rel, how):
    path = run_dir / "state" / rel
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncate" else how)
    return path


@pytest.mark.parametrize("rel,how", [("run.json", "truncate"), ("run.json", b'{"tier": 3}'),
                                     ("run.json", b"[]"), ("done/kernels.json", "truncate"),
                                     ("done/kernels.json", b'"done"'),
                                     ("rows/kernels.jsonl", b'garbage\n{"case_id": "x", "status": "pass"}\n')])
def test_resume_of_a_torn_state_is_a_usage_error_not_a_traceback(partial_run, tmp_path, rel, how):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(partial_run, run_dir)
    path = _torn(run_dir, rel, how)
    result = CliRunner().invoke(app, ["verify", "--resume", str(run_dir), "--suites-dir", str(SUITES)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    first = result.output.strip().splitlines()[0]
    assert first.startswith("error: run state") and str(path.name) in first and "unreadable or was edited" in first


DRIVER = r'''
import os, signal, sys
import fastpath.bundle as bundle, fastpath.signing as signing, fastpath.verify as verify

point = sys.argv[1]
def term():
    os.kill(os.getpid(), signal.SIGTERM)

def after(mod, name):
    orig = getattr(mod, name)
    def wrapped(*a, **k):
        out = orig(*a, **k)
        term()
        return out
    setattr(mod, name, wrapped)

def before(mod, name):
    orig = getattr(mod, name)
    def wrapped(*a, **k):
        term()
        return orig(*a, **k)
    setattr(mod, name, wrapped)

{"prepare": lambda: after(verify, "build_plan"),      # before any suite
 "staged": lambda: after(bundle, "write_manifest"),   # bundle written under its temp name
 "signed": lambda: after(signing, "sign_bundle"),     # signed, not packed
 "packed": lambda: before(bundle, "_replace_dir"),    # archive in place, directory not renamed
 }[point]()
from fastpath.cli import app
sys.argv = ["fastpath", "verify", "--tier", "smoke", "--out", sys.argv[2], "--suites-dir", sys.argv[3],
            "--key", sys.argv[4], sys.argv[5]]
app()
'''


@pytest.mark.parametrize("point", ["prepare", "staged", "signed", "packed"])
def test_sigterm_anywhere_exits_3_and_leaves_nothing_half_done(tmp_path, point):
    from fastpath.signing import generate_keypair

    key, _, _ = generate_keypair(tmp_path / "k.key", tmp_path / "k.pub")
    spec = make_project(tmp_path / "p")
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "doubles")])}
    proc = subprocess.run([sys.executable, "-c", DRIVER, point, str(run_dir), str(SUITES), str(key), str(spec)],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    leftovers = [p for p in run_dir.rglob("*") if p.name.startswith(".") or p.name.endswith((".tmp", ".old"))]
    assert leftovers == []
    assert not list(run_dir.glob("*.fastpath/statement.dsse.json"))  # no signed directory at all
    if point == "packed":  # the archive was complete and renamed before the signal: it is the result
        assert (run_dir / "double.smoke.fastpath.tar.gz").is_file()
