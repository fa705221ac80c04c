"""The features suite's speculative cases (gate features_speculative) on the tiny config, CPU:
the plan's cases, greedy equality on the real code, and planted defects the checks must catch."""

from __future__ import annotations

import types

import pytest
import torch

from fastpath import speculative_checks as SC
from fastpath.engine import GenerationRequest
from fastpath.plan import build_plan
from fastpath.spec import load_spec
from optimized_model.k3 import generate as k3_generate
from optimized_model.k3.drafters import NgramDrafter
from optimized_model.k3.engine import EmbeddedEngine
from optimized_model.k3.fast import dispatch
from optimized_model.k3.speculative import accept as honest_accept

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SPEC = "optimized_model/k3/fastpath.toml"
K = 3


@pytest.fixture(scope="module")
def std():
    return EmbeddedEngine(config="tiny", device="cpu", dtype="float32").load("standard")


@pytest.fixture(scope="module")
def fast():
    return EmbeddedEngine(config="tiny", device="cpu", dtype="float32").load(
        "fast", additional_config=dispatch.switch_config())


def _greedy_requests(std, n=2, max_tokens=6):
    return [GenerationRequest(prompt_ids=p, max_tokens=max_tokens, ignore_eos=True) for p in SC.prompts(std, "smoke", n)]


# -- the plan ---------------------------------------------------------------------------------------
def _spec_with(tmp_path, speculative: bool, smoke_drafts: str = "[0, 3]"):
    text = open(SPEC).read()
    text = text.replace("speculative_decoding = true", f"speculative_decoding = {str(speculative).lower()}")
    old = "context_lengths = [16, 64]\ndraft_lengths = [0, 3]\n"
    assert old in text
    text = text.replace(old, f"context_lengths = [16, 64]\ndraft_lengths = {smoke_drafts}\n")
    p = tmp_path / "fastpath.toml"
    p.write_text(text)
    # the spec's relative globs resolve against its directory: keep it next to the original
    target = type(tmp_path)(SPEC).parent / f".test_{tmp_path.name}.toml"
    target.write_text(text)
    try:
        return load_spec(target)
    finally:
        target.unlink()


def test_plan_makes_speculative_cases_per_draft_length(tmp_path):
    spec = _spec_with(tmp_path, True)
    full, _ = build_plan(spec, "full").for_suite("features")
    ids = [c.case_id for c in full if c.kind == "speculative"]
    assert ids == ["features/speculative/greedy-d3", "features/speculative/synthetic-d3",
                   "features/speculative/greedy-d7", "features/speculative/synthetic-d7",
                   "features/speculative/sampled-d7"]
    assert {c.case_id for c in full if c.kind == "structured" and c.config["draft"]} == {
        f"features/structured/{k}-{m}-d7" for k in ("json_schema", "regex") for m in ("greedy", "sampled")}
    smoke, waived = build_plan(spec, "smoke").for_suite("features")
    assert [c.case_id for c in smoke if c.kind in ("speculative", "structured") and c.config.get("draft")] == [
        "features/structured/regex-greedy-d3", "features/speculative/greedy-d3",
        "features/speculative/synthetic-d3", "features/speculative/sampled-d3"]
    assert len([w for w in waived if w.case.kind == "structured"]) == 3
    assert all("smoke tier runs one structured case" in w.reason for w in waived)


def test_plan_waives_the_gate_visibly_without_speculation(tmp_path):
    spec = _spec_with(tmp_path, False)
    cases, waived = build_plan(spec, "smoke").for_suite("features")
    assert not [c for c in cases if c.kind == "speculative" or c.config.get("draft")]
    assert [(w.case.case_id, w.reason) for w in waived] == [
        ("features/speculative/none", "features.speculative_decoding is false or the tier declares no draft length > 0")]


# -- greedy equality --------------------------------------------------------------------------------
def test_greedy_equality_passes_on_both_paths(std, fast):
    reqs = _greedy_requests(std, n=1, max_tokens=6)
    for model, on_fast in ((std, False), (fast, True)):
        res = SC.greedy_compare(model, reqs, K)
        assert SC.greedy_failure(res, K, fast_path=on_fast) == "", res
        assert res["stats"]["drafted"] > 0
    assert res["verify_launches"] > 0  # the fast path: kda_verify at K + 1 tokens per sequence


