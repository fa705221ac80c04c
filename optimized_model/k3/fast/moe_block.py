"""The MoE FFN of a layer in the fast step, on three streams (CUDA) or sequentially (CPU).

Main stream: fused router (norm prologue, parallel fp32 logits; its last program: sigmoid,
bias, top-k, normalise, scale and — or in its own launch, plan ``align_in_router`` — the
by-expert grouping of the pairs); latent down gemv (norm prologue; or on the aux stream beside
the router, plan ``latent_down_beside_router``); sorted experts up (SwiGLU) + down (× routing
weight), each selected expert's weights streamed once by many programs.
Side stream (overlapped, low priority): the shared expert gate|up SwiGLU gemv (norm prologue),
down gemv with the residual epilogue → xs = x + shared.
Join (event), then the latent up gemv: slot-sum prologue (or the sum written by the experts'
down kernel, plan ``slot_sum_in_down``) + residual epilogue (x + shared).
Schedule "shared_in": "fused" (plan ``shared_in_fused``, batch 1): one gemv streams [latent
down; shared gate|up] on the main stream, the router beside it on the aux stream, the shared
down gemv (SwiGLU prologue) beside the experts on the side stream.
"""

from __future__ import annotations

from typing import Any

import torch

from fastpath import trace

from .kernels import gemv as G
from .kernels import moe as MOE
from .packed import PackedLayer


def moe(s: Any, i: int, p: PackedLayer, x, xs, x_out) -> None:
    """x → x_out = x + routed(x) + shared(x); ``xs`` receives x + shared(x)."""
    cfg, plan, bufs = s.cfg, s.plan.moe, s.bufs
    B = x.shape[0]
    # each schedule runs the router, the experts and the shared expert (x + shared → xs)
    run = _fused_in if plan.shared_in_fused else _separate
    router_variant, experts_variant, c_sh, overlap = run(s, i, p, x, xs)
    if i + 1 < cfg.n_layers:
        s.l2.prefetch("next_in", i, B, s.layers[i + 1].attn.w_in)
    # x + routed + shared, residual x + shared; the routed sum over the slots is the experts'
    # down kernel's (plan) or this gemv's prologue over the per-slot outputs
    routed = bufs.lat_sum if plan.slot_sum_in_down else bufs.eo
    s.gemv(f"L{i}.up", routed, p.ffn.moe_up, x_out, epilogue="residual", residual=xs)
    trace.engaged("moe_router", router_variant, layer=i, batch=B, experts=cfg.n_experts, top_k=cfg.top_k)
    trace.engaged("moe_experts", experts_variant, layer=i, batch=B, experts=cfg.n_experts,
                  top_k=cfg.top_k, latent=cfg.moe_latent, inter=cfg.expert_inter)
    trace.engaged("shared_expert", ("fused_in_" if plan.shared_in_fused else "") + G.variant_name(B, c_sh) + "_" + overlap,
                  layer=i, batch=B, inter=cfg.n_shared * cfg.shared_inter)
    trace.engaged("dense_gemv", "triton_latent_proj", layer=i, op="moe_latent", batch=B)
    trace.engaged("norm_residual", "fused_gemv_prologue_epilogue", layer=i, batch=B)


def _route(s: Any, p: PackedLayer, x) -> str:
    """Router (top-k, weights) and the by-expert grouping of the pairs. Returns the trace variant."""
    cfg, plan, bufs, w = s.cfg, s.plan.moe, s.bufs, p.ffn
    fused_align = plan.align_in_router
    MOE.moe_router(x, w.router, w.router_bias, cfg.top_k, routed_scaling=cfg.routed_scaling,
                   norm_weight=p.ffn_norm, eps=cfg.norm_eps, ids=bufs.ids, weights=bufs.rw,
                   config=plan.router_config, scratch=bufs.router_scratch, align=bufs.align if fused_align else None)
    if not fused_align:
        MOE.moe_align(bufs.ids, cfg.n_experts, bufs.align.block_m, align=bufs.align)
    return "triton_parallel_topk_align" if fused_align else "triton_parallel_topk+align_launch"


