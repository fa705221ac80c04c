"""Fused KDA verify step: T tokens per sequence (the last emitted token + T-1 drafts) in one launch.

Same math as ``kda_decode`` (conv + SiLU, L2 norm, lower-bounded decay, delta rule, o-norm and
sigmoid gate), but one program per (sequence b, head h, V-tile) walks the T tokens with its
fp32 state tile [K, BV] held in registers, so the state is read once and written once per token
it must keep. For ``commit`` (K3Model.commit: keep the first n tokens of each row) it writes what the
standard path's ``kda_verify`` leaves in its trail:

* ``states`` [B, T, H, K, V] fp32: the recurrent state after each token (``state`` itself ends
  after all T tokens, as in the standard path);
* ``window`` [B, 3d, W-1+T]: the conv inputs, oldest first (the W-1 cached ones, then the T new
  pre-conv q|k|v projections); the conv state after n tokens is ``window[..., n:n+W-1]``.

The conv state is only read (commit sets it from the window). Token t's conv window is gathered
straight from the cached state (positions < W-1) and the projection rows (b*T + t - ...), so no
shifted copy is kept in registers.

V split (grid (B, H, NV)): the delta rule is independent per V column, so each V-tile program
carries its own columns; q and k (whole K) are formed by every tile program, their window
channels stored by tile 0 only. The RMSNorm over V needs the whole head: with NV > 1 each
program stores its un-normalised o rows (and, low-rank, its gate rows) to an fp32 workspace and
takes a ticket (acq_rel atomic per (b, h), re-armed by the last program); the last to arrive
normalises and gates the head's T rows (as ``kda_decode``; the result does not depend on which
program is last). Without a split one program per (b, h) had to hold a [128, 128] fp32 tile
through T serial tokens: 0.34 ms per layer at batch 16, T = 4 on the H200 (perf notes, run Z).

Layouts as ``kda_decode``, with rows = B*T (row b*T + t is token t of sequence b): ``q, k, f``
[B*T, H*K], ``v, gate`` [B*T, H*V], ``b`` [B*T, H]; or ``low_rank`` = (fg_a [B*T, 2R], f_b, g_b).
The conv state length must be W-1 (K3's DecodeState).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from fastpath import trace

from . import _counters
from . import kda_decode as KD
from .entry import KernelSpec, default_dtypes

COMPONENT = "kda_decode"  # a variant of it in the trace ("triton_verify", with T)
VARIANT = "triton_verify"


@triton.jit
def _conv_token(x_ptr, sx, st_ptr, s_c, s_j, w_ptr, sw_c, sw_j, win_ptr, swin_c, swin_j,
                chan, mask, owner, t: tl.constexpr, W: tl.constexpr, WP: tl.constexpr):
    """silu(conv) fp32 [BC] of token t; ``x_ptr`` points at the sequence's first row. The
    ``owner`` of the channels also stores the token's input in the trail window (and, at t == 0,
    the cached inputs)."""
    j = tl.arange(0, WP)
    pos = t + j  # index into [cached W-1 | T new] inputs
    m = mask[:, None] & (j[None, :] < W)
    old = tl.load(st_ptr + chan[:, None] * s_c + pos[None, :] * s_j,
                  mask=m & (pos[None, :] < W - 1), other=0.0)
    new = tl.load(x_ptr + (pos[None, :] - (W - 1)) * sx + chan[:, None],
                  mask=m & (pos[None, :] >= W - 1), other=0.0)
    wt = tl.load(w_ptr + chan[:, None] * sw_c + j[None, :] * sw_j, mask=m, other=0.0)
    acc = tl.sum((old + new).to(tl.float32) * wt.to(tl.float32), 1)
    if t == 0:
        tl.store(win_ptr + chan[:, None] * swin_c + j[None, :] * swin_j, old,
                 mask=m & (j[None, :] < W - 1) & owner)
    xr = tl.load(x_ptr + t * sx + chan, mask=mask, other=0.0)
    tl.store(win_ptr + chan * swin_c + (W - 1 + t) * swin_j, xr, mask=mask & owner)
    return acc * tl.sigmoid(acc)


@triton.jit
def _gated_rmsnorm(o, nw, gt, V: tl.constexpr, eps_norm):
    """A token's output of one head: RMSNorm of o [V] (weight ``nw``, fp32) times sigmoid(gt)."""
    rstd = 1.0 / tl.sqrt(tl.sum(o * o, 0) / V + eps_norm)
    return o * rstd * nw * tl.sigmoid(gt)