def _accepts_every_greedy_draft(logits, drafts, params, gen, bitmask=None, **kw):
    """Planted defect: greedy rows accept every draft, argmax or not."""
    if params.greedy:
        toks, lps, _ = honest_accept(logits, [], params, gen, bitmask, **{k: v for k, v in kw.items() if k == "n_valid"})
        return list(drafts) + toks, [0.0] * len(drafts) + lps, len(drafts)
    return honest_accept(logits, drafts, params, gen, bitmask, **kw)


def test_greedy_check_fails_an_acceptance_that_takes_non_argmax_drafts(std, monkeypatch):
    reqs = _greedy_requests(std)
    monkeypatch.setattr(k3_generate, "accept", _accepts_every_greedy_draft)
    res = SC.greedy_compare(std, reqs, K)
    assert "rows differ from greedy decoding" in SC.greedy_failure(res, K, fast_path=False), res


def _plant_leaky_commit(monkeypatch):
    """Planted defect: commit keeps the KDA state one token past the accepted ones (a rejected
    draft's state survives) while lengths and latents are right."""
    from optimized_model.k3.model import K3Model

    honest_commit = K3Model.commit

    def leaky_commit(self, state, trail, keep):
        honest_commit(self, state, trail, keep)
        rows = torch.arange(state.batch)
        past = torch.clamp(keep.to(torch.int64), max=trail.T - 1)  # index keep = the next token's state
        for s in range(self.cfg.n_kda):
            state.kda[s].copy_(trail.kda[s][rows, past])

    monkeypatch.setattr(K3Model, "commit", leaky_commit)


def test_greedy_check_fails_a_rollback_that_keeps_a_rejected_tokens_state(std, monkeypatch):
    reqs = _greedy_requests(std, max_tokens=24)  # the leak must reach a later argmax
    _plant_leaky_commit(monkeypatch)
    res = SC.greedy_compare(std, reqs, K)
    assert "rows differ from greedy decoding" in SC.greedy_failure(res, K, fast_path=False), res


def test_the_suites_near_tie_judgement_does_not_excuse_a_leaky_rollback(std, monkeypatch):
    """The features suite excuses a differing row only at a near-tie (``_greedy_row``); the
    leaky rollback's rows part where the fp32 oracle ranks the plain row's token clearly higher."""
    from suite_modules import load_suite

    features = load_suite("features")
    oracle = EmbeddedEngine(config="tiny", device="cpu", dtype="float32").load("oracle")
    reqs = _greedy_requests(std, max_tokens=24)
    _plant_leaky_commit(monkeypatch)
    res = SC.greedy_compare(std, reqs, K)
    judged = [features._greedy_row(std, oracle, r.prompt_ids, spec, plain)
              for r, spec, plain in zip(reqs, res["speculative"], res["plain"]) if spec != plain]
    assert judged and not any(j["near_tie"] for j in judged), judged


def test_greedy_check_fails_when_nothing_was_drafted(std, monkeypatch):
    reqs = _greedy_requests(std)
    monkeypatch.setattr(NgramDrafter, "propose_one", lambda self, context: [])
    res = SC.greedy_compare(std, reqs, K)
    assert res["identical_rows"] == res["rows"]  # outputs alone would pass
    assert SC.greedy_failure(res, K, fast_path=False) == "no draft was proposed and verified: speculation never ran"


def test_greedy_check_fails_a_fast_path_without_its_verify_kernels(std):
    """The standard path passed off as the fast one: no verify kernel in the trace."""
    res = SC.greedy_compare(std, _greedy_requests(std, n=1), K)
    assert SC.greedy_failure(res, K, fast_path=True) == f"the fast verify kernels never ran at {K + 1} tokens per sequence"


def test_engine_without_speculation_is_an_error_naming_cause_and_fix(std):
    class NoSpec:  # e.g. the vLLM engine's model: generate(requests) only
        engine_name = "vllm"
        tokenizer = std.tokenizer

        def generate(self, requests):
            return std.generate(requests)

    with pytest.raises(SC.SpeculationUnsupported, match=r"^engine vllm does not offer speculative decoding: "
                                                         r"set features.speculative_decoding = false$"):
        SC.greedy_compare(NoSpec(), _greedy_requests(std, n=1), K)
    from fastpath.vllm_engine.engine import VllmModel

    vllm_model = types.SimpleNamespace(generate=lambda requests: VllmModel.generate(None, requests))
    assert not SC.offers_speculation(vllm_model)  # the vLLM engine gets the error rows


