"""`fastpath verify` end to end on the test-double engine and suites."""

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from fastpath.cli import app
from fastpath.errors import UsageError
from fastpath.results import read_rows
from fastpath.verify import VerifyOptions, verify

DOUBLES = Path(__file__).parent / "doubles" / "stub"
SUITES = DOUBLES / "suites"


def make_project(root: Path, mode: str = "good") -> Path:
    """A tiny project: pyproject with default_spec, the double spec, one fast-path source file."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text('[project]\nname = "p"\n[tool.fastpath]\ndefault_spec = "spec.toml"\n')
    (root / "src").mkdir(exist_ok=True)
    (root / "src" / "fast.py").write_text("FAST = True\n")
    text = (DOUBLES / "spec.toml").read_text().replace('mode = "good", dtype = "float32"',
                                                       f'mode = "{mode}", dtype = "float32"')
    (root / "spec.toml").write_text(text)
    return root / "spec.toml"


def run(spec=None, console=None, **kw):
    return verify(VerifyOptions(spec=spec, tier=kw.pop("tier", "smoke"), suites_dir=SUITES, argv=["test"], **kw),
                  console or Console(file=open(os.devnull, "w")))


def summary(result):
    return json.loads((result.bundle_dir / "summary.json").read_text())


def test_passing_run_writes_complete_bundle(tmp_path):
    spec = make_project(tmp_path / "p")
    result = run(spec, out=tmp_path / "run")
    assert (result.exit_code, result.verdict) == (0, "pass"), result.message
    s = summary(result)
    assert s["complete"] is True and s["tier"] == "smoke"
    assert s["suites"] == {"coverage": "done", "kernels": "done"}
    names = {p.relative_to(result.bundle_dir).as_posix() for p in result.bundle_dir.rglob("*") if p.is_file()}
    assert {"spec.toml", "plan.json", "environment.json", "summary.json", "manifest.json",
            "logs/coverage.log", "logs/kernels.log"} <= names
    rows = pd.read_parquet(next(result.bundle_dir.glob("results/*.parquet")))
    plan = json.loads((result.bundle_dir / "plan.json").read_text())
    assert set(rows["case_id"]) == {c["case_id"] for c in plan["cases"] + plan["waivers"]}
    assert result.archive.is_file() and not result.signed


def test_fast_path_silently_not_firing_fails_naming_the_gate(tmp_path):
    spec = make_project(tmp_path / "p", mode="broken_fast")
    result = run(spec, out=tmp_path / "run")
    assert (result.exit_code, result.verdict) == (1, "fail")
    s = summary(result)
    assert s["gates"]["coverage_fast_path_fired"]["status"] == "fail"
    assert s["gates"]["kernels_noise_floor"]["status"] == "pass"
    assert [r["case_id"] for r in s["failing_rows"]] == ["coverage/decode/b4-c16-d0"]
    assert s["failing_rows"][0]["evidence"] == {"engaged": []}


def test_crashing_kernel_is_an_error_row_not_a_crash(tmp_path):
    spec = make_project(tmp_path / "p", mode="kernel_raises")
    result = run(spec, out=tmp_path / "run")
    assert result.verdict == "fail"
    [bad] = summary(result)["failing_rows"]
    assert bad["status"] == "error" and "planted: fast kernel crashed" in bad["message"]


def test_only_then_resume_accumulates_and_skips_done_suites(tmp_path):
    spec = make_project(tmp_path / "p")
    first = run(spec, out=tmp_path / "run", only=["kernels"])
    assert (first.exit_code, first.verdict) == (3, "incomplete")
    assert summary(first)["complete"] is False and "--resume" in first.message
    log = tmp_path / "run" / "state" / "logs" / "kernels.log"
    stamp = log.stat().st_mtime_ns
    second = run(None, resume=tmp_path / "run")  # no --only: runs what is left
    assert (second.exit_code, second.verdict) == (0, "pass"), second.message
    assert log.stat().st_mtime_ns == stamp  # kernels was not rerun
    assert summary(second)["suites"] == {"coverage": "done", "kernels": "done"}


def test_only_a_failing_suite_exits_1_and_a_passing_one_3(tmp_path):
    spec = make_project(tmp_path / "p", mode="broken_fast")
    failed = run(spec, out=tmp_path / "run", only=["coverage"])
    # still incomplete (kernels not run), but the coverage gate already failed: exit 1
    assert (failed.exit_code, failed.verdict) == (1, "incomplete"), failed.message
    assert "already failed" in failed.message and "--resume" in failed.message
    assert summary(failed)["gates"]["coverage_fast_path_fired"]["status"] == "fail"
    passing = run(spec, out=tmp_path / "run2", only=["kernels"])  # kernels pass in this mode
    assert (passing.exit_code, passing.verdict) == (3, "incomplete"), passing.message
    runner = CliRunner()
    res = runner.invoke(app, ["verify", str(spec), "--tier", "smoke", "--only", "coverage", "--out",
                              str(tmp_path / "run3"), "--suites-dir", str(SUITES)])
    assert res.exit_code == 1, res.output


@pytest.mark.parametrize("how", ["1", "term"])  # Ctrl-C, or SIGTERM from a time limit
def test_interrupted_run_is_never_signed_nor_passing_and_resumes(tmp_path, monkeypatch, how):
    from fastpath.signing import generate_keypair

    key, _, _ = generate_keypair(tmp_path / "k.key", tmp_path / "k.pub")
    spec = make_project(tmp_path / "p")
    monkeypatch.setenv("FASTPATH_DOUBLE_INTERRUPT", how)
    result = run(spec, out=tmp_path / "run", key=key)
    assert (result.exit_code, result.verdict) == (3, "incomplete")
    assert "--resume" in result.message
    s = summary(result)
    assert s["verdict"] == "incomplete" and s["suites"]["kernels"] == "not_run"
    assert not (result.bundle_dir / "statement.dsse.json").exists() and not result.signed
    monkeypatch.delenv("FASTPATH_DOUBLE_INTERRUPT")
    resumed = run(None, resume=tmp_path / "run", key=key)
    assert (resumed.exit_code, resumed.verdict) == (0, "pass")
    assert resumed.signed and (resumed.bundle_dir / "statement.dsse.json").is_file()


def _rows(result) -> list[dict]:
    frame = pd.read_parquet(next(result.bundle_dir.glob("results/*.parquet")))
    return sorted(frame.drop(columns=["message"]).astype(str).to_dict("records"), key=str)


def test_suites_in_worker_processes_write_what_one_process_writes(tmp_path):
    spec = make_project(tmp_path / "p", mode="broken_fast")
    serial = run(spec, out=tmp_path / "serial", jobs=1)
    parallel = run(spec, out=tmp_path / "parallel", jobs=2)
    assert (serial.exit_code, parallel.exit_code) == (1, 1)
    assert _rows(serial) == _rows(parallel)
    assert summary(parallel)["suites"] == {"coverage": "done", "kernels": "done"}
    logs = tmp_path / "parallel" / "state" / "logs"
    assert "passed" in (logs / "kernels.log").read_text() and (logs / "coverage.log").read_text()


def test_a_suite_worker_that_dies_is_an_error_row_naming_its_exit_code(tmp_path, monkeypatch):
    spec = make_project(tmp_path / "p")
    monkeypatch.setenv("FASTPATH_DOUBLE_INTERRUPT", "die")  # the kernels worker exits 9 mid-suite
    result = run(spec, out=tmp_path / "run", jobs=2)
    assert (result.exit_code, result.verdict) == (1, "fail")
    s = summary(result)
    assert s["suites"] == {"coverage": "done", "kernels": "crashed"}
    [row] = [r for r in s["failing_rows"] if r["case_id"] == "kernels/suite"]
    assert "exited with code 9" in row["message"]


def test_a_case_out_of_gpu_memory_beside_other_shards_runs_again_alone(tmp_path, monkeypatch):
    spec = make_project(tmp_path / "p")
    serial = run(spec, out=tmp_path / "serial", jobs=1)
    monkeypatch.setenv("FASTPATH_DOUBLE_OOM", f"once:{tmp_path}")  # b4's decode: out of memory once
    parallel = run(spec, out=tmp_path / "parallel", jobs=2)
    assert (tmp_path / "oom-b4-c16").exists()  # it did run out, in a shard
    assert (serial.exit_code, parallel.exit_code) == (0, 0)
    assert _rows(serial) == _rows(parallel)  # the shard's attempt left no row; the retry's are the rows
    log = (tmp_path / "parallel" / "state" / "logs" / "coverage.log").read_text()
    assert "== retried alone" in log and "== shard 2 of 2" in log
    state = tmp_path / "parallel" / "state"
    assert json.loads((state / "done" / "coverage.json").read_text())["retried_alone"] is True
    assert sorted(p.name for p in (state / "rows").iterdir()) == ["coverage.jsonl", "kernels.jsonl"]
    assert not (state / "claims" / "coverage").exists()


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_case_out_of_gpu_memory_alone_is_one_error_row_naming_cause_and_fix(tmp_path, monkeypatch, jobs):
    spec = make_project(tmp_path / "p")
    monkeypatch.setenv("FASTPATH_DOUBLE_OOM", "always")
    result = run(spec, out=tmp_path / "run", jobs=jobs)
    assert (result.exit_code, result.verdict) == (1, "fail")
    [row] = [r for r in summary(result)["failing_rows"]]
    assert (row["case_id"], row["metric"]) == ("coverage/decode/b4-c16-d0", "out_of_memory")
    assert row["message"].startswith("call ran out of GPU memory; fix: it ran alone on the GPU: run it on a GPU "
                                     "with more memory")


def test_long_suites_start_first_and_timing_suites_run_alone_after_the_others():
    from fastpath.suite_workers import waves

    assert waves(["coverage", "kernels", "perf", "parity"]) == [["kernels", "coverage", "parity"], ["perf"]]
    assert waves(["coverage", "kernels", "parity", "features"]) == [["kernels", "features", "coverage", "parity"]]
    assert waves(["perf"]) == [["perf"]]


def test_long_suites_run_as_shards_merged_back_into_one_suite(tmp_path):
    from fastpath.run_state import RunState
    from fastpath.suite_workers import units

    assert units(["features", "coverage"], 2, {"features": 9, "coverage": 16}) == [
        ("features", (0, 2)), ("features", (1, 2)), ("coverage", (0, 2)), ("coverage", (1, 2))]
    assert units(["parity"], 2, {"parity": 1}) == [("parity", (0, 1))]
    # the evals cases all read one session's lm-eval runs: two shards would each run them all
    assert units(["evals", "coverage"], 2, {"evals": 9, "coverage": 16}) == [
        ("evals", (0, 1)), ("coverage", (0, 2)), ("coverage", (1, 2))]
    state = RunState(tmp_path)
    for i, status in enumerate(("done", "done")):
        state.rows_path("features", (i, 2)).parent.mkdir(parents=True, exist_ok=True)
        state.rows_path("features", (i, 2)).write_text(f'{{"case_id": "features/x/{i}", "status": "pass"}}\n')
        state.log_path("features", (i, 2)).parent.mkdir(parents=True, exist_ok=True)
        state.log_path("features", (i, 2)).write_text(f"log {i}\n")
        state.mark("features", status, (i, 2), pytest_exit=i)
    state.merge_shards("features", 2)
    assert [r["case_id"] for r in read_rows(state.rows_path("features"))] == ["features/x/0", "features/x/1"]
    assert "log 0" in state.log_path("features").read_text() and state.marker("features")["status"] == "done"
    assert sorted(p.name for p in (tmp_path / "state" / "rows").iterdir()) == ["features.jsonl"]
    state.mark("coverage", "done", (0, 2), pytest_exit=0)  # from an interrupted attempt
    state.forget("coverage", (0, 2))
    assert state.marker("coverage", (0, 2)) is None
    state.mark("parity", "crashed", (1, 2), message="shard 2 died")
    state.mark("parity", "done", (0, 2), pytest_exit=0)
    state.merge_shards("parity", 2)
    assert state.marker("parity") == {"suite": "parity", "status": "crashed", "message": "shard 2 died"}


def test_merged_shards_rows_follow_the_plan_whichever_shard_ran_a_case(tmp_path):
    from fastpath.run_state import RunState

    state = RunState(tmp_path)
    rows = {0: ["c", "a", "a"], 1: ["b", "helper", "d"]}  # shard 0 claimed c before a
    for i, ids in rows.items():
        state.rows_path("kernels", (i, 2)).parent.mkdir(parents=True, exist_ok=True)
        state.rows_path("kernels", (i, 2)).write_text(
            "".join(f'{{"case_id": "kernels/{c}", "status": "pass", "n": {n}}}\n' for n, c in enumerate(ids)))
        state.mark("kernels", "done", (i, 2), pytest_exit=0)
    state.claims_dir("kernels").mkdir(parents=True)
    state.merge_shards("kernels", 2, ["kernels/a", "kernels/b", "kernels/c", "kernels/d"])
    merged = [(r["case_id"].split("/")[1], r["n"]) for r in read_rows(state.rows_path("kernels"))]
    assert merged == [("a", 1), ("a", 2), ("b", 0), ("c", 0), ("d", 2), ("helper", 1)]
    assert not state.claims_dir("kernels").exists()


def test_resume_refuses_a_changed_spec_and_out_refuses_reuse(tmp_path):
    spec = make_project(tmp_path / "p")
    run(spec, out=tmp_path / "run", only=["kernels"])
    with pytest.raises(UsageError, match="already holds a run"):
        run(spec, out=tmp_path / "run")
    spec.write_text(spec.read_text().replace('name = "double"', 'name = "double-2"'))
    with pytest.raises(UsageError, match="changed since the run"):
        run(None, resume=tmp_path / "run")
    with pytest.raises(UsageError, match="unknown suite"):
        run(make_project(tmp_path / "q"), out=tmp_path / "run2", only=["nope"])


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_suite_cut_off_mid_way_keeps_its_finished_cases_on_resume(tmp_path, monkeypatch, jobs):
    """Ctrl-C inside coverage's batch-4 decode case: the cases that had finished are kept (not
    run again), the one cut off runs again whole, and the rows equal an uninterrupted run's."""
    spec = make_project(tmp_path / "p")
    whole = run(spec, out=tmp_path / "whole", jobs=jobs)
    monkeypatch.setenv("FASTPATH_DOUBLE_INTERRUPT", "decode-b4")
    cut = run(spec, out=tmp_path / "run", jobs=jobs)
    assert (cut.exit_code, cut.verdict) == (3, "incomplete") and "finished suites and cases" in cut.message
    state = tmp_path / "run" / "state"
    finished = {line for p in (state / "finished").glob("coverage*.txt") for line in p.read_text().split()}
    assert "coverage/decode/b4-c16-d0" not in finished
    if jobs == 1:  # in one process the cases run in plan order: the batch-1 decode case came first
        assert finished == {"coverage/decode/b1-c16-d0"}
    monkeypatch.delenv("FASTPATH_DOUBLE_INTERRUPT")
    resumed = run(None, resume=tmp_path / "run", jobs=jobs)
    assert (resumed.exit_code, resumed.verdict) == (0, "pass"), resumed.message
    assert _rows(resumed) == _rows(whole)
    if jobs == 1:
        assert f"{len(finished)} deselected" in (state / "logs" / "coverage.log").read_text()
    assert not list((state / "kept").iterdir()) and not list((state / "finished").iterdir())


