"""check_bundle: a valid signed bundle passes; each tampering or shortfall fails with its own reason."""

import io
import json
import tarfile

import pandas as pd
import pytest

from bundle_factory import build
from fastpath.bundle import ROWS, pack, write_json, write_manifest
from fastpath.check import check_bundle, main_check
from fastpath.signing import generate_keypair, sign_bundle


def _check(b, bundle=None, require_tier="full"):
    return check_bundle(bundle or b.bundle, trust_path=b.trust, source_root=b.repo, require_tier=require_tier)


def _failed(report):
    return sorted({f.rule for f in report.failures})


def _reasons(report):
    return " | ".join(f.reason for f in report.failures)


def _resign(b, key=None):
    """The contributor's own (trusted) tool re-manifests and re-signs: only semantics can catch it."""
    write_manifest(b.bundle)
    sign_bundle(b.bundle, key or b.private_key)


@pytest.fixture
def b(tmp_path):
    return build(tmp_path)


def test_round_trip_directory_and_archive_pass(b):
    report = _check(b)
    assert report.passed, report.render_text()
    assert [r.status for r in report.results] == ["pass"] * 13
    archive = pack(b.bundle)
    assert _check(b, archive).passed


def _files(tmp_path):
    b = build(tmp_path)
    return sorted(p.relative_to(b.bundle).as_posix() for p in b.bundle.rglob("*") if p.is_file())


ALL_FILES = ["attested.json", "environment.json", "logs/pytest.log", "manifest.json", "plan.json", "report.html",
             "results/rows.parquet", "spec.toml", "statement.dsse.json", "statement.json",
             "summary.json"]


def test_all_files_are_covered_by_the_byte_flip_test(tmp_path):
    assert _files(tmp_path) == ALL_FILES


@pytest.mark.parametrize("name", ALL_FILES)
def test_one_byte_changed_in_any_file_is_rejected(b, name):
    path = b.bundle / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    report = _check(b)
    assert not report.passed
    expected = {"manifest.json": {"statement_binding", "manifest"}, "statement.dsse.json": {"signature"},
                "statement.json": {"statement_binding"}}.get(name, {"manifest"})
    assert set(_failed(report)) & expected, _reasons(report)
    if name not in ("manifest.json", "statement.dsse.json", "statement.json"):
        assert f"{name}: sha256" in _reasons(report)


def test_one_byte_changed_in_the_archive_is_rejected(b):
    archive = pack(b.bundle)
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive.write_bytes(bytes(data))
    report = _check(b, archive)
    assert _failed(report) == ["safe_extraction"]  # the gzip CRC is verified before extracting
    assert all(r.status == "skipped" for r in report.results[1:])


def test_unlisted_file_is_rejected(b):
    (b.bundle / "logs" / "extra.log").write_text("smuggled")
    assert "logs/extra.log: present in the bundle but not listed" in _reasons(_check(b))


def test_results_row_removed_is_rejected(b):
    rows = pd.read_parquet(b.bundle / ROWS)
    victim = rows["case_id"].iloc[0]
    rows.iloc[1:].to_parquet(b.bundle / ROWS, index=False)
    tampered = _check(b)
    # Not re-signed: the manifest digest catches it (and the semantic rule too).
    assert {"manifest", "results_cover_plan"} <= set(_failed(tampered))
    assert "results/rows.parquet: sha256" in _reasons(tampered)
    _resign(b)
    report = _check(b)
    assert "results_cover_plan" in _failed(report)  # (gates_passed also sees the missing result)
    assert f"case {victim} has no result row" in _reasons(report)


def test_spec_changed_in_tree_is_rejected(b):
    b.spec.write_text(b.spec.read_text() + "# changed\n")
    report = _check(b)
    assert _failed(report) == ["attested_digests"]
    assert _reasons(report) == "stale: spec changed since the bundle: subject/fastpath.toml"


def test_case_missing_from_plan_is_rejected(b):
    plan = json.loads((b.bundle / "plan.json").read_bytes())
    dropped = plan["cases"].pop(3)["case_id"]
    write_json(b.bundle / "plan.json", plan)
    _resign(b)
    report = _check(b)
    assert _failed(report) == ["plan_covers_scope"]
    assert f"plan is missing case {dropped}" in _reasons(report)


def test_signature_by_untrusted_key_is_rejected(b, tmp_path):
    other, _, kid = generate_keypair(tmp_path / "other.key", tmp_path / "other.pub")
    sign_bundle(b.bundle, other)
    report = _check(b)
    assert _failed(report) == ["signature"]
    assert f"untrusted key(s) {kid}" in _reasons(report)


def test_key_trusted_for_smoke_only_cannot_attest_full(tmp_path):
    b = build(tmp_path, trust_tiers=["smoke"])
    report = _check(b)
    assert _failed(report) == ["signature"] and "not for tier 'full'" in _reasons(report)


def test_no_signature_is_rejected(b):
    (b.bundle / "statement.dsse.json").unlink()
    report = _check(b)
    assert _failed(report) == ["signature"]
    assert "no signature" in _reasons(report)
    assert next(r for r in report.results if r.name == "statement_binding").status == "skipped"


def test_source_digest_different_from_tree_is_rejected(b):
    (b.repo / "subject/fast/kernels/gemv.py").write_text("BLOCK = 128\n")
    report = _check(b)
    assert _failed(report) == ["attested_digests"]
    assert _reasons(report) == "stale: fast-path sources changed since the bundle: subject/fast/kernels/gemv.py"


