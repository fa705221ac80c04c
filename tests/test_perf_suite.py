"""The perf suite (fastpath/suites/test_perf.py) end to end on the CPU: K3-mini's tiny config through the
embedded engine, one speedup case, the control and the summary; every row is `info` and says
why it does not gate (the perf gate requires the full tier on supported hardware)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from suite_modules import load_suite

REPO = Path(__file__).resolve().parent.parent
REAL_SPEC = REPO / "optimized_model" / "k3" / "fastpath.toml"


def perf_only_spec(tmp_path: Path) -> Path:
    """The real spec with the perf gates only and a smoke slice of batch 1 at context 16, draft
    0 and 3 (whatever draft lengths the real spec declares)."""
    text = REAL_SPEC.read_text()
    head, _, gates = text.partition("[gates]\n")
    head = re.sub(r"(?m)^draft_lengths = .*\n", "", head)
    head = re.sub(r"(?m)^max_verify_rows = .*\n", "", head)  # only with a draft in [scope]
    head = re.sub(r"(?m)^speculative_decoding = false$", "speculative_decoding = true", head)
    head = head.replace("batch_sizes = [1, 2, 4]\ncontext_lengths = [16, 64]",
                        "batch_sizes = [1, 2]\ncontext_lengths = [16]\ndraft_lengths = [0, 3]", 1)
    assert "context_lengths = [16]\ndraft_lengths = [0, 3]" in head and "speculative_decoding = true" in head
    perf_gates = gates[gates.index("[gates.perf_speedup]"):]
    path = tmp_path / "fastpath.toml"
    path.write_text(head + "[gates]\nversion = \"test\"\n\n" + perf_gates)
    return path


def run_perf_suite(tmp: Path, *extra: str) -> tuple[list[dict], Path]:
    """The perf suite on the smoke slice (perf_only_spec) in its own pytest process, as verify
    runs it: (its rows, its artifacts folder)."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec = perf_only_spec(tmp)
    rows, artifacts = tmp / "rows.jsonl", tmp / "artifacts"
    (tmp / "pytest.ini").write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", str(REPO / "fastpath" / "suites" / "test_perf.py"), "-c", str(tmp / "pytest.ini"),
           "--rootdir", str(REPO / "fastpath" / "suites"), "-p", "fastpath.pytest_plugin", "-p", "no:cacheprovider",
           "--import-mode=importlib", "-q", "--fastpath-spec", str(spec), "--fastpath-tier", "smoke",
           "--fastpath-rows", str(rows), "--fastpath-suite", "perf", "--fastpath-artifacts", str(artifacts), *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in rows.read_text().splitlines()], artifacts


@pytest.fixture(scope="module")
def perf_run(tmp_path_factory):
    return run_perf_suite(tmp_path_factory.mktemp("perf"))


def test_every_case_has_rows_and_none_gates_on_cpu(perf_run):
    rows, _ = perf_run
    cases = {r["case_id"] for r in rows}
    prompts = {f"perf/prompts/{p}-b{b}" for p in ("mrcr-c512", "mrcr-c2048", "aime25") for b in (1, 4)}
    assert cases == {"perf/speedup/b1-c16-d0", "perf/speedup/b2-c16-d0", "perf/speedup/b1-c16-d3",
                     "perf/speedup/b2-c16-d3", "perf/control/b1-c16-d0", "perf/summary/table"} | prompts
    waived = [r for r in rows if r["case_id"].startswith("perf/speedup/b2-")]
    assert [r["status"] for r in waived] == ["waived"] * 2 and "smallest batch only" in waived[0]["message"]
    # the smoke tier's 3 documents per task cannot make a batch of 4 distinct ones
    assert {r["case_id"] for r in rows if r["status"] == "waived" and "eval documents" in r["message"]} == \
        {c for c in prompts if c.endswith("-b4")}
    measured = [r for r in rows if r["status"] != "waived"]
    assert measured and all(r["status"] == "info" for r in measured)
    gate_rows = [r for r in measured if r["metric"] in ("speedup_ci_low", "control_speedup")]
    assert len(gate_rows) == 3 and all("full tier" in r["message"] for r in gate_rows)


