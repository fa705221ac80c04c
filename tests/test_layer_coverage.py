"""Coverage per layer and the second source on CPU: the K3-mini registry declares the layers
each component serves from the config, the fast step's events name them, and the Triton
interpreter's launches (fastpath.launches) agree -- for the benchmark hook ``decode_step`` and
for production decoding (``generate``) alike."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from fastpath import launches, trace

from suite_modules import load_suite, profiler_case_rows

REPO = Path(__file__).resolve().parent.parent


def _coverage_suite():
    return load_suite("coverage", "_suite_coverage_layers")


coverage = _coverage_suite()


def test_registry_declares_layers_from_the_config():
    from optimized_model.k3.config import get_config
    from optimized_model.k3.fast import registry

    for name in ("tiny", "mini"):
        cfg = get_config(name)
        served = {c.name: c.layers for c in registry.components(entries=[], cfg=cfg)}
        kinds = cfg.layer_kinds
        assert served["kda_decode"] == [i for i, k in enumerate(kinds) if k == "kda"]
        assert served["mla_decode"] == [i for i, k in enumerate(kinds) if k == "mla"]
        assert served["moe_experts"] == [i for i in range(cfg.n_layers) if cfg.ffn_kind(i) == "moe"]
        assert served["dense_gemv"] == list(range(cfg.n_layers))
        assert served["lm_head"] is None and served["sampler"] is None and served["decode_graph"] is None
    # without a config: no declaration (judged per step), the kernel patterns unchanged
    assert all(c.layers is None for c in registry.components(entries=[]))


def test_layer_gap_and_launch_shortfall_rules():
    recs = []
    for layers in ([0, 1, 2], [0, 2]):
        with trace.recording() as rec:
            for i in layers:
                with trace.layer(i):
                    trace.engaged("kda_decode", "v")
        recs.append(rec)
    assert coverage.layer_gaps(recs, "kda_decode", [0, 1, 2]) == {2: [1]}
    assert coverage.layer_gaps(recs, "kda_decode", [0, 2]) == {}
    assert coverage.launch_shortfall([3, 2], 3) == {2: 2}
    # the production comparison's prompt: capacity = prompt + tokens + 1, a multiple of 256, equal
    # to the benchmark hook's (context + 1 rounded up to 64)
    for batch, context in ((1, 1024), (64, 32768), (8, 8192), (2, 16)):
        p = coverage.production_prompt(batch, context)
        cap = p + coverage.PRODUCTION_TOKENS + 1
        assert cap % 256 == 0 and -(-(p + 1) // 64) * 64 == cap and batch * p <= max(
            256 * batch, coverage.PRODUCTION_PREFILL_TOKENS)
    # at draft d: the generation reserves one token a step (its drafts are never accepted) and a
    # window's overrun of d
    for batch, context, d in ((1, 1024, 3), (16, 8192, 3), (8, 1024, 7), (1, 16, 7)):
        p = coverage.production_prompt(batch, context, d)
        cap = p + coverage.production_tokens(d) + 1
        assert coverage.production_tokens(d) == coverage.PRODUCTION_TOKENS + d
        assert cap % 256 == 0 and -(-(p + d + 1) // 64) * 64 == cap


def test_interpreter_launches_are_recorded_by_kernel_name(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def fp_test_double_kernel(X, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(X + offs, tl.load(X + offs) * 2)

    x = torch.ones(8)
    assert launches.available() == (True, "")
    with launches.recording() as rec:
        fp_test_double_kernel[(1,)](x, N=8)
        fp_test_double_kernel[(1,)](x, N=8)
    fp_test_double_kernel[(1,)](x, N=8)  # no recorder open: nothing kept
    assert rec.names == ["fp_test_double_kernel"] * 2 and rec.count([r"^fp_test"]) == 2
    assert torch.equal(x, torch.full((8,), 8.0))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert launches.available()[0] is False
    with pytest.raises(RuntimeError, match="interpreter is off"):
        with launches.recording():
            pass


@pytest.fixture(scope="module")
def fast_tiny(one_torch_thread):
    from fastpath.engine import create_engine

    engine = create_engine("embedded", config="tiny", device="cpu", dtype="float16", threads=1)
    from optimized_model.k3.fast import dispatch

    return engine, engine.load("fast", additional_config=dispatch.switch_config())


def test_decode_step_events_name_every_declared_layer_and_launches_agree(fast_tiny):
    engine, model = fast_tiny
    step = model.decode_step(2, 16)
    with trace.recording() as rec, launches.recording() as seen:
        step()
    for comp in engine.components():
        if comp.layers:
            assert rec.engaged_layers(comp.name) == set(comp.layers), comp.name
            assert seen.count(comp.fast_kernel_patterns) >= len(comp.layers), comp.name
    kda = next(c for c in engine.components() if c.name == "kda_decode")
    assert seen.count([r"kda_decode_fused_kernel"]) == len(kda.layers) == 3  # tiny: KDA KDA KDA MLA


def test_decode_step_launches_what_production_decoding_launches(fast_tiny):
    """The CPU analogue of the profiler case's comparison (there: torch.profiler on generate)."""
    engine, model = fast_tiny

    def interpreted(run):
        with launches.recording() as rec:
            run()
        return rec.names

    batch, prompt = 2, coverage.production_prompt(2, 16)
    prod, uneven, rec = coverage.production_decode_kernels(model, model.tokenizer, batch, prompt, tokens=3,
                                                           profile=interpreted)
    hook = model.decode_step(batch, prompt)
    assert not uneven and prod == Counter(interpreted(hook))
    assert rec.engaged("sampler") and rec.engaged("kda_decode")


def test_profiler_case_logic_with_the_interpreter_standing_in_for_the_profiler(fast_tiny, monkeypatch):
    """The GPU-only profiler case, driven on CPU: the interpreter's launches stand in for
    torch.profiler's kernel names (a test of the case's bookkeeping, never a result row)."""
    engine, model = fast_tiny
    case = {"case_id": "coverage/profiler/b2-c16-d0", "config": {"batch": 2, "context": 16, "draft": 0, "tp": 1}}
    rows = profiler_case_rows(coverage, engine, model, monkeypatch, case, production_tokens=3)
    by_metric = Counter(r["metric"] for r in rows)
    n = len(engine.components())
    assert by_metric == {"production_fast_kernels": n, "fast_kernels_present": n, "decode_step_matches_production": 1}
    failing = [(r["metric"], r.get("component"), r["message"]) for r in rows if not r["passed"]]
    # on CPU the whole-step graph is refused (no_cuda): the only row that cannot pass here
    assert {c for _, c, _ in failing} <= {"decode_graph"}, failing