def test_a_suite_done_as_the_run_was_interrupted_still_joins_its_kept_rows(tmp_path):
    """A worker can end "done" while verify is being interrupted, before verify joins the suite's
    kept rows (CI saw its finished notes left over): the bundle's rows must still hold every case
    and the notes go. Made by hand: coverage done, its first case's rows still in kept/."""
    spec = make_project(tmp_path / "p")
    whole = run(spec, out=tmp_path / "whole")
    assert run(spec, out=tmp_path / "run", only=["coverage"]).exit_code == 3
    state = tmp_path / "run" / "state"
    lines = (state / "rows" / "coverage.jsonl").read_text().splitlines(keepends=True)
    first = json.loads(lines[0])["case_id"]
    (state / "kept").mkdir(exist_ok=True)
    (state / "kept" / "coverage.jsonl").write_text("".join(l for l in lines if json.loads(l)["case_id"] == first))
    (state / "rows" / "coverage.jsonl").write_text("".join(l for l in lines if json.loads(l)["case_id"] != first))
    (state / "finished").mkdir(exist_ok=True)
    (state / "finished" / "coverage.txt").write_text(first + "\n")
    resumed = run(None, resume=tmp_path / "run")
    assert (resumed.exit_code, resumed.verdict) == (0, "pass"), resumed.message
    assert _rows(resumed) == _rows(whole)
    assert not list((state / "kept").iterdir()) and not list((state / "finished").iterdir())