def test_draft_case_times_the_real_verify_step_with_synthetic_tokens(perf_run):
    """b1-c16-d3 on the tiny model: the fast verify step fired (else the outcome says so), its
    tokens are 1 x the spec's AL / step time, labelled synthetic, and its bytes are the verify
    step's (more than the decode step's at the same batch and context)."""
    rows, artifacts = perf_run
    mine = {(r["metric"], r["path"]): r for r in rows if r["case_id"] == "perf/speedup/b1-c16-d3"}
    plain = {(r["metric"], r["path"]): r for r in rows if r["case_id"] == "perf/speedup/b1-c16-d0"}
    head = mine[("speedup_ci_low", "fast")]
    assert json.loads(head["detail"])["outcome"] not in ("fast path did not fire", "fast path did not verify")
    al = mine[("acceptance_length", None)]
    assert al["value"] == 3.5 and "synthetic" in al["message"]
    for path in ("standard", "fast"):
        tok = mine[("tokens_per_s", path)]
        assert tok["value"] == pytest.approx(3.5 * 1e3 / mine[("step_ms", path)]["value"]) and "synthetic" in tok["message"]
        assert mine[("ms_per_output_token", path)]["value"] == pytest.approx(mine[("step_ms", path)]["value"] / 3.5)
    assert mine[("bytes_per_step", None)]["value"] > plain[("bytes_per_step", None)]["value"]
    text = (artifacts / "perf" / "summary.md").read_text()
    assert "| 1 | 3 | 3.5 synthetic |" in text.split("### draft lengths, context 16")[1]


def test_speedup_case_reports_paths_roofline_and_abba_order(perf_run):
    rows, _ = perf_run
    mine = [r for r in rows if r["case_id"] == "perf/speedup/b1-c16-d0"]
    by = {(r["metric"], r["path"]): r for r in mine}
    for path in ("standard", "fast"):
        for metric in ("step_ms", "tokens_per_s", "setup_s", "mbu"):
            assert (metric, path) in by, (metric, path)
        assert by[("tokens_per_s", path)]["value"] == pytest.approx(1e3 / by[("step_ms", path)]["value"])
    head = by[("speedup_ci_low", "fast")]
    ev = json.loads(head["evidence"])
    assert ev["order"] == "ABBA" * 2  # smoke_rounds = 2, what the timer saw
    assert len(ev["baseline_s"]) == len(ev["fast_s"]) == 2 and ev["baseline"] == "standard"
    assert ev["traffic"]["total"] == by[("bytes_per_step", None)]["value"]
    assert json.loads(by[("experts_touched", None)]["detail"])["per_layer"]  # routed experts per MoE layer
    mbu = by[("mbu", "fast")]["value"]
    assert mbu == pytest.approx(ev["traffic"]["total"] / ev["bandwidth"] / (by[("step_ms", "fast")]["value"] / 1e3))


