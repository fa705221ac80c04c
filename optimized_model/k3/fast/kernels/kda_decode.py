"""Fused KDA (Kimi Delta Attention) decode step for a batch of sequences (one new token each).

One Triton kernel does, per (sequence b, head h, V-tile):

1. short-conv step for q, k, v (depthwise causal conv, kernel W = 4): read the conv window
   (the cached W-1 previous inputs + the new input), write the shifted conv state back,
   apply SiLU;
2. L2 normalisation of q and k over the head dim K (``x / sqrt(sum x^2 + eps)``, as fla's
   ``use_qk_l2norm_in_kernel``), q scaled by ``scale`` (default ``K ** -0.5``);
3. per-channel decay gate with the lower bound ``g = lower_bound * sigmoid(exp(A_log[h]) *
   (f + dt_bias[h, :]))`` (``lower_bound`` = -5) and ``beta = sigmoid(b)``;
4. the delta rule on the fp32 recurrent state, read once and written once (in place)::

       S <- Diag(e^g) S ;  u = beta * (v - S^T k) ;  S <- S + k u^T ;  o = scale * S^T q

   which is ``S <- (I - beta k k^T) Diag(e^g) S + beta k v^T`` (= fla ``naive_recurrent_kda``);
5. per-head RMSNorm of o over V (weight ``norm_weight[V]``) and the sigmoid output gate:
   ``out = rmsnorm(o) * w * sigmoid(gate)`` (fla ``FusedRMSNormGated`` with sigmoid).

Grid: (B, H, NV) with NV = V / BV V-tiles. Stages 4 is per tile; q/k (stages 1-3) are
computed redundantly by each V-tile program (2·K·W loads, cheap). Two things need the whole
head: the q/k conv-state write-back (every V-tile program must have *read* the old window
first) and the RMSNorm over all of V. With NV > 1 they are done by the *last* program of the
(b, h) group to arrive (an acq_rel atomic counter per (b, h), reset by that program, so the
counter buffer is reusable and CUDA-graph safe): each program stores its un-normalised o tile
to an fp32 workspace, bumps the counter, and the last one writes the q/k conv state and
normalises + gates the full row. The result does not depend on which program is last
(deterministic). With NV == 1 no counter is used.

Layouts (all tensors on one device; "row stride" = any stride of dim 0, inner dims contiguous):

* ``q, k``: [B, H*K] projected pre-conv inputs (views of the fused projection output are fine);
  ``v``: [B, H*V]; ``f`` (gate pre-activation): [B, H*K]; ``b`` (beta pre-activation): [B, H];
  ``gate`` (output-gate pre-activation): [B, H*V]. Working dtype (fp16 / bf16 / fp32).
* ``conv_q, conv_k``: [B, H*K, SL]; ``conv_v``: [B, H*V, SL], any strides. SL (the conv state
  length) is W-1 (the previous W-1 inputs, oldest first) or W (fla ``ShortConvolution`` cache;
  the oldest entry is then not used). Updated in place: shift by one, append the new input.
* ``conv_wq, conv_wk``: [H*K, W]; ``conv_wv``: [H*V, W] (depthwise weights, no bias).
* ``A_log``: [H]; ``dt_bias``: [H*K]; ``norm_weight``: [V] (shared by heads).
* ``state``: fp32 [B, H, K, V] (fla's K-first layout), updated in place.
* or, instead of ``f`` and ``gate`` (``low_rank``): ``fg_a`` [B, 2R] = [f_a(x) | g_a(x)] and the
  weights ``f_b`` [H*K, R], ``g_b`` [H*V, R]; each program forms its head's f and its tile's
  gate (rounded to the working dtype, as the projections' outputs are).
* returns ``out`` [B, H*V] in the dtype of ``v`` (ready for o_proj).

Only H == HV (no grouped-value heads).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import triton
import triton.language as tl

from fastpath import trace

from . import _counters, pdl
from ...weights import KDA_A_LOG_INIT, KDA_DT_BIAS_INIT
from .entry import KernelSpec, default_dtypes
from .pdl import pdl_enter

COMPONENT = "kda_decode"
LOWER_BOUND = -5.0


@triton.jit
def _conv_silu(x_ptr, st_ptr, s_c, s_j, w_ptr, sw_c, sw_j, chan, mask,
               W: tl.constexpr, SL: tl.constexpr, SLP: tl.constexpr):
    """Depthwise causal conv over [old state window, x] + SiLU for channels ``chan`` [BC].

    Returns (silu(conv) fp32 [BC], the shifted conv state [BC, SLP] to store later:
    new[:, i] = old[:, i + 1] for i < SL - 1, new[:, SL - 1] = x). Everything is loaded here,
    before any store, so the caller can store after a barrier (threads holding replicated
    elements must not see a half-shifted state)."""
    oj = tl.arange(0, SLP)
    m_old = mask[:, None] & (oj[None, :] < SL)
    old = tl.load(st_ptr + chan[:, None] * s_c + oj[None, :] * s_j, mask=m_old, other=0.0)
    tap = oj - (SL - (W - 1))  # weight tap of state column j (the oldest SL-(W-1) unused)
    m_w = m_old & (tap[None, :] >= 0)
    wt = tl.load(w_ptr + chan[:, None] * sw_c + tap[None, :] * sw_j, mask=m_w, other=0.0)
    xr = tl.load(x_ptr + chan, mask=mask, other=0.0)
    w_x = tl.load(w_ptr + chan * sw_c + (W - 1) * sw_j, mask=mask, other=0.0)
    acc = tl.sum(old.to(tl.float32) * wt.to(tl.float32), 1) + xr.to(tl.float32) * w_x.to(tl.float32)
    m_nxt = mask[:, None] & (oj[None, :] < SL - 1)
    nxt = tl.load(st_ptr + chan[:, None] * s_c + (oj[None, :] + 1) * s_j, mask=m_nxt, other=0.0)
    new = tl.where(oj[None, :] == SL - 1, xr[:, None].to(nxt.dtype), nxt)
    return acc * tl.sigmoid(acc), new


@triton.jit
def _conv_store(st_ptr, s_c, s_j, chan, mask, new, SL: tl.constexpr, SLP: tl.constexpr):
    oj = tl.arange(0, SLP)
    tl.store(st_ptr + chan[:, None] * s_c + oj[None, :] * s_j, new,
             mask=mask[:, None] & (oj[None, :] < SL))


@triton.jit
def _low_rank_weights(FB, sfb, GB, sgb, chan_k, chan_v, mk, mv, rr, mr):
    """The low-rank gates' second halves for these channels: f_b rows [BK, RP], g_b rows [BV, RP]."""
    w_f = tl.load(FB + chan_k[:, None] * sfb + rr[None, :], mask=mk[:, None] & mr[None, :], other=0.0)
    w_g = tl.load(GB + chan_v[:, None] * sgb + rr[None, :], mask=mv[:, None] & mr[None, :], other=0.0)
    return w_f, w_g


