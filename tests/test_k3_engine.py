"""The embedded engine (K3-mini tiny on CPU) against fastpath.engine's protocols."""

from __future__ import annotations

import pytest
import torch

from fastpath import trace
from fastpath.engine import (Component, Engine, GenerationRequest, GenerationResult, KernelEntry, Model,
                             PromptModel, Tokenizer, create_engine)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def engine():
    return create_engine("embedded", config="tiny", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def std(engine):
    return engine.load("standard")


def test_protocol_conformance(engine, std):
    assert isinstance(engine, Engine)
    assert isinstance(std, Model) and std.path == "standard" and std.device == "cpu"
    assert isinstance(std.tokenizer, Tokenizer)
    info = engine.info()
    for key in ("device", "arch", "device_name", "model_config", "dtype", "triton_interpreter"):
        assert key in info
    assert info["device"] == "cpu" and info["arch"] == "cpu" and info["model_config"] == "tiny"
    assert info["dtype"] == "float32" and info["triton_interpreter"] is True
    assert info["params_total"] > info["params_active_per_token"] > 0
    for c in engine.components():
        assert isinstance(c, Component)
    for k in engine.kernels():
        assert isinstance(k, KernelEntry)
    ok, why = engine.fast_path_available()
    assert isinstance(ok, bool) and (ok or why)


def test_bad_options_are_clear():
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU.*Fix"):
            create_engine("embedded", config="tiny", device="cuda")
    with pytest.raises(ValueError, match="unknown K3 config"):
        create_engine("embedded", config="huge")
    with pytest.raises(ValueError, match="dtype"):
        create_engine("embedded", dtype="int8")
    with pytest.raises(ValueError, match="path"):
        create_engine("embedded").load("turbo")
    with pytest.raises(ValueError, match="standard_compile_verify 'yes': true or false"):
        create_engine("embedded", standard_compile_verify="yes")
    # reported only where a compiled step exists to cover verify steps (CPU: standard_compile off)
    assert create_engine("embedded", standard_compile_verify=True).info()["standard_compile_verify"] is False
    assert create_engine("embedded", standard_compile="default",
                         standard_compile_verify=True).info()["standard_compile_verify"] is True


SWITCH = {"decode_backend": "latency_specialized"}  # the spec's [switch], as additional_config


def test_fast_path_never_silently_standard(engine):
    ok, why = engine.fast_path_available()
    if not ok:
        from optimized_model.k3.engine import FastPathUnavailable

        with pytest.raises(FastPathUnavailable, match="fast path"):
            engine.load("fast", additional_config=SWITCH)
    else:
        fast = engine.load("fast", additional_config=SWITCH)
        assert fast.path == "fast" and fast.runner.fast is not None


def test_engine_states_its_switch_and_it_matches_the_spec(engine):
    from fastpath.spec import load_spec
    from optimized_model.k3.fast import dispatch

    spec = load_spec("optimized_model/k3/fastpath.toml")
    assert engine.info()["switch"] == spec.switch == dispatch.own_switch()
    assert dispatch.switch_config() == SWITCH


@pytest.mark.parametrize("config", [{"decode_backend": "default"}, {"decode_backend_": "latency_specialized"},
                                    {}, None], ids=["wrong_value", "missing_key", "empty", "none"])
def test_switch_mismatch_runs_the_standard_path_with_no_fast_path_event(engine, config):
    model = engine.load("fast", additional_config=config)
    assert model.path == "standard" and model.runner.fast is None
    with trace.recording() as rec:
        model.decode_step(1, 16)()
        model.prefill_step(1, 16)()
    assert rec.events == []


def test_own_switch_engages_the_fast_path(engine):
    ok, why = engine.fast_path_available()
    if not ok:
        pytest.skip(f"fast path unavailable here: {why}")
    fast = engine.load("fast", additional_config=dict(SWITCH))
    with trace.recording() as rec:
        fast.decode_step(1, 16)()
    assert {e.component for e in rec.engaged()} >= {"dense_gemv", "lm_head"}


def test_context_beyond_max_context_is_a_declared_fallback(engine):
    """The spec declares context_out_of_scope; the fast model refuses it for every component."""
    from fastpath.spec import load_spec

    ok, why = engine.fast_path_available()
    if not ok:
        pytest.skip(f"fast path unavailable here: {why}")
    spec = load_spec("optimized_model/k3/fastpath.toml")
    assert spec.scope["fallbacks"]["context_out_of_scope"] == "context_out_of_scope"
    fast = engine.load("fast", additional_config=SWITCH)
    with trace.recording() as rec:
        fast.decode_step(1, spec.features["max_context"] + 1)()
    assert rec.engaged() == []
    assert {e.component for e in rec.refused()} == {c.name for c in engine.components()}
    assert {e.detail for e in rec.refused()} == {"context_out_of_scope"}


def test_greedy_generate_agrees_with_score(std):
    tok = std.tokenizer
    prompts = [tok.encode("Hello, K3"), tok.encode("a")]
    res = std.generate([GenerationRequest(prompt_ids=p, max_tokens=6) for p in prompts])
    for p, r in zip(prompts, res):
        assert isinstance(r, GenerationResult)
        assert 1 <= len(r.token_ids) <= 6
        full = p + r.token_ids
        logits = std.score([full])[0]
        assert logits.shape == (len(full), tok.vocab_size) and logits.dtype == torch.float32
        want = logits[len(p) - 1: len(full) - 1].argmax(-1).tolist()
        assert r.token_ids == want
        assert all(t < tok.n_real_tokens for t in r.token_ids)


def test_seeded_sampling_reproducible(std):
    tok = std.tokenizer
    req = lambda seed: GenerationRequest(prompt_ids=tok.encode("xyz"), max_tokens=12, temperature=1.0, seed=seed)
    a = std.generate([req(7), req(8)])
    b = std.generate([req(7)])
    assert a[0].token_ids == b[0].token_ids
    assert a[0].token_ids != a[1].token_ids


def test_score_ragged_equals_alone(std):
    seqs = [[256, 1, 2, 3, 4, 5, 6], [256, 9], [256, 40, 41, 42]]
    together = std.score(seqs)
    for s, t in zip(seqs, together):
        torch.testing.assert_close(t, std.score([s])[0], rtol=1e-4, atol=1e-4)


def test_runner_grows_state_past_capacity(std):
    """A decode beyond the pooled capacity grows the latent cache in place, same results."""
    runner, m = std.runner, std.model
    old = runner.reserve
    try:
        runner.reserve = 1
        logits, st = runner.prefill([[256, 3, 4]])
        cap = st.capacity
        ids = []
        for _ in range(cap - 2):
            nxt = logits.argmax(-1)
            ids.append(int(nxt))
            logits = runner.decode(nxt, st)
        assert st.capacity > cap and st.max_len == cap + 1
    finally:
        runner.reserve = old
    # same tokens, teacher-forced in one prefill
    full = std.score([[256, 3, 4] + ids])[0]
    n = m.cfg.n_real_tokens
    torch.testing.assert_close(logits[0, :n], full[-1, :n], rtol=1e-3, atol=1e-3)


def test_decode_step_hooks_run_and_stay_at_context(std):
    step = std.decode_step(4, 40)
    for _ in range(3):
        step()  # lengths are reset each call, so repeated calls never overflow
    std.prefill_step(2, 16)()
    std.mixed_step(3, 16)()
    std.mixed_step(1, 8)()
    std.decode_step(1, 8, draft=2)()  # a verify step of 3 tokens (tests/test_k3_speculative.py)
    verify, decode = std.step_traffic(1, 8, draft=2), std.step_traffic(1, 8)  # tests/test_k3_traffic.py
    assert verify["total"] > decode["total"] and verify["weights"] == decode["weights"]


def test_prompt_step_is_greedy_generation_and_reset_replays_it(std):
    """Model.prompt_step (perf's prompt cases): each call decodes the greedy next token of real
    generation (generate's tokens after its first), reset() starts the same tokens again, and
    a call past the room it was built with is refused, never a silently grown cache."""
    assert isinstance(std, PromptModel)
    tok = std.tokenizer
    prompts = [tok.encode("Hello, K3"), tok.encode("a longer second prompt")]
    want = [r.token_ids for r in std.generate([GenerationRequest(prompt_ids=p, max_tokens=5) for p in prompts])]
    assert all(len(w) == 5 for w in want)  # the tiny model writes no eos this early
    step = std.prompt_step(prompts, 4)
    for _ in range(2):
        step.reset()
        for _ in range(4):
            step()
        assert step.generated_ids() == [w[1:] for w in want]
    with pytest.raises(RuntimeError, match="4 decode steps since the last reset"):
        step()
    assert step.traffic()["total"] > 0


def test_standard_path_reports_nothing(std):
    with trace.recording() as rec:
        std.decode_step(2, 16)()
        std.generate([GenerationRequest(prompt_ids=[256, 65], max_tokens=2)])
    assert rec.events == []


def test_oracle_path_is_fp32_and_close(engine, std):
    orc = engine.load("oracle")
    assert orc.path == "oracle" and orc.model.dtype == torch.float32 and orc.model.kda_backend == "torch"
    seq = [[256] + list(b"oracle parity check")]
    torch.testing.assert_close(orc.score(seq)[0], std.score(seq)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_graph_pool_survives_dropped_benchmark_steps():
    """A benchmark step's CUDA graph is dropped with its callable; capturing another step into
    the runner's shared pool afterwards must still work (on the H200 it hit PyTorch's allocator
    assert `use_count > 0` once every graph of the pool had been freed)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: CUDA-graph pools exist only there")
    eng = create_engine("embedded", config="tiny", device="cuda", dtype="float32")
    model = eng.load("standard")
    for context in (16, 40, 64):
        step = model.decode_step(1, context)
        step()
        del step
        torch.cuda.synchronize()
