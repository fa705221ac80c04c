"""lab/carried_run.py: says whether a carried run directory still matches the attested tree."""

import io
import json
import tarfile
from pathlib import Path

from fastpath.digest import attested_parts
from fastpath.spec import load_spec
from lab import carried_run

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "optimized_model" / "k3" / "fastpath.toml"


def _archive(path: Path, run: dict, done: list[str], attested: dict | None = None,
             extra: list[tuple[str, bytes]] = ()) -> Path:
    files = [("full/state/run.json", json.dumps(run).encode()),
             *[(f"full/state/done/{s}.json", b"{}") for s in done], *extra]
    if attested is not None:
        files.append(("full/k3.full.fastpath/attested.json", json.dumps(attested).encode()))
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _run_of_this_tree() -> tuple[dict, dict]:
    spec = load_spec(SPEC)
    attested = attested_parts(ROOT, spec)
    run = {"spec_digest": spec.digest, "attested": {p: v["digest"] for p, v in attested["parts"].items()}}
    return run, attested


def test_a_run_of_this_tree_is_resumable_and_names_what_is_left(tmp_path, monkeypatch, capsys):
    archive = _archive(tmp_path / "full.tar.gz", _run_of_this_tree()[0], ["coverage", "kernels"])
    monkeypatch.chdir(ROOT)
    assert carried_run.main([str(archive)]) == 0
    out = capsys.readouterr().out
    assert "resumable" in out and "done: coverage, kernels" in out and "left: parity, features, evals, perf" in out


def test_the_cases_a_resume_keeps_and_the_machine_are_named(tmp_path, monkeypatch, capsys):
    run = {**_run_of_this_tree()[0], "machine": "NVIDIA H100 80GB HBM3 (sm_90)"}
    extra = [("full/state/finished/perf.txt", b"perf/speedup/b1-c1024-d0\nperf/speedup/b2-c1024-d0\n"),
             ("full/state/kept/perf.jsonl", b'{"case_id": "perf/speedup/b1-c1024-d0", "status": "pass"}\n'
                                            b'{"case_id": "perf/control/b1-c1024-d0", "status": "pass"}\n')]
    archive = _archive(tmp_path / "full.tar.gz", run, ["coverage", "kernels", "parity", "features", "evals"],
                       extra=extra)
    monkeypatch.chdir(ROOT)
    assert carried_run.main([str(archive)]) == 0
    out = capsys.readouterr().out
    assert "left: perf (3 of its cases finished: kept)" in out and "on NVIDIA H100 80GB HBM3 (sm_90) only" in out


def test_a_changed_part_is_named_and_refused(tmp_path, monkeypatch, capsys):
    run, _ = _run_of_this_tree()
    run["attested"]["validation"] = "0" * 64
    archive = _archive(tmp_path / "full.tar.gz", run, [])
    monkeypatch.chdir(ROOT)
    assert carried_run.main([str(archive)]) == 1
    out = capsys.readouterr().out
    assert "validation: its digest differs" in out and "start afresh" in out and "fast_path" not in out


def test_a_changed_file_is_named_where_the_run_recorded_its_files(tmp_path, monkeypatch, capsys):
    run, attested = _run_of_this_tree()
    run["attested"]["validation"] = "0" * 64
    changed = attested["parts"]["validation"]["files"][0]
    changed["sha256"] = "f" * 64
    archive = _archive(tmp_path / "full.tar.gz", run, ["coverage"], attested)
    monkeypatch.chdir(ROOT)
    assert carried_run.main([str(archive)]) == 1
    assert f"validation: {changed['path']}" in capsys.readouterr().out


def test_an_unreadable_archive_is_one_line_with_the_fix(tmp_path, capsys):
    bad = tmp_path / "full.tar.gz"
    bad.write_bytes(b"not a tar")
    assert carried_run.main([str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read" in err[0] and "fix:" in err[0]