@triton.jit
def kda_verify_kernel(
    xq, xk, xv, xf, xb, xg, sxq, sxk, sxv, sxf, sxb, sxg,
    cq, ck, cv, scq_b, scq_c, scq_j, sck_b, sck_c, sck_j, scv_b, scv_c, scv_j,
    wq, wk, wv, swq_c, swq_j, swk_c, swk_j, swv_c, swv_j,
    A_log, dt_bias, S, sS_b, sS_h, sS_k, sS_v,
    TS, sT_b, sT_t, sT_h, sT_k, sT_v,
    WIN, sw_b, sw_c, sw_j,
    norm_w, out, sout, o_ws, g_ws, counter,
    FA, sfa, FB, sfb, GB, sgb,
    scale, eps_l2, eps_norm, lower_bound,
    T: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BVF: tl.constexpr, NV: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
    LOWRANK: tl.constexpr, R: tl.constexpr, RP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    iv = tl.program_id(2)
    ok = tl.arange(0, BK)
    mk = ok < K
    ov = iv * BV + tl.arange(0, BV)
    mv = ov < V
    first = iv == 0  # the tile that stores the q/k window channels
    chan_k = h * K + ok
    chan_v = h * V + ov
    d = H * K  # window channels: q | k | v
    win = WIN + b * sw_b
    row0 = b * T  # the sequence's first row

    if LOWRANK:  # the gate weights are loaded once for all T tokens
        rr = tl.arange(0, RP)
        mr = rr < R
        w_f, w_g = KD._low_rank_weights(FB, sfb, GB, sgb, chan_k, chan_v, mk, mv, rr, mr)
    a = tl.exp(tl.load(A_log + h).to(tl.float32))
    dtb = tl.load(dt_bias + chan_k, mask=mk, other=0.0).to(tl.float32)
    nw = tl.load(norm_w + ov, mask=mv, other=0.0).to(tl.float32)

    p_s = S + b * sS_b + h * sS_h + ok[:, None] * sS_k + ov[None, :] * sS_v
    m_s = mk[:, None] & mv[None, :]
    s = tl.load(p_s, mask=m_s, other=0.0)
    for t in tl.static_range(T):  # the state stays in registers across the tokens
        row = row0 + t
        q = _conv_token(xq + row0 * sxq, sxq, cq + b * scq_b, scq_c, scq_j, wq, swq_c, swq_j,
                        win, sw_c, sw_j, chan_k, mk, first, t, W, WP)
        k = _conv_token(xk + row0 * sxk, sxk, ck + b * sck_b, sck_c, sck_j, wk, swk_c, swk_j,
                        win + d * sw_c, sw_c, sw_j, chan_k, mk, first, t, W, WP)
        v = _conv_token(xv + row0 * sxv, sxv, cv + b * scv_b, scv_c, scv_j, wv, swv_c, swv_j,
                        win + 2 * d * sw_c, sw_c, sw_j, chan_v, mv, True, t, W, WP)
        q = q / tl.sqrt(tl.sum(q * q, 0) + eps_l2) * scale
        k = k / tl.sqrt(tl.sum(k * k, 0) + eps_l2)
        if LOWRANK:  # rounded to the working dtype like the standard path's projections
            a_f = tl.load(FA + row * sfa + rr, mask=mr, other=0.0).to(tl.float32)
            a_g = tl.load(FA + row * sfa + R + rr, mask=mr, other=0.0).to(tl.float32)
            f = KD._low_rank_gate(w_f, a_f, FA.dtype.element_ty)
            gt = KD._low_rank_gate(w_g, a_g, FA.dtype.element_ty)
        else:
            f = tl.load(xf + row * sxf + chan_k, mask=mk, other=0.0).to(tl.float32)
            gt = tl.load(xg + row * sxg + chan_v, mask=mv, other=0.0).to(tl.float32)
        g = lower_bound * tl.sigmoid(a * (f + dtb))
        beta = tl.sigmoid(tl.load(xb + row * sxb + h).to(tl.float32))

        s, o = KD._delta_rule(s, q, k, v, g, beta)
        tl.store(TS + b * sT_b + t * sT_t + h * sT_h + ok[:, None] * sT_k + ov[None, :] * sT_v, s, mask=m_s)

        if NV == 1:
            y = _gated_rmsnorm(tl.where(mv, o, 0.0), nw, gt, V, eps_norm)
            tl.store(out + row * sout + chan_v, y.to(out.dtype.element_ty), mask=mv)
        else:  # the head's last tile to arrive normalises (below)
            tl.store(o_ws + (row * H + h) * V + ov, o, mask=mv)
            tl.store(g_ws + (row * H + h) * V + ov, gt, mask=mv)
    tl.store(p_s, s, mask=m_s)
    if NV > 1:
        tl.debug_barrier()  # every o / gate row of this program is stored before its ticket
        arrived = tl.atomic_add(counter + b * H + h, 1, sem="acq_rel")
        if arrived == NV - 1:
            of = tl.arange(0, BVF)
            mf = of < V
            nwf = tl.load(norm_w + of, mask=mf, other=0.0).to(tl.float32)
            for t in tl.static_range(T):
                ws = ((row0 + t) * H + h) * V + of
                oo = tl.load(o_ws + ws, mask=mf, other=0.0, cache_modifier=".cg")
                gg = tl.load(g_ws + ws, mask=mf, other=0.0, cache_modifier=".cg")
                y = _gated_rmsnorm(oo, nwf, gg, V, eps_norm)
                tl.store(out + (row0 + t) * sout + h * V + of, y.to(out.dtype.element_ty), mask=mf)
            tl.atomic_xchg(counter + b * H + h, 0)


def kda_verify(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor | None, b: torch.Tensor,
    gate: torch.Tensor | None,
    conv_q: torch.Tensor, conv_k: torch.Tensor, conv_v: torch.Tensor,
    conv_wq: torch.Tensor, conv_wk: torch.Tensor, conv_wv: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, norm_weight: torch.Tensor,
    *, tokens: int, num_heads: int, head_k: int, head_v: int, states: torch.Tensor, window: torch.Tensor,
    scale: float | None = None, eps_l2: float = 1e-6, eps_norm: float = 1e-6,
    lower_bound: float = KD.LOWER_BOUND, out: torch.Tensor | None = None,
    low_rank: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, num_warps: int | None = None,
    block_v: int | None = None,
) -> torch.Tensor:
    """One verify step of ``tokens`` = T tokens per sequence (module docstring). Updates ``state``
    (to after all T tokens), fills ``states`` [B, T, H, K, V] and ``window`` [B, 3d, W-1+T];
    returns ``out`` [B*T, H*V]. ``block_v``: the V-tile width (default ``choose_block_v``)."""
    T, H, K, V = tokens, num_heads, head_k, head_v
    B = state.shape[0]
    M = B * T
    assert state.dtype == torch.float32 and tuple(state.shape) == (B, H, K, V), state.shape
    assert tuple(states.shape) == (B, T, H, K, V) and states.dtype == torch.float32
    W = conv_wq.shape[-1]
    assert conv_q.shape[-1] == W - 1, "kda_verify: the conv state must hold W-1 inputs"
    assert tuple(window.shape) == (B, H * (2 * K + V), W - 1 + T), window.shape
    R = 0
    if low_rank is not None:
        assert f is None and gate is None, "kda_verify: pass f and gate, or low_rank, not both"
        fg_a, f_b, g_b = low_rank
        R = f_b.shape[1]
        assert fg_a.shape == (M, 2 * R) and fg_a.stride(-1) == 1, fg_a.shape
        f = gate = fg_a  # not read
    else:
        fg_a = f_b = g_b = v  # not read
    for t_, n in ((q, H * K), (k, H * K), (v, H * V), (b, H), (f, None), (gate, None)):
        assert t_.shape[0] == M and t_.stride(-1) == 1 and (n is None or t_.shape[1] == n), (t_.shape, n)
    if out is None:
        out = torch.empty((M, H * V), dtype=v.dtype, device=v.device)
    BK, BVF = triton.next_power_of_2(K), triton.next_power_of_2(V)
    BV = min(block_v or choose_block_v(B, H, V, T), BVF)
    NV = triton.cdiv(V, BV)
    if NV > 1:
        o_ws = torch.empty((M, H, V), dtype=torch.float32, device=v.device)
        g_ws = torch.empty_like(o_ws)
        counter = _counters.zeroed("kda_verify", v.device, B * H)
    else:
        o_ws = g_ws = counter = state  # not read
    trace.engaged(COMPONENT, VARIANT + ("_low_rank" if low_rank is not None else ""),
                  batch=B, tokens=T, heads=H, head_k=K, head_v=V, block_v=BV)
    kda_verify_kernel[(B, H, NV)](
        q, k, v, f, b, gate, q.stride(0), k.stride(0), v.stride(0), f.stride(0), b.stride(0), gate.stride(0),
        conv_q, conv_k, conv_v, *conv_q.stride(), *conv_k.stride(), *conv_v.stride(),
        conv_wq, conv_wk, conv_wv, *conv_wq.stride(), *conv_wk.stride(), *conv_wv.stride(),
        A_log, dt_bias, state, *state.stride(), states, *states.stride(),
        window, *window.stride(), norm_weight, out, out.stride(0), o_ws, g_ws, counter,
        fg_a, fg_a.stride(0), f_b, f_b.stride(0), g_b, g_b.stride(0),
        float(scale if scale is not None else K ** -0.5), float(eps_l2), float(eps_norm), float(lower_bound),
        T=T, H=H, K=K, V=V, BK=BK, BV=BV, BVF=BVF, NV=NV, W=W, WP=triton.next_power_of_2(W),
        LOWRANK=low_rank is not None, R=R, RP=triton.next_power_of_2(max(R, 1)),
        num_warps=num_warps or (4 if BK * BV <= 8192 else 8),
    )
    return out


def choose_block_v(batch: int, heads: int, v_dim: int, tokens: int) -> int:
    """V-tile width, from the H200 sweep of lab/gpu_verify_kernels.py (perf notes, run Z; K3-mini
    heads, V = 128): T <= 4 tokens, 4 tiles at every batch (1.4-2.1x the unsplit kernel); T = 8,
    fewer, wider tiles as the batch grows (8 tiles at B*H = 32, 4 at 64, 2 from 128 on), since
    each tile program re-forms q and k for every token and the head's last program normalises T
    rows. Tiles stay >= 16 columns."""
    if tokens <= 4:
        nv = 4
    else:
        bh = batch * heads
        nv = 2 if bh >= 128 else 4 if bh >= 64 else 8
    while nv > 1 and v_dim // nv < 16:
        nv //= 2
    return triton.next_power_of_2(-(-v_dim // nv))


# ----------------------------------------------------------------------------------------------
# references: T consecutive kda_decode steps (oracle / standard), keeping every state

def _as_steps(inputs: dict) -> dict:
    """Verify inputs (rows b*T + t) → kda_decode's multi-step inputs ([T, B, ...])."""
    T = inputs["tokens"]
    out = {k: v for k, v in inputs.items() if k not in ("tokens",)}
    B = inputs["state"].shape[0]
    for key in KD._STEP_KEYS:
        if inputs.get(key) is not None:
            out[key] = inputs[key].unflatten(0, (B, T)).transpose(0, 1)
    if inputs.get("low_rank") is not None:
        fg_a, f_b, g_b = inputs["low_rank"]
        out["low_rank"] = (fg_a.unflatten(0, (B, T)).transpose(0, 1), f_b, g_b)
    return out


def _reference(inputs: dict, dtype: torch.dtype) -> tuple:
    """(out [B*T, H*V], states [B, T, H, K, V], window) by T standard decode steps."""
    T, B = inputs["tokens"], inputs["state"].shape[0]
    args = {k: v for k, v in _as_steps(inputs).items() if v is not None}
    use_fla = dtype != torch.float32 and inputs["v"].is_cuda
    outs, states = [], []
    for t in range(T):
        step = dict(args)
        for key in KD._STEP_KEYS:
            if key in args:
                step[key] = args[key][t]
        if "low_rank" in args:
            step["low_rank"] = (args["low_rank"][0][t], *args["low_rank"][1:])
        y, S, cq, ck, cv = KD._reference(step, dtype=dtype, use_fla=use_fla)
        args["state"], args["conv_q"], args["conv_k"], args["conv_v"] = S, cq, ck, cv
        outs.append(y)
        states.append(S)
    out = torch.stack(outs, 1).flatten(0, 1)
    xs = torch.cat([inputs["q"], inputs["k"], inputs["v"]], -1).unflatten(0, (B, T)).transpose(1, 2)
    conv = torch.cat([inputs["conv_q"], inputs["conv_k"], inputs["conv_v"]], 1)
    return out, torch.stack(states, 1), torch.cat([conv, xs.to(conv.dtype)], -1)


def oracle(**inputs) -> tuple:
    out, states, window = _reference(inputs, torch.float32)
    return out.float(), states, window


def standard(**inputs) -> tuple:
    return _reference(inputs, inputs["v"].dtype)


def call_args(inputs: dict) -> tuple[list, dict]:
    """``kda_verify``'s (positional, keyword) arguments for an input set of ``make_inputs``, with
    a fresh copy of the state and fresh ``states`` / ``window`` outputs (keywords) to write."""
    args = dict(inputs)
    B, T = inputs["state"].shape[0], inputs["tokens"]
    H, K, V = inputs["num_heads"], inputs["head_k"], inputs["head_v"]
    W = inputs["conv_wq"].shape[-1]
    args["state"] = inputs["state"].clone()
    args["states"] = torch.empty(B, T, H, K, V, dtype=torch.float32, device=inputs["v"].device)
    args["window"] = torch.empty(B, H * (2 * K + V), W - 1 + T, dtype=inputs["conv_q"].dtype,
                                 device=inputs["v"].device)
    return [args.pop(n, None) for n in KD.POSITIONAL], args


def fast(**inputs) -> tuple:
    pos, args = call_args(inputs)
    out = kda_verify(*pos, **args)
    return out, args["states"], args["window"]


def make_inputs(shape: dict, value_class: str = "normal", dtype: Any = torch.float32,
                device: Any = "cpu", seed: int = 0) -> dict:
    """kda_decode's inputs for ``shape["tokens"]`` = T tokens per sequence, as rows b*T + t."""
    T = int(shape["tokens"])
    base = {k: v for k, v in shape.items() if k not in ("tokens", "block_v")}
    inp = KD.make_inputs(dict(base, steps=T), value_class, dtype, device, seed)
    B = shape["batch"]
    del inp["steps"]
    for key in KD._STEP_KEYS:
        if key in inp:
            inp[key] = inp[key].transpose(0, 1).flatten(0, 1).contiguous()  # [T, B, n] → [B*T, n]
    if "low_rank" in inp:
        fg_a, f_b, g_b = inp["low_rank"]
        inp["low_rank"] = (fg_a.transpose(0, 1).flatten(0, 1).contiguous(), f_b, g_b)
    inp["tokens"] = T
    if shape.get("block_v"):
        inp["block_v"] = shape["block_v"]
    assert inp["q"].shape[0] == B * T
    return inp


def kernel_entry(device: Any = None) -> KernelSpec:
    """``kda_verify``: T = 4 and 8 tokens per sequence (drafts 3 and 7), batch up to 16, at the
    default V tile and at others (the whole V, a tile with a tail)."""
    on_cuda = str(device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if on_cuda:
        hk = dict(heads=32, head_k=128, head_v=128)
        shapes = [dict(batch=bs, tokens=t, **hk) for t in (4, 8) for bs in (1, 2, 4, 8, 16)]
        shapes += [dict(batch=2, tokens=8, rank=128, **hk), dict(batch=3, tokens=3, heads=3, head_k=96, head_v=80),
                   dict(batch=8, tokens=4, block_v=128, **hk), dict(batch=4, tokens=8, rank=128, block_v=64, **hk),
                   dict(batch=3, tokens=3, heads=3, head_k=96, head_v=80, block_v=32)]
    else:  # Triton interpreter: small heads
        hk = dict(heads=2, head_k=16, head_v=16)
        shapes = [dict(batch=bs, tokens=t, **hk) for t in (4, 8) for bs in (1, 3, 16)]
        shapes += [dict(batch=2, tokens=4, rank=12, **hk), dict(batch=2, tokens=3, heads=3, head_k=12, head_v=20),
                   dict(batch=3, tokens=4, block_v=8, **hk), dict(batch=2, tokens=4, rank=12, block_v=4, **hk),
                   dict(batch=2, tokens=3, heads=3, head_k=12, head_v=20, block_v=8)]
    return KernelSpec(name="kda_verify", component=COMPONENT, fast=fast, standard=standard, oracle=oracle,
                      make_inputs=make_inputs, shapes=shapes, value_classes=["normal", "large", "near_zero"],
                      dtypes=default_dtypes(device), k=2.0, deterministic=True,
                      kernel_patterns=[r"kda_verify_kernel"],
                      verify_variants=[VARIANT, VARIANT + "_low_rank"])