def test_hardware_outside_scope_is_rejected(tmp_path):
    b = build(tmp_path, hardware="sm_80")
    report = _check(b)
    assert _failed(report) == ["hardware_in_scope"]
    assert "sm_80 is outside the spec's scope.hardware ['sm_90']" in _reasons(report)


def test_tier_below_required_is_rejected(tmp_path):
    b = build(tmp_path, tier="smoke", hardware="cpu")
    assert _check(b, require_tier="smoke").passed
    report = _check(b, require_tier="full")
    assert _failed(report) == ["tier_sufficient"]
    assert "'smoke' is below the required tier 'full'" in _reasons(report)


def test_failing_gate_and_lying_summary_are_rejected(b):
    rows = pd.read_parquet(b.bundle / ROWS)
    rows.loc[0, ["status", "passed"]] = ["fail", False]
    rows.to_parquet(b.bundle / ROWS, index=False)
    _resign(b)  # summary still claims every gate passed
    report = _check(b)
    assert _failed(report) == ["gates_passed"]
    assert "recomputed from the rows as 'fail' (1 of 4 rows failed), summary says 'pass'" in _reasons(report)


def test_runtime_waiver_not_allowed_on_full_tier(b):
    rows = pd.read_parquet(b.bundle / ROWS)
    rows.loc[0, ["status", "passed"]] = ["waived", False]
    rows.to_parquet(b.bundle / ROWS, index=False)
    _resign(b)
    assert "the full-tier plan allows no waiver" in _reasons(_check(b))


def _evil_archive(path, name, type_=tarfile.REGTYPE):
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.type = type_
        info.linkname = "/etc/passwd" if type_ == tarfile.SYMTYPE else ""
        info.size = 0 if type_ == tarfile.SYMTYPE else 1
        tar.addfile(info, io.BytesIO(b"x") if info.size else None)
    return path


@pytest.mark.parametrize("name,type_,reason", [("b.fastpath/../x", tarfile.REGTYPE, "'..'"),
                                               ("/abs/x", tarfile.REGTYPE, "absolute path"),
                                               ("b.fastpath/l", tarfile.SYMTYPE, "symbolic link")])
def test_hostile_archives_fail_safe_extraction(b, tmp_path, name, type_, reason):
    report = _check(b, _evil_archive(tmp_path / "evil.fastpath.tar.gz", name, type_))
    assert _failed(report) == ["safe_extraction"] and reason in _reasons(report)


def test_huge_member_archive_fails_safe_extraction(b, tmp_path):
    info = tarfile.TarInfo("b.fastpath/huge")
    info.size = 10 * 2**30
    path = tmp_path / "huge.fastpath.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.fileobj.write(info.tobuf(tarfile.PAX_FORMAT, tar.encoding, tar.errors))
    report = _check(b, path)
    assert _failed(report) == ["safe_extraction"] and "exceeds" in _reasons(report)


def test_hostile_spec_path_does_not_escape_the_tree(b):
    env = json.loads((b.bundle / "environment.json").read_bytes())
    write_json(b.bundle / "environment.json", {**env, "spec_path": "../../etc/passwd"})
    _resign(b)
    report = _check(b)
    # The recorded path is never opened: the tree's declared spec is the one judged.
    assert {"statement_binding", "spec_is_tree_spec"} <= set(_failed(report))
    assert "the bundle's spec was at '../../etc/passwd', the tree declares 'subject/fastpath.toml'" in _reasons(report)


def test_outputs_text_markdown_json_and_exit_code(b, tmp_path, monkeypatch):
    (b.bundle / "statement.dsse.json").unlink()
    report = _check(b)
    assert "signature" in report.render_text() and "FAILED" in report.render_text()
    md = report.render_markdown()
    assert md.startswith("### ❌") and "| `signature` | ❌ fail | no signature" in md
    data = json.loads(report.to_json())
    assert data["passed"] is False and data["failures"][0]["rule"] == "signature"
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out = io.StringIO()
    rc = main_check(b.bundle, trust=b.trust, source=b.repo, require_tier="full", fmt="json", out=out)
    assert rc == 1 and json.loads(out.getvalue())["passed"] is False
    assert "fastpath check failed" in summary.read_text()
    sign_bundle(b.bundle, b.private_key)
    assert main_check(b.bundle, trust=b.trust, source=b.repo, require_tier="full", out=io.StringIO()) == 0


def test_full_tier_waivers_of_verify_steps_over_max_verify_rows_pass_the_check(tmp_path):
    """Plan-time waivers (a verify step of batch x (draft + 1) rows over scope.max_verify_rows)
    are allowed on the full tier: each has its waiver row, and check accepts the bundle."""
    from bundle_factory import SPEC_REL, make_repo

    repo = make_repo(tmp_path / "repo")
    spec = repo / SPEC_REL
    spec.write_text(spec.read_text().replace("draft_lengths = [0]", "draft_lengths = [0, 3]\nmax_verify_rows = 4")
                    .replace("max_context = 128", "max_context = 128\nspeculative_decoding = true")
                    .replace("[gates]\n", "[perf]\nsynthetic_acceptance_length = { 3 = 3.0 }\n\n[gates]\n", 1))
    b = build(tmp_path, repo=repo)
    plan = json.loads((b.bundle / "plan.json").read_text())
    waived = {w["case_id"]: w["reason"] for w in plan["waivers"]}
    assert "coverage/decode/b2-c64-d3" in waived and "max_verify_rows" in waived["coverage/decode/b2-c64-d3"]
    assert "coverage/decode/b1-c64-d3" in {c["case_id"] for c in plan["cases"]}  # 4 rows: in scope
    report = _check(b)
    assert report.passed, report.render_text()