@triton.jit
def _low_rank_gate(w, a, dtype):
    """One low-rank gate, w a (w [C, RP], a [RP] fp32), rounded to the working ``dtype`` like the
    standard path's projection output; fp32 [C]."""
    return tl.sum(w.to(tl.float32) * a[None, :], 1).to(dtype).to(tl.float32)


@triton.jit
def _delta_rule(s, q, k, v, g, beta):
    """One token of the gated delta rule on the fp32 state tile s [BK, BV]: decay by e^g, then
    s += k (beta (v - sᵀk))ᵀ; returns (the new state, its readout sᵀq [BV])."""
    s = s * tl.exp(g)[:, None]
    u = (v - tl.sum(s * k[:, None], 0)) * beta
    s = s + k[:, None] * u[None, :]
    return s, tl.sum(s * q[:, None], 0)


@triton.jit
def kda_decode_fused_kernel(
    xq, xk, xv, xf, xb, xg, sxq, sxk, sxv, sxf, sxb, sxg,
    cq, ck, cv,
    scq_b, scq_c, scq_j, sck_b, sck_c, sck_j, scv_b, scv_c, scv_j,
    wq, wk, wv, swq_c, swq_j, swk_c, swk_j, swv_c, swv_j,
    A_log, dt_bias, S, sS_b, sS_h, sS_k, sS_v,
    norm_w, out, sout, o_ws, counter,
    FA, sfa, FB, sfb, GB, sgb, g_ws,
    scale, eps_l2, eps_norm, lower_bound,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BVF: tl.constexpr, NV: tl.constexpr,
    W: tl.constexpr, SL: tl.constexpr, SLP: tl.constexpr,
    LOWRANK: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, EARLY_W: tl.constexpr,
    PDL: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    iv = tl.program_id(2)

    ok = tl.arange(0, BK)
    mk = ok < K
    ov = iv * BV + tl.arange(0, BV)
    mv = ov < V
    chan_k = h * K + ok
    chan_v = h * V + ov
    pcq = cq + b * scq_b
    pck = ck + b * sck_b
    pcv = cv + b * scv_b

    if LOWRANK:
        # the low-rank gate projections' second halves: this head's f_b rows (K channels) and
        # this tile's g_b rows (V channels); a separate gemv launch before this kernel cost
        # ~4.6 us per KDA layer at batch 1 (perf notes, run M). Weights are never written, so
        # with EARLY_W they load before the wait (under PDL, while the in-projection ends).
        rr = tl.arange(0, RP)
        mr = rr < R
        if EARLY_W:
            w_f, w_g = _low_rank_weights(FB, sfb, GB, sgb, chan_k, chan_v, mk, mv, rr, mr)
    # Nothing else is loaded before the wait: loading the state tile early (under PDL only) made
    # the compiler order the delta rule's arithmetic differently, and the step's numbers then
    # depended on the launch mode (perf notes, run L); lab/ptx_diff.py --pdl checks it.
    pdl_enter(PDL)
    if LOWRANK and not EARLY_W:
        w_f, w_g = _low_rank_weights(FB, sfb, GB, sgb, chan_k, chan_v, mk, mv, rr, mr)

    # 1-2. conv + SiLU (+ the shifted conv states, kept in registers), L2 norm of q and k
    q, new_q = _conv_silu(xq + b * sxq, pcq, scq_c, scq_j, wq, swq_c, swq_j, chan_k, mk, W, SL, SLP)
    k, new_k = _conv_silu(xk + b * sxk, pck, sck_c, sck_j, wk, swk_c, swk_j, chan_k, mk, W, SL, SLP)
    v, new_v = _conv_silu(xv + b * sxv, pcv, scv_c, scv_j, wv, swv_c, swv_j, chan_v, mv, W, SL, SLP)
    q = q / tl.sqrt(tl.sum(q * q, 0) + eps_l2) * scale
    k = k / tl.sqrt(tl.sum(k * k, 0) + eps_l2)

    # 3. gate and beta
    if LOWRANK:
        # f = f_a(x) f_bᵀ, gate = g_a(x) g_bᵀ, rounded to the working dtype like the standard
        # path's projection outputs (FA = [f_a(x) | g_a(x)], written by the in-projection)
        a_f = tl.load(FA + b * sfa + rr, mask=mr, other=0.0).to(tl.float32)
        a_g = tl.load(FA + b * sfa + R + rr, mask=mr, other=0.0).to(tl.float32)
        f = _low_rank_gate(w_f, a_f, FA.dtype.element_ty)
        gate_v = _low_rank_gate(w_g, a_g, FA.dtype.element_ty)
    else:
        f = tl.load(xf + b * sxf + chan_k, mask=mk, other=0.0).to(tl.float32)
    f += tl.load(dt_bias + chan_k, mask=mk, other=0.0).to(tl.float32)
    a = tl.exp(tl.load(A_log + h).to(tl.float32))
    g = lower_bound * tl.sigmoid(a * f)
    beta = tl.sigmoid(tl.load(xb + b * sxb + h).to(tl.float32))

    # 4. delta rule on the fp32 state tile [BK, BV]
    p_s = S + b * sS_b + h * sS_h + ok[:, None] * sS_k + ov[None, :] * sS_v
    m_s = mk[:, None] & mv[None, :]
    s = tl.load(p_s, mask=m_s, other=0.0)
    s, o = _delta_rule(s, q, k, v, g, beta)

    row = (b * H + h) * V
    if NV > 1:
        tl.store(o_ws + row + ov, o, mask=mv)
        if LOWRANK:  # the last program gates the whole row
            tl.store(g_ws + row + ov, gate_v, mask=mv)
    # every load of this CTA is done and its o tile is stored before any in-place store below
    # and before the counter's release
    tl.debug_barrier()
    tl.store(p_s, s, mask=m_s)
    _conv_store(pcv, scv_c, scv_j, chan_v, mv, new_v, SL, SLP)  # this program owns these v channels

    # 5. q/k conv state + RMSNorm over V + sigmoid gate (whole head); kda_verify's
    # _gated_rmsnorm computes the same, but here the weight and gate loads follow the norm
    # (loaded before it, this kernel's PTX changed: lab.ptx_diff)
    if NV == 1:
        _conv_store(pcq, scq_c, scq_j, chan_k, mk, new_q, SL, SLP)
        _conv_store(pck, sck_c, sck_j, chan_k, mk, new_k, SL, SLP)
        o = tl.where(mv, o, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(o * o, 0) / V + eps_norm)
        y = o * rstd * tl.load(norm_w + ov, mask=mv, other=0.0).to(tl.float32)
        if LOWRANK:
            gt = gate_v
        else:
            gt = tl.load(xg + b * sxg + chan_v, mask=mv, other=0.0).to(tl.float32)
        y = y * tl.sigmoid(gt)
        tl.store(out + b * sout + chan_v, y.to(out.dtype.element_ty), mask=mv)
    else:
        arrived = tl.atomic_add(counter + b * H + h, 1, sem="acq_rel")
        if arrived == NV - 1:
            # every program of this (b, h) has read the old q/k window and stored its o tile
            _conv_store(pcq, scq_c, scq_j, chan_k, mk, new_q, SL, SLP)
            _conv_store(pck, sck_c, sck_j, chan_k, mk, new_k, SL, SLP)
            of = tl.arange(0, BVF)
            mf = of < V
            oo = tl.load(o_ws + row + of, mask=mf, other=0.0, cache_modifier=".cg")
            rstd = 1.0 / tl.sqrt(tl.sum(oo * oo, 0) / V + eps_norm)
            y = oo * rstd * tl.load(norm_w + of, mask=mf, other=0.0).to(tl.float32)
            if LOWRANK:
                gt = tl.load(g_ws + row + of, mask=mf, other=0.0, cache_modifier=".cg")
            else:
                gt = tl.load(xg + b * sxg + h * V + of, mask=mf, other=0.0).to(tl.float32)
            y = y * tl.sigmoid(gt)
            tl.store(out + b * sout + h * V + of, y.to(out.dtype.element_ty), mask=mf)
            tl.atomic_xchg(counter + b * H + h, 0)


def _counter(device: torch.device, n: int) -> torch.Tensor:
    """KDA decode's zeroed per-(sequence, head) counters (the kernel resets them)."""
    return _counters.zeroed("kda_decode", device, n, min_size=1024)


def choose_block_v(batch: int, heads: int, v_dim: int, sm_count: int | None = None) -> int:
    """V-tile width: split V so that B*H*NV programs fill the GPU (>= 2 waves of SMs) at small
    batch, no split at large batch (each split re-reads q/k and adds a workspace round trip)."""
    if sm_count is None:
        sm_count = 132
    target = 2 * sm_count
    nv = 1
    while batch * heads * nv < target and v_dim // (nv * 2) >= 32:
        nv *= 2
    return triton.next_power_of_2(math.ceil(v_dim / nv))


@functools.lru_cache(maxsize=None)
def _sm_count_idx(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sm_count(device: torch.device) -> int | None:
    if device.type == "cuda":
        return _sm_count_idx(device.index if device.index is not None else torch.cuda.current_device())
    return None


def kda_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor | None, b: torch.Tensor,
    gate: torch.Tensor | None,
    conv_q: torch.Tensor, conv_k: torch.Tensor, conv_v: torch.Tensor,
    conv_wq: torch.Tensor, conv_wk: torch.Tensor, conv_wv: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, norm_weight: torch.Tensor,
    *, num_heads: int, head_k: int, head_v: int, scale: float | None = None,
    eps_l2: float = 1e-6, eps_norm: float = 1e-6, lower_bound: float = LOWER_BOUND,
    block_v: int | None = None, num_warps: int | None = None, out: torch.Tensor | None = None,
    low_rank: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    early_weights: bool = False,
) -> torch.Tensor:
    """One fused KDA decode step (layouts in the module docstring). Updates ``conv_q``,
    ``conv_k``, ``conv_v`` and ``state`` in place and returns ``out`` [B, H*V].

    ``low_rank = (fg_a, f_b, g_b)``: the kernel forms ``f`` and ``gate`` itself (pass them as
    None) from ``fg_a`` [B, 2R] = [f_a(x) | g_a(x)] and the weights ``f_b`` [H*K, R], ``g_b``
    [H*V, R] — one launch fewer per layer; ``early_weights``: their weights load before the
    programmatic-launch wait."""
    B = q.shape[0]
    H, K, V = num_heads, head_k, head_v
    assert state.dtype == torch.float32 and tuple(state.shape) == (B, H, K, V), state.shape
    R = 0
    if low_rank is not None:
        if f is not None or gate is not None:
            raise ValueError("kda_decode: pass f and gate, or low_rank, not both")
        fg_a, f_b, g_b = low_rank
        R = f_b.shape[1]
        assert fg_a.shape == (B, 2 * R) and fg_a.stride(-1) == 1, fg_a.shape
        assert f_b.shape == (H * K, R) and g_b.shape == (H * V, R), (f_b.shape, g_b.shape)
        assert f_b.stride(1) == 1 and g_b.stride(1) == 1
        f = gate = fg_a  # not read
    for t, n in ((q, H * K), (k, H * K), (v, H * V), (b, H)) + (
            () if low_rank else ((f, H * K), (gate, H * V))):
        assert t.shape == (B, n) and t.stride(-1) == 1, (t.shape, n)
    W = conv_wq.shape[-1]
    SL = conv_q.shape[-1]
    assert SL in (W - 1, W) and conv_k.shape[-1] == SL and conv_v.shape[-1] == SL
    assert conv_q.shape[:2] == (B, H * K) and conv_v.shape[:2] == (B, H * V)
    if scale is None:
        scale = K ** -0.5
    BV = block_v or choose_block_v(B, H, V, _sm_count(q.device))
    BV = min(BV, triton.next_power_of_2(V))
    NV = triton.cdiv(V, BV)
    if out is None:
        out = torch.empty((B, H * V), dtype=v.dtype, device=v.device)
    if NV > 1:
        o_ws = torch.empty((B, H, V), dtype=torch.float32, device=v.device)
        counter = _counter(v.device, B * H)
    else:
        o_ws = counter = state  # unused
    g_ws = torch.empty_like(o_ws) if low_rank is not None and NV > 1 else o_ws
    fg_a, f_b, g_b = low_rank if low_rank is not None else (v, v, v)  # unused without low_rank
    trace.engaged(COMPONENT, "triton_fused_low_rank" if low_rank is not None else "triton_fused",
                  batch=B, heads=H, head_k=K, head_v=V, block_v=BV)
    kda_decode_fused_kernel[(B, H, NV)](
        q, k, v, f, b, gate, q.stride(0), k.stride(0), v.stride(0), f.stride(0), b.stride(0),
        gate.stride(0),
        conv_q, conv_k, conv_v, *conv_q.stride(), *conv_k.stride(), *conv_v.stride(),
        conv_wq, conv_wk, conv_wv, *conv_wq.stride(), *conv_wk.stride(), *conv_wv.stride(),
        A_log, dt_bias, state, *state.stride(),
        norm_weight, out, out.stride(0), o_ws, counter,
        fg_a, fg_a.stride(0), f_b, f_b.stride(0), g_b, g_b.stride(0), g_ws,
        float(scale), float(eps_l2), float(eps_norm), float(lower_bound),
        H=H, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV, BVF=triton.next_power_of_2(V),
        NV=NV, W=W, SL=SL, SLP=triton.next_power_of_2(SL),
        LOWRANK=low_rank is not None, R=R, RP=triton.next_power_of_2(max(R, 1)),
        EARLY_W=bool(early_weights) and low_rank is not None,
        num_warps=num_warps or (4 if BV * triton.next_power_of_2(K) <= 8192 else 8),
        **pdl.launch_args(),
    )
    return out


# ----------------------------------------------------------------------------------------------
# references: oracle (fp32) and the standard path (working dtype / fla kernel on GPU)

_STATE_KEYS = ("conv_q", "conv_k", "conv_v", "state")


def _conv_step_torch(x, st, w, dtype):
    """x [B, C], st [B, C, SL], w [C, W] -> (silu(conv) [B, C] in dtype, new state)."""
    Wn = w.shape[-1]
    win = torch.cat([st[..., st.shape[-1] - (Wn - 1):].to(dtype), x.to(dtype)[..., None]], -1)
    y = (win.float() * w.float()).sum(-1) if dtype == torch.float32 else (win * w.to(dtype)).sum(-1)
    new = torch.cat([st[..., 1:], x.to(st.dtype)[..., None]], -1)
    return torch.nn.functional.silu(y).to(dtype), new


def _gate_inputs(inputs: dict, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(f, gate) in ``dtype``: given, or formed from the low-rank inputs like the standard
    path's projections (``F.linear`` in ``dtype``; fp32 for the oracle)."""
    if inputs.get("low_rank") is None:
        return inputs["f"].to(dtype), inputs["gate"].to(dtype)
    fg_a, f_b, g_b = (t.to(dtype) for t in inputs["low_rank"])
    R = f_b.shape[1]
    lin = torch.nn.functional.linear
    return lin(fg_a[:, :R], f_b), lin(fg_a[:, R:], g_b)


def _reference(inputs: dict, *, dtype: torch.dtype, use_fla: bool) -> tuple:
    from fla.ops.kda.naive import naive_recurrent_kda

    H, K, V = inputs["num_heads"], inputs["head_k"], inputs["head_v"]
    lb = inputs.get("lower_bound", LOWER_BOUND)
    eps_l2, eps_norm = inputs.get("eps_l2", 1e-6), inputs.get("eps_norm", 1e-6)
    B = inputs["q"].shape[0]
    q, cq = _conv_step_torch(inputs["q"], inputs["conv_q"], inputs["conv_wq"], dtype)
    k, ck = _conv_step_torch(inputs["k"], inputs["conv_k"], inputs["conv_wk"], dtype)
    v, cv = _conv_step_torch(inputs["v"], inputs["conv_v"], inputs["conv_wv"], dtype)
    q, k, v = q.view(B, 1, H, K), k.view(B, 1, H, K), v.view(B, 1, H, V)
    f, gate = _gate_inputs(inputs, dtype)
    f = f.view(B, 1, H, K)
    braw = inputs["b"].to(dtype).view(B, 1, H)
    S0 = inputs["state"].float()
    if use_fla:  # the standard path's GPU kernel: fla fused_recurrent_kda with the gate in-kernel
        from fla.ops.kda import fused_recurrent_kda

        o, S = fused_recurrent_kda(
            q, k, v, f, braw, A_log=inputs["A_log"].float(), dt_bias=inputs["dt_bias"].float(),
            initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=lb)
    else:
        def l2(x):
            xf = x.float()
            return (xf / torch.sqrt((xf * xf).sum(-1, keepdim=True) + eps_l2)).to(dtype)
        q, k = l2(q), l2(k)
        g = lb * torch.sigmoid(inputs["A_log"].float().exp().view(H, 1)
                               * (f.float() + inputs["dt_bias"].float().view(H, K)))
        beta = torch.sigmoid(braw.float())
        o, S = naive_recurrent_kda(q.float(), k.float(), v.float(), g.to(dtype).float(), beta.to(dtype).float(),
                                   scale=inputs.get("scale"), initial_state=S0, output_final_state=True)
    o = o.to(dtype).view(B, H, V)
    of = o.float() if dtype == torch.float32 else o
    rstd = torch.rsqrt(of.float().pow(2).mean(-1, keepdim=True) + eps_norm)
    y = (of.float() * rstd).to(dtype) * inputs["norm_weight"].to(dtype)
    y = y * torch.sigmoid(gate.view(B, H, V))
    return y.reshape(B, H * V), S, cq, ck, cv


# per-step inputs: a multi-step case (``steps`` > 1) holds them as [steps, B, ...]
_STEP_KEYS = ("q", "k", "v", "f", "b", "gate")


def _steps(inputs: dict, one_step) -> tuple:
    """Run ``one_step(inputs) -> (out, state, conv_q, conv_k, conv_v)`` over ``inputs["steps"]``
    consecutive decode steps, each fed its own step's inputs and the previous step's states.
    Returns (the steps' outputs stacked [steps, B, H*V], the final states)."""
    n = int(inputs.get("steps", 1))
    args = {k: v for k, v in inputs.items() if k != "steps"}
    if n == 1:
        return one_step(args)
    outs = []
    for t in range(n):
        step = dict(args)
        for key in _STEP_KEYS:
            if inputs.get(key) is not None:
                step[key] = inputs[key][t]
        if inputs.get("low_rank") is not None:
            fg_a, f_b, g_b = inputs["low_rank"]
            step["low_rank"] = (fg_a[t], f_b, g_b)
        out, args["state"], args["conv_q"], args["conv_k"], args["conv_v"] = one_step(step)
        outs.append(out)
    return (torch.stack(outs), args["state"], args["conv_q"], args["conv_k"], args["conv_v"])


def oracle(**inputs) -> tuple:
    """fp32 torch: conv + SiLU, L2 norm, gate, fla ``naive_recurrent_kda``, RMSNorm + gate.
    Returns (out [B, H*V] fp32 -- [steps, B, H*V] for a multi-step case --, state, conv_q,
    conv_k, conv_v); inputs are not modified."""
    def one(step):
        y, S, cq, ck, cv = _reference(step, dtype=torch.float32, use_fla=False)
        return y.float(), S, cq, ck, cv

    return _steps(inputs, one)


def standard(**inputs) -> tuple:
    """The standard path's way: torch conv/norm ops in the working dtype around the recurrence
    (fla ``fused_recurrent_kda`` on CUDA, the torch recurrence on fp32 state on CPU)."""
    dtype = inputs["v"].dtype
    use_fla = inputs["v"].is_cuda
    return _steps(inputs, lambda step: _reference(step, dtype=dtype, use_fla=use_fla))


# kda_decode's (and kda_verify's) positional parameters, in order: an input set's keys
POSITIONAL = ("q", "k", "v", "f", "b", "gate", "conv_q", "conv_k", "conv_v", "conv_wq", "conv_wk", "conv_wv",
              "A_log", "dt_bias", "state", "norm_weight")


def fast(**inputs) -> tuple:
    """The fused kernel on copies of the states, step after step for a multi-step case; returns
    (out, state, conv_q, conv_k, conv_v)."""
    def one(step):
        args = dict(step)
        for key in _STATE_KEYS:
            args[key] = step[key].clone()
        pos = [args.pop(n, None) for n in POSITIONAL]
        out = kda_decode(*pos, **args)
        return out, pos[14], pos[6], pos[7], pos[8]

    return _steps(inputs, one)


def make_inputs(shape: dict, value_class: str = "normal", dtype: Any = torch.float32,
                device: Any = "cpu", seed: int = 0) -> dict:
    """shape: {"batch", "heads", "head_k", "head_v", "conv_len" (SL, default 3), "width" (4),
    "block_v" (optional), "rank" (optional: low-rank gates), "steps" (optional: consecutive
    decode steps, states carried)}. Value classes: normal, large (x8 pre-activations, big
    state), near_zero (tiny inputs and state), long_memory (the model's parameter ranges:
    A_log and dt_bias as ``weights.init_weights`` draws them, so the channels range from long
    memory -- forget gate ~0.998, the state carried across every step -- to fast decay;
    unit-scale activations, f at the scale of the model's low-rank projection, a zero initial
    state as after a fresh prompt)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    B, H, K, V = shape["batch"], shape["heads"], shape["head_k"], shape["head_v"]
    W = shape.get("width", 4)
    SL = shape.get("conv_len", W - 1)
    S = int(shape.get("steps", 1))
    step = (S,) if S > 1 else ()
    amp = {"normal": 1.0, "large": 8.0, "near_zero": 1e-3, "long_memory": 1.0}[value_class]

    def r(*s, a=1.0, dt=dtype):
        return (torch.randn(*s, generator=g, device=device) * a).to(dt)

    def u(n, bounds):
        lo, hi = bounds
        return (lo + (hi - lo) * torch.rand(n, generator=g, device=device)).float()

    inp = dict(
        q=r(*step, B, H * K, a=amp), k=r(*step, B, H * K, a=amp), v=r(*step, B, H * V, a=amp),
        f=r(*step, B, H * K, a=amp), b=r(*step, B, H, a=amp), gate=r(*step, B, H * V, a=amp),
        conv_q=r(B, H * K, SL, a=amp), conv_k=r(B, H * K, SL, a=amp), conv_v=r(B, H * V, SL, a=amp),
        conv_wq=r(H * K, W, a=0.5), conv_wk=r(H * K, W, a=0.5), conv_wv=r(H * V, W, a=0.5),
        A_log=r(H, a=0.5, dt=torch.float32), dt_bias=r(H * K, a=0.5, dt=torch.float32),
        state=r(B, H, K, V, a=0.1 * (amp if value_class != "normal" else 1.0), dt=torch.float32),
        norm_weight=(1.0 + 0.1 * torch.randn(V, generator=g, device=device)).to(dtype),
        num_heads=H, head_k=K, head_v=V,
    )
    if value_class == "long_memory":
        inp["A_log"], inp["dt_bias"] = u(H, KDA_A_LOG_INIT), u(H * K, KDA_DT_BIAS_INIT)
        inp["f"] = r(*step, B, H * K, a=0.5)
        inp["state"].zero_()
    if S > 1:
        inp["steps"] = S
    if shape.get("block_v"):
        inp["block_v"] = shape["block_v"]
    if shape.get("rank"):  # f and gate from the low-rank projections, inside the kernel
        R = shape["rank"]
        del inp["f"], inp["gate"]
        f_scale = 0.5 if value_class == "long_memory" else 1.0
        inp["low_rank"] = (r(*step, B, 2 * R, a=amp), r(H * K, R, a=f_scale * R ** -0.5), r(H * V, R, a=R ** -0.5))
    return inp


def kernel_entry(device: Any = None) -> list[KernelSpec]:
    """Two entries: ``kda_decode`` (one step over the shapes and value classes) and
    ``kda_decode_steps`` (long horizon: many consecutive steps, state carried, on inputs from
    the model's parameter ranges -- a state or decay kept in too low a precision drifts
    slowly, within one step's tolerance, and shows only after many)."""
    on_cuda = str(device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if on_cuda:
        hk = dict(heads=32, head_k=128, head_v=128)
        shapes = [dict(batch=bs, **hk) for bs in (1, 2, 4, 8, 16, 32, 64)]
        shapes += [dict(batch=3, **hk), dict(batch=5, heads=32, head_k=128, head_v=128, conv_len=4),
                   dict(batch=1, heads=32, head_k=128, head_v=128, block_v=32),
                   dict(batch=32, heads=32, head_k=128, head_v=128, block_v=32),  # H200 table, batch 32-64
                   dict(batch=64, heads=32, head_k=128, head_v=128, block_v=32),
                   dict(batch=64, heads=32, head_k=128, head_v=128, block_v=64),
                   dict(batch=7, heads=3, head_k=96, head_v=80),
                   # the fused low-rank gates (H200 table, batch 1), also with one V tile
                   dict(batch=1, rank=128, block_v=32, **hk), dict(batch=4, rank=128, block_v=128, **hk),
                   dict(batch=3, heads=3, head_k=96, head_v=80, rank=96)]
        # the H200 table's batch-1 configuration (fused low-rank gates, V split) and a batch
        # past the 16 bucket with separate gates, 256 steps each (~1 ms apiece on the GPU)
        long = [dict(batch=1, rank=128, block_v=32, steps=256, **hk), dict(batch=17, steps=256, **hk)]
    else:  # Triton interpreter: small heads
        hk = dict(heads=2, head_k=16, head_v=16)
        shapes = [dict(batch=bs, **hk) for bs in (1, 2, 4, 8, 16, 32, 64)]
        shapes += [dict(batch=3, heads=3, head_k=16, head_v=32, block_v=16),
                   dict(batch=2, heads=2, head_k=12, head_v=20, conv_len=4, block_v=8),
                   dict(batch=1, rank=16, block_v=8, **hk), dict(batch=2, rank=12, **hk),
                   dict(batch=3, heads=3, head_k=16, head_v=32, block_v=16, rank=16)]
        # the tiny model's KDA heads (2 x 32 channels: each head draws its own A_log, so some
        # channels sit at the long-memory end); one sequence with separate gates (the low-rank
        # variant runs the same recurrence code): every interpreted step costs a program per
        # (sequence, head)
        long = [dict(batch=1, steps=32, heads=2, head_k=32, head_v=32)]
    common = dict(component=COMPONENT, fast=fast, standard=standard, oracle=oracle, make_inputs=make_inputs,
                  dtypes=default_dtypes(device), k=2.0, deterministic=True,
                  kernel_patterns=[r"kda_decode_fused_kernel"])
    return [KernelSpec(name="kda_decode", shapes=shapes, value_classes=["normal", "large", "near_zero"], **common),
            KernelSpec(name="kda_decode_steps", shapes=long, value_classes=["long_memory"], **common)]
