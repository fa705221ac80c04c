"""The K3-mini fast decoder: one decode step of the whole model with the fast kernels, static
buffers and (on CUDA) one CUDA graph per (batch, state) — DESIGN §7, issue 4.

Per layer (weights prepacked once at build time; every projection is an ``fp_gemv`` launch):

  KDA   1 gemv  [RMSNorm prologue] x → q|k|v|f_a|g_a|b        (one concatenated weight)
        1 gemv  [f_a|g_a] → [f|g]                              (block-diagonal f_b ⊕ g_b; or,
                table data "kda_decode.low_rank_gates": "fused", inside KDA decode)
        1 kda_decode (fused conv, gates, L2 norm, delta rule, o-norm, output gate; kernels/kda_decode.py)
        1 gemv  o_proj + residual epilogue
  MLA   1 gemv  [RMSNorm prologue] x → q_a|kv_a|gate_proj
        1 gemv  [q_a_norm prologue] q_b ;  1 grouped gemv q·W_uk (absorbed, per head)
        1 add_rmsnorm  kv_a_norm, written straight into the latent cache at lengths[b]
        mla_decode (split-KV flash decoding + combine; kernels/mla_decode.py)
        1 grouped gemv W_uv with the sigmoid-gate epilogue ; 1 gemv o_proj + residual
  MoE   main stream: fused router (norm prologue, parallel fp32 logits; its last program:
        sigmoid, bias, top-k, normalise, scale, and — or in its own launch, table data — the
        by-expert grouping of the pairs); latent down gemv (norm prologue; or on the aux stream
        beside the router, table data); sorted experts up (SwiGLU) + down (× routing weight),
        grid (expert block, N tile): each selected expert's weights streamed once by many
        programs
        side stream (overlapped, low priority): shared expert gate|up SwiGLU gemv (norm
        prologue), down gemv with residual epilogue → x + shared
        join (event), latent up gemv: slot-sum prologue (or, table data, the sum written by
        the experts' down kernel) + residual epilogue (x + shared)
        schedule "shared_in": "fused" (table data, batch 1): one gemv streams [latent down;
        shared gate|up] on the main stream, the router beside it on the aux stream, the shared
        down gemv (SwiGLU prologue) beside the experts on the side stream
  dense FFN (layer 0): SwiGLU gemv (norm prologue) + down gemv with residual epilogue
  head  gemv [final-norm prologue] → fp32 logits (padding columns stay -inf)
  option (table data "l2_prefetch", sites ``L2_SITES``; none adopted on the H200, perf notes
        run M): an L2 prefetch of an upcoming weight on its own stream (kernels/l2_prefetch.py)

On CUDA the whole step is captured once per (batch, state tensors) under
``fastpath.trace.capturing(key)``; every replay reports ``fastpath.trace.replayed(key)``. On
CPU (Triton interpreter) the step runs eagerly, sequentially, and ``decode_graph`` is refused
with reason ``no_cuda``.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import torch

from fastpath import trace

from . import tuning
from .kernels import gemv as G
from .kernels import l2_prefetch as L2
from .kernels import moe as MOE
from .kernels import norm as NORM
from .kernels import pdl as PDL

_graph_ids = itertools.count()

# Where the step can ask the L2 for an upcoming weight (table data "l2_prefetch": site →
# fraction of the weight): the weight, and when the prefetch starts.
L2_SITES = {
    "kda_o": "KDA o_proj, after the in-projection (beside the gate projection and KDA decode)",
    "mla_o": "MLA o_proj, after the in-projection (beside q_b, the absorbed attention, W_uv)",
    "moe_up": "MoE latent up, when the routed experts start",
    "next_in": "the next layer's in-projection, when the MoE latent up starts",
}


class _Packed:
    """Prepacked weights of one layer."""


class FastDecoder:
    """Built by ``hooks.build_fast_decoder``. ``decode(tokens, state)`` → fp32 logits [B, V]
    (state updated in place, like ``K3Model.decode``); ``decode_step(batch, context)`` → a
    callable running one step (a graph replay on CUDA); ``sampler``: the fused FastSampler."""

    def __init__(self, model: Any, state_factory: Callable[..., Any] | None = None, *,
                 max_context: int | None = None, use_graphs: bool | None = None,
                 max_graphs: int = 16):
        self.model = model
        self.cfg = cfg = model.cfg
        self.device = torch.device(model.device)
        self.dtype = model.dtype
        self.state_factory = state_factory
        self.on_cuda = self.device.type == "cuda" and not tuning.device_name(self.device) == tuning.CPU_DEVICE
        self.use_graphs = self.on_cuda if use_graphs is None else (bool(use_graphs) and self.on_cuda)
        self.max_graphs = max_graphs
        self.eps = cfg.norm_eps
        self._graphs: dict[Any, Any] = {}
        self._bufs: dict[int, dict] = {}
        self._scratch: dict[tuple, G.GemvScratch] = {}
        # stream priorities: lower number = higher priority; graph kernel nodes keep the priority
        # of the stream they were captured from. The step is captured on ``_main`` (high) — not on
        # torch's default capture stream, whose priority is the lowest, the same as the side
        # stream's — so the critical path's blocks are scheduled before the shared expert's.
        if self.on_cuda:
            self._main = torch.cuda.Stream(device=self.device, priority=-1)
            self._aux = torch.cuda.Stream(device=self.device, priority=-1)
            self._side = torch.cuda.Stream(device=self.device, priority=0)
            # L2 prefetches (table data "l2_prefetch") get their own stream: one on the side
            # stream would also wait for the shared expert queued there
            self._pf = torch.cuda.Stream(device=self.device, priority=0)
            self._pf_fork, self._pf_join = torch.cuda.Event(), torch.cuda.Event()
        else:
            self._main = self._aux = self._side = self._pf = None
        self._pf_plan: dict = {}
        self._pf_pending = False
        self._mempool = None
        self.layers = [self._pack(i) for i in range(cfg.n_layers)]
        self.w_embed = model.w["embed"]
        self.w_final_norm = model.w["final_norm"]
        self.w_head = model.w["lm_head"][: cfg.n_real_tokens]
        from .kernels.sampler import FastSampler

        self.sampler = FastSampler(n_valid=cfg.n_real_tokens)

    # -- weights --------------------------------------------------------------------------------
    def _pack(self, i: int) -> _Packed:
        cfg, W = self.cfg, (lambda n: self.model.w[f"L{i}.{n}"])
        p = _Packed()
        p.kind, p.ffn = cfg.layer_kind(i), cfg.ffn_kind(i)
        p.slot = cfg.slot(i)
        p.attn_norm, p.ffn_norm = W("attn_norm"), W("ffn_norm")
        if p.kind == "kda":
            d, r, H = cfg.kda_dim, cfg.kda_rank, cfg.kda_heads
            p.w_in = torch.cat([W("qkv_proj"), W("f_a"), W("g_a"), W("b_proj")]).contiguous()
            p.cols = {"q": (0, d), "k": (d, 2 * d), "v": (2 * d, 3 * d), "fg": (3 * d, 3 * d + 2 * r),
                      "b": (3 * d + 2 * r, 3 * d + 2 * r + H)}
            bd = torch.zeros(2 * d, 2 * r, dtype=self.dtype, device=self.device)
            bd[:d, :r] = W("f_b")
            bd[d:, r:] = W("g_b")
            p.w_fg = bd
            p.f_b, p.g_b = W("f_b"), W("g_b")  # the same weights for KDA decode's fused gates
            conv = W("conv")
            p.conv_w = (conv[:d], conv[d:2 * d], conv[2 * d:])
            p.A_log, p.dt_bias, p.o_norm, p.o_proj = W("A_log"), W("dt_bias"), W("o_norm"), W("o_proj")
        else:
            H, ql, kl, nope, v = cfg.mla_heads, cfg.q_lora, cfg.kv_lora, cfg.qk_nope, cfg.v_head
            p.w_in = torch.cat([W("q_a"), W("kv_a"), W("gate_proj")]).contiguous()
            p.cols = {"q_a": (0, ql), "kv": (ql, ql + kl), "gate": (ql + kl, ql + kl + H * v)}
            p.q_a_norm, p.q_b, p.kv_a_norm = W("q_a_norm"), W("q_b"), W("kv_a_norm")
            kvb = W("kv_b").view(H, nope + v, kl)
            p.w_ukT = kvb[:, :nope].transpose(1, 2).contiguous()  # [H, C, nope]
            p.kv_b = W("kv_b")  # W_uv rows read in place (view [H, nope + v, C])
            p.o_proj = W("o_proj")
        if p.ffn == "dense":
            p.w13, p.w2 = W("w13"), W("w2")
        else:
            p.router, p.router_bias = W("router"), W("router_bias")
            # [latent down; shared gate|up]: both read the normed x, so one launch can stream
            # them (schedule "shared_in": "fused"); the separate schedule reads the same rows
            p.moe_in = torch.cat([W("moe_down"), W("shared_w13")]).contiguous()
            p.moe_down, p.sw13 = p.moe_in[: cfg.moe_latent], p.moe_in[cfg.moe_latent:]
            p.moe_up, p.sw2 = W("moe_up"), W("shared_w2")
            p.ew13, p.ew2 = W("experts_w13"), W("experts_w2")
        return p

    # -- buffers ----------------------------------------------------------------------------------
    def _buffers(self, B: int) -> dict:
        bufs = self._bufs.get(B)
        if bufs is not None:
            return bufs
        cfg, dt, dev = self.cfg, self.dtype, self.device
        e = lambda *s, dtype=dt: torch.empty(*s, dtype=dtype, device=dev)  # noqa: E731
        h = cfg.hidden
        wide = max([p.w_in.shape[0] for p in self.layers])
        bufs = {
            "tokens": torch.zeros(B, dtype=torch.long, device=dev),
            "xa": e(B, h), "xb": e(B, h), "xs": e(B, h),
            "proj": e(B, wide),
            "fg": e(B, 2 * cfg.kda_dim),
            "o": e(B, max(cfg.kda_dim, cfg.mla_heads * cfg.v_head)),
            "q": e(B, cfg.mla_heads * cfg.qk_nope),
            "q_lat": e(B, cfg.mla_heads, cfg.kv_lora),
            "o_lat": e(B, cfg.mla_heads, cfg.kv_lora),
            "ffn_h": e(B, max(cfg.dense_inter, cfg.n_shared * cfg.shared_inter)),
            "sh_h": e(B, cfg.n_shared * cfg.shared_inter),
            "lat": e(B, cfg.moe_latent),
            "moe_in": e(B, cfg.moe_latent + 2 * cfg.n_shared * cfg.shared_inter),
            "ids": e(B, cfg.top_k, dtype=torch.int32),
            "rw": e(B, cfg.top_k, dtype=torch.float32),
            "eh": e(B * cfg.top_k, cfg.expert_inter),
            "eo": e(B, cfg.top_k, cfg.moe_latent, dtype=torch.float32),
            "lat_sum": e(B, cfg.moe_latent),  # Σ over the slots, when the down kernel forms it
            "router_scratch": MOE.RouterScratch(B, cfg.n_experts, dev),
            "align": MOE.MoeAlign(B, cfg.top_k, cfg.n_experts,
                                  MOE.experts_block_m(B, tuning.lookup("moe_experts", B, device=dev)), dev),
            "logits": torch.full((B, cfg.vocab_size), float("-inf"), dtype=torch.float32, device=dev),
            # per MoE layer: fork (main → aux, side), aux done (router or latent down → main),
            # wide launch done (main → side; fused schedule), join (side → main)
            "events": [tuple(torch.cuda.Event() for _ in range(4)) for _ in range(cfg.n_layers)] if self.on_cuda else None,
        }
        self._bufs[B] = bufs
        return bufs

    def _cfg(self, M: int, N: int, K: int, epilogue: str = "none") -> dict:
        return tuning.lookup("gemv", M, device=self.device, N=N, K=K, epilogue=epilogue)

    def _gemv(self, site: str, x, w, out, **kw) -> dict:
        """One gemv launch with this call site's tuning entry and split-K scratch; returns the
        config that ran. An entry with ``"variant": "cute"`` runs the CuTe DSL twin where the
        call is in its scope (``_cute_gemv``), else the Triton kernel."""
        M = x.shape[0]
        N = w.shape[0] // 2 if kw.get("epilogue") == "swiglu" else w.shape[0]
        cfg = self._cfg(M, N, w.shape[1], kw.get("epilogue", "none"))
        if cfg.get("variant") == "cute":
            ran = self._cute_gemv(site, x, w, out, cfg, kw)
            if ran is not None:
                return ran
            cfg = {**cfg, "variant": "triton"}
        scratch = None
        if int(cfg.get("SPLIT_K", 1)) > 1 and "groups" not in kw:
            key = (site, M, int(cfg["SPLIT_K"]))  # a retuned table (A/B of variants) gets its own
            scratch = self._scratch.get(key)
            if scratch is None:
                scratch = self._scratch[key] = G.GemvScratch(M, N, int(cfg["SPLIT_K"]), kw.get("epilogue") == "swiglu", self.device)
        G.gemv(x, w, out=out, config=cfg, scratch=scratch, eps=self.eps, **kw)
        return cfg

    # the Triton kernel's keywords the CuTe GEMV implements (RMSNorm prologue, residual epilogue)
    CUTE_FUSIONS = {"norm_weight", "residual", "epilogue"}

    def _cute_gemv(self, site: str, x, w, out, cfg: dict, kw: dict) -> dict | None:
        """The CuTe DSL GEMV for a call site whose table entry asks for it; None (after a trace
        event naming why) when the call is outside its scope, and the caller runs Triton."""
        from .kernels import cute_gemv

        why = ""
        extra = sorted(set(kw) - self.CUTE_FUSIONS)
        if extra or kw.get("epilogue", "none") not in ("none", "residual"):
            why = f"fusion {extra or kw['epilogue']} not in the CuTe kernel (RMSNorm prologue, residual epilogue only)"
        else:
            residual = kw.get("residual") if kw.get("epilogue") == "residual" else None
            ok, why = cute_gemv.supports(x, w, out=out, norm_weight=kw.get("norm_weight"), residual=residual)
            if ok:
                cute_gemv.gemv(x, w, out=out, norm_weight=kw.get("norm_weight"), residual=residual,
                               eps=self.eps, warps=int(cfg.get("warps", 0)) or None,
                               rows_per_warp=int(cfg.get("rows_per_warp", 0)) or None)
                return cfg
        trace.engaged("dense_gemv", "triton_for_cute", site=site, batch=x.shape[0], reason=why)
        return None

    # -- one step ---------------------------------------------------------------------------------
    def _use_pdl(self, B: int) -> str:
        """Where the step uses programmatic dependent launch (kernels/pdl.py): table data
        "launch.pdl" — "all", "outside_moe" (not in the MoE layers, where the routed chain
        overlaps the shared expert's stream) or "off"; always "off" on the CPU (the
        interpreter's table has no "launch" entry)."""
        if self.device.type == "cpu" or "launch" not in tuning.table_for(self.device)["kernels"]:
            return "off"
        mode = str(tuning.entry("launch", B, device=self.device).get("pdl", "off"))
        if mode not in ("all", "outside_moe", "off"):
            raise ValueError(f"tuning table: launch.pdl {mode!r}; expected 'all', 'outside_moe' or 'off'")
        return mode

    def _step(self, bufs: dict, state: Any) -> torch.Tensor:
        """The whole decode step on static buffers (capturable: no host sync, no allocation
        that changes between calls)."""
        B = bufs["tokens"].shape[0]
        mode = self._use_pdl(B)
        self._pf_plan, self._pf_pending = self._l2_prefetch_plan(B), False
        with PDL.scope(mode != "off"):
            logits = self._layers_and_head(bufs, state, moe_pdl=mode == "all")
        if self._pf_pending:  # a capture must end with every stream joined back
            self._pf_join.record(self._pf)
            torch.cuda.current_stream(self.device).wait_event(self._pf_join)
        return logits

    def _l2_prefetch_plan(self, B: int) -> dict:
        """Table data "l2_prefetch" for batch B: {site: fraction of the weight, "chunk": bytes
        per prefetch, "per_program": prefetches per program}; none on CPU (no PTX) or where the
        table has no entry."""
        if not self.on_cuda or "l2_prefetch" not in tuning.table_for(self.device)["kernels"]:
            return {}
        plan = tuning.entry("l2_prefetch", B, device=self.device)
        unknown = set(plan) - {"max_batch", "note", "chunk", "per_program", *L2_SITES}
        if unknown:
            raise ValueError(f"tuning table: l2_prefetch has unknown fields {sorted(unknown)}; "
                             f"sites are {list(L2_SITES)}")
        return plan

    def _l2_prefetch(self, site: str, i: int, B: int, w) -> None:
        """Ask the L2 for (the table's fraction of) weight ``w`` on the prefetch stream, starting
        once the main stream's work so far is done — so it runs beside what the main stream
        does next. Nothing to wait for: the step joins the stream at its end."""
        frac = float(self._pf_plan.get(site, 0.0))
        if frac <= 0.0:
            return
        main = torch.cuda.current_stream(self.device)
        self._pf_fork.record(main)
        with torch.cuda.stream(self._pf):
            self._pf.wait_event(self._pf_fork)
            n = L2.l2_prefetch(w, frac, chunk=int(self._pf_plan.get("chunk", 16384)),
                               per_program=int(self._pf_plan.get("per_program", 32)))
        self._pf_pending = True
        trace.engaged("dense_gemv", "l2_prefetch", layer=i, site=site, batch=B, bytes=n)

    def _layers_and_head(self, bufs: dict, state: Any, moe_pdl: bool) -> torch.Tensor:
        cfg = self.cfg
        B = bufs["tokens"].shape[0]
        xa, xb, xs = bufs["xa"], bufs["xb"], bufs["xs"]
        torch.index_select(self.w_embed, 0, bufs["tokens"], out=xa)
        for i, p in enumerate(self.layers):
            if p.kind == "kda":
                self._kda(i, p, bufs, state, xa, xb)
            else:
                self._mla(i, p, bufs, state, xa, xb)
            if p.ffn == "dense":
                c = self._gemv(f"L{i}.w13", xb, p.w13, bufs["ffn_h"][:, : cfg.dense_inter],
                               epilogue="swiglu", norm_weight=p.ffn_norm)
                self._gemv(f"L{i}.w2", bufs["ffn_h"][:, : cfg.dense_inter], p.w2, xa,
                           epilogue="residual", residual=xb)
                trace.engaged("dense_gemv", G.variant_name(B, c), layer=i, op="dense_ffn", batch=B)
                trace.engaged("norm_residual", "fused_gemv_prologue_epilogue", layer=i, batch=B)
            else:
                with PDL.scope(moe_pdl):
                    self._moe(i, p, bufs, xb, xs, xa)
        c = self._gemv("lm_head", xa, self.w_head, bufs["logits"][:, : cfg.n_real_tokens],
                       norm_weight=self.w_final_norm)
        trace.engaged("lm_head", G.variant_name(B, c), batch=B, vocab=cfg.n_real_tokens, hidden=cfg.hidden)
        state.lengths.add_(1)
        return bufs["logits"]

    def _kda(self, i, p, bufs, state, x, x_out) -> None:
        from .kernels.kda_decode import kda_decode

        cfg = self.cfg
        B = x.shape[0]
        n_in = p.w_in.shape[0]
        proj = bufs["proj"][:, :n_in]
        c = self._gemv(f"L{i}.in", x, p.w_in, proj, norm_weight=p.attn_norm)
        self._l2_prefetch("kda_o", i, B, p.o_proj)
        col = lambda k: proj[:, p.cols[k][0]: p.cols[k][1]]  # noqa: E731
        d = cfg.kda_dim
        kcfg = tuning.entry("kda_decode", B, device=self.device)
        gates = kcfg.get("low_rank_gates", "gemv")
        if gates == "fused":  # KDA decode forms f and the output gate from f_a(x), g_a(x) itself
            f = gate = None
            low_rank = (col("fg"), p.f_b, p.g_b)
        elif gates == "gemv":  # [f_a(x) | g_a(x)] → [f | gate] by one block-diagonal gemv first
            fg = bufs["fg"]
            self._gemv(f"L{i}.fg", col("fg"), p.w_fg, fg)
            f, gate, low_rank = fg[:, :d], fg[:, d:], None
        else:
            raise ValueError(f"tuning table: kda_decode.low_rank_gates {gates!r}; expected 'fused' or 'gemv'")
        conv = state.conv[p.slot]
        o = bufs["o"][:, :d]
        kda_decode(col("q"), col("k"), col("v"), f, col("b"), gate,
                   conv[:, :d], conv[:, d:2 * d], conv[:, 2 * d:], *p.conv_w,
                   p.A_log, p.dt_bias, state.kda[p.slot], p.o_norm,
                   num_heads=cfg.kda_heads, head_k=cfg.kda_head_dim, head_v=cfg.kda_head_dim,
                   eps_l2=1e-6, eps_norm=cfg.norm_eps, lower_bound=cfg.kda_lower_bound, out=o,
                   block_v=int(kcfg.get("BLOCK_V", 0)) or None, num_warps=int(kcfg.get("num_warps", 0)) or None,
                   low_rank=low_rank, early_weights=bool(kcfg.get("early_weights", 0)))
        self._gemv(f"L{i}.o", o, p.o_proj, x_out, epilogue="residual", residual=x)
        trace.engaged("dense_gemv", G.variant_name(B, c), layer=i, op="kda_in", batch=B, N=n_in, K=cfg.hidden)
        trace.engaged("norm_residual", "fused_gemv_prologue_epilogue", layer=i, batch=B)

    def _mla(self, i, p, bufs, state, x, x_out) -> None:
        from .kernels.mla_decode import MAX_SPLITS, MIN_CHUNK, WAVES, mla_decode

        cfg = self.cfg
        B = x.shape[0]
        H, C, nope, v = cfg.mla_heads, cfg.kv_lora, cfg.qk_nope, cfg.v_head
        n_in = p.w_in.shape[0]
        proj = bufs["proj"][:, :n_in]
        c = self._gemv(f"L{i}.in", x, p.w_in, proj, norm_weight=p.attn_norm)
        self._l2_prefetch("mla_o", i, B, p.o_proj)
        col = lambda k: proj[:, p.cols[k][0]: p.cols[k][1]]  # noqa: E731
        q = bufs["q"]
        self._gemv(f"L{i}.q_b", col("q_a"), p.q_b, q, norm_weight=p.q_a_norm)
        q_lat = bufs["q_lat"]
        # q_lat[b, h] = q[b, h] @ W_uk[h]  (per-head weights: grouped gemv over W_ukT [H, C, nope])
        G.gemv(q[:, :nope], p.w_ukT[0], out=q_lat[:, 0], config=self._cfg(B, C, nope),
               groups=(H, nope, C * nope, C, 0))
        cache = state.latent[p.slot]
        NORM.add_rmsnorm(col("kv"), p.kv_a_norm, eps=cfg.norm_eps, out=cache, positions=state.lengths)
        o_lat = bufs["o_lat"]
        mcfg = tuning.entry("mla_decode", B, device=self.device)
        mla_decode(q_lat, cache, state.lengths, scale=nope ** -0.5, length_offset=1,
                   max_len=cache.shape[1], out=o_lat, block_h=int(mcfg.get("BLOCK_H", 16)),
                   layout=mcfg.get("layout", "head_major"), block_t=mcfg.get("BLOCK_T"),
                   num_warps=mcfg.get("num_warps"), min_chunk=int(mcfg.get("min_chunk", MIN_CHUNK)),
                   max_splits=int(mcfg.get("max_splits", MAX_SPLITS)), waves=float(mcfg.get("waves", WAVES)),
                   combine_programs_per_head=int(mcfg.get("combine_programs_per_head", 1)))
        o = bufs["o"][:, : H * v]
        w_uv = p.kv_b[nope: nope + v]  # head 0's W_uv rows; head h at + h * (nope + v) * C
        G.gemv(o_lat[:, 0], w_uv, out=o[:, :v], epilogue="sigmoid_gate", gate=col("gate")[:, :v],
               config=self._cfg(B, v, C, "sigmoid_gate"), groups=(H, C, (nope + v) * C, v, v))
        self._gemv(f"L{i}.o", o, p.o_proj, x_out, epilogue="residual", residual=x)
        trace.engaged("dense_gemv", G.variant_name(B, c), layer=i, op="mla_in", batch=B, N=n_in, K=cfg.hidden)
        trace.engaged("norm_residual", "fused_gemv_prologue_epilogue", layer=i, batch=B)

    def _moe_schedule(self, B: int) -> dict:
        """Table data "moe_schedule" for batch B: ``shared_in`` "fused" (one launch streams the
        latent down projection and the shared gate|up) or "separate"; ``latent_down`` "aux" or
        "main" (separate schedule, CUDA only). Tables without the entry: separate, main."""
        if "moe_schedule" not in tuning.table_for(self.device)["kernels"]:
            return {}
        sched = tuning.entry("moe_schedule", B, device=self.device)
        if sched.get("shared_in", "separate") not in ("fused", "separate"):
            raise ValueError(f"tuning table: moe_schedule.shared_in {sched['shared_in']!r}; "
                             "expected 'fused' or 'separate'")
        return sched

    def _moe(self, i, p, bufs, x, xs, x_out) -> None:
        cfg = self.cfg
        B = x.shape[0]
        sched = self._moe_schedule(B)
        fused_in = sched.get("shared_in") == "fused"
        # each schedule runs the router, the experts and the shared expert (x + shared → xs)
        run = self._moe_fused_in if fused_in else self._moe_separate
        router_variant, experts_variant, c_sh, overlap = run(i, p, bufs, x, xs, sched)
        if i + 1 < cfg.n_layers:
            self._l2_prefetch("next_in", i, B, self.layers[i + 1].w_in)
        # x + routed + shared, residual x + shared; the routed sum over the slots is the experts'
        # down kernel's (table data) or this gemv's prologue over the per-slot outputs
        routed = bufs["lat_sum"] if self._slot_sum_in_down(B) else bufs["eo"]
        self._gemv(f"L{i}.up", routed, p.moe_up, x_out, epilogue="residual", residual=xs)
        trace.engaged("moe_router", router_variant, layer=i, batch=B, experts=cfg.n_experts, top_k=cfg.top_k)
        trace.engaged("moe_experts", experts_variant, layer=i, batch=B, experts=cfg.n_experts,
                      top_k=cfg.top_k, latent=cfg.moe_latent, inter=cfg.expert_inter)
        trace.engaged("shared_expert", ("fused_in_" if fused_in else "") + G.variant_name(B, c_sh) + "_" + overlap,
                      layer=i, batch=B, inter=cfg.n_shared * cfg.shared_inter)
        trace.engaged("dense_gemv", "triton_latent_proj", layer=i, op="moe_latent", batch=B)
        trace.engaged("norm_residual", "fused_gemv_prologue_epilogue", layer=i, batch=B)

    def _route(self, p, bufs, x) -> str:
        """Router (top-k, weights) and the by-expert grouping of the pairs: in the router's
        last program ("fused", table data) or in its own launch. Returns the trace variant."""
        cfg = self.cfg
        B = x.shape[0]
        rcfg = tuning.lookup("moe_router", B, device=self.device)
        fused_align = rcfg.get("align", "fused") == "fused"
        MOE.moe_router(x, p.router, p.router_bias, cfg.top_k, routed_scaling=cfg.routed_scaling,
                       norm_weight=p.ffn_norm, eps=cfg.norm_eps, ids=bufs["ids"], weights=bufs["rw"],
                       config=rcfg, scratch=bufs["router_scratch"], align=bufs["align"] if fused_align else None)
        if not fused_align:
            MOE.moe_align(bufs["ids"], cfg.n_experts, bufs["align"].block_m, align=bufs["align"])
        return "triton_parallel_topk_align" if fused_align else "triton_parallel_topk+align_launch"

    def _experts(self, i, p, bufs, lat) -> str:
        """The routed experts over the grouping; returns the trace variant."""
        B = lat.shape[0]
        self._l2_prefetch("moe_up", i, B, p.moe_up)
        ecfg = tuning.lookup("moe_experts", B, device=self.device)
        in_down = self._slot_sum_in_down(B)
        MOE.moe_experts(lat, bufs["ids"], bufs["rw"], p.ew13, p.ew2, h_buf=bufs["eh"], out=bufs["eo"],
                        config=ecfg, align=bufs["align"], slot_sum=bufs["lat_sum"] if in_down else None)
        return MOE.variant_name(B, ecfg) + ("_slot_sum" if in_down else "")

    def _slot_sum_in_down(self, B: int) -> bool:
        """Table data "moe_experts.slot_sum": "down" (the experts' down kernel writes the sum over
        the slots; batch ≤ MOE.MAX_SLOT_SUM_TOKENS) or "latent_up" (the latent up's prologue)."""
        where = tuning.entry("moe_experts", B, device=self.device).get("slot_sum", "latent_up")
        if where not in ("down", "latent_up"):
            raise ValueError(f"tuning table: moe_experts.slot_sum {where!r}; expected 'down' or 'latent_up'")
        if where == "down" and B > MOE.MAX_SLOT_SUM_TOKENS:
            raise ValueError(f"tuning table: moe_experts.slot_sum 'down' at batch {B}; the down kernel "
                             f"sums the slots for at most {MOE.MAX_SLOT_SUM_TOKENS} tokens")
        return where == "down"

    def _moe_separate(self, i, p, bufs, x, xs, sched) -> tuple[str, str, dict, str]:
        """The routed chain (router -> latent down -> experts) is the step's critical path: it is
        issued first, on the high-priority main stream; the latent down projection can run beside
        the router on the high-priority aux stream (table data "moe_schedule.latent_down": "aux";
        "main": after the router); the shared expert (gate|up SwiGLU gemv, down gemv + residual
        → xs) runs on the low-priority side stream (started after the router instead, the whole
        step was 4-9 % slower: perf notes, run I). Returns (router variant, experts variant,
        the shared gate|up's gemv config, the overlap)."""
        lat = bufs["lat"]
        down_beside = self.on_cuda and sched.get("latent_down") == "aux"
        if self.on_cuda:
            fork, aux_done, _, join = bufs["events"][i]
            main = torch.cuda.current_stream(self.device)
            fork.record(main)
        if down_beside:
            with torch.cuda.stream(self._aux):
                self._aux.wait_event(fork)
                self._gemv(f"L{i}.down", x, p.moe_down, lat, norm_weight=p.ffn_norm)
                aux_done.record(self._aux)
        router = self._route(p, bufs, x)
        if down_beside:
            main.wait_event(aux_done)
        else:
            self._gemv(f"L{i}.down", x, p.moe_down, lat, norm_weight=p.ffn_norm)
        experts = self._experts(i, p, bufs, lat)

        def shared():
            c = self._gemv(f"L{i}.sw13", x, p.sw13, bufs["sh_h"], epilogue="swiglu", norm_weight=p.ffn_norm)
            self._gemv(f"L{i}.sw2", bufs["sh_h"], p.sw2, xs, epilogue="residual", residual=x)
            return c

        if not self.on_cuda:
            return router, experts, shared(), "sequential"
        with torch.cuda.stream(self._side):
            self._side.wait_event(fork)
            c_sh = shared()
            join.record(self._side)
        main.wait_event(join)
        return router, experts, c_sh, "side_stream"

    def _moe_fused_in(self, i, p, bufs, x, xs, sched) -> tuple[str, str, dict, str]:
        """One launch streams [latent down; shared gate|up] (both read the normed x) on the main
        stream while the router runs beside it on the aux stream; then the experts (main) and
        the shared down projection (side stream, SwiGLU prologue over the raw gate|up, residual
        → xs). At batch 1 the router and the latent down no longer sit on the critical path
        one after the other while the shared gate|up streams alone (perf notes, run L).
        Returns what ``_moe_separate`` returns (the wide launch's config for the shared
        expert)."""
        L = self.cfg.moe_latent
        wide = bufs["moe_in"]
        lat, gate_up = wide[:, :L], wide[:, L:]
        if self.on_cuda:
            fork, routed, wide_done, join = bufs["events"][i]
            main = torch.cuda.current_stream(self.device)
            fork.record(main)
            with torch.cuda.stream(self._aux):
                self._aux.wait_event(fork)
                router = self._route(p, bufs, x)
                routed.record(self._aux)
        else:
            router = self._route(p, bufs, x)
        c = self._gemv(f"L{i}.moe_in", x, p.moe_in, wide, norm_weight=p.ffn_norm)

        def shared_down():
            self._gemv(f"L{i}.sw2", gate_up, p.sw2, xs, epilogue="residual", residual=x, glu_input=True)

        if not self.on_cuda:
            shared_down()
            return router, self._experts(i, p, bufs, lat), c, "sequential"
        wide_done.record(main)
        with torch.cuda.stream(self._side):
            self._side.wait_event(wide_done)
            shared_down()
            join.record(self._side)
        main.wait_event(routed)
        experts = self._experts(i, p, bufs, lat)
        main.wait_event(join)
        return router, experts, c, "side_stream"

    # -- public -------------------------------------------------------------------------------------
    def _state_key(self, state) -> tuple:
        return tuple((t.data_ptr(), tuple(t.shape)) for t in state.tensors())

    def _capture(self, bufs: dict, state: Any, lengths_base: torch.Tensor | None, extra=None):
        """Warm up (compile) on a clone of the state, then capture the whole step."""
        B = bufs["tokens"].shape[0]
        scratch = state.clone()
        main = self._main
        main.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(main):
            self._step(bufs, scratch)
            if extra is not None:
                extra()
        torch.cuda.current_stream(self.device).wait_stream(main)
        torch.cuda.synchronize(self.device)
        del scratch
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        key = ("k3_fast_decode", B, next(_graph_ids))
        graph = torch.cuda.CUDAGraph()
        with trace.capturing(key):
            with torch.cuda.graph(graph, pool=self._mempool, stream=main):
                if lengths_base is not None:
                    state.lengths.copy_(lengths_base)
                self._step(bufs, state)
                if extra is not None:
                    extra()
            trace.engaged("decode_graph", "cuda_graph_whole_step", batch=B,
                          dependent_launch=self._use_pdl(B))
        return key, graph

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, state: Any) -> torch.Tensor:
        """One decode step; returns fp32 logits [B, V] (a fresh tensor)."""
        B = state.batch
        bufs = self._buffers(B)
        bufs["tokens"].copy_(tokens.to(self.device))
        if self.use_graphs:
            skey = (B, self._state_key(state))
            entry = self._graphs.get(skey)
            if entry is None:
                if len(self._graphs) >= self.max_graphs:
                    old_key, (gk, _) = next(iter(self._graphs.items()))
                    trace.forget(gk)
                    del self._graphs[old_key]
                saved = getattr(state, "max_len", None)
                entry = self._graphs[skey] = self._capture(bufs, state, None)
                if saved is not None:
                    state.max_len = saved
            gk, graph = entry
            graph.replay()
            trace.replayed(gk)
            out = bufs["logits"].clone()
        else:
            if self.device.type != "cuda":
                trace.refused("decode_graph", "no_cuda", batch=B)
            else:
                trace.refused("decode_graph", "graphs_off", batch=B)
            out = self._step(bufs, state).clone()
        if hasattr(state, "max_len"):
            state.max_len += 1
        return out

    def decode_step(self, batch: int, context: int, draft: int = 0, seed: int = 0) -> Callable[[], None]:
        """A callable running one fast decode step of ``batch`` sequences at ``context`` tokens
        (lengths reset to ``context`` inside the step), greedy-sampled by the fused sampler
        (so the step covers every component). A CUDA-graph replay on CUDA."""
        if draft:
            raise NotImplementedError("speculative decoding (draft > 0) is out of the fast path's scope")
        cap = -(-(context + 1) // 64) * 64
        if hasattr(self.model, "random_state"):
            state = self.model.random_state(batch, context, cap, seed=seed)
        else:
            state = self.state_factory(batch, cap)
            state.lengths.fill_(context)
        base = state.lengths.clone()
        gen = torch.Generator().manual_seed(seed)
        bufs = self._buffers(batch)
        tokens = torch.randint(0, self.cfg.n_real_tokens, (batch,), generator=gen).to(self.device)
        from .kernels.sampler import sample_tensors

        V = self.cfg.vocab_size
        s_temp = torch.zeros(batch, dtype=torch.float32, device=self.device)
        s_topk = torch.zeros(batch, dtype=torch.int32, device=self.device)
        s_topp = torch.ones(batch, dtype=torch.float32, device=self.device)
        s_noise = torch.ones(batch, V, dtype=torch.float32, device=self.device)
        s_tok = torch.empty(batch, dtype=torch.int64, device=self.device)
        s_lp = torch.empty(batch, dtype=torch.float32, device=self.device)

        def sample():
            sample_tensors(bufs["logits"], s_temp, s_topk, s_topp, s_noise, None,
                           n_valid=self.cfg.n_real_tokens, out_tokens=s_tok, out_logprobs=s_lp)
            trace.engaged("sampler", self.sampler.variant + ("" if self.on_cuda else "_interp"),
                          batch=batch, vocab=V)

        if self.use_graphs:
            with torch.inference_mode():
                bufs["tokens"].copy_(tokens)
                key, graph = self._capture(bufs, state, base, extra=sample)

            def run() -> None:
                graph.replay()
                trace.replayed(key)

            # the graph reads and writes these tensors at every replay: they must live as long as
            # it does (a freed ``base`` or sampler buffer is reused by the next allocation, and
            # the replay then reads its lengths from someone else's memory)
            run._keep = (state, graph, bufs, base, s_temp, s_topk, s_topp, s_noise, s_tok, s_lp)  # type: ignore[attr-defined]
            return run

        def run_eager() -> None:
            with torch.inference_mode():
                state.lengths.copy_(base)
                bufs["tokens"].copy_(tokens)
                trace.refused("decode_graph", "no_cuda" if self.device.type != "cuda" else "graphs_off",
                              batch=batch)
                self._step(bufs, state)
                sample()

        return run_eager
