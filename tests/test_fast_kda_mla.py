"""Fast-path attention decode kernels (KDA fused step, MLA split-KV) under the Triton interpreter,
against references written here from fla-core's naive oracles and plain torch."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton / kernel modules are imported

import pytest
import torch
import torch.nn.functional as F

from fastpath import trace
from optimized_model.k3.fast.kernels import kda_decode as kda
from optimized_model.k3.fast.kernels import mla_decode as mla

fla_naive = pytest.importorskip("fla.ops.kda.naive")
fla_gate = pytest.importorskip("fla.ops.kda.gate")


# ------------------------------------------------------------------------------------------------
# KDA: reference = conv window sum + SiLU, fla l2-norm convention, fla's lower-bound gate,
# fla naive_recurrent_kda, torch rms_norm, sigmoid gate — all fp32


def _kda_reference_step(inp, conv_state, S):
    """One decode step; returns (out [B, H*V], new state S, new conv states (q, k, v))."""
    H, K, V = inp["num_heads"], inp["head_k"], inp["head_v"]
    B = inp["q"].shape[0]

    def conv(x, st, w):
        x, st, w = x.float(), st.float(), w.float()
        W = w.shape[1]
        window = torch.cat([st[..., st.shape[-1] - (W - 1):], x[..., None]], -1)  # oldest first
        y = F.silu((window * w).sum(-1))
        return y, torch.cat([st[..., 1:], x[..., None]], -1)

    q, cq = conv(inp["q"], conv_state[0], inp["conv_wq"])
    k, ck = conv(inp["k"], conv_state[1], inp["conv_wk"])
    v, cv = conv(inp["v"], conv_state[2], inp["conv_wv"])
    q = q.view(B, 1, H, K)
    k = k.view(B, 1, H, K)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    g = fla_gate.naive_kda_lowerbound_gate(inp["f"].float().view(B, 1, H, K), inp["A_log"].float(),
                                           inp["dt_bias"].float(), lower_bound=-5.0)
    beta = torch.sigmoid(inp["b"].float()).view(B, 1, H)
    o, S_new = fla_naive.naive_recurrent_kda(q, k, v.view(B, 1, H, V), g, beta,
                                             initial_state=S.float(), output_final_state=True)
    o = F.rms_norm(o.view(B, H, V), (V,), inp["norm_weight"].float(), eps=1e-6)
    o = o * torch.sigmoid(inp["gate"].float().view(B, H, V))
    return o.reshape(B, H * V), S_new, (cq, ck, cv)


def _kda_args(inp):
    names = ("q", "k", "v", "f", "b", "gate", "conv_q", "conv_k", "conv_v", "conv_wq", "conv_wk",
             "conv_wv", "A_log", "dt_bias", "state", "norm_weight")
    kw = {n: inp[n] for n in ("num_heads", "head_k", "head_v")}
    if "block_v" in inp:
        kw["block_v"] = inp["block_v"]
    return [inp[n] for n in names], kw


def _tol(dtype):
    return dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=4e-3, rtol=4e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [
    dict(batch=2, heads=2, head_k=16, head_v=16),                                  # NV == 1
    dict(batch=3, heads=3, head_k=16, head_v=32, block_v=8),                       # NV == 4
    dict(batch=1, heads=2, head_k=12, head_v=20, width=4, conv_len=4, block_v=8),  # ragged, SL == W
])
def test_kda_one_step_vs_fla_naive(shape, dtype):
    inp = kda.make_inputs(shape, "normal", dtype, "cpu", seed=1)
    ref_out, ref_S, ref_conv = _kda_reference_step(inp, (inp["conv_q"], inp["conv_k"], inp["conv_v"]),
                                                   inp["state"])
    args, kw = _kda_args(inp)
    args = [a.clone() for a in args]
    out = kda.kda_decode(*args, **kw)
    assert out.dtype == dtype and out.shape == ref_out.shape
    torch.testing.assert_close(out.float(), ref_out, **_tol(dtype))
    torch.testing.assert_close(args[14], ref_S, atol=2e-5, rtol=1e-4)  # fp32 state in place
    for got, want in zip(args[6:9], ref_conv):  # conv states: exact shift + append
        assert torch.equal(got.float(), want)
    if kw.get("block_v", 0) and kw["block_v"] < shape["head_v"]:
        assert int(kda._counter(out.device, 1).abs().sum()) == 0  # counters reset by the kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kda_consecutive_steps_on_fused_views(dtype):
    """Three steps on views of one fused projection and of the model's concatenated conv state
    [B, 3d, W-1] (DecodeState layout), vs the reference carried step by step."""
    B, H, K, V, W = 2, 2, 16, 16, 4
    d = H * K
    g = torch.Generator().manual_seed(3)
    conv_all = torch.randn(B, 3 * d, W - 1, generator=g).to(dtype)
    conv_w = (torch.randn(3 * d, W, generator=g) * 0.5).to(dtype)
    S = torch.randn(B, H, K, V, generator=g) * 0.1
    A_log, dt_bias = torch.randn(H, generator=g) * 0.5, torch.randn(d, generator=g) * 0.5
    norm_w = (1 + 0.1 * torch.randn(V, generator=g)).to(dtype)
    ref_conv = (conv_all[:, :d].float(), conv_all[:, d:2 * d].float(), conv_all[:, 2 * d:].float())
    ref_S = S.clone()
    for step in range(3):
        proj = torch.randn(B, 3 * d + d + H + d + 5, generator=g).to(dtype)  # q|k|v|f|b|gate|pad
        views = dict(q=proj[:, :d], k=proj[:, d:2 * d], v=proj[:, 2 * d:3 * d],
                     f=proj[:, 3 * d:4 * d], b=proj[:, 4 * d:4 * d + H],
                     gate=proj[:, 4 * d + H:5 * d + H])
        inp = dict(views, conv_wq=conv_w[:d], conv_wk=conv_w[d:2 * d], conv_wv=conv_w[2 * d:],
                   A_log=A_log, dt_bias=dt_bias, norm_weight=norm_w, num_heads=H, head_k=K, head_v=V)
        ref_out, ref_S, ref_conv = _kda_reference_step(inp, ref_conv, ref_S)
        out = kda.kda_decode(views["q"], views["k"], views["v"], views["f"], views["b"], views["gate"],
                             conv_all[:, :d], conv_all[:, d:2 * d], conv_all[:, 2 * d:],
                             inp["conv_wq"], inp["conv_wk"], inp["conv_wv"], A_log, dt_bias, S, norm_w,
                             num_heads=H, head_k=K, head_v=V, block_v=8 if step % 2 else None)
        torch.testing.assert_close(out.float(), ref_out, **_tol(dtype))
        torch.testing.assert_close(S, ref_S, atol=5e-5, rtol=1e-4)
        torch.testing.assert_close(conv_all.float(), torch.cat(ref_conv, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [
    dict(batch=2, heads=2, head_k=16, head_v=16, rank=16),                # NV == 1
    dict(batch=3, heads=3, head_k=16, head_v=32, block_v=8, rank=12),     # NV == 4, ragged rank
])
def test_kda_low_rank_gates_in_kernel(shape, dtype):
    """``low_rank=(f_a(x)|g_a(x), f_b, g_b)``: the kernel forms f and the output gate itself —
    the same step as passing f and gate from the projections (rounded to the working dtype)."""
    inp = kda.make_inputs(shape, "normal", dtype, "cpu", seed=5)
    fg_a, f_b, g_b = inp["low_rank"]
    R = f_b.shape[1]
    given = dict(inp, f=F.linear(fg_a[:, :R].float(), f_b.float()).to(dtype),
                 gate=F.linear(fg_a[:, R:].float(), g_b.float()).to(dtype), low_rank=None)
    ref = kda.fast(**given)
    got = kda.fast(**inp)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.float(), b.float(), **_tol(dtype))
    early = kda.fast(**inp, early_weights=True)  # the weights load before the (PDL) wait
    assert all(torch.equal(a, b) for a, b in zip(early, got))
    with pytest.raises(ValueError, match="not both"):
        kda.fast(**dict(inp, f=given["f"], gate=given["gate"]))


def test_kda_trace_and_entry():
    inp = kda.make_inputs(dict(batch=2, heads=2, head_k=16, head_v=16, block_v=8), "normal",
                          torch.float32, "cpu", seed=0)
    with trace.recording() as rec:
        kda.fast(**inp)
    ev = rec.engaged("kda_decode")
    assert len(ev) == 1 and ev[0].detail == "triton_fused"
    assert ev[0].shape_dict()["batch"] == 2 and ev[0].shape_dict()["block_v"] == 8
    e, steps = kda.kernel_entry("cpu")
    assert e.component == "kda_decode" and e.dtypes == ["float16", "float32"]
    assert {s["batch"] for s in e.shapes} >= {1, 2, 4, 8, 16, 32, 64}
    assert set(e.value_classes) >= {"normal", "large", "near_zero"}
    assert all(__import__("re").fullmatch(p, "kda_decode_fused_kernel") for p in e.kernel_patterns)
    assert steps.name == "kda_decode_steps" and steps.value_classes == ["long_memory"]
    assert all(s["steps"] >= 32 and s["heads"] >= 2 for s in steps.shapes)


def test_kda_multi_step_carries_the_state_from_step_to_step():
    """A ``steps`` case is the one-step kernel applied in turn, each step fed its own inputs and
    the previous step's states; its gates come from the model's ranges (long memory)."""
    shape = dict(batch=2, heads=2, head_k=16, head_v=16, rank=8, steps=3)
    inp = kda.make_inputs(shape, "long_memory", torch.float32, "cpu", seed=3)
    out, state, cq, ck, cv = kda.fast(**inp)
    assert out.shape == (3, 2, 32)
    carried = {k: inp[k] for k in ("conv_q", "conv_k", "conv_v", "state")}
    fg_a, f_b, g_b = inp["low_rank"]
    for t in range(3):
        one = {k: v for k, v in inp.items() if k != "steps"}
        one.update({k: inp[k][t] for k in ("q", "k", "v", "b")}, low_rank=(fg_a[t], f_b, g_b), **carried)
        o_t, *states = kda.fast(**one)
        assert torch.equal(o_t, out[t])
        carried = dict(zip(("state", "conv_q", "conv_k", "conv_v"), states))
    assert torch.equal(carried["state"], state) and torch.equal(carried["conv_v"], cv)
    g = -5 * torch.sigmoid(inp["A_log"].exp().repeat_interleave(16) * inp["dt_bias"])
    assert (g > -0.005).any() and (g < -1).any()  # long-memory and fast-decaying channels both


@pytest.mark.parametrize("value_class", ["large", "near_zero"])
@pytest.mark.parametrize("rank", [0, 16])
def test_kda_entry_noise_floor(value_class, rank):
    """fast within max(atol floor, k x standard's error) of the oracle (the kernel suite's rule),
    with f and gate given and formed in the kernel (rank)."""
    e = kda.kernel_entry("cpu")[0]
    shape = next(s for s in e.shapes if s.get("block_v") and s.get("rank", 0) == rank and s["heads"] == 3)
    inp = e.make_inputs(shape, value_class, "float16", "cpu", 7)
    fast, std, ora = e.fast(**inp), e.standard(**inp), e.oracle(**inp)
    for f_, s_, o_ in zip(fast, std, ora):
        noise = (s_.float() - o_.float()).abs().max().item()
        err = (f_.float() - o_.float()).abs().max().item()
        assert err <= max(e.atol_floor["float16"], e.k * noise), (err, noise)


def test_choose_block_v_fills_gpu_at_small_batch():
    assert kda.choose_block_v(1, 32, 128) < 128   # B*H = 32 programs: split V
    assert kda.choose_block_v(64, 32, 128) == 128  # 2048 programs: no split
    assert kda.choose_block_v(1, 32, 128) >= 32


# ------------------------------------------------------------------------------------------------
# MLA: reference = per-sequence softmax over the first n positions, fp32


def _mla_reference(q, cache, lengths, scale, offset=0):
    B, H, D = q.shape
    out = torch.zeros(B, H, D)
    for b in range(B):
        n = int(lengths[b]) + offset
        if n <= 0:
            continue
        c = cache[b, :n].float()
        p = torch.softmax(q[b].float() @ c.T * scale, -1)
        out[b] = p @ c
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_splits", [1, 3, 7])
def test_mla_split_kv_vs_reference(dtype, num_splits):
    g = torch.Generator().manual_seed(num_splits)
    B, H, D, T = 5, 3, 24, 150
    q = torch.randn(B, H, D, generator=g).to(dtype)
    cache = torch.randn(B, T, D, generator=g).to(dtype)
    lengths = torch.tensor([150, 1, 0, 77, 129], dtype=torch.int32)  # full, single, empty, ragged
    out = mla.mla_decode(q, cache, lengths, scale=0.25, num_splits=num_splits)
    ref = _mla_reference(q, cache, lengths, 0.25)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, **_tol(dtype))
    assert torch.all(out[2] == 0)  # empty sequence -> zeros, no NaN


def test_mla_combine_split_over_channels_is_bitwise_the_same():
    """``combine_programs_per_head`` (batch-1 table): several programs per head, each merging a
    slice of the channels, give the one-program merge bit for bit; a count that does not divide
    the channel chunks is refused by name."""
    g = torch.Generator().manual_seed(4)
    B, H, D, T = 2, 2, 512, 300  # 4 chunks of 128 channels
    q = torch.randn(B, H, D, generator=g)
    cache = torch.randn(B, T, D, generator=g)
    lengths = torch.tensor([300, 131], dtype=torch.int32)
    one = mla.mla_decode(q, cache, lengths, scale=0.05, num_splits=3)
    for per_head in (2, 4):
        got = mla.mla_decode(q, cache, lengths, scale=0.05, num_splits=3, combine_programs_per_head=per_head)
        assert torch.equal(got, one), per_head
    torch.testing.assert_close(one, _mla_reference(q, cache, lengths, 0.05), **_tol(torch.float32))
    with pytest.raises(ValueError, match="combine_programs_per_head 3"):
        mla.mla_decode(q, cache, lengths, scale=0.05, num_splits=3, combine_programs_per_head=3)


def test_mla_length_offset_and_strided_cache():
    """DecodeState semantics: the step attends to positions <= lengths[b] (length_offset=1), on a
    per-layer view of the [n_mla, B, capacity, D] latent cache; auto split count > 1."""
    g = torch.Generator().manual_seed(0)
    n_mla, B, Hh, D, cap = 2, 2, 2, 16, 600
    latent = torch.randn(n_mla, B, cap, D, generator=g)
    q = torch.randn(B, Hh, D, generator=g)
    lengths = torch.tensor([520, 99])
    with trace.recording() as rec:
        out = mla.mla_decode(q, latent[1], lengths, scale=0.3, length_offset=1, max_len=521)
    ref = _mla_reference(q, latent[1], lengths, 0.3, offset=1)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    ev = rec.engaged("mla_decode")
    assert len(ev) == 1 and ev[0].detail == "triton_splitkv"
    assert ev[0].shape_dict()["num_splits"] > 1


def test_mla_choose_splits():
    long_b1 = mla.choose_splits(1, 2, 32768)
    assert long_b1 >= 32                                 # batch 1, long context: many splits
    assert mla.choose_splits(64, 2, 32768) < long_b1     # bigger batch: fewer splits
    assert mla.choose_splits(256, 4, 1024) == 1          # 1024 programs already: no split
    assert mla.choose_splits(1, 2, 100) == 1             # short: one split
    assert max(mla.choose_splits(b, 1, 10 ** 6) for b in (1, 2, 4)) <= 128


@pytest.mark.parametrize("max_len", [1, 64, 1088, 8256, 32768, 32832, 10 ** 6 + 7])
@pytest.mark.parametrize("batch,waves,max_splits", [(1, 1, 256), (1, 4, 128), (8, 4, 128), (64, 4, 128)])
def test_mla_split_plan_covers_every_position_in_whole_tiles(max_len, batch, waves, max_splits):
    ns, split_len = mla.split_plan(batch, 1, max_len, 64, min_chunk=128, max_splits=max_splits,
                                   waves=waves, min_tiles=2)
    assert split_len % 64 == 0 and split_len >= 128            # whole tiles, at least two
    assert (ns - 1) * split_len < max(max_len, 1) <= ns * split_len  # no empty split
    assert ns <= max(1, mla.choose_splits(batch, 1, max_len, min_chunk=128, max_splits=max_splits,
                                          waves=waves))


def test_mla_split_plan_fills_one_wave_at_batch_1_just_past_32k():
    """The step's capacity at 32k is 32 832 (context + 1 rounded up to 64). A power-of-two tile
    count per split gave 65 splits of 8 tiles there (half of the 132 SMs idle); whole tiles give
    the table's one wave: 129 splits of 4."""
    assert mla.split_plan(1, 1, 32832, 64, waves=1, max_splits=256, min_tiles=2) == (129, 256)
    assert mla.split_plan(1, 1, 32768, 64, min_tiles=2) == (128, 256)
    assert mla.split_plan(1, 1, 32768, 64, num_splits=3, min_tiles=2) == (3, 64 * 171)


@pytest.mark.parametrize("bad", [dict(waves=0), dict(waves=-1.0), dict(waves=float("nan")),
                                 dict(min_chunk=0), dict(max_splits=0)])
def test_mla_split_plan_names_a_bad_table_value(bad):
    with pytest.raises(ValueError, match="tuning table entry mla_decode"):
        mla.split_plan(1, 1, 32832, 64, **bad)


def test_mla_entry_masked_noise_floor():
    e = mla.kernel_entry("cpu")
    assert {s["batch"] for s in e.shapes} >= {1, 2, 4, 8, 16, 32, 64}
    assert "masked" in e.value_classes and e.dtypes == ["float16", "float32"]
    inp = e.make_inputs(e.shapes[-2], "masked", "float16", "cpu", 3)
    assert int(inp["lengths"].min()) == 0
    fast, std, ora = e.fast(**inp), e.standard(**inp), e.oracle(**inp)
    noise = (std.float() - ora).abs().max().item()
    err = (fast.float() - ora).abs().max().item()
    assert torch.isfinite(fast).all()
    assert err <= max(e.atol_floor["float16"], e.k * noise), (err, noise)
