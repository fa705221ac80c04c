"""The command line's rough edges, each as a fresh user meets it."""

from __future__ import annotations

import io
import json
import tomllib

import pytest
from rich.console import Console
from typer.testing import CliRunner

from fastpath.check import load_trust, main_check
from fastpath.cli import _config_text, app
from fastpath.progress import note, reporting_to
from fastpath.results import make_row
from fastpath.verify import progress_line
from tests.bundle_factory import build
from tests.test_verify import SUITES, make_project, run

runner = CliRunner()


@pytest.mark.parametrize("command", ["plan", "verify", "check", "digest"])
def test_help_keeps_tool_fastpath(command):
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "[tool.fastpath]" in res.output


def test_version():
    from fastpath import __version__

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"fastpath {__version__}"


@pytest.mark.parametrize("args", [["plan", "--tier", "huge"], ["verify", "--tier", "huge"],
                                  ["check", "x.tar.gz", "--format", "html"], ["check", "x.tar.gz", "--require-tier", "gold"],
                                  ["check", "x.tar.gz", "--freshness", "maybe"]])
def test_choices_are_usage_errors(args):
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and "is not one of" in res.output and "Traceback" not in res.output


def _one_line_error(res) -> str:
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    return lines[0]


def test_check_missing_or_not_a_bundle_is_one_line_exit_2(tmp_path):
    assert "no such bundle" in _one_line_error(runner.invoke(app, ["check", str(tmp_path / "none.tar.gz")]))
    gz = tmp_path / "x.tar.gz"
    import gzip

    gz.write_bytes(gzip.compress(b"hello, not a tar archive" * 100))
    assert "not of a tar archive" in _one_line_error(runner.invoke(app, ["check", str(gz)]))
    (tmp_path / "d").mkdir()
    assert "not a bundle directory" in _one_line_error(runner.invoke(app, ["check", str(tmp_path / "d")]))


def test_a_pass_names_signer_required_tier_and_what_did_not_apply(tmp_path):
    b = build(tmp_path)
    out = io.StringIO()
    assert main_check(b.bundle, trust=b.trust, source=b.repo, out=out) == 0
    text = out.getvalue()
    last = text.strip().splitlines()[-1]
    assert last.startswith("passed: full bundle signed by tests (key ") and "no tier required" in last
    assert "None" not in text
    assert "n/a" in text and "a directory was checked, not an archive" in text and "no --require-tier given" in text
    md = io.StringIO()
    main_check(b.bundle, trust=b.trust, source=b.repo, require_tier="full", fmt="markdown", out=md)
    assert f"Signed by key `{b.keyid}` (tests)" in md.getvalue() and "required tier: full" in md.getvalue()


def test_incomplete_bundle_leads_with_the_resume_line(tmp_path):
    spec = make_project(tmp_path / "p")
    result = run(spec, out=tmp_path / "run", only=["coverage"])
    assert result.exit_code == 3
    out = io.StringIO()
    main_check(result.bundle_dir, trust=_any_trust(tmp_path), source=tmp_path / "p", out=out)
    first = out.getvalue().splitlines()[0]
    assert first.startswith("incomplete: suites not run: kernels; resume with `fastpath verify --resume ")
    assert "--only kernels" in first


def _any_trust(tmp_path):
    from fastpath.signing import generate_keypair
    from tests.bundle_factory import write_trust

    _, pub, _ = generate_keypair(tmp_path / "t.key", tmp_path / "t.pub")
    write_trust(tmp_path / "trust.toml", pub, ["smoke"])
    return tmp_path / "trust.toml"


def test_keygen_prints_a_paste_ready_block_and_refuses_a_second_with_a_fix(tmp_path):
    res = runner.invoke(app, ["keygen", "--out", str(tmp_path / "k.key")])
    assert res.exit_code == 0
    block = res.output[res.output.index("[[keys]]"):]
    policy = tmp_path / "trusted_keys.toml"
    policy.write_text(block)
    assert tomllib.loads(block)["keys"][0]["tiers"] == ["smoke", "full"]
    assert list(load_trust(policy)) == [tomllib.loads(block)["keys"][0]["keyid"]]  # the checker accepts it as is
    res = runner.invoke(app, ["keygen", "--out", str(tmp_path / "k.key")])
    assert res.exit_code == 2 and "already exists" in res.output and "fix:" in res.output


def test_sign_refusals_name_their_fix(tmp_path):
    runner.invoke(app, ["keygen", "--out", str(tmp_path / "k.key")])
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, ["sign", str(tmp_path / "empty"), "--key", str(tmp_path / "k.key")])
    assert res.exit_code == 2 and "no summary.json" in res.output and "fix:" in res.output
    spec = make_project(tmp_path / "p")
    result = run(spec, out=tmp_path / "run", only=["coverage"])
    res = runner.invoke(app, ["sign", str(result.bundle_dir), "--key", str(tmp_path / "k.key")])
    assert res.exit_code == 2 and "incomplete run" in res.output and "fix:" in res.output and "--resume" in res.output


