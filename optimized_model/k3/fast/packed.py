"""The model's weights, packed once at build time the way the fast kernels read them.

One dataclass per layer part: the attention (``KdaWeights`` or ``MlaWeights``) and the FFN
(``DenseFfnWeights`` or ``MoeWeights``) of a ``PackedLayer``. Packing concatenates the
projections that read the same input into one weight (one gemv launch streams them all) and
keeps views into it where a step reads a part on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class KdaWeights:
    w_in: torch.Tensor  # [q | k | v | f_a | g_a | b] rows: one gemv after the attention norm
    cols: dict[str, tuple[int, int]]  # each part's columns of the in-projection's output
    w_fg: torch.Tensor  # block-diagonal f_b ⊕ g_b: [f_a | g_a] → [f | g] in one gemv
    f_b: torch.Tensor  # the same weights, for KDA decode's fused low-rank gates
    g_b: torch.Tensor
    conv_w: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # short conv of q, k, v
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    o_norm: torch.Tensor
    o_proj: torch.Tensor


@dataclass(frozen=True)
class MlaWeights:
    w_in: torch.Tensor  # [q_a | kv_a | gate_proj] rows: one gemv after the attention norm
    cols: dict[str, tuple[int, int]]
    q_a_norm: torch.Tensor
    q_b: torch.Tensor
    kv_a_norm: torch.Tensor
    w_ukT: torch.Tensor  # [H, C, nope]: W_uk per head, for the absorbed q·W_uk
    kv_b: torch.Tensor  # W_uv rows are read in place (view [H, nope + v, C])
    o_proj: torch.Tensor


@dataclass(frozen=True)
class DenseFfnWeights:
    w13: torch.Tensor  # gate | up (SwiGLU)
    w2: torch.Tensor


@dataclass(frozen=True)
class MoeWeights:
    router: torch.Tensor
    router_bias: torch.Tensor
    # [latent down; shared gate|up]: both read the normed x, so one launch can stream them
    # (schedule "shared_in": "fused"); the separate schedule reads the same rows as views
    moe_in: torch.Tensor
    moe_down: torch.Tensor
    sw13: torch.Tensor
    moe_up: torch.Tensor
    sw2: torch.Tensor
    ew13: torch.Tensor  # routed experts' gate|up [E, 2I, L]
    ew2: torch.Tensor  # routed experts' down [E, L, I]


@dataclass(frozen=True)
class PackedLayer:
    kind: str  # "kda" | "mla"
    ffn_kind: str  # "dense" | "moe"
    slot: int  # the layer's index among its kind's state tensors
    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    attn: KdaWeights | MlaWeights
    ffn: DenseFfnWeights | MoeWeights


@dataclass(frozen=True)
class HeadWeights:
    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # the real tokens' rows only (the padding logits stay -inf)


def pack_head(model: Any) -> HeadWeights:
    return HeadWeights(model.w["embed"], model.w["final_norm"], model.w["lm_head"][: model.cfg.n_real_tokens])


def _kda(cfg: Any, W, dtype, device) -> KdaWeights:
    d, r, H = cfg.kda_dim, cfg.kda_rank, cfg.kda_heads
    bd = torch.zeros(2 * d, 2 * r, dtype=dtype, device=device)
    bd[:d, :r] = W("f_b")
    bd[d:, r:] = W("g_b")
    conv = W("conv")
    return KdaWeights(
        w_in=torch.cat([W("qkv_proj"), W("f_a"), W("g_a"), W("b_proj")]).contiguous(),
        cols={"q": (0, d), "k": (d, 2 * d), "v": (2 * d, 3 * d), "fg": (3 * d, 3 * d + 2 * r),
              "b": (3 * d + 2 * r, 3 * d + 2 * r + H)},
        w_fg=bd, f_b=W("f_b"), g_b=W("g_b"),
        conv_w=(conv[:d], conv[d:2 * d], conv[2 * d:]),
        A_log=W("A_log"), dt_bias=W("dt_bias"), o_norm=W("o_norm"), o_proj=W("o_proj"))


def _mla(cfg: Any, W) -> MlaWeights:
    H, ql, kl, nope, v = cfg.mla_heads, cfg.q_lora, cfg.kv_lora, cfg.qk_nope, cfg.v_head
    kvb = W("kv_b").view(H, nope + v, kl)
    return MlaWeights(
        w_in=torch.cat([W("q_a"), W("kv_a"), W("gate_proj")]).contiguous(),
        cols={"q_a": (0, ql), "kv": (ql, ql + kl), "gate": (ql + kl, ql + kl + H * v)},
        q_a_norm=W("q_a_norm"), q_b=W("q_b"), kv_a_norm=W("kv_a_norm"),
        w_ukT=kvb[:, :nope].transpose(1, 2).contiguous(),
        kv_b=W("kv_b"), o_proj=W("o_proj"))


def _moe(cfg: Any, W) -> MoeWeights:
    moe_in = torch.cat([W("moe_down"), W("shared_w13")]).contiguous()
    return MoeWeights(
        router=W("router"), router_bias=W("router_bias"),
        moe_in=moe_in, moe_down=moe_in[: cfg.moe_latent], sw13=moe_in[cfg.moe_latent:],
        moe_up=W("moe_up"), sw2=W("shared_w2"), ew13=W("experts_w13"), ew2=W("experts_w2"))


def pack_layer(model: Any, i: int) -> PackedLayer:
    cfg = model.cfg
    W = lambda n: model.w[f"L{i}.{n}"]  # noqa: E731
    kind, ffn_kind = cfg.layer_kind(i), cfg.ffn_kind(i)
    attn = _kda(cfg, W, model.dtype, torch.device(model.device)) if kind == "kda" else _mla(cfg, W)
    ffn = DenseFfnWeights(W("w13"), W("w2")) if ffn_kind == "dense" else _moe(cfg, W)
    return PackedLayer(kind, ffn_kind, cfg.slot(i), W("attn_norm"), W("ffn_norm"), attn, ffn)


def columns(proj: torch.Tensor, weights: KdaWeights | MlaWeights, part: str) -> torch.Tensor:
    """The columns of the in-projection's output ``proj`` that hold ``part``."""
    lo, hi = weights.cols[part]
    return proj[:, lo:hi]
