import gzip
import hashlib
import json
import os
import tarfile

import pandas as pd
import pytest

from fastpath.bundle import MANIFEST, archive_path, build_manifest, pack, write_bundle
from fastpath.digest import sha256_file


def _write(tmp_path, name="run.fastpath", rows=None, logs=True):
    spec = tmp_path / "repo" / "sub" / "fastpath.toml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "repo" / "pyproject.toml").write_text("")
    spec.write_bytes(b"# spec \xe2\x9c\x93\n[fastpath]\nname = 'x'\n")
    logs_dir = tmp_path / "logs"
    if logs:
        (logs_dir / "suite").mkdir(parents=True, exist_ok=True)
        (logs_dir / "suite" / "pytest.log").write_text("ok\n")
    rows = rows if rows is not None else pd.DataFrame({"case_id": ["a", "b"], "value": [1.0, 2.0]})
    return write_bundle(tmp_path / "out" / name, spec_path=spec, plan={"cases": [{"case_id": "a"}], "b": 1},
                        rows=rows, summary={"verdict": "pass", "complete": True, "tier": "smoke"},
                        environment={"hardware": "cpu"}, logs_dir=logs_dir if logs else None,
                        report_html="<html></html>",
                        attested={"algorithm": "sha256-tree-v1", "parts": {}})


def test_layout_and_manifest(tmp_path):
    b = _write(tmp_path)
    names = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    assert names == ["attested.json", "environment.json", "logs/suite/pytest.log", "manifest.json", "plan.json", "report.html",
                     "results/rows.parquet", "spec.toml", "summary.json"]
    assert (b / "spec.toml").read_bytes() == (tmp_path / "repo/sub/fastpath.toml").read_bytes()
    manifest = json.loads((b / MANIFEST).read_bytes())
    listed = {f["path"]: f for f in manifest["files"]}
    assert MANIFEST not in listed and len(listed) == len(names) - 1
    for path, f in listed.items():
        assert (f["sha256"], f["size"]) == sha256_file(b / path)
    assert pd.read_parquet(b / "results/rows.parquet")["value"].tolist() == [1.0, 2.0]
    # The spec's repo-relative path is recorded so `check` finds the tree's copy.
    assert json.loads((b / "environment.json").read_bytes())["spec_path"] == "sub/fastpath.toml"


def test_json_files_are_canonical(tmp_path):
    b = _write(tmp_path)
    raw = (b / "plan.json").read_bytes()
    assert raw == b'{"b":1,"cases":[{"case_id":"a"}]}\n'


def test_rewrite_replaces_atomically_and_leaves_no_temp(tmp_path):
    _write(tmp_path)
    b = _write(tmp_path, rows=pd.DataFrame({"case_id": ["z"], "value": [9.0]}))
    assert pd.read_parquet(b / "results/rows.parquet")["case_id"].tolist() == ["z"]
    assert sorted(os.listdir(b.parent)) == ["run.fastpath"]


def test_failed_write_keeps_previous_bundle(tmp_path):
    b = _write(tmp_path)
    before = (b / MANIFEST).read_bytes()
    with pytest.raises(Exception):
        _write(tmp_path, rows=pd.DataFrame({"bad": [object()]}))  # parquet cannot encode it
    assert (b / MANIFEST).read_bytes() == before
    assert sorted(os.listdir(b.parent)) == ["run.fastpath"]


def test_pack_twice_is_byte_identical_and_normalised(tmp_path):
    b = _write(tmp_path)
    first = pack(b).read_bytes()
    os.utime(b / "spec.toml", (12345, 12345))
    os.chmod(b / "summary.json", 0o600)
    second = pack(b).read_bytes()
    assert hashlib.sha256(first).hexdigest() == hashlib.sha256(second).hexdigest()
    assert archive_path(b).name == "run.fastpath.tar.gz"
    assert first[4:8] == b"\0\0\0\0"  # gzip header mtime
    assert not first[3] & 0x08  # no FNAME flag
    with tarfile.open(archive_path(b)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and names[0] == "run.fastpath"
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
        assert m.mode == (0o755 if m.isdir() else 0o644)


def test_pack_differs_when_content_differs(tmp_path):
    b = _write(tmp_path)
    first = pack(b).read_bytes()
    (b / "report.html").write_text("<html>changed</html>")
    assert pack(b).read_bytes() != first
    assert gzip.decompress(first)  # a valid gzip stream


def test_manifest_ignores_statements(tmp_path):
    b = _write(tmp_path)
    (b / "statement.json").write_text("{}")
    (b / "statement.dsse.json").write_text("{}")
    assert {f["path"] for f in build_manifest(b)["files"]}.isdisjoint({"statement.json", "statement.dsse.json"})


def test_rewriting_the_same_run_packs_to_the_same_bytes(tmp_path):
    # Parquet, JSON and the copied files are all deterministic, so a re-written bundle of the
    # same run is byte-identical as an archive.
    first = pack(_write(tmp_path)).read_bytes()
    second = pack(_write(tmp_path)).read_bytes()
    assert first == second