def test_verify_usage_error_leaves_no_run_and_prints_nothing_before(tmp_path, monkeypatch):
    make_project(tmp_path / "p")
    monkeypatch.chdir(tmp_path / "p")
    res = runner.invoke(app, ["verify", "--tier", "auto", "--only", "nonsense", "--out", str(tmp_path / "run"),
                              "--suites-dir", str(SUITES)])
    assert res.exit_code == 2 and res.output.startswith("error: --only names unknown suite(s): nonsense")
    assert not (tmp_path / "run").exists()


def test_plan_prints_only_parameters_that_apply():
    assert _config_text({"batch": 1, "kernel": None, "fallback": "prefill", "out_of_scope_batch": 65,
                         "out_of_scope_context": 32769}) == "batch=1 fallback=prefill"
    assert _config_text({"fallback": "batch_out_of_scope", "out_of_scope_batch": 65,
                         "out_of_scope_context": 32769}) == "fallback=batch_out_of_scope out_of_scope_batch=65"
    res = runner.invoke(app, ["plan"], env={"COLUMNS": "250"})
    assert res.exit_code == 0 and "=None" not in res.output


def test_progress_lines_name_the_component_and_keep_waiver_reasons():
    rows = [make_row("coverage", "coverage/decode/b1", "fired", "steps_engaged", 2, threshold=2, comparator=">=",
                     component=c) for c in ("dense_gemv", "kda_decode")]
    lines = [progress_line(r) for r in rows]
    assert lines[0] != lines[1] and "[dense_gemv]" in lines[0] and "= 2 (needs >= 2)" in lines[0]
    waiver = progress_line(make_row("kernels", "k/x", "kernels_finite", "dtype_supported", status="waived",
                                    kernel="gemv_cute", message="nvidia-cutlass-dsl not importable"))
    assert waiver.startswith("  ~ k/x [gemv_cute]") and waiver.endswith("— nvidia-cutlass-dsl not importable")
    crash = progress_line(make_row("parity", "p/c16", "parity_kl", "kl", status="error",
                                   message="call raised: x\n  File a.py\n    ^^^^\nE   RuntimeError: boom\n"))
    assert "\n" not in crash and crash.endswith("— call raised: x … E   RuntimeError: boom")


def test_notes_from_inside_a_case_reach_the_terminal_only_during_verify():
    seen = []
    note("before")  # outside verify: nothing, no error
    with reporting_to(seen.append):
        note("bucket 2/7: context 4096")
    note("after")
    assert len(seen) == 1 and seen[0].endswith("s  bucket 2/7: context 4096")


def test_verify_shows_notes_in_a_non_tty_log(tmp_path):
    buf = io.StringIO()
    spec = make_project(tmp_path / "p")
    suite = tmp_path / "suites"
    suite.mkdir()
    for f in SUITES.iterdir():
        if f.is_file():
            (suite / f.name).write_bytes(f.read_bytes())
    text = (suite / "test_kernels.py").read_text()
    (suite / "test_kernels.py").write_text("from fastpath.progress import note as _note\n" + text.replace(
        "def test_", "def _first():\n    _note('inside the long case')\n\n\n_first()\n\n\ndef test_", 1))
    from fastpath.verify import VerifyOptions, verify

    verify(VerifyOptions(spec=spec, tier="smoke", suites_dir=suite, out=tmp_path / "run", argv=["t"]),
           Console(file=buf, force_terminal=False, width=200))
    assert "inside the long case" in buf.getvalue()
    assert "inside the long case" in (tmp_path / "run" / "state" / "logs" / "kernels.log").read_text()


def test_the_bar_advances_once_per_case_that_wrote_rows_not_for_a_released_case_or_a_helper(tmp_path):
    from fastpath.verify import ProgressHook

    class Quiet:
        def print(self, *a, **k):
            pass

    rows_path, advanced = tmp_path / "rows.jsonl", []
    hook = ProgressHook(rows_path, Quiet(), lambda: advanced.append(1))

    def finish(*new_rows):
        with open(rows_path, "a", encoding="utf-8") as fh:
            for r in new_rows:
                fh.write(json.dumps(r) + "\n")
        hook.pytest_runtest_logfinish("node", None)

    row = make_row("parity", "parity/b1", "top1", "agreement", 1.0, passed=True)
    finish(row, row)  # a case of two rows
    finish()  # a helper test, or a case released for its retry alone: no rows
    finish(row)  # the released case's retry
    assert len(advanced) == 2
