"""K3-mini model and standard path (tiny config, CPU, fp32 unless stated)."""

from __future__ import annotations

import math

import pytest
import torch

from optimized_model.k3.config import MINI, TINY, get_config, param_counts
from optimized_model.k3.kda import kda_chunked, kda_recurrent, kda_step_
from optimized_model.k3.model import K3Model, swiglu
from optimized_model.k3.weights import init_weights


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model32():
    return K3Model.build("tiny", dtype=torch.float32, seed=0)


def _kda_inputs(B=2, T=37, H=2, K=16, V=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    v = torch.randn(B, T, H, V, generator=g)
    # decays across the whole range, down to the -5 lower bound
    gate = -5.0 * torch.sigmoid(4 * torch.randn(B, T, H, K, generator=g))
    beta = torch.rand(B, T, H, generator=g)
    h0 = torch.randn(B, H, K, V, generator=g)
    return q, k, v, gate, beta, h0


# -- KDA -----------------------------------------------------------------------------------------
def test_kda_recurrence_equals_fla_naive():
    from fla.ops.kda.naive import naive_recurrent_kda

    q, k, v, g, beta, h0 = _kda_inputs()
    o_ref, s_ref = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, s = kda_recurrent(q, k, v, g, beta, initial_state=h0)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)
    # a different scale must change the result (the convention is actually exercised)
    o2, _ = kda_recurrent(q, k, v, g, beta, scale=1.0, initial_state=h0)
    assert not torch.allclose(o2, o_ref, atol=1e-3)


@pytest.mark.parametrize("T,chunk", [(1, 16), (37, 16), (64, 32), (70, 32)])
def test_chunked_prefill_then_decode_equals_recurrence(T, chunk):
    q, k, v, g, beta, h0 = _kda_inputs(T=T + 5)
    o_ref, s_ref = kda_recurrent(q, k, v, g, beta, initial_state=h0)
    o, s = kda_chunked(q[:, :T], k[:, :T], v[:, :T], g[:, :T], beta[:, :T], initial_state=h0, chunk=chunk)
    torch.testing.assert_close(o, o_ref[:, :T], rtol=1e-4, atol=1e-4)
    outs = []
    for t in range(T, T + 5):  # decode continues from the chunked prefill's state
        outs.append(kda_step_(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], s, q.shape[-1] ** -0.5))
    torch.testing.assert_close(torch.stack(outs, 1), o_ref[:, T:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-4)


def test_chunked_padding_steps_leave_state_unchanged():
    q, k, v, g, beta, h0 = _kda_inputs(T=20)
    _, s_ref = kda_recurrent(q[:, :12], k[:, :12], v[:, :12], g[:, :12], beta[:, :12], initial_state=h0)
    g2, b2 = g.clone(), beta.clone()
    g2[:, 12:] = 0
    b2[:, 12:] = 0
    _, s = kda_chunked(q, k, v, g2, b2, initial_state=h0, chunk=8)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-4)


def test_state_to_dtype_copies_the_caches_in_the_new_dtype(model32):
    st = model32.random_state(2, 9, 64, seed=3)
    st.max_len = 9
    for dtype in (torch.float64, torch.float32):  # a new dtype, and the one it has
        c = st.to_dtype(dtype)
        assert c.conv.dtype == c.latent.dtype == dtype and c.kda.dtype == torch.float32
        assert c.max_len == 9 and torch.equal(c.lengths, st.lengths)
        for a, b in zip(c.tensors(), st.tensors()):
            assert a.data_ptr() != b.data_ptr() and torch.equal(a.to(b.dtype), b)


# -- MLA -----------------------------------------------------------------------------------------
def test_absorbed_mla_decode_equals_non_absorbed(model32):
    m = model32
    st = m.random_state(3, 40, 64, seed=1)
    st.lengths.copy_(torch.tensor([40, 7, 23]))  # ragged contexts
    st.max_len = 40
    a, b = st.clone(), st.clone()
    tok = torch.tensor([5, 200, 77])
    la = m.decode(tok, a)
    lb = m.decode(tok, b, absorbed=False)
    n = m.cfg.n_real_tokens
    torch.testing.assert_close(la[:, :n], lb[:, :n], rtol=1e-4, atol=1e-4)
    for x, y in zip(a.tensors(), b.tensors()):
        torch.testing.assert_close(x, y)
    # and the cached context matters (the comparison is not vacuous)
    c = st.clone()
    c.latent.normal_()
    assert not torch.allclose(m.decode(tok, c)[:, :n], la[:, :n], atol=1e-3)