# -- sampled: the distribution ----------------------------------------------------------------------
def _accepts_every_sampled_draft(logits, drafts, params, gen, bitmask=None, **kw):
    """Planted defect: a sampled row keeps its drafts without the rejection test."""
    if not params.greedy and drafts:
        return list(drafts[:1]), [0.0], 0
    return honest_accept(logits, drafts, params, gen, bitmask, **kw)


def _sampled_p_value(std, draws=256):
    prompt = SC.prompts(std, "smoke", 1)[0]
    drafter = {"method": "synthetic", "num_speculative_tokens": K, "acceptance_length": K + 1}
    pairs, t = SC.sampled_second_tokens(std, prompt, draws=draws, batch=16, temperature=0.8, speculative=drafter,
                                        seed0=5_000_000)
    assert t["drafted"] >= K * draws and len(pairs) == draws, t
    return SC.distribution_test(std, prompt, pairs, 0.8, std.tokenizer.n_real_tokens).p_value


def test_g_test_keeps_an_honest_rejection_sampler(std):
    assert _sampled_p_value(std) >= 0.001


def test_g_test_rejects_a_biased_sampler(std, monkeypatch):
    monkeypatch.setattr(k3_generate, "accept", _accepts_every_sampled_draft)
    assert _sampled_p_value(std) < 0.001


def test_greedy_check_excuses_only_rows_judged_near_ties():
    """A row parted at a near-tie (the suite's ``_greedy_row`` judges it) passes; any other
    differing row still fails, and the message names it."""
    res = {"stats": {"drafted": 4, "rows_without_statistics": 0}, "verify_launches": 1, "rows": 2,
           "identical_rows": 0, "plain": [[1, 2, 3], [4, 5, 6]], "speculative": [[1, 9, 9], [4, 5, 7]],
           "first_difference": [1, 2]}
    assert "2 of 2 rows differ" in SC.greedy_failure(dict(res, near_ties=[]), K, fast_path=True)
    assert "rows [1]" in SC.greedy_failure(dict(res, near_ties=[0]), K, fast_path=True)
    assert SC.greedy_failure(dict(res, near_ties=[0, 1]), K, fast_path=True) == ""


def test_verify_launches_count_declared_verify_variants_at_k_plus_1():
    """With components that declare verify variants, only those variants at K + 1 tokens count
    (a decode kernel reporting K + 1 rows does not); with none declared, any event at K + 1."""
    from fastpath import trace

    comps = [types.SimpleNamespace(name="kda_decode", verify_variants=["triton_verify"]),
             types.SimpleNamespace(name="moe_experts", verify_variants=[])]
    with trace.recording() as rec:
        trace.engaged("kda_decode", "triton_verify", batch=2, tokens=K + 1)
        trace.engaged("kda_decode", "triton_verify", batch=2, tokens=K)  # another draft length
        trace.engaged("kda_decode", "triton", batch=2, tokens=K + 1)  # the decode kernel
        trace.engaged("moe_experts", "triton", batch=2, tokens=K + 1)  # declares no verify variant
    assert SC.verify_launches(rec, K, comps) == 1
    assert SC.verify_launches(rec, K) == 3
    assert SC.verify_launches(rec, K + 1, comps) == 0


def test_speculative_batches_stay_within_the_specs_verify_rows():
    """The features suite's verify steps are ones the fast path serves: batch x (K + 1) rows
    within scope.max_verify_rows (64 in the K3 spec), else its checks would judge the standard
    path's verify step under the fast path's name."""
    from fastpath import suite_helpers as H

    spec = load_spec(SPEC)
    full = spec.tier("full")
    assert spec.scope["max_verify_rows"] == 64
    assert [H.verify_batch(spec, full, k, 8) for k in (3, 7)] == [8, 8]
    assert [H.verify_batch(spec, full, k, 4000) for k in (3, 7)] == [16, 8]  # the sampled check: as many as fit
    assert H.verify_batch(spec, full, 7, 1) == 1
    unlimited = type("S", (), {"scope": {"batch_sizes": [1, 2, 4, 8, 16, 32, 64]}})()
    assert H.verify_batch(unlimited, full, 7, 16) == 8  # none declared: the largest batch's 64 rows
