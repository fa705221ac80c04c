"""Tensor-parallel weight shards of K3-mini: one rank's slice of the full (seeded) weights.

Pure tensor slicing, no communication: ``shard_weights(cfg, full, rank, tp)`` returns the flat
dict rank ``rank`` of ``tp`` holds, under the names of weights.py (a sharded tensor keeps its
name; its shape shrinks). What each rank holds (Megatron-style; collectives in parallel.py):

* heads (KDA and MLA): rank r owns the contiguous heads r*H/tp .. (r+1)*H/tp - 1. Every
  head-indexed row (KDA q|k|v, conv taps, f_b, dt_bias, A_log, b_proj, g_b; MLA q_b, kv_b,
  gate_proj) is cut to those heads; the output projections (o_proj) keep the heads' columns
  (row-parallel: partial sums, then all-reduce).
* the KDA low-rank inputs f_a, g_a (hidden -> head_dim) and every norm weight are replicated:
  a head_dim-wide output is cheaper to recompute than to gather.
* MLA latent projection: q_a and kv_a fused as ``qkv_a`` [q_lora + kv_lora, hidden], rows
  split (each rank computes 1/tp of the latents, then all-gather).
* router [E, hidden]: rows (experts' scores) split, all-gathered before the top-k, so every rank
  selects from the same scores. router_bias is replicated (it acts on the gathered scores).
* MoE latent projections: moe_down rows split (all-gather), moe_up columns split (its input
  arrives reduce-scattered over the latent width).
* experts, shared expert, layer-0 dense FFN: every rank holds a 1/tp slice of each expert's
  intermediate width (w13: the slice of the gate rows then the same slice of the up rows; w2:
  the matching columns). Slicing each expert rather than splitting whole experts keeps the
  decode step balanced: top-k of E at small batch puts all of a token's experts on one rank
  with expert splitting, while slices give every rank exactly 1/tp of the active bytes.
* embedding replicated; lm_head rows (vocabulary) split, logits all-gathered.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .config import K3Config


def check_tp(cfg: K3Config, tp: int) -> None:
    """One-line error naming the dimension that ``tp`` does not divide."""
    dims = {"kda_heads": cfg.kda_heads, "mla_heads": cfg.mla_heads, "n_experts": cfg.n_experts,
            "moe_latent": cfg.moe_latent, "q_lora + kv_lora": cfg.q_lora + cfg.kv_lora,
            "dense_inter": cfg.dense_inter, "expert_inter": cfg.expert_inter,
            "n_shared * shared_inter": cfg.n_shared * cfg.shared_inter, "vocab_size": cfg.vocab_size}
    if tp < 1:
        raise ValueError(f"tensor-parallel size {tp} < 1; use 1 or more ranks")
    bad = [f"{k}={v}" for k, v in dims.items() if v % tp]
    if bad:
        raise ValueError(f"tensor-parallel size {tp} does not divide {', '.join(bad)} of config "
                         f"{cfg.name!r}; pick a size dividing them (or a config with more heads)")


def local_config(cfg: K3Config, tp: int) -> K3Config:
    """The config one rank's forward sees: its share of the heads (everything else as full)."""
    check_tp(cfg, tp)
    return replace(cfg, kda_heads=cfg.kda_heads // tp, mla_heads=cfg.mla_heads // tp)


def _rows(t: torch.Tensor, rank: int, tp: int, dim: int = 0) -> torch.Tensor:
    return t.chunk(tp, dim=dim)[rank].contiguous()


def _gate_up(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """A SwiGLU w13 ([.., 2I, in]: gate rows | up rows) -> this rank's gate slice | up slice."""
    gate, up = t.chunk(2, dim=-2)
    return torch.cat([_rows(gate, rank, tp, -2), _rows(up, rank, tp, -2)], dim=-2)


def _head_rows(t: torch.Tensor, n_heads: int, rank: int, tp: int) -> torch.Tensor:
    """Rows of a head-major tensor ([n_heads * per_head, ..]) -> this rank's heads."""
    return _rows(t.unflatten(0, (n_heads, -1)), rank, tp).flatten(0, 1)


def shard_weights(cfg: K3Config, full: dict[str, torch.Tensor], rank: int, tp: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s slice of ``full`` (weights.init_weights(cfg, ...)); see the module docstring."""
    check_tp(cfg, tp)
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} outside 0..{tp - 1}; pass the rank within the tensor-parallel group")
    out = {"embed": full["embed"], "final_norm": full["final_norm"],
           "lm_head": _rows(full["lm_head"], rank, tp)}
    for i in range(cfg.n_layers):
        p = f"L{i}."

        def W(name):
            return full[p + name]

        def put(name, t):
            out[p + name] = t

        for n in ("attn_norm", "ffn_norm"):
            put(n, W(n))
        if cfg.layer_kind(i) == "kda":
            H = cfg.kda_heads
            qkv = lambda t: torch.cat([_head_rows(b, H, rank, tp) for b in t.chunk(3, dim=0)])  # noqa: E731
            put("qkv_proj", qkv(W("qkv_proj")))
            put("conv", qkv(W("conv")))
            for n in ("f_b", "dt_bias", "A_log", "b_proj", "g_b"):
                put(n, _head_rows(W(n), H, rank, tp))
            for n in ("f_a", "g_a", "o_norm"):
                put(n, W(n))
            put("o_proj", _rows(W("o_proj"), rank, tp, dim=1))
        else:
            H = cfg.mla_heads
            put("qkv_a", _rows(torch.cat([W("q_a"), W("kv_a")]), rank, tp))
            for n in ("q_a_norm", "kv_a_norm"):
                put(n, W(n))
            for n in ("q_b", "kv_b", "gate_proj"):
                put(n, _head_rows(W(n), H, rank, tp))
            put("o_proj", _rows(W("o_proj"), rank, tp, dim=1))
        if cfg.ffn_kind(i) == "dense":
            put("w13", _gate_up(W("w13"), rank, tp))
            put("w2", _rows(W("w2"), rank, tp, dim=1))
        else:
            put("router", _rows(W("router"), rank, tp))
            put("router_bias", W("router_bias"))
            put("moe_down", _rows(W("moe_down"), rank, tp))
            put("moe_up", _rows(W("moe_up"), rank, tp, dim=1))
            put("experts_w13", _gate_up(W("experts_w13"), rank, tp))
            put("experts_w2", _rows(W("experts_w2"), rank, tp, dim=-1))
            put("shared_w13", _gate_up(W("shared_w13"), rank, tp))
            put("shared_w2", _rows(W("shared_w2"), rank, tp, dim=1))
    return out