@pytest.mark.parametrize("jobs", [1, 2])
def test_resuming_only_suites_already_done_runs_nothing_and_says_so(tmp_path, jobs):
    spec = make_project(tmp_path / "p")
    assert run(spec, out=tmp_path / "run", only=["kernels"]).exit_code == 3
    lines = []
    console = Console(file=open(os.devnull, "w"))
    console.print = lambda *a, **k: lines.append(" ".join(map(str, a)))
    again = run(None, console=console, resume=tmp_path / "run", only=["kernels"], jobs=jobs)
    assert (again.exit_code, again.verdict) == (3, "incomplete")
    assert any("already done" in line and "kernels" in line for line in lines)


def test_resume_on_another_kind_of_machine_is_refused(tmp_path, monkeypatch):
    from fastpath import verify as V

    spec = make_project(tmp_path / "p")
    first = run(spec, out=tmp_path / "run", only=["kernels"])
    assert first.exit_code == 3
    assert json.loads((tmp_path / "run" / "state" / "run.json").read_text())["machine"] == V.machine_kind()
    monkeypatch.setattr(V, "machine_kind", lambda: "NVIDIA H200 (sm_90)")
    with pytest.raises(UsageError, match=r"started on .*; this machine is NVIDIA H200 \(sm_90\)") as err:
        run(None, resume=tmp_path / "run")
    assert "same kind of machine" in err.value.fix


