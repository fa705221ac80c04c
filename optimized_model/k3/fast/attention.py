"""The attention half of a layer in the fast step: KDA (linear attention, recurrent state) or
MLA (latent attention over the compressed KV cache). Each reads its in-projection once (the
attention RMSNorm as the gemv's prologue) and ends with o_proj + the residual (epilogue)."""

from __future__ import annotations

from typing import Any

from fastpath import trace

from .kernels import gemv as G
from .kernels import norm as NORM
from .packed import PackedLayer, columns


def _in_projection(s: Any, i: int, p: PackedLayer, x, prefetch_site: str):
    """The attention in-projection (RMSNorm prologue) into the ``proj`` buffer, then the L2
    prefetch of o_proj (plan) beside what follows; (its output, the config that ran)."""
    w = p.attn
    proj = s.bufs.proj[:, : w.w_in.shape[0]]
    c = s.gemv(f"L{i}.in", x, w.w_in, proj, norm_weight=p.attn_norm)
    s.l2.prefetch(prefetch_site, i, x.shape[0], w.o_proj)
    return proj, c


def _out_projection(s: Any, i: int, p: PackedLayer, o, x, x_out, c_in, op: str) -> None:
    """x_out = x + o_proj(o) (residual epilogue); the trace of the layer's attention gemvs."""
    s.gemv(f"L{i}.o", o, p.attn.o_proj, x_out, epilogue="residual", residual=x)
    B = x.shape[0]
    trace.engaged("dense_gemv", G.variant_name(B, c_in), layer=i, op=op, batch=B, N=p.attn.w_in.shape[0], K=s.cfg.hidden)
    trace.engaged("norm_residual", "fused_gemv_prologue_epilogue", layer=i, batch=B)


def _kda_gates(s: Any, i: int, p: PackedLayer, col) -> tuple:
    """(f, gate, low_rank) for the KDA kernel: with the plan's fused gates the kernel forms f and
    the output gate from f_a(x), g_a(x) itself (low_rank); else [f_a(x) | g_a(x)] → [f | gate]
    by one block-diagonal gemv first."""
    w = p.attn
    if s.plan.kda.fused_gates:
        return None, None, (col("fg"), w.f_b, w.g_b)
    fg, d = s.bufs.fg, s.cfg.kda_dim
    s.gemv(f"L{i}.fg", col("fg"), w.w_fg, fg)
    return fg[:, :d], fg[:, d:], None


def kda(s: Any, i: int, p: PackedLayer, state: Any, x, x_out) -> None:
    """x → x_out = x + KDA(x). ``s``: the running DecodeStep."""
    from .kernels.kda_decode import kda_decode

    cfg, plan, bufs, w = s.cfg, s.plan.kda, s.bufs, p.attn
    proj, c_in = _in_projection(s, i, p, x, "kda_o")
    col = lambda k: columns(proj, w, k)  # noqa: E731
    d = cfg.kda_dim
    f, gate, low_rank = _kda_gates(s, i, p, col)
    conv = state.conv[p.slot]
    o = bufs.o[:, :d]
    kda_decode(col("q"), col("k"), col("v"), f, col("b"), gate,
               conv[:, :d], conv[:, d:2 * d], conv[:, 2 * d:], *w.conv_w,
               w.A_log, w.dt_bias, state.kda[p.slot], w.o_norm,
               num_heads=cfg.kda_heads, head_k=cfg.kda_head_dim, head_v=cfg.kda_head_dim,
               eps_l2=1e-6, eps_norm=cfg.norm_eps, lower_bound=cfg.kda_lower_bound, out=o,
               block_v=plan.block_v, num_warps=plan.num_warps,
               low_rank=low_rank, early_weights=plan.early_weights)
    _out_projection(s, i, p, o, x, x_out, c_in, "kda_in")


def _mla_query(s: Any, i: int, p: PackedLayer, col):
    """q_b (q_a_norm prologue), then the absorbed query q_lat[b, h] = q[b, h] @ W_uk[h] (per-head
    weights: a grouped gemv over W_ukT [H, C, nope]) into ``bufs.q_lat``."""
    cfg, w, q, q_lat = s.cfg, p.attn, s.bufs.q, s.bufs.q_lat
    H, C, nope = cfg.mla_heads, cfg.kv_lora, cfg.qk_nope
    s.gemv(f"L{i}.q_b", col("q_a"), w.q_b, q, norm_weight=w.q_a_norm)
    G.gemv(q[:, :nope], w.w_ukT[0], out=q_lat[:, 0], config=s.plan.gemv[f"L{i}.uk"],
           groups=(H, nope, C * nope, C, 0))
    return q_lat


def _mla_output(s: Any, i: int, p: PackedLayer, col, o_lat, x, x_out, c_in) -> None:
    """x_out = x + o_proj(sigmoid(gate) * (o_lat @ W_uv)): W_uv per head by a grouped gemv with
    the gate as its epilogue, then o_proj with the residual."""
    cfg, w = s.cfg, p.attn
    H, C, nope, v = cfg.mla_heads, cfg.kv_lora, cfg.qk_nope, cfg.v_head
    o = s.bufs.o[:, : H * v]
    w_uv = w.kv_b[nope: nope + v]  # head 0's W_uv rows; head h at + h * (nope + v) * C
    G.gemv(o_lat[:, 0], w_uv, out=o[:, :v], epilogue="sigmoid_gate", gate=col("gate")[:, :v],
           config=s.plan.gemv[f"L{i}.uv"], groups=(H, C, (nope + v) * C, v, v))
    _out_projection(s, i, p, o, x, x_out, c_in, "mla_in")


def mla(s: Any, i: int, p: PackedLayer, state: Any, x, x_out) -> None:
    """x → x_out = x + MLA(x); the normed kv latent is written into the cache at lengths[b]."""
    from .kernels.mla_decode import mla_decode

    cfg, plan, w = s.cfg, s.plan.mla, p.attn
    proj, c_in = _in_projection(s, i, p, x, "mla_o")
    col = lambda k: columns(proj, w, k)  # noqa: E731
    q_lat = _mla_query(s, i, p, col)
    cache = state.latent[p.slot]
    NORM.add_rmsnorm(col("kv"), w.kv_a_norm, eps=cfg.norm_eps, out=cache, positions=state.lengths)
    o_lat = s.bufs.o_lat
    mla_decode(q_lat, cache, state.lengths, scale=cfg.qk_nope ** -0.5, length_offset=1,
               max_len=cache.shape[1], out=o_lat, block_h=plan.block_h,
               layout=plan.layout, block_t=plan.block_t,
               num_warps=plan.num_warps, min_chunk=plan.min_chunk,
               max_splits=plan.max_splits, waves=plan.waves,
               combine_programs_per_head=plan.combine_programs_per_head)
    _mla_output(s, i, p, col, o_lat, x, x_out, c_in)
