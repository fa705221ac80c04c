"""One decode step of the whole model on the fast kernels — the layer loop.

Per layer (weights prepacked, packed.py; every projection is an ``fp_gemv`` launch):

  KDA   1 gemv  [RMSNorm prologue] x → q|k|v|f_a|g_a|b        (one concatenated weight)
        1 gemv  [f_a|g_a] → [f|g]  (block-diagonal f_b ⊕ g_b; or, plan, inside KDA decode)
        1 kda_decode (fused conv, gates, L2 norm, delta rule, o-norm, output gate)
        1 gemv  o_proj + residual epilogue
  MLA   1 gemv  [RMSNorm prologue] x → q_a|kv_a|gate_proj
        1 gemv  [q_a_norm prologue] q_b ;  1 grouped gemv q·W_uk (absorbed, per head)
        1 add_rmsnorm  kv_a_norm, written straight into the latent cache at lengths[b]
        mla_decode (split-KV flash decoding + combine)
        1 grouped gemv W_uv with the sigmoid-gate epilogue ; 1 gemv o_proj + residual
  MoE   router, latent down, routed experts, shared expert on its own stream, latent up
        (moe_block.py)
  dense FFN (layer 0): SwiGLU gemv (norm prologue) + down gemv with residual epilogue
  head  gemv [final-norm prologue] → fp32 logits (padding columns stay -inf)
  option (plan ``l2``, sites ``tuning.L2_SITES``; none adopted on the H200, perf notes run M):
        an L2 prefetch of an upcoming weight on its own stream (schedule.py)

Every choice above is read from the batch's ``StepPlan`` (step_plan.py), resolved once.
"""

from __future__ import annotations

from typing import Any

import torch

from fastpath import trace

from . import attention, moe_block
from .buffers import StepBuffers
from .gemv_call import GemvLauncher
from .kernels import gemv as G
from .kernels import pdl as PDL
from .packed import HeadWeights, PackedLayer
from .schedule import L2Prefetcher, Streams
from .step_plan import StepPlan


class DecodeStep:
    """The step of one batch size: its plan, its buffers, the decoder's streams.
    ``step(state)`` runs it on the static buffers (capturable: no host sync, no allocation
    that changes between calls) and returns the logits buffer."""

    def __init__(self, cfg: Any, layers: list[PackedLayer], head: HeadWeights, plan: StepPlan,
                 bufs: StepBuffers, streams: Streams, launcher: GemvLauncher, device, on_cuda: bool):
        self.cfg, self.layers, self.head = cfg, layers, head
        self.plan, self.bufs, self.streams = plan, bufs, streams
        self.device, self.on_cuda = device, on_cuda
        self._launch = launcher
        self.l2 = L2Prefetcher(streams, device, plan.l2)

    def gemv(self, site: str, x, w, out, **kw):
        """One gemv at ``site`` with the plan's config; returns the config that ran."""
        return self._launch(self.plan.gemv[site], site, x, w, out, **kw)

    def __call__(self, state: Any) -> torch.Tensor:
        cfg, plan, b = self.cfg, self.plan, self.bufs
        B = plan.batch
        self.l2.begin()
        with PDL.scope(plan.pdl != "off"):
            torch.index_select(self.head.embed, 0, b.tokens, out=b.xa)
            for i, p in enumerate(self.layers):
                with trace.layer(i):  # every event of the layer names it (the coverage gate's per-layer check)
                    self.attend(i, p, state, b.xa, b.xb)  # xa → xb = xa + attention
                    if p.ffn_kind == "dense":
                        self.dense_ffn(i, p, b.xb, b.xa)  # xb → xa = xb + FFN
                    else:
                        with PDL.scope(plan.pdl_in_moe):
                            moe_block.moe(self, i, p, b.xb, b.xs, b.xa)
            c = self.gemv("lm_head", b.xa, self.head.lm_head, b.logits[:, : cfg.n_real_tokens],
                          norm_weight=self.head.final_norm)
            trace.engaged("lm_head", G.variant_name(B, c), batch=B, vocab=cfg.n_real_tokens, hidden=cfg.hidden)
            self.advance(state)
        self.l2.join()
        return b.logits

    def attend(self, i: int, p: PackedLayer, state: Any, x, x_out) -> None:
        """x → x_out = x + attention(x) (a verify step overrides it: verify_step.py)."""
        (attention.kda if p.kind == "kda" else attention.mla)(self, i, p, state, x, x_out)

    def advance(self, state: Any) -> None:
        state.lengths.add_(1)

    def dense_ffn(self, i: int, p: PackedLayer, x, x_out) -> None:
        h = self.bufs.ffn_h[:, : self.cfg.dense_inter]
        c = self.gemv(f"L{i}.w13", x, p.ffn.w13, h, epilogue="swiglu", norm_weight=p.ffn_norm)
        self.gemv(f"L{i}.w2", h, p.ffn.w2, x_out, epilogue="residual", residual=x)
        B = x.shape[0]
        trace.engaged("dense_gemv", G.variant_name(B, c), layer=i, op="dense_ffn", batch=B)
        trace.engaged("norm_residual", "fused_gemv_prologue_epilogue", layer=i, batch=B)