def test_changed_fast_path_sources_are_never_attested_together(tmp_path):
    spec = make_project(tmp_path / "p")
    first = run(spec, out=tmp_path / "run", only=["coverage"])
    assert first.exit_code == 3
    (tmp_path / "p" / "src" / "fast.py").write_text("FAST = False  # edited between suites\n")
    with pytest.raises(UsageError, match="fast-path sources changed"):
        run(None, resume=tmp_path / "run")


def test_signed_bundle_passes_check(tmp_path):
    from fastpath.check import check_bundle
    from fastpath.signing import generate_keypair, load_public_key, public_key_hex

    key, pub, kid = generate_keypair(tmp_path / "k.key", tmp_path / "k.pub")
    spec = make_project(tmp_path / "p")
    result = run(spec, out=tmp_path / "p" / "out", key=key)
    trust = tmp_path / "trust.toml"
    trust.write_text(f'[[keys]]\nkeyid = "{kid}"\npublic_key = "{public_key_hex(load_public_key(pub))}"\n'
                     f'owner = "t"\ntiers = ["smoke"]\n')
    report = check_bundle(result.archive, trust_path=trust, source_root=tmp_path / "p", require_tier="smoke")
    assert report.passed, [(f.rule, f.reason) for f in report.failures]


def test_cli_verify_uses_default_spec_and_maps_exit_codes(tmp_path, monkeypatch):
    make_project(tmp_path / "p")
    monkeypatch.chdir(tmp_path / "p")
    runner = CliRunner()
    result = runner.invoke(app, ["verify", "--tier", "smoke", "--out", str(tmp_path / "run"),
                                 "--suites-dir", str(SUITES)])
    assert result.exit_code == 0, result.output
    assert "verdict: PASS" in result.output
    assert "coverage/decode/b4-c16-d0" in result.output  # a progress line per case
    result = runner.invoke(app, ["verify", "--tier", "huge"])  # a choice: click's usage error names the choices
    assert result.exit_code == 2 and "'huge' is not one of 'auto', 'smoke', 'full'" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["verify", "--resume", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "holds no fastpath run" in result.output


def test_suite_without_module_fails_with_its_reason(tmp_path):
    spec = make_project(tmp_path / "p")
    spec.write_text(spec.read_text() + '\n[gates.parity_kl]\nsuite = "parity"\n')
    result = run(spec, out=tmp_path / "run")
    assert (result.exit_code, result.verdict) == (1, "fail")
    s = summary(result)
    assert s["complete"] is True and s["suites"]["parity"] == "crashed"
    messages = [r["message"] for r in s["failing_rows"]]
    assert any("no suite module" in m and "test_parity.py" in m for m in messages)
    assert "case produced no result" in messages  # its planned cases are accounted for


def test_auto_tier_is_smoke_without_torch(monkeypatch):
    import importlib.util

    from fastpath.spec import load_spec
    from fastpath.verify import detect_tier

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert detect_tier(load_spec(DOUBLES / "spec.toml")) == ("smoke", "torch is not installed")


def test_cli_keygen_sign_refuses_incomplete_and_check_rejects(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["keygen", "--out", str(tmp_path / "k.key"), "--pub", str(tmp_path / "k.pub")])
    assert result.exit_code == 0, result.output
    assert oct((tmp_path / "k.key").stat().st_mode & 0o777) == "0o600"
    partial = run(make_project(tmp_path / "p"), out=tmp_path / "run", only=["kernels"])
    result = runner.invoke(app, ["sign", str(partial.bundle_dir), "--key", str(tmp_path / "k.key")])
    assert result.exit_code == 2 and "incomplete" in result.output and "Traceback" not in result.output
    args = ["check", str(partial.archive), "--source", str(tmp_path / "p"), "--format", "json"]
    result = runner.invoke(app, [*args, "--trust", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2 and "cannot read trust policy" in result.output  # unreadable input
    (tmp_path / "none.toml").write_text("# no keys yet\n")
    result = runner.invoke(app, [*args, "--trust", str(tmp_path / "none.toml")])
    assert result.exit_code == 1
    assert json.loads(result.output)["passed"] is False


def test_unsigned_run_needs_no_cryptography(tmp_path):
    """The GPU machine has no `cryptography`: a run without --key (signed later, elsewhere) must
    never import it, also on the resume path that compares attested digests."""
    import subprocess
    import sys

    spec = make_project(tmp_path / "p")
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'cryptography' or name.startswith('cryptography.'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from fastpath.cli import app\n"
        f"app(['verify', {str(spec)!r}, '--tier', 'smoke', '--out', {str(tmp_path / 'run')!r},"
        f" '--suites-dir', {str(SUITES)!r}])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), str(DOUBLES.parent)])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "blocked" not in proc.stderr