def test_prompt_cases_decode_the_eval_documents_on_both_paths(perf_run):
    """perf/prompts: the evals suite's documents prefilled (their real lengths, MRCR's within its
    bucket), greedy decode timed on both paths with the fast path's events seen, and a block of
    the summary table."""
    rows, artifacts = perf_run
    prompt_rows = {r["case_id"]: r for r in rows if r["metric"] == "prompt_speedup"}
    assert set(prompt_rows) == {"perf/prompts/mrcr-c512-b1", "perf/prompts/mrcr-c2048-b1", "perf/prompts/aime25-b1"}
    for case_id, r in prompt_rows.items():
        detail, evidence = json.loads(r["detail"]), json.loads(r["evidence"])
        assert r["status"] == "info" and detail["fired"], (case_id, r["message"])
        assert "reported, not gated" in r["message"]
        if detail["bucket"]:
            assert all(detail["bucket"] // 2 < n <= detail["bucket"] for n in detail["prompt_tokens"])
        assert len(evidence["baseline_s"]) == len(evidence["fast_s"]) == 2 and evidence["order"] == "ABBA" * 2
        assert detail["std_tok_s"] > 0 and detail["fast_tok_s"] > 0
        assert [len(g) for g in detail["generated"]["fast"]] == [1] and detail["token_agreement"] in (0.0, 1.0)
        assert detail["experts_per_layer"] and evidence["traffic"]["total"] > 0
    text = (artifacts / "perf" / "summary.md").read_text()
    assert "decode on the evals suite's prompts" in text and "| mrcr c2048 | 1 |" in text
    assert len(json.loads((artifacts / "perf" / "summary.json").read_text())["prompt_cases"]) == 3


def test_summary_table_is_a_row_and_an_artifact(perf_run):
    rows, artifacts = perf_run
    summary = next(r for r in rows if r["metric"] == "summary_cases")
    assert summary["value"] == 2
    text = (artifacts / "perf" / "summary.md").read_text()
    assert "### context 16" in text and "| 1 |" in text and "control (standard vs standard)" in text
    assert json.loads(summary["evidence"])["table"] == text
    data = json.loads((artifacts / "perf" / "summary.json").read_text())
    assert data["cases"][0]["batch"] == 1 and data["gated"] is False


def _perf_module():
    return load_suite("perf")


class _Engine:
    def __init__(self, device, arch):
        self._info = {"device": device, "arch": arch, "device_name": "x"}

    def info(self):
        return self._info

    def components(self):  # none declares verify variants: any event at K + 1 tokens counts
        return []


class _Tier:
    def __init__(self, name):
        self.name = name


def test_gating_needs_the_full_tier_on_in_scope_hardware():
    from fastpath.spec import load_spec

    perf = _perf_module()
    spec = load_spec(REAL_SPEC)
    assert perf.gating(spec, _Tier("full"), _Engine("cuda", "sm_90")) == (True, "")
    ok, why = perf.gating(spec, _Tier("full"), _Engine("cuda", "sm_80"))
    assert not ok and "requires supported hardware (sm_90)" in why
    ok, why = perf.gating(spec, _Tier("full"), _Engine("cpu", "cpu"))
    assert not ok and "supported hardware" in why
    ok, why = perf.gating(spec, _Tier("smoke"), _Engine("cuda", "sm_90"))
    assert not ok and "full tier only" in why
    # not gated: few rounds, no extra batch
    s = perf.run_settings(spec, gated=False)
    assert s["rounds"] == spec.perf["smoke_rounds"] and s["max_extra_batches"] == 0


def test_a_case_past_the_time_budget_stops_the_suite_for_a_resume_not_measuring():
    import time

    from fastpath.spec import load_spec

    perf = _perf_module()
    spec = load_spec(REAL_SPEC)
    perf._SESSION["t0"] = time.monotonic() - 10 * spec.perf["budget_s"]
    rows = []

    class Models:
        def __getitem__(self, path):
            raise AssertionError("a case past the budget must not load or time anything")

    case = {"case_id": "perf/speedup/b1-c1024-d0", "config": {"batch": 1, "context": 1024, "draft": 0}}
    with pytest.raises(pytest.exit.Exception) as stop:
        perf.test_speedup(case, Models(), _Engine("cuda", "sm_90"), spec, _Tier("full"),
                          lambda *a, **k: rows.append((a, k)))
    perf._SESSION.clear()
    assert not rows  # no row: the case is not finished, so a resume runs it
    assert "budget_s = 540 s" in str(stop.value) and "perf/speedup/b1-c1024-d0" in str(stop.value)
    assert "fastpath verify --resume" in str(stop.value)


def test_a_case_that_would_end_past_the_budget_is_not_started():
    """The longest case so far (here 30 s) is what the next may take: with 20 s of the budget left
    the suite stops before it; with 40 s left it starts it."""
    import time

    from fastpath.spec import load_spec

    perf = _perf_module()
    spec = load_spec(REAL_SPEC)
    budget = spec.perf["budget_s"]

    class Models:
        def __getitem__(self, path):
            raise AssertionError("the case started")

    case = {"case_id": "perf/speedup/b8-c8192-d0", "config": {"batch": 8, "context": 8192, "draft": 0}}
    for left, starts in ((20, False), (40, True)):
        now = time.monotonic()
        perf._SESSION.update(t0=now - (budget - left), case_t0=now - 30)  # the last case began 30 s ago
        try:
            with pytest.raises(AssertionError if starts else pytest.exit.Exception) as raised:
                perf.test_speedup(case, Models(), _Engine("cuda", "sm_90"), spec, _Tier("full"), lambda *a, **k: None)
        finally:
            perf._SESSION.clear()
        assert ("the case started" in str(raised.value)) == starts
        if not starts:
            assert "the longest case so far 30 s" in str(raised.value) and "b8-c8192-d0 ended" in str(raised.value)


def test_the_summary_of_a_resumed_suite_reads_the_kept_cases(perf_run, tmp_path):
    """The suite again with every case but the summary kept (as `verify --resume` passes them):
    only the summary runs, and its table holds the kept cases and the control."""
    rows, artifacts = perf_run
    kept = tmp_path / "kept.jsonl"
    kept.write_text("".join(json.dumps(r) + "\n" for r in rows if r["case_id"] != "perf/summary/table"))
    new_rows, new_artifacts = run_perf_suite(tmp_path / "again", "--fastpath-kept", str(kept))
    assert {r["case_id"] for r in new_rows} == {"perf/summary/table"}
    first = json.loads((artifacts / "perf" / "summary.json").read_text())
    second = json.loads((new_artifacts / "perf" / "summary.json").read_text())
    assert second["cases"] == first["cases"] and second["prompt_cases"] == first["prompt_cases"]
    assert second["control"] == first["control"] and first["cases"]
    kept_bw = json.loads(next(r for r in rows if r["metric"] == "speedup_ci_low")["evidence"])["bandwidth"]
    text = (new_artifacts / "perf" / "summary.md").read_text()
    assert f"kept from an earlier, cut-off attempt of the run; their MBU is against that attempt's copy " \
        f"bandwidth: {kept_bw / 1e9:,.1f} GB/s" in text
    assert "kept from an earlier" not in (artifacts / "perf" / "summary.md").read_text()


class _FakeModel:
    """A step that sleeps ``seconds``; "fast" reports a fast-path event; ``broken`` raises."""

    device = "cpu"

    def __init__(self, seconds, fast=False, broken=False):
        self.seconds, self.fast, self.broken = seconds, fast, broken

    def decode_step(self, batch, context, draft=0):
        import time

        from fastpath import trace

        if self.broken:
            raise RuntimeError("inductor exploded")

        def step():
            if self.fast:
                trace.engaged("decode", "fake", batch=batch, tokens=draft + 1)
            time.sleep(self.seconds)

        return step

    def step_traffic(self, batch, context, draft=0):
        return {"total": 1000, "weights": 1000, "experts": 0, "embedding": 0, "state": 0, "cache": 0, "io": 0,
                "experts_touched": [], "n_experts": 0}


def test_a_broken_compiled_baseline_fails_the_gate_and_is_measured_against_eager(tmp_path):
    from fastpath.spec import load_spec

    perf = _perf_module()
    spec = load_spec(perf_only_spec(tmp_path))
    perf._SESSION.clear()
    perf._SESSION["bandwidth"] = 1e9
    models = {"standard": _FakeModel(0.002, broken=True), "standard_eager": _FakeModel(0.002),
              "fast": _FakeModel(0.001, fast=True)}
    engine = _Engine("cpu", "cpu")
    engine._info["standard_compile"] = "default"
    rows = []
    case = {"case_id": "perf/speedup/b1-c16-d0", "config": {"batch": 1, "context": 16, "draft": 0}}
    perf.test_speedup(case, models, engine, spec, _Tier("smoke"), lambda *a, **k: rows.append((a, k)))
    head = next(k for a, k in rows if a[1] == "speedup_ci_low")
    assert head["status"] == "error" and "inductor exploded" in head["message"]
    assert "against standard_eager instead" in head["message"]
    paths = {k.get("path") for a, k in rows if a[1] == "step_ms"}
    assert paths == {"standard_eager", "fast"}
    assert perf.RESULTS[-1]["outcome"].startswith("error")


def test_verify_prints_a_verdict_with_info_only_gates():
    """Smoke-tier perf gates hold only info rows: the verdict table must print them (it crashed
    with KeyError 'info' at the end of a smoke verify)."""
    import io

    from rich.console import Console

    from fastpath.gates import GATE_STATUS_TABLE, GateResult
    from fastpath.verify import _print_verdict

    class V:
        tier = "smoke"
        verdict = "pass"
        failing_rows: list = []
        gates = {s: GateResult(f"g_{s}", "perf", s, 1, 0, 0, "") for s in GATE_STATUS_TABLE}

    out = io.StringIO()
    _print_verdict(V(), Console(file=out, width=200))
    assert "g_info" in out.getvalue() and "info" in out.getvalue()


def test_the_faster_standard_step_is_the_gated_baseline():
    perf = load_suite("perf")
    seconds = {"compiled": 2.0e-3, "eager": 1.5e-3}

    def timer(step, replays):  # a step "is" its name here; the timer returns its seconds per step
        return seconds[step]

    assert perf.faster_baseline("compiled", "eager", 2, 20, timer) == ("standard_eager", "eager", "standard",
                                                                        [2.0e-3, 2.0e-3])
    seconds["eager"] = 2.5e-3
    assert perf.faster_baseline("compiled", "eager", 2, 20, timer)[:3] == ("standard", "compiled", "standard_eager")


def test_a_draft_case_times_verify_steps_and_counts_synthetic_tokens(tmp_path):
    """At draft 7 both paths' steps are built with draft 7 (one verify step of 8 tokens per
    sequence) and tokens/s = batch x the spec's synthetic AL (6) / step time, labelled so."""
    from fastpath.spec import load_spec

    perf = _perf_module()
    spec = load_spec(perf_only_spec(tmp_path))
    assert spec.perf["synthetic_acceptance_length"][7] == 6.0
    perf._SESSION.clear()
    perf._SESSION["bandwidth"] = 1e9
    built = []

    class Drafted(_FakeModel):
        def decode_step(self, batch, context, draft=0):
            built.append((self.fast, draft))
            return super().decode_step(batch, context, draft)

    models = {"standard": Drafted(0.004), "fast": Drafted(0.002, fast=True)}
    rows = []
    case = {"case_id": "perf/speedup/b2-c16-d7", "config": {"batch": 2, "context": 16, "draft": 7}}
    perf.test_speedup(case, models, _Engine("cpu", "cpu"), spec, _Tier("smoke"), lambda *a, **k: rows.append((a, k)))
    assert built and all(draft == 7 for _, draft in built) and {fast for fast, _ in built} == {True, False}
    by = {(a[1], k.get("path")): (a[2], k) for a, k in rows}
    step_fast = by[("step_ms", "fast")][0] / 1e3
    value, kw = by[("tokens_per_s", "fast")]
    assert value == pytest.approx(2 * 6.0 / step_fast) and "synthetic" in kw["message"]
    assert kw["detail"]["acceptance_length"] == 6.0 and kw["detail"]["synthetic"] is True
    assert by[("ms_per_output_token", "fast")][0] == pytest.approx(1e3 * step_fast / 6.0)
    al, kw = by[("acceptance_length", None)]
    assert al == 6.0 and "synthetic" in kw["message"]
    head = by[("speedup_ci_low", "fast")][1]
    assert head["detail"]["acceptance_length"] == 6.0
    r = perf.RESULTS[-1]
    assert r["draft"] == 7 and r["synthetic"] and r["fast_tok_s"] == pytest.approx(2 * 6.0 / step_fast)
    # the speedup stays the ratio of step times: both paths emit the same tokens
    assert r["speedup"] == pytest.approx(r["fast_tok_s"] / r["std_tok_s"], rel=0.05)


def test_a_draft_case_whose_fast_step_verifies_nothing_does_not_pass(tmp_path):
    """A fast step built for draft 3 that reports only one-token events (it decoded instead of
    verifying) must not count as a verify step."""
    from fastpath import trace
    from fastpath.spec import load_spec

    perf = _perf_module()
    spec = load_spec(perf_only_spec(tmp_path))
    perf._SESSION.clear()
    perf._SESSION["bandwidth"] = 1e9

    class Decodes(_FakeModel):
        def decode_step(self, batch, context, draft=0):
            return lambda: trace.engaged("decode", "fake", batch=batch, tokens=1)

    models = {"standard": _FakeModel(0.002), "fast": Decodes(0.0)}
    rows = []
    case = {"case_id": "perf/speedup/b1-c16-d3", "config": {"batch": 1, "context": 16, "draft": 3}}
    perf.test_speedup(case, models, _Engine("cpu", "cpu"), spec, _Tier("smoke"), lambda *a, **k: rows.append((a, k)))
    head = next(k for a, k in rows if a[1] == "speedup_ci_low")
    assert head["passed"] is False and "tokens = 4" in head["message"]
    assert head["detail"]["outcome"] == "fast path did not verify"