def _experts(s: Any, i: int, p: PackedLayer, lat) -> str:
    """The routed experts over the grouping; returns the trace variant."""
    plan, bufs = s.plan.moe, s.bufs
    B = lat.shape[0]
    s.l2.prefetch("moe_up", i, B, p.ffn.moe_up)
    in_down = plan.slot_sum_in_down
    MOE.moe_experts(lat, bufs.ids, bufs.rw, p.ffn.ew13, p.ffn.ew2, h_buf=bufs.eh, out=bufs.eo,
                    config=plan.experts_config, align=bufs.align, slot_sum=bufs.lat_sum if in_down else None)
    return MOE.variant_name(B, plan.experts_config) + ("_slot_sum" if in_down else "")


def _separate(s: Any, i: int, p: PackedLayer, x, xs) -> tuple[str, str, Any, str]:
    """The routed chain (router -> latent down -> experts) is the step's critical path: it is
    issued first, on the high-priority main stream; the latent down projection can run beside
    the router on the high-priority aux stream (plan ``latent_down_beside_router``; else after
    the router); the shared expert (gate|up SwiGLU gemv, down gemv + residual → xs) runs on the
    low-priority side stream (started after the router instead, the whole step was 4-9 %
    slower: perf notes, run I). Returns (router variant, experts variant, the shared gate|up's
    gemv config, the overlap)."""
    bufs, w, streams = s.bufs, p.ffn, s.streams
    lat = bufs.lat
    down_beside = s.plan.moe.latent_down_beside_router  # (only ever True on CUDA)
    if s.on_cuda:
        fork, aux_done, _, join = bufs.events[i]
        main = torch.cuda.current_stream(s.device)
        fork.record(main)
    if down_beside:
        with torch.cuda.stream(streams.aux):
            streams.aux.wait_event(fork)
            s.gemv(f"L{i}.down", x, w.moe_down, lat, norm_weight=p.ffn_norm)
            aux_done.record(streams.aux)
    router = _route(s, p, x)
    if down_beside:
        main.wait_event(aux_done)
    else:
        s.gemv(f"L{i}.down", x, w.moe_down, lat, norm_weight=p.ffn_norm)
    experts = _experts(s, i, p, lat)

    def shared():
        c = s.gemv(f"L{i}.sw13", x, w.sw13, bufs.sh_h, epilogue="swiglu", norm_weight=p.ffn_norm)
        s.gemv(f"L{i}.sw2", bufs.sh_h, w.sw2, xs, epilogue="residual", residual=x)
        return c

    if not s.on_cuda:
        return router, experts, shared(), "sequential"
    with torch.cuda.stream(streams.side):
        streams.side.wait_event(fork)
        c_sh = shared()
        join.record(streams.side)
    main.wait_event(join)
    return router, experts, c_sh, "side_stream"


def _fused_in(s: Any, i: int, p: PackedLayer, x, xs) -> tuple[str, str, Any, str]:
    """One launch streams [latent down; shared gate|up] (both read the normed x) on the main
    stream while the router runs beside it on the aux stream; then the experts (main) and
    the shared down projection (side stream, SwiGLU prologue over the raw gate|up, residual
    → xs). At batch 1 the router and the latent down no longer sit on the critical path
    one after the other while the shared gate|up streams alone (perf notes, run L).
    Returns what ``_separate`` returns (the wide launch's config for the shared expert)."""
    bufs, w, streams = s.bufs, p.ffn, s.streams
    L = s.cfg.moe_latent
    wide = bufs.moe_in
    lat, gate_up = wide[:, :L], wide[:, L:]
    if s.on_cuda:
        fork, routed, wide_done, join = bufs.events[i]
        main = torch.cuda.current_stream(s.device)
        fork.record(main)
        with torch.cuda.stream(streams.aux):
            streams.aux.wait_event(fork)
            router = _route(s, p, x)
            routed.record(streams.aux)
    else:
        router = _route(s, p, x)
    c = s.gemv(f"L{i}.moe_in", x, w.moe_in, wide, norm_weight=p.ffn_norm)

    def shared_down():
        s.gemv(f"L{i}.sw2", gate_up, w.sw2, xs, epilogue="residual", residual=x, glu_input=True)

    if not s.on_cuda:
        shared_down()
        return router, _experts(s, i, p, lat), c, "sequential"
    wide_done.record(main)
    with torch.cuda.stream(streams.side):
        streams.side.wait_event(wide_done)
        shared_down()
        join.record(streams.side)
    main.wait_event(routed)
    experts = _experts(s, i, p, lat)
    main.wait_event(join)
    return router, experts, c, "side_stream"
