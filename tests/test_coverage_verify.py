"""Coverage at draft > 0: a speculative verify step must run the fast path's VERIFY kernels (the
trace's verify variants and the Triton interpreter's launches of the verify kernels, at every
layer), not its decode kernels T times; a verify step beyond scope.max_verify_rows falls back
with verify_rows_out_of_scope on every component."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any fast kernel module is imported

import pytest  # noqa: E402

from fastpath import trace  # noqa: E402
from fastpath.engine import GenerationRequest  # noqa: E402
from fastpath.plan import build_plan  # noqa: E402
from fastpath.spec import load_spec  # noqa: E402

from suite_modules import load_suite, profiler_case_rows  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "optimized_model" / "k3" / "fastpath.toml"
coverage = load_suite("coverage", "_suite_coverage_verify")


def test_registry_declares_the_verify_kernels_apart_from_the_decode_kernels():
    from optimized_model.k3.fast import registry

    comps = {c.name: c for c in registry.components()}
    # the commit closes the verify step: its kernels are verify kernels of the KDA component
    assert comps["kda_decode"].verify_variants == ["triton_verify", "triton_verify_low_rank", "triton_commit"]
    verify_kda = ["kda_verify_kernel", "fp_keep_state_kernel", "fp_drop_rejected_kernel"]
    assert comps["kda_decode"].verify_kernel_patterns == verify_kda
    # the combine kernel is shared with the decode kernel: it proves nothing about a verify step
    assert comps["mla_decode"].verify_kernel_patterns == ["mla_verify_split_kernel"]
    assert all(not c.verify_variants for n, c in comps.items() if n not in ("kda_decode", "mla_decode"))
    assert coverage.fast_patterns(comps["kda_decode"], 0) == comps["kda_decode"].fast_kernel_patterns
    assert coverage.fast_patterns(comps["kda_decode"], 3) == verify_kda


def test_verify_gaps_name_decode_variants_and_missing_layers():
    recs = []
    for variants in (("triton_verify", "triton_verify"), ("triton_verify", "triton_fused")):
        with trace.recording() as rec:
            for layer, v in enumerate(variants):
                with trace.layer(layer):
                    trace.engaged("kda_decode", v)
        recs.append(rec)
    wrong, gaps = coverage.verify_gaps(recs, "kda_decode", ["triton_verify"], [0, 1])
    assert wrong == ["triton_fused"] and gaps == {2: [1]}
    assert coverage.verify_gaps(recs[:1], "kda_decode", ["triton_verify"], [0, 1]) == ([], {})


@pytest.fixture(scope="module")
def fast_tiny(one_torch_thread):
    from fastpath.engine import create_engine
    from optimized_model.k3.fast import dispatch

    engine = create_engine("embedded", config="tiny", device="cpu", dtype="float16", threads=1)
    return engine, engine.load("fast", additional_config=dispatch.switch_config())


def _run_decode_case(engine, model, batch=1, context=16, draft=3):
    rows = []

    def record(gate, metric, value, **kw):
        rows.append({"gate": gate, "metric": metric, "value": value, **kw})

    case = {"case_id": f"coverage/decode/b{batch}-c{context}-d{draft}",
            "config": {"batch": batch, "context": context, "draft": draft, "tp": 1}}
    coverage.test_decode_fast_path_fired(case, engine, {"fast": model}, load_spec(SPEC), record)
    return rows


def _row(rows, gate, comp):
    return next(r for r in rows if r["gate"] == gate and r.get("component") == comp)


def test_decode_case_at_draft_3_sees_the_verify_kernels(fast_tiny):
    engine, model = fast_tiny
    rows = _run_decode_case(engine, model)
    failing = [(r["gate"], r.get("component"), r.get("message")) for r in rows
               if r.get("passed") is False and r.get("status") != "waived"]
    assert not failing, failing
    # on CPU the whole-step graph is refused (no_cuda): waived, the only component that is
    assert {r.get("component") for r in rows if r.get("status") == "waived"} == {"decode_graph"}
    kda = _row(rows, "coverage_fast_path_fired", "kda_decode")
    assert kda["passed"] and kda["detail"]["variants"] == ["triton_commit", "triton_verify"] and kda["draft"] == 3
    assert kda["detail"]["verify_variants_expected"] == ["triton_verify", "triton_verify_low_rank", "triton_commit"]
    mla = _row(rows, "coverage_profiler_kernels", "mla_decode")
    assert mla["passed"] and mla["detail"]["patterns"] == ["mla_verify_split_kernel"]
    assert mla["value"] >= 1 and mla["detail"]["kernels"] == ["mla_verify_split_kernel"]


def test_planted_defect_decode_kernels_run_T_times_at_draft_3_is_caught(fast_tiny, monkeypatch):
    """The fast verify step silently replaced by its decode step run draft + 1 times: every
    component engages at every layer, so only the verify expectation can tell."""
    engine, model = fast_tiny
    from optimized_model.k3.fast import runtime

    honest = runtime.FastDecoder.decode_step

    def decode_T_times(self, batch, context, draft=0, seed=0):
        one = honest(self, batch, context, 0, seed)

        def run():
            for _ in range(draft + 1):
                one()
        return run

    monkeypatch.setattr(runtime.FastDecoder, "decode_step", decode_T_times)
    rows = _run_decode_case(engine, model)
    for comp in ("kda_decode", "mla_decode"):
        fired = _row(rows, "coverage_fast_path_fired", comp)
        assert fired["passed"] is False, comp
        assert "at draft 3 it ran variant(s)" in fired["message"] and "expected its verify" in fired["message"]
        launched = _row(rows, "coverage_profiler_kernels", comp)
        assert launched["passed"] is False and launched["value"] == 0, comp
    assert "triton_fused" in _row(rows, "coverage_fast_path_fired", "kda_decode")["message"]
    # the row-wise components run the same kernels in both: they pass, as they should
    assert _row(rows, "coverage_fast_path_fired", "moe_experts")["passed"]


def test_verify_rows_fallback_case_refuses_on_every_component(fast_tiny, tmp_path):
    engine, model = fast_tiny
    spec = load_spec(SPEC)
    plan = build_plan(spec, "smoke")
    case = next(c for c in plan.cases if c.case_id == "coverage/fallback/verify_rows")
    cfg = case.config
    assert cfg["reason"] == "verify_rows_out_of_scope" and cfg["draft"] == 3
    assert cfg["out_of_scope_batch"] * (cfg["draft"] + 1) > 64 >= (cfg["out_of_scope_batch"] - 1) * (cfg["draft"] + 1)
    rows = []

    def record(gate, metric, value, **kw):
        rows.append({"gate": gate, "metric": metric, "value": value, **kw})

    coverage.test_clean_fallback(case, engine, {"fast": model}, spec, record)
    assert len(rows) == len(engine.components())
    bad = [(r["component"], r["message"]) for r in rows if not r["passed"]]
    assert not bad, bad
    assert all(r["draft"] == 3 and r["batch"] == cfg["out_of_scope_batch"] for r in rows)


def test_dispatch_reads_the_verify_row_limit_from_the_spec(tmp_path, monkeypatch):
    from optimized_model.k3.fast import dispatch

    assert load_spec(SPEC).scope["max_verify_rows"] == dispatch.scope()["max_verify_rows"] == 64
    assert dispatch.scope()["draft_lengths"] == [0, 3, 7]
    # another declared limit is the one the dispatch enforces; none declared: the largest batch
    for line, rows in (("max_verify_rows = 48\n", 48), ("", 64)):
        path = tmp_path / f"limit{rows}" / "fastpath.toml"
        path.parent.mkdir()
        path.write_text(SPEC.read_text().replace("max_verify_rows = 64\n", line))
        monkeypatch.setattr(dispatch, "SPEC_PATH", path)
        dispatch.scope.cache_clear()
        try:
            assert dispatch.scope()["max_verify_rows"] == rows
        finally:
            monkeypatch.undo()
            dispatch.scope.cache_clear()
    assert dispatch.decide(17, 16, "verify", 3) == "verify_rows_out_of_scope"  # 68 rows
    assert dispatch.decide(16, 16, "verify", 3) is None  # 64 rows
    assert dispatch.decide(8, 16, "verify", 7) is None  # 64 rows
    assert dispatch.decide(16, 16, "verify", 7) == "verify_rows_out_of_scope"  # the 128 rows


def _profiler_rows_at_draft_3(engine, model, monkeypatch):
    case = {"case_id": "coverage/profiler/b1-c16-d3", "config": {"batch": 1, "context": 16, "draft": 3, "tp": 1}}
    return profiler_case_rows(coverage, engine, model, monkeypatch, case, production_tokens=2)


@pytest.fixture(scope="module")
def profiler_rows_d3(fast_tiny):
    mp = pytest.MonkeyPatch()
    try:
        return _profiler_rows_at_draft_3(*fast_tiny, mp)
    finally:
        mp.undo()


def test_profiler_case_at_draft_3_with_the_interpreter_standing_in_for_the_profiler(profiler_rows_d3):
    """The GPU-only profiler case at draft 3, driven on CPU: production is ``generate`` with the
    synthetic drafter at acceptance length 1 (each step a verify step of 4 tokens), the kernels
    expected are the verify kernels, and the benchmark hook launches what production does --
    but for the sampler (next test)."""
    rows = profiler_rows_d3
    failing = {(r["metric"], r.get("component")) for r in rows if not r["passed"]}
    assert failing <= {("production_fast_kernels", "decode_graph"), ("fast_kernels_present", "decode_graph"),
                       ("production_fast_kernels", "sampler"), ("decode_step_matches_production", None)}, failing
    for metric in ("production_fast_kernels", "fast_kernels_present"):
        for comp, kernels in (("kda_decode", ["fp_drop_rejected_kernel", "fp_keep_state_kernel", "kda_verify_kernel"]),
                              ("mla_decode", ["mla_verify_split_kernel"])):
            row = next(r for r in rows if r["metric"] == metric and r.get("component") == comp)
            assert row["passed"] and row["detail"]["fast_kernels"] == kernels and row["value"] >= 1, (metric, comp)
    match = next(r for r in rows if r["metric"] == "decode_step_matches_production")
    assert set(match["detail"]["differences"]) <= {"fp_sampler_kernel"}, match["detail"]


def test_production_at_a_draft_runs_no_drafter_model(fast_tiny, monkeypatch):
    """The production comparison's drafter runs no model: a lookahead's decode steps on the
    target (the standard path's kernels) would land in the profile beside the verify steps'
    (on the H200 every profiler case at a draft failed on them, perf notes run Y)."""
    engine, model = fast_tiny
    decodes = []
    real = type(model.model).decode
    monkeypatch.setattr(type(model.model), "decode", lambda self, *a, **k: decodes.append(1) or real(self, *a, **k))
    per_step, uneven, _ = coverage.production_decode_kernels(model, model.tokenizer, 1, 16, tokens=2,
                                                             profile=lambda run: (run(), [])[1], draft=3)
    assert decodes == [] and uneven == []
    # the same generation with a drafter that looks ahead decodes on the target: what the test sees
    model.generate([GenerationRequest(prompt_ids=[5] * 16, max_tokens=3, temperature=0.0, ignore_eos=True)],
                   speculative={"method": "synthetic", "num_speculative_tokens": 3, "acceptance_length": 2})
    assert decodes


def test_production_verify_steps_run_the_fast_sampler(profiler_rows_d3):
    """Greedy verify steps draw their targets with the fast path's fused sampler (generate.py)."""
    row = next(r for r in profiler_rows_d3 if r["metric"] == "production_fast_kernels" and r.get("component") == "sampler")
    assert row["passed"], row["message"]


def test_planted_defect_standard_path_at_draft_3_is_caught(fast_tiny, monkeypatch):
    """The fast path handing every verify step back to the standard path (a refusal where the
    spec declares the shape in scope) fails the decode case on every component."""
    engine, model = fast_tiny
    from optimized_model.k3.fast import dispatch

    honest = dispatch.decide
    monkeypatch.setattr(dispatch, "decide", lambda b, c, kind="decode", draft=0: (
        "verify_rows_out_of_scope" if kind == "verify" else honest(b, c, kind, draft)))
    rows = _run_decode_case(engine, model)
    fired = [r for r in rows if r["gate"] == "coverage_fast_path_fired" and r.get("status") != "waived"]
    assert fired and all(r["passed"] is False and "refused (verify_rows_out_of_scope)" in r["message"] for r in fired)
    launched = _row(rows, "coverage_profiler_kernels", "kda_decode")
    assert launched["passed"] is False and launched["value"] == 0
