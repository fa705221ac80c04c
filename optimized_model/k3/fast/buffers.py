"""The static buffers of one batch size: every tensor a decode step writes, allocated once so
that a CUDA graph captured over them can be replayed (no allocation inside the step)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .kernels import moe as MOE


@dataclass
class StepBuffers:
    tokens: torch.Tensor  # [B] the step's input tokens (copied in before each step / replay)
    xa: torch.Tensor  # hidden state ping-pong: layer input / FFN output
    xb: torch.Tensor  # attention output (+ residual)
    xs: torch.Tensor  # x + shared expert (the MoE's residual)
    proj: torch.Tensor  # the attention in-projection's output (widest layer)
    fg: torch.Tensor  # KDA [f | gate] when formed by their own gemv
    o: torch.Tensor  # attention output before o_proj
    q: torch.Tensor
    q_lat: torch.Tensor  # MLA absorbed queries [B, H, C]
    o_lat: torch.Tensor  # MLA latent attention output [B, H, C]
    ffn_h: torch.Tensor  # dense FFN hidden
    sh_h: torch.Tensor  # shared expert hidden
    lat: torch.Tensor  # MoE latent (separate schedule)
    moe_in: torch.Tensor  # [latent | shared gate|up] (fused schedule)
    ids: torch.Tensor  # routed expert ids [B, top_k]
    rw: torch.Tensor  # routing weights [B, top_k]
    eh: torch.Tensor  # routed experts' hidden [B * top_k, I]
    eo: torch.Tensor  # routed experts' per-slot outputs [B, top_k, L] fp32
    lat_sum: torch.Tensor  # Σ over the slots, when the experts' down kernel forms it
    router_scratch: Any
    align: Any  # the by-expert grouping of the (token, slot) pairs
    logits: torch.Tensor  # [B, V] fp32; padding columns stay -inf
    # per MoE layer: fork (main → aux, side), aux done (router or latent down → main), wide
    # launch done (main → side; fused schedule), join (side → main); None off CUDA
    events: list | None

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]


def allocate(cfg: Any, in_widths: list[int], B: int, experts_block_m: int, device, dtype,
             on_cuda: bool) -> StepBuffers:
    """``in_widths``: each layer's in-projection width (the widest sizes ``proj``)."""
    e = lambda *s, dtype=dtype: torch.empty(*s, dtype=dtype, device=device)  # noqa: E731
    h = cfg.hidden
    return StepBuffers(
        tokens=torch.zeros(B, dtype=torch.long, device=device),
        xa=e(B, h), xb=e(B, h), xs=e(B, h),
        proj=e(B, max(in_widths)),
        fg=e(B, 2 * cfg.kda_dim),
        o=e(B, max(cfg.kda_dim, cfg.mla_heads * cfg.v_head)),
        q=e(B, cfg.mla_heads * cfg.qk_nope),
        q_lat=e(B, cfg.mla_heads, cfg.kv_lora),
        o_lat=e(B, cfg.mla_heads, cfg.kv_lora),
        ffn_h=e(B, max(cfg.dense_inter, cfg.n_shared * cfg.shared_inter)),
        sh_h=e(B, cfg.n_shared * cfg.shared_inter),
        lat=e(B, cfg.moe_latent),
        moe_in=e(B, cfg.moe_latent + 2 * cfg.n_shared * cfg.shared_inter),
        ids=e(B, cfg.top_k, dtype=torch.int32),
        rw=e(B, cfg.top_k, dtype=torch.float32),
        eh=e(B * cfg.top_k, cfg.expert_inter),
        eo=e(B, cfg.top_k, cfg.moe_latent, dtype=torch.float32),
        lat_sum=e(B, cfg.moe_latent),
        router_scratch=MOE.RouterScratch(B, cfg.n_experts, device),
        align=MOE.MoeAlign(B, cfg.top_k, cfg.n_experts, experts_block_m, device),
        logits=torch.full((B, cfg.vocab_size), float("-inf"), dtype=torch.float32, device=device),
        events=[tuple(torch.cuda.Event() for _ in range(4)) for _ in range(cfg.n_layers)] if on_cuda else None,
    )
