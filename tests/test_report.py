"""The reviewer's report (fastpath.report): sections from real and synthetic rows, determinism,
no network, hostile bundles, and its place in the bundle verify writes."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from markupsafe import escape
from typer.testing import CliRunner

from fastpath.cli import app
from fastpath.report import CSP, SCRIPT, render
from fastpath.report.rerender import DIFFERENT, SAME, rerender
from fastpath.results import make_row, rows_frame

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "bundles" / "k3-mini-latency-specialized.smoke.fastpath.tar.gz"


def make_bundle(root: Path, rows: list[dict], *, suites: dict[str, str], name: str = "toy.smoke.fastpath",
                summary: dict | None = None) -> Path:
    """A bundle directory with just the files the report reads (no signature: the report never
    needs one)."""
    d = root / name
    (d / "results").mkdir(parents=True)
    rows_frame(rows).to_parquet(d / "results" / "rows.parquet", index=False)
    base = {"verdict": "pass", "complete": True, "tier": "full", "spec": "toy", "suites": suites,
            "gates": {"perf_speedup": {"status": "pass", "suite": "perf", "rows": len(rows), "failed": 0, "waived": 0,
                                       "reason": ""}}, "failing_rows": [], "counts": {"rows": len(rows)}}
    (d / "summary.json").write_text(json.dumps(summary if summary is not None else base))
    (d / "plan.json").write_text(json.dumps({"cases": [], "waivers": []}))
    (d / "environment.json").write_text(json.dumps({"hardware": "sm_90", "git": {"commit": "abc123", "dirty": False},
                                                    "spec_path": "subject/fastpath.toml", "argv": ["fastpath", "verify"]}))
    (d / "spec.toml").write_text('[fastpath]\nname = "toy"\n[scope]\nbatch_sizes = [1, 2, 4]\n')
    return d


def perf_rows() -> list[dict]:
    """Perf rows in both shapes the report reads: a speedup row with its CI and per-path figures in
    detail, and per-path rows; one failing case, one control case."""
    rows = []
    for b in (1, 4, 16):
        for c in (1024, 8192):
            speed = 1.2 + 0.1 * b / 16 - (0.3 if (b, c) == (16, 8192) else 0.0)
            ok = (b, c) != (16, 8192)
            fast_ms, std_ms = 1.0 + 0.02 * b, (1.0 + 0.02 * b) * speed
            rows.append(make_row("perf", f"perf/decode/b{b}-c{c}", "perf_speedup", "speedup", speed, threshold=1.0,
                                 comparator=">", status="pass" if ok else "fail", passed=ok, batch=b, context=c, draft=0,
                                 detail={"ci_low": speed - 0.05 if ok else 0.93, "ci_high": speed + 0.05,
                                         "tokens_per_s": {"fast": b * 1000 / fast_ms, "standard": b * 1000 / std_ms},
                                         "hbm_gbps": 4000.0}))
            for path, ms in (("fast", fast_ms), ("standard", std_ms)):
                cfg = dict(batch=b, context=c, draft=0, path=path)
                rows.append(make_row("perf", f"perf/decode/b{b}-c{c}", "", "step_ms", ms, status="info", **cfg))
                rows.append(make_row("perf", f"perf/decode/b{b}-c{c}", "", "bytes_per_step", 3.2e9, status="info", **cfg))
                rows.append(make_row("perf", f"perf/decode/b{b}-c{c}", "", "mbu", 3.2e9 / (ms * 1e6) / 4000,
                                     status="info", **cfg))
    rows.append(make_row("perf", "perf/control/b1-c1024", "", "speedup", 1.003, status="info", batch=1, context=1024,
                         draft=0, detail={"control": True, "ci": [0.99, 1.01]}))
    return rows


@pytest.fixture(scope="module")
def smoke_page(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "report.html"
    done = rerender(SMOKE, out)  # the committed bundle, read-only, opened as check opens it
    return done, out.read_text(encoding="utf-8")


def test_committed_smoke_bundle_renders_every_suite_it_holds(smoke_page):
    done, page = smoke_page
    assert done.bundled == SAME  # the page inside the bundle is what its own files render
    assert 'id="verdict">PASS<' in page
    assert 'id="coverage-matrix"' in page and "triton_splitkv" in page  # the variant per case and component
    assert "refused:prefill" in page  # the fallbacks refused, with their reason
    assert "error / tolerance" in page and "gemv_norm_swiglu" in page and "M1-N48-K64" in page
    assert "parity_kl" in page and "kl_standard_fast" in page
    assert "features_structured_output" in page
    assert "evals_output_agreement" in page and "perf_speedup" in page
    for suite in ("coverage", "kernels", "parity", "features", "evals", "perf"):  # every suite ran in it
        assert f"{suite} did not run" not in page
    import tarfile

    with tarfile.open(SMOKE) as tar:  # the commit the bundle was made at, as its environment records it
        env = json.load(tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("/environment.json"))))
    commit = env["git"]["commit"]
    assert re.fullmatch(r"[0-9a-f]{40}", commit) and not env["git"]["dirty"]
    assert f"git checkout {commit}" in page


def test_rendering_is_deterministic_across_processes(smoke_page, tmp_path):
    _, page = smoke_page
    out = tmp_path / "again.html"
    subprocess.run([sys.executable, "-m", "fastpath.cli", "report", str(SMOKE), "--out", str(out)], check=True,
                   capture_output=True, cwd=tmp_path, env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin",
                                                          "PYTHONPATH": str(ROOT)})
    assert out.read_text(encoding="utf-8") == page


def test_page_cannot_reach_the_network(smoke_page):
    _, page = smoke_page
    head = page[:page.index("<style>")]
    assert f"<meta http-equiv=\"Content-Security-Policy\" content=\"{escape(CSP)}\">" in head
    assert "default-src 'none'" in CSP and "connect-src" not in CSP and "http" not in CSP
    # the one inline script is allowed by its hash, and it is the page's only script
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in CSP
    assert page.count("<script") == 1 and f"<script>{SCRIPT}</script>" in page
    # nothing to fetch: no src/href other than in-page anchors, no url(), no @import, no embedded image
    assert not re.search(r"\ssrc\s*=", page)
    assert set(re.findall(r'\shref="([^"]*)"', page)) <= {f"#{i}" for i in
                                                         ("gates", "scope", "kernels", "parity", "evals", "features",
                                                          "perf", "environment", "reproduce", "rows")}
    assert all(ref.startswith("#") for ref in re.findall(r"url\(([^)]*)\)", page))  # in-page clip paths only
    assert "@import" not in page and "<image" not in page
    # URLs left are XML namespace names of the inline SVGs, which are never fetched
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls


def test_perf_section_draws_heatmap_roofline_and_table(tmp_path):
    d = make_bundle(tmp_path, perf_rows(), suites={"perf": "done"})
    page = render(d)
    heat = page[page.index('id="perf-heatmap-1"'):page.index("</figure>", page.index('id="perf-heatmap-1"'))]
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", heat)
    assert sorted(t for t in labels if t.endswith("×")) == ["1.00×", "1.21×", "1.21×", "1.22×", "1.22×", "1.30×"]
    assert "speedup, draft=0" in labels and "<pattern" in heat  # the failing cell is hatched
    assert "context length" in heat and "batch" in heat
    roof = page[page.index('id="perf-roofline"'):]
    assert "bound at 4,000 GB/s" in roof and "bytes each step must move" in roof
    table = page[page.index('id="perf-table"'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr>") == 1 + 7  # header + 6 cases + the control
    assert "(control: standard vs standard)" in table and "[0.99, 1.01]" in table
    assert "[0.93, 1.05]" in table and 's-fail">fail' in table
    assert "%" in table  # MBU of the fast path
    assert "perf did not run" not in page and "evals did not run in this bundle." in page


def test_perf_rows_without_figures_still_render(tmp_path):
    rows = [make_row("perf", "perf/x", "perf_speedup", "speedup", status="waived", message="needs a GPU")]
    page = render(make_bundle(tmp_path, rows, suites={"perf": "done"}))
    assert "perf-heatmap" not in page and "needs a GPU" in page


HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)> $\\frac{1}{0}$ javascript:alert(3) ]]></svg>'


def test_hostile_bundle_is_escaped_and_capped(tmp_path):
    rows = [make_row("coverage", HOSTILE, HOSTILE, HOSTILE, 1.0, threshold=1.0, comparator=">=", component=HOSTILE,
                     kernel=HOSTILE, message="x" * 100_000, evidence={"coverage_matrix": {HOSTILE: "refused:" + HOSTILE}}),
            make_row("kernels", "k", "kernels_noise_floor", "max_abs_err", 2.0, threshold=1.0, comparator="<=",
                     kernel=HOSTILE, detail={"shape_label": HOSTILE}),
            make_row("perf", "p", "perf_speedup", "speedup", 1.5, threshold=1.0, comparator=">", batch=1, context=8,
                     detail={"tokens_per_s": {HOSTILE: 5.0}, "ci": "not a list"}),
            make_row(HOSTILE, "c", "g", "m", status="info")]
    rows[0]["detail"] = "{not json"
    summary = {"verdict": HOSTILE, "tier": HOSTILE, "suites": {"coverage": "done", "kernels": "done", "perf": "done",
                                                               HOSTILE: "done"},
               "gates": {HOSTILE: {"status": "fail", "reason": HOSTILE}, "g2": "not a dict"},
               "failing_rows": [{"case_id": HOSTILE, "evidence": {"deep": [HOSTILE] * 5000}}, "not a dict"]}
    d = make_bundle(tmp_path, rows, suites={}, summary=summary)
    (d / "spec.toml").write_text("not = [valid toml")
    (d / "environment.json").write_text("[1, 2]")
    page = render(d)
    assert page.count("<script") == 1 and "<img" not in page and "</svg>\"" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count("<svg") == page.count("</svg>")  # a label cannot close a chart early
    assert "x" * 2001 not in page and "more characters" in page
    assert "environment.json is not a JSON object" in page and "spec.toml is not valid TOML" in page
    assert 'class="verdict v-other"' in page  # an unknown verdict is never shown as a pass


def test_unreadable_rows_are_reported_not_fatal(tmp_path):
    d = make_bundle(tmp_path, [], suites={"coverage": "done"})
    (d / "results" / "rows.parquet").write_bytes(b"PAR1 this is not parquet")
    (d / "summary.json").unlink()
    page = render(d)
    assert "results/rows.parquet is not readable" in page and "summary.json is missing" in page
    assert 'id="verdict">UNKNOWN<' in page


def test_verify_bundles_a_signed_report_that_check_re_renders_identically(tmp_path):
    from tests.test_verify import make_project, run

    from fastpath.check import check_bundle
    from fastpath.signing import generate_keypair
    from tests.bundle_factory import write_trust

    spec = make_project(tmp_path / "p")
    key, pub, _ = generate_keypair(tmp_path / "k.key", tmp_path / "k.pub")
    result = run(spec, out=tmp_path / "run", key=key)
    assert result.exit_code == 0 and result.signed, result.message
    assert "report.html" in result.message
    manifest = json.loads((result.bundle_dir / "manifest.json").read_text())
    assert "report.html" in {f["path"] for f in manifest["files"]}  # covered by the signature
    assert rerender(result.archive, tmp_path / "again.html").bundled == SAME
    trust = tmp_path / "trust.toml"
    write_trust(trust, pub, ["smoke"])
    report = check_bundle(result.archive, trust_path=trust, source_root=tmp_path / "p", render_report=True)
    assert report.passed, report.failures
    assert 'id="checked"' in report.report_html and "fastpath check: passed" in report.report_html
    # an edited report is an edited bundle: the manifest no longer matches
    page = result.bundle_dir / "report.html"
    page.write_text(page.read_text().replace("PASS", "FAIL"))
    assert rerender(result.bundle_dir, tmp_path / "third.html").bundled == DIFFERENT
    edited = check_bundle(result.bundle_dir, trust_path=trust, source_root=tmp_path / "p")
    assert "manifest" in edited.failed_rules()


def test_cli_report_and_its_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    res = runner.invoke(app, ["report", str(SMOKE)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "k3-mini-latency-specialized.smoke.fastpath.report.html").is_file()
    res = runner.invoke(app, ["report", str(tmp_path / "nope.tar.gz")])
    assert res.exit_code == 2 and res.output.count("\n") == 2 and "no such bundle" in res.output
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not a gzip")
    res = runner.invoke(app, ["report", str(junk)])
    assert res.exit_code == 2 and "cannot be opened safely" in res.output and "Traceback" not in res.output


def test_markdown_summary_escapes_and_caps_hostile_values():
    from fastpath.check import CheckReport, RuleResult

    evil = "<img src=x onerror=alert(1)> | [click](https://evil.example) `code` **bold** www.evil.example a@b.c\n# h"
    report = CheckReport(evil, [RuleResult("safe_extraction", "d", "pass", []),
                                RuleResult("manifest", "d", "fail", [evil * 50] * 5000)],
                         tier="full", signers=[{"keyid": "ab" * 32, "owner": evil}],
                         bundle_view={"verdict": {"verdict": evil, "gates": [{"name": evil, "status": evil,
                                                                              "reason": evil}] * 64},
                                      "perf": [{k: evil for k in ("context", "batch", "draft", "acceptance", "standard",
                                                                  "fast", "speedup", "ci", "mbu", "status")}] * 64})
    md = report.render_markdown()
    assert len(md.encode()) < 256 << 10  # far inside the step summary's 1 MiB
    # what markdown reads as markup: escaped characters are literal, code spans show their text
    prose = re.sub(r"`[^`\n]*`", "", re.sub(r"\\.", "", md))
    assert prose.count("`") == 0  # bundle text cannot close a code span early
    assert "<img" not in prose and "](https" not in prose and "https://" not in prose and "www.evil" not in prose
    assert "**bold**" not in prose and "\n# h" not in md
    for line in md.splitlines():
        if line.startswith("| `manifest`"):
            assert len(re.findall(r"(?<!\\)\|", line)) == 4  # bundle text adds no table cell
    assert "… 4980 more" in md


def test_checked_report_header_escapes_reasons(tmp_path):
    d = make_bundle(tmp_path, [], suites={})
    page = render(d, checked={"passed": False, "line": HOSTILE, "failures": [{"rule": HOSTILE, "reason": HOSTILE}]})
    assert page.count("<script") == 1 and "<img" not in page and 'id="checked"' in page


def test_a_bundle_cannot_ask_for_a_vast_chart(tmp_path):
    rows = [make_row("perf", f"perf/b{b}", "perf_speedup", "speedup", 1.1, threshold=1.0, comparator=">", batch=b,
                     context=b * 3, detail={"bytes_per_step_fast": -1.0, "step_ms_fast": 0.0}) for b in range(1, 400)]
    rows += [make_row("kernels", "k", "kernels_noise_floor", "max_abs_err", 0.1, threshold=1.0, comparator="<=",
                      kernel=f"kernel{i}") for i in range(300)]
    page = render(make_bundle(tmp_path, rows, suites={"perf": "done", "kernels": "done"}))
    heat = page[page.index('id="perf-heatmap-1"'):page.index("</figure>", page.index('id="perf-heatmap-1"'))]
    assert len(re.findall(r"<text[^>]*>[^<]*×</text>", heat)) <= 32 * 32
    assert "perf-roofline" not in page  # no positive bytes/time: nothing to draw on log axes
    assert "kernel59<" in page and "kernel60<" not in page.split('id="kernels"')[1].split("<details>")[0]


def test_perf_draft_cases_get_their_own_heatmap_and_synthetic_acceptance(tmp_path):
    """The same batch x context at draft 0 and 7: one heatmap per draft length (not one cell
    overwriting the other), and the table says the draft case's tokens are synthetic."""
    rows = []
    for draft, speed, al in ((0, 1.3, None), (7, 1.1, 6.0)):
        cid = f"perf/speedup/b1-c1024-d{draft}"
        cfg = dict(batch=1, context=1024, draft=draft)
        rows.append(make_row("perf", cid, "perf_speedup", "speedup", speed, threshold=1.0, comparator=">",
                             status="pass", passed=True, detail={"ci_low": speed - 0.05, "ci_high": speed + 0.05},
                             **cfg))
        rows.append(make_row("perf", cid, "", "tokens_per_s", 1000.0 * (al or 1), status="info", path="fast", **cfg))
        if al:
            rows.append(make_row("perf", cid, "", "acceptance_length", al, status="info", **cfg))
    page = render(make_bundle(tmp_path, rows, suites={"perf": "done"}))
    titles = []
    for k in (1, 2):
        heat = page[page.index(f'id="perf-heatmap-{k}"'):page.index("</figure>", page.index(f'id="perf-heatmap-{k}"'))]
        labels = re.findall(r"<text[^>]*>([^<]*)</text>", heat)
        titles += [t for t in labels if t.startswith("speedup, draft=")]
        assert [t for t in labels if t.endswith("×")] == (["1.30×"] if k == 1 else ["1.10×"])
    assert titles == ["speedup, draft=0", "speedup, draft=7"]
    table = page[page.index('id="perf-table"'):]
    table = table[:table.index("</table>")]
    assert "acceptance length" in table and "6 synthetic" in table and "6,000" in table