# -- MoE -----------------------------------------------------------------------------------------
def _moe_reference(m, i, x):
    """Per-token dense loop: select by score + bias, weight by normalised scores."""
    cfg = m.cfg
    out = []
    for xt in x:
        s = torch.sigmoid(m.W(i, "router") @ xt.float())
        ids = torch.topk(s + m.W(i, "router_bias"), cfg.top_k).indices
        w = s[ids] / s[ids].sum() * cfg.routed_scaling
        lat = m.W(i, "moe_down") @ xt
        y = sum(w[j] * swiglu(lat, m.W(i, "experts_w13")[e], m.W(i, "experts_w2")[e]) for j, e in enumerate(ids.tolist()))
        y = m.W(i, "moe_up") @ y + swiglu(xt, m.W(i, "shared_w13"), m.W(i, "shared_w2"))
        out.append(y)
    return torch.stack(out)


@pytest.mark.parametrize("backend", ["grouped", "loop"])
def test_moe_equals_per_token_dense_loop(model32, backend):
    if backend == "grouped" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm is not in this torch")
    m = K3Model(model32.cfg, model32.w, moe_backend=backend)
    x = torch.randn(13, m.cfg.hidden, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(m.moe(1, x), _moe_reference(m, 1, x), rtol=1e-4, atol=1e-4)
    # the correction bias changes the selection for some tokens but never the weights' source
    s = torch.sigmoid(x.float() @ m.W(1, "router").T)
    with_bias = torch.topk(s + m.W(1, "router_bias"), m.cfg.top_k).indices.sort(-1).values
    without = torch.topk(s, m.cfg.top_k).indices.sort(-1).values
    assert (with_bias != without).any()


# -- whole model ------------------------------------------------------------------------------------
def _tokens(B, T, seed=0):
    return torch.randint(0, 265, (B, T), generator=torch.Generator().manual_seed(seed))


def test_prefill_plus_decode_equals_full_forward(model32):
    m, n = model32, model32.cfg.n_real_tokens
    toks = _tokens(2, 30)
    full = m.prefill(toks, torch.tensor([30, 30]), m.new_state(2, 64), all_logits=True)
    st = m.new_state(2, 64)
    outs = [m.prefill(toks[:, :21], torch.tensor([21, 21]), st)]
    for t in range(21, 29):
        outs.append(m.decode(toks[:, t], st))
    got = torch.stack(outs, 1)
    torch.testing.assert_close(got[..., :n], full[:, 20:29, :n], rtol=1e-4, atol=1e-4)
    assert st.max_len == 29 and st.lengths.tolist() == [29, 29]


def test_ragged_batch_equals_each_sequence_alone(model32):
    m, n = model32, model32.cfg.n_real_tokens
    lens = [17, 5, 11]
    toks = _tokens(3, max(lens), seed=4)
    st = m.new_state(3, 64)
    out = [m.prefill(toks, torch.tensor(lens), st)]
    nxt = _tokens(3, 4, seed=5)
    for t in range(4):
        out.append(m.decode(nxt[:, t], st))
    for b, L in enumerate(lens):
        sb = m.new_state(1, 64)
        ref = [m.prefill(toks[b:b + 1, :L], torch.tensor([L]), sb)]
        for t in range(4):
            ref.append(m.decode(nxt[b:b + 1, t], sb))
        for got, want in zip(out, ref):
            torch.testing.assert_close(got[b, :n], want[0, :n], rtol=1e-4, atol=1e-4)


def test_padding_ids_are_minus_inf_and_real_ids_finite(model32):
    lg = model32.decode(torch.tensor([1]), model32.random_state(1, 4, 64))
    n = model32.cfg.n_real_tokens
    assert torch.isfinite(lg[:, :n]).all()
    assert torch.isneginf(lg[:, n:]).all() and lg.shape[-1] == model32.cfg.vocab_size


def test_fp16_standard_close_to_fp32_oracle():
    std = K3Model.build("tiny", dtype=torch.float16, seed=0)
    orc = K3Model.build("tiny", dtype=torch.float16, seed=0, oracle=True)
    assert orc.dtype == torch.float32 and orc.kda_backend == "torch" and orc.moe_backend == "loop"
    # the oracle's weights are exactly the standard weights, upcast
    assert all(torch.equal(orc.w[k], std.w[k].float()) for k in std.w)
    toks = _tokens(1, 48, seed=6)
    a = std.prefill(toks, torch.tensor([48]), std.new_state(1, 64), all_logits=True)
    b = orc.prefill(toks, torch.tensor([48]), orc.new_state(1, 64), all_logits=True)
    n = std.cfg.n_real_tokens
    assert (a[0, :, :n].argmax(-1) == b[0, :, :n].argmax(-1)).float().mean() > 0.9
    assert (a[0, :, :n] - b[0, :, :n]).abs().max() < 0.1


def test_weights_seeded_and_scaled():
    a = init_weights(TINY, seed=1)
    b = init_weights(TINY, seed=1)
    c = init_weights(TINY, seed=2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["lm_head"], c["lm_head"])
    assert a["L1.router"].dtype == torch.float32 and a["L0.A_log"].dtype == torch.float32
    n_params = sum(t.numel() for t in a.values())
    assert n_params == param_counts(TINY)["total"]


def test_configs_pattern_and_sizes():
    assert TINY.layer_kinds == ["kda", "kda", "kda", "mla"]
    assert MINI.layer_kinds == ["kda", "kda", "kda", "mla"] * 2
    assert get_config("tiny", n_layers=6).layer_kinds == ["kda", "kda", "kda", "mla", "kda", "mla"]
    pc = param_counts(MINI)
    assert pc["active_per_token"] * 2 >= 1e9  # >= 1 GB of bf16 weights read per token
    assert MINI.n_experts >= 64 and MINI.vocab_size % 64 == 0


def test_conditioning_over_2k_tokens(model32):
    """Activations stay bounded and next-token distributions non-degenerate over 2k tokens
    (figures in docs/k3-mini.md)."""
    m, n = model32, model32.cfg.n_real_tokens
    T = 2048
    text = ("In the beginning the model reads bytes; " * 60).encode()[: T - 1]
    toks = torch.tensor([[m.cfg.n_real_tokens - 9] + list(text)])  # <|bos|> + bytes
    stats: list = []
    lg = m.prefill(toks, torch.tensor([T]), m.new_state(1, T + 8), all_logits=True, stats=stats)
    rms = torch.stack([s[0] for s in stats])  # [layers, T]
    assert torch.isfinite(rms).all()
    assert rms.max() < 10 and rms.min() > 0.1
    # no drift: the last quarter's RMS is within 2x of the first quarter's, per layer
    ratio = rms[:, -T // 4:].mean(1) / rms[:, : T // 4].mean(1)
    assert ((ratio > 0.5) & (ratio < 2)).all()
    logp = torch.log_softmax(lg[0, :, :n], -1)
    ent = -(logp.exp() * logp).sum(-1)
    assert torch.isfinite(ent).all()
    assert 1.0 < ent.mean() < math.log(n) - 1.0
    assert ent.min() > 0.05 and ent.max() < math.log(n) - 0.1


@pytest.mark.gpu
def test_fla_kernels_match_torch_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (fla-core Triton kernels); run lab/gpu_check.py on the H200")
    std = K3Model.build("tiny", device="cuda", dtype=torch.bfloat16, seed=0)
    ref = K3Model(std.cfg, {k: v.float() for k, v in std.w.items()}, oracle=True)
    assert std.kda_backend == "fla"
    toks = _tokens(2, 100).cuda()
    lens = torch.tensor([100, 61], device="cuda")
    a = std.prefill(toks, lens, std.new_state(2, 128))
    b = ref.prefill(toks, lens, ref.new_state(2, 128))
    n = std.cfg.n_real_tokens
    assert (a[:, :n] - b[:, :n]).abs().max() < 0.25
