"""K3-mini's standard path over several ranks: tensor parallelism (TP) and decode context
parallelism (DCP), communicating only through ``torch.distributed`` collectives (NCCL on GPU,
gloo on CPU; launched by torchrun or torch.multiprocessing).

Each rank runs ``K3ParallelModel``: a K3Model whose config has its share of the heads
(shard.local_config) and whose weights are its slice of the full seeded weights
(shard.shard_weights, which says what is sliced how), plus the collectives at the seams:

    KDA block         heads local; o_proj partial sums -> all-reduce
    MLA block         qkv_a (latent projection) rows split -> all-gather; heads local;
                      o_proj partial -> all-reduce. Latent cache: every TP rank holds the
                      (replicated) latents, unless DCP splits them by position (below)
    MoE block         router scores split -> all-gather (every rank takes the same top-k);
                      moe_down split -> all-gather; experts and shared expert sliced over the
                      intermediate width (partial sums); routed sum reduce-scattered over the
                      latent width into the column-split moe_up; one all-reduce of the block
                      output (routed + shared partials)
    dense FFN         sliced intermediate -> all-reduce
    LM head           vocabulary split -> all-gather of the logits

DCP (``dcp`` ranks, dividing tp; groups of consecutive TP ranks): position p of the latent
cache lives on group rank p % dcp at local slot p // dcp, so each rank stores 1/dcp of the
context. A decode step all-gathers the absorbed queries of the group's heads, each rank
attends over its positions (normalised partial output + log-sum-exp), then the partials are
merged exactly: all-gather the LSEs, rescale each partial by exp(lse_local - lse_global),
reduce-scatter over heads (each rank gets its own heads' merged output). Prefill attends with
the full prompt (every rank has all latents after the all-gather) and stores its positions.

Every rank ends a forward with identical logits (all-gathered). Batch rows and the host-side
runner (CUDA graphs, fast path) are out of this module's scope: it is the standard math only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .config import K3Config
from .model import K3Model
from .shard import local_config, shard_weights
from .state import DecodeState


@dataclass(frozen=True)
class Layout:
    """Where this rank sits: TP over the whole (default) process group, DCP over groups of
    ``dcp`` consecutive TP ranks. Build with ``Layout.from_world(dcp)`` after init_process_group."""

    tp: int
    rank: int
    dcp: int = 1
    dcp_group: Any = None

    @property
    def dcp_rank(self) -> int:
        return self.rank % self.dcp

    @classmethod
    def from_world(cls, dcp: int = 1) -> "Layout":
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised; call init_process_group "
                               "(torchrun sets the environment) before building the layout")
        tp, rank = dist.get_world_size(), dist.get_rank()
        if dcp < 1 or tp % dcp:
            raise ValueError(f"DCP size {dcp} does not divide the TP size {tp}; pick a divisor of {tp}")
        mine = None
        for g in range(tp // dcp):  # every rank creates every group, in the same order
            ranks = list(range(g * dcp, (g + 1) * dcp))
            group = dist.new_group(ranks) if dcp > 1 else None
            if rank in ranks:
                mine = group
        return cls(tp=tp, rank=rank, dcp=dcp, dcp_group=mine)


# -- collectives (each a thin wrapper: which dimension is split) --------------------------------
# recent torch names the single-tensor collectives *_single (the *_tensor names warn), older
# releases only *_tensor; looked up per call so that importing this module never needs them
def _all_gather(out, t, group):
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, t, group=group)


def _reduce_scatter(out, t, group):
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, t, group=group)


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    return t


def _gather_first(t: torch.Tensor, n: int, group) -> torch.Tensor:
    """[..] per rank -> [n, ..] in rank order (concatenated along dim 0: gloo's layout)."""
    t = t.contiguous()
    buf = t.new_empty(n * t.shape[0], *t.shape[1:])
    _all_gather(buf, t, group=group)
    return buf.view(n, *t.shape)


def _reduce_scatter_first(t: torch.Tensor, n: int, group) -> torch.Tensor:
    """Sum over ranks of [n * m, ..]; each rank keeps its [m, ..] block of dim 0."""
    t = t.contiguous()
    out = t.new_empty(t.shape[0] // n, *t.shape[1:])
    _reduce_scatter(out, t, group=group)
    return out


def gather_last(t: torch.Tensor, n: int, group=None) -> torch.Tensor:
    """All-gather the ranks' slices of the last dimension, in rank order."""
    return _gather_first(t, n, group).movedim(0, -2).flatten(-2)


def reduce_scatter_last(t: torch.Tensor, n: int, group=None) -> torch.Tensor:
    """Sum over ranks, each rank keeping its 1/n slice of the last dimension."""
    return _reduce_scatter_first(t.movedim(-1, 0), n, group).movedim(0, -1)


def gather_heads(t: torch.Tensor, n: int, group) -> torch.Tensor:
    """[B, h, ..] per rank -> [B, n * h, ..] (the group's heads in rank order)."""
    return _gather_first(t, n, group).transpose(0, 1).flatten(1, 2)


def partial_attention(q: torch.Tensor, keys: torch.Tensor, masked: torch.Tensor, scale: float):
    """Softmax attention of q [B, h, C] over this rank's keys [B, S, C] (values = keys: the
    absorbed MLA latents). Returns (output normalised over these keys [B, h, C], log-sum-exp
    [B, h] fp32); a row with no visible key gives output 0 and lse -inf."""
    scores = torch.bmm(q, keys.transpose(1, 2)).float() * scale
    scores = scores.masked_fill(masked, float("-inf"))
    m = scores.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(scores - m)
    den = e.sum(-1, keepdim=True)
    p = (e / den.clamp_min(torch.finfo(den.dtype).tiny)).to(keys.dtype)
    return torch.bmm(p, keys), (den.log() + m).squeeze(-1)


def merge_partials(o: torch.Tensor, lse: torch.Tensor, n: int, group) -> torch.Tensor:
    """Exact merge of the group's partial attentions o [B, n*h, C], lse [B, n*h] (each over
    disjoint keys): softmax over all keys = sum_r exp(lse_r - lse) o_r with lse = logsumexp_r.
    Returns this rank's heads [B, h, C] (reduce-scatter over heads)."""
    total = torch.logsumexp(_gather_first(lse, n, group), dim=0)
    o = (o.float() * torch.exp(lse - total).unsqueeze(-1)).to(o.dtype)
    out = _reduce_scatter_first(o.transpose(0, 1), n, group)  # heads first: [h, B, C]
    return out.transpose(0, 1)


class K3ParallelModel(K3Model):
    """One rank of a TP (x DCP) K3-mini; built from the FULL weights, sliced here."""

    def __init__(self, cfg: K3Config, full_weights: dict[str, torch.Tensor], layout: Layout, **kw):
        self.full_cfg = cfg
        self.layout = layout
        super().__init__(local_config(cfg, layout.tp), shard_weights(cfg, full_weights, layout.rank, layout.tp), **kw)

    # -- the seams of K3Model (identities on one rank), the collectives here -----------------------
    def _gather(self, t):
        return gather_last(t, self.layout.tp)

    def _reduce(self, t):
        return all_reduce(t)

    def _reduce_scatter(self, t):
        return reduce_scatter_last(t, self.layout.tp)

    def _mla_latents(self, i, x):
        """q_a and kv_a are one fused row-split projection here (shard.py): one all-gather."""
        return self._gather(F.linear(x, self.W(i, "qkv_a"))).split([self.cfg.q_lora, self.cfg.kv_lora], dim=-1)

    # -- state and DCP ------------------------------------------------------------------------------
    def new_state(self, batch: int, capacity: int) -> DecodeState:
        """An empty state for ``capacity`` positions; with DCP the latent cache holds this
        rank's ceil(capacity / dcp) slots."""
        st = super().new_state(batch, capacity)
        if self.layout.dcp > 1:
            st.latent = st.latent.new_zeros(*st.latent.shape[:2], math.ceil(capacity / self.layout.dcp),
                                            st.latent.shape[3])
        return st

    def random_state(self, *a, **kw):
        raise NotImplementedError("random_state is single-rank only; prefill a K3ParallelModel state instead")

    def _cache_prompt(self, s, c, state):
        n, d = self.layout.dcp, self.layout.dcp_rank
        if n == 1:
            return super()._cache_prompt(s, c, state)
        mine = c[:, d::n]
        if mine.shape[1] > state.capacity:
            raise ValueError(f"prompt of {c.shape[1]} tokens exceeds the DCP state capacity "
                             f"{state.capacity} x {n} ranks")
        state.latent[s, :, : mine.shape[1]].copy_(mine)

    def _positions(self, state):
        """Global positions of this rank's cache slots [cap_local]."""
        n, d = self.layout.dcp, self.layout.dcp_rank
        return torch.arange(state.capacity, device=state.lengths.device) * n + d

    def mla_decode(self, i, x, state: DecodeState):
        n = self.layout.dcp
        if n == 1:
            return super().mla_decode(i, x, state)
        cfg, s = self.cfg, self.cfg.slot(i)
        q, c = self._mla_q_c(i, x)  # c: the full latent, identical on every rank
        B = c.shape[0]
        rows = torch.arange(B, device=c.device)
        slot = state.lengths // n
        lat = state.latent[s]
        mine = (state.lengths % n == self.layout.dcp_rank).unsqueeze(-1)
        lat.index_put_((rows, slot), torch.where(mine, c, lat[rows, slot]))  # owner writes, others keep
        masked = self._positions(state).view(1, 1, -1) > state.lengths.view(-1, 1, 1)
        w_uk, w_uv = self._w_uk_uv(i)
        q_lat = gather_heads(torch.einsum("bhn,hnc->bhc", q, w_uk), n, self.layout.dcp_group)
        o, lse = partial_attention(q_lat, lat, masked, cfg.qk_nope ** -0.5)
        o = merge_partials(o, lse, n, self.layout.dcp_group)
        return self._mla_out(i, torch.einsum("bhc,hvc->bhv", o, w_uv), x)

    def mla_decode_reference(self, i, x, state: DecodeState):
        if self.layout.dcp > 1:
            raise NotImplementedError("the non-absorbed reference decode is not context-parallel; use absorbed=True")
        return super().mla_decode_reference(i, x, state)
