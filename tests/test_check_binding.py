"""check: a genuine signature over a statement that contradicts the bundle, rows with unknown
statuses, a bundle of another spec, stale parts (named), --freshness warn, the trust policy,
the canonical archive and the CLI contract (exit codes, digest JSON)."""

import base64
import gzip
import io
import json
import tarfile

import pandas as pd
import pytest
from typer.testing import CliRunner

from bundle_factory import OTHER_SPEC_REL, SPEC_REL, build
from fastpath.bundle import ROWS, STATEMENT, ENVELOPE, pack, write_json, write_manifest
from fastpath.check import check_bundle, main_check
from fastpath.cli import app
from fastpath.digest import canonical_json
from fastpath.signing import load_private_key, sign_bundle, sign_envelope


def _check(b, bundle=None, **kw):
    kw.setdefault("require_tier", "full")
    return check_bundle(bundle or b.bundle, trust_path=b.trust, source_root=b.repo, **kw)


def _failed(report):
    return sorted({f.rule for f in report.failures})


def _reasons(report):
    return " | ".join(f.reason for f in report.failures)


@pytest.fixture
def b(tmp_path):
    return build(tmp_path)


def _sign_statement(b, edit):
    """Sign, with the trusted key, a statement edited by ``edit``: the signature is genuine, only
    the comparison with the bundle's own files can catch the lie."""
    st = json.loads((b.bundle / STATEMENT).read_bytes())
    edit(st)
    write_json(b.bundle / STATEMENT, st)
    write_json(b.bundle / ENVELOPE, sign_envelope(canonical_json(st), load_private_key(b.private_key)))


def _set(path, value):
    def edit(st):
        node = st
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _subject(name, value):
    def edit(st):
        for s in st["subject"]:
            if s["name"] == name:
                s["digest"]["sha256"] = value
    return edit


@pytest.mark.parametrize("claim,edit", [
    ("tier", _set(["predicate", "tier"], "smoke")),
    ("verdict", _set(["predicate", "verdict"], "fail")),
    ("complete", _set(["predicate", "complete"], False)),
    ("hardware", _set(["predicate", "hardware"], "sm_100")),
    ("gates", _set(["predicate", "gates", "coverage_clean_fallback"], "waived")),
    ("spec.path", _set(["predicate", "spec", "path"], OTHER_SPEC_REL)),
    ("spec.sha256", _set(["predicate", "spec", "sha256"], "0" * 64)),
    ("spec.name", _set(["predicate", "spec", "name"], "toy-other")),
    ("tool.version", _set(["predicate", "tool", "version"], "9.9.9")),
    ("invocation", _set(["predicate", "invocation", "argv"], ["fastpath", "verify", "--tier", "full", "--x"])),
    ("predicateType", _set(["predicateType"], "https://example.com/other")),
    ("subject manifest.json", _subject("manifest.json", "1" * 64)),
    ("subject fastpath:validation", _subject("fastpath:validation", "2" * 64)),
    ("subject fastpath:subject", _subject("fastpath:subject", "3" * 64)),
])
def test_every_signed_claim_is_compared_with_the_bundle(b, claim, edit):
    assert _check(b).passed
    _sign_statement(b, edit)
    report = _check(b)
    assert "statement_binding" in _failed(report)
    assert f"statement {claim} " in _reasons(report) and "contradicts the bundle's" in _reasons(report)


def test_bundle_files_that_disagree_with_each_other_fail_the_binding(b):
    summary = json.loads((b.bundle / "summary.json").read_bytes())
    write_json(b.bundle / "summary.json", {**summary, "spec_digest": "0" * 64})
    write_manifest(b.bundle)
    sign_bundle(b.bundle, b.private_key)
    report = _check(b)
    assert _failed(report) == ["statement_binding"]
    assert "summary.json spec_digest '" + "0" * 64 + "' != sha256 of spec.toml" in _reasons(report)


def _rows_edit(b, **values):
    rows = pd.read_parquet(b.bundle / ROWS)
    for col, v in values.items():
        rows[col] = rows[col].astype(object)
        rows.loc[0, col] = v
    rows.to_parquet(b.bundle / ROWS, index=False)
    write_manifest(b.bundle)
    sign_bundle(b.bundle, b.private_key)
    return rows["case_id"].iloc[0]


def test_an_unknown_row_status_is_rejected(b):
    case = _rows_edit(b, status="skipped")
    report = _check(b)
    assert {"result_rows", "gates_passed"} <= set(_failed(report))
    assert (f"1 row(s) invalid: row status 'skipped' is not one of pass, fail, error, waived, info (e.g. {case})"
            in _reasons(report))


def test_passed_contradicting_the_status_is_rejected(b):
    _rows_edit(b, status="pass", passed=False)
    report = _check(b)
    assert "result_rows" in _failed(report)
    assert "row passed=False contradicts its status 'pass'" in _reasons(report)


def test_a_signed_bundle_of_another_spec_of_the_repository_fails(tmp_path):
    mine = build(tmp_path / "a")
    other = build(tmp_path / "b", spec_rel=OTHER_SPEC_REL, repo=mine.repo)
    # Genuine and signed: it passes against the spec it was made for...
    assert check_bundle(other.bundle, trust_path=other.trust, source_root=mine.repo, spec=OTHER_SPEC_REL).passed
    # ...but the tree declares the other one (pyproject default_spec), whatever the bundle recorded.
    report = check_bundle(other.bundle, trust_path=other.trust, source_root=mine.repo)
    assert "spec_is_tree_spec" in _failed(report)
    assert "the bundle is for spec 'toy-other', the tree declares 'toy-fast' (subject/fastpath.toml)" in _reasons(report)
    assert "attested_digests" in _failed(report)  # its spec part is not the tree's spec either
    report = check_bundle(other.bundle, trust_path=other.trust, source_root=mine.repo, spec=SPEC_REL)
    assert "spec_is_tree_spec" in _failed(report)


@pytest.mark.parametrize("path,part,label", [
    ("fastpath/suites/test_coverage.py", "validation", "validation sources"),
    ("subject/model.py", "subject", "subject"),
    ("subject/fast/tuning.json", "fast_path", "fast-path sources"),
])
def test_a_stale_part_is_named_with_its_files(b, path, part, label):
    (b.repo / path).write_text((b.repo / path).read_text() + "# edited\n")
    report = _check(b)
    assert _failed(report) == ["attested_digests"]
    assert _reasons(report) == f"stale: {label} changed since the bundle: {path}"


def test_new_files_and_gate_rules_are_part_of_the_validation_digest(b):
    (b.repo / "fastpath/suites/test_new.py").write_text("def test_x():\n    pass\n")
    assert _reasons(_check(b)) == "stale: validation sources changed since the bundle: fastpath/suites/test_new.py (new)"
    (b.repo / "fastpath/suites/test_new.py").unlink()
    b.spec.write_text(b.spec.read_text() + "threshold = 2\n")  # lands in the last [gates.*] table
    reasons = _reasons(_check(b))
    assert "stale: validation sources changed since the bundle: [gates]" in reasons
    assert "stale: spec changed since the bundle: subject/fastpath.toml" in reasons


def test_freshness_warn_reports_stale_parts_but_still_checks_integrity(b, tmp_path):
    (b.repo / "fastpath/suites/test_coverage.py").write_text("# edited\n")
    # A tree spec whose plan differs: warn judges the plan by the bundle's own spec.
    b.spec.write_text(b.spec.read_text().replace("batch_sizes = [1, 2]", "batch_sizes = [1, 2, 4]"))
    enforce = _check(b)
    assert {"attested_digests", "plan_covers_scope"} <= set(_failed(enforce))
    warn = _check(b, freshness="warn")
    assert warn.passed, _reasons(warn)
    assert warn.warnings == [
        "warning: stale validation: validation sources changed since the bundle: fastpath/suites/test_coverage.py",
        "warning: stale spec: spec changed since the bundle: subject/fastpath.toml"]
    out = io.StringIO()
    assert main_check(b.bundle, trust=b.trust, source=b.repo, freshness="warn", out=out) == 0
    assert "warning: stale validation: validation sources changed" in out.getvalue()
    (b.bundle / "report.html").write_text("<html>edited</html>")  # integrity is never a warning
    assert "manifest" in _failed(_check(b, freshness="warn"))


def test_duplicate_keyids_in_the_trust_policy_are_an_error(b):
    text = b.trust.read_text()
    b.trust.write_text(text + "\n" + text.replace('owner = "tests"', 'owner = "someone else"'))
    report = _check(b)
    assert _failed(report) == ["signature"]
    assert f"duplicate keyid {b.keyid} (already listed for tests)" in _reasons(report)
    err = io.StringIO()
    assert main_check(b.bundle, trust=b.trust, source=b.repo, out=io.StringIO(), err=err) == 2
    assert err.getvalue().startswith("error: ") and err.getvalue().count("\n") == 1


def _retar(archive, transform):
    raw = transform(gzip.decompress(archive.read_bytes()))
    archive.write_bytes(gzip.compress(raw))
    return archive


def test_only_the_tar_stream_pack_writes_is_accepted(b, tmp_path):
    archive = pack(b.bundle)
    assert _check(b, archive).passed
    # Extra zero padding is safe to extract, but not what pack writes.
    report = _check(b, _retar(archive, lambda raw: raw + b"\0" * 10240))
    assert _failed(report) == ["canonical_archive"]
    assert "is not what `fastpath pack` writes for its members" in _reasons(report)
    # The same members written by another tool (own mtimes, modes, order).
    other = tmp_path / "other.fastpath.tar.gz"
    with tarfile.open(other, "w:gz") as tar:
        tar.add(b.bundle, arcname=b.bundle.name)
    assert _failed(_check(b, other)) == ["canonical_archive"]


def test_cli_contract_exit_codes_and_digest_json(b, tmp_path):
    runner = CliRunner()
    archive = pack(b.bundle)
    args = ["--trust", str(b.trust), "--source", str(b.repo), "--require-tier", "full"]
    assert runner.invoke(app, ["check", str(archive), *args]).exit_code == 0
    assert runner.invoke(app, ["check", str(archive), *args, "--spec", OTHER_SPEC_REL]).exit_code == 1
    for bad in (tmp_path / "missing.tar.gz", b.trust):  # missing; not a bundle
        result = runner.invoke(app, ["check", str(bad), *args])
        assert result.exit_code == 2 and "error:" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["check", str(archive), *args, "--spec", "nope.toml"])
    assert result.exit_code == 2 and "no spec file" in result.output
    result = runner.invoke(app, ["check", str(archive), *args, "--freshness", "sometimes"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["check", str(archive), *args, "--format", "json"])
    data = json.loads(result.output)
    assert data["passed"] is True and data["spec"] == SPEC_REL and data["warnings"] == []
    result = runner.invoke(app, ["digest", "--source", str(b.repo), "--json"])
    assert result.exit_code == 0, result.output
    digest = json.loads(result.output)
    attested = json.loads((b.bundle / "attested.json").read_bytes())
    assert digest == {"spec": SPEC_REL, "name": "toy-fast",
                      "parts": {p: attested["parts"][p]["digest"] for p in ("fast_path", "validation", "subject", "spec")}}
    result = runner.invoke(app, ["digest", OTHER_SPEC_REL, "--source", str(b.repo), "--json"])
    assert json.loads(result.output)["name"] == "toy-other"
