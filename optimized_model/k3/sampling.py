"""The standard sampler of K3-mini (docs/architecture.md, "Sampling contract").

Per row (request), per step, in fp32::

    x = logits; x[bitmask bit == 0] = -inf; x[id >= n_valid] = -inf
    temperature == 0  -> token = argmax(x) (ties: lowest id); logprob = log_softmax(x)[token]
    else  x = x / temperature
          top-k (k > 0 and k < V): keep x >= the k-th largest value (ties at the boundary kept)
          p = softmax(x)
          top-p (p < 1): keep p_i >= t*, where t* is the largest probability value such that
                         sum(p_j for p_j >= t*) >= top_p  (= the smallest prefix of the
                         descending-sorted probs whose sum reaches top_p, boundary ties kept;
                         if rounding leaves the total mass below top_p, everything is kept,
                         so at least one token always survives)
          q = p * kept / sum(p * kept)                       (renormalise)
          token = argmax(where(q > 0, q / E, -1))  (ties: lowest id), E ~ Exp(1)[V]
          logprob = log(q[token])

E comes from the request's own CPU ``torch.Generator`` seeded with its ``seed``
(``draw_noise``), so every path consumes the same noise and the same seed gives the same samples.
``q / E`` is only formed where q > 0, so a zero E (or a masked token) can never yield NaN.

The fast path's fused Triton kernel (``fast/kernels/sampler.py``) implements the same rules
and is tested token-for-token against this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

__all__ = [
    "SamplingParams",
    "Sampler",
    "draw_noise",
    "make_generators",
    "apply_bitmask",
    "bitmask_to_bool",
    "sample_reference",
    "sample_batched",
    "final_probs",
]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @classmethod
    def from_request(cls, req: Any) -> "SamplingParams":
        return cls(
            temperature=float(getattr(req, "temperature", 0.0)),
            top_p=float(getattr(req, "top_p", 1.0)),
            top_k=int(getattr(req, "top_k", 0) or 0),
            seed=int(getattr(req, "seed", 0)),
        )

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")


def make_generators(params: Sequence[SamplingParams]) -> list[torch.Generator | None]:
    """One CPU generator per sampled request, seeded with its seed (None for greedy rows)."""
    gens: list[torch.Generator | None] = []
    for p in params:
        if p.greedy:
            gens.append(None)
        else:
            g = torch.Generator(device="cpu")
            g.manual_seed(int(p.seed))
            gens.append(g)
    return gens


def draw_noise(generators: Sequence[torch.Generator | None], vocab: int) -> torch.Tensor:
    """E ~ Exp(1) of shape [B, vocab] fp32 on CPU, row b drawn from ``generators[b]``.

    Rows whose generator is None (greedy or finished requests) are filled with ones and consume
    no randomness, so a request's samples do not depend on what else is in the batch."""
    noise = torch.ones(len(generators), vocab, dtype=torch.float32)
    for b, g in enumerate(generators):
        if g is not None:
            noise[b].exponential_(1.0, generator=g)
    return noise


def bitmask_to_bool(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """xgrammar's packed int32 bitmask [B, ceil(V/32)] -> allowed bool [B, V] (bit j of word i
    is token 32*i + j; 1 = allowed)."""
    ids = torch.arange(vocab, device=bitmask.device)
    words = bitmask.to(torch.int64)[:, ids >> 5]
    return ((words >> (ids & 31)) & 1).bool()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor | None, n_valid: int | None = None) -> torch.Tensor:
    """A copy of ``logits`` with disallowed ids (bitmask bit 0, or id >= n_valid) set to -inf."""
    x = logits.clone()
    if bitmask is not None:
        allowed = bitmask_to_bool(bitmask.to(x.device), x.shape[-1])
        x = x.masked_fill(~allowed, float("-inf"))
    if n_valid is not None and n_valid < x.shape[-1]:
        x[..., n_valid:] = float("-inf")
    return x


def _row_distribution(x: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Final distribution of one sampled row (x already masked, any float dtype)."""
    x = x / p.temperature
    V = x.shape[-1]
    if 0 < p.top_k < V:
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if p.top_p < 1.0:
        sorted_p, _ = torch.sort(probs, descending=True)
        csum = torch.cumsum(sorted_p, dim=-1)
        reach = torch.nonzero(csum >= p.top_p)
        if reach.numel() > 0:  # else: rounding left the mass below top_p -> keep everything
            t_star = sorted_p[reach[0, 0]]
            probs = probs.masked_fill(probs < t_star, 0.0)
    return probs / probs.sum()


def _race(q: torch.Tensor, e: torch.Tensor) -> int:
    score = torch.where(q > 0, q / e.to(q.dtype), torch.full_like(q, -1.0))
    return int(torch.argmax(score))  # torch.argmax returns the first (lowest) maximal index


def sample_reference(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    noise: torch.Tensor | None,
    bitmask: torch.Tensor | None = None,
    *,
    n_valid: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The contract, row by row, in ``dtype`` (fp32 = standard, fp64 = oracle).

    Returns (tokens int64 [B], logprobs fp32 [B], final distribution ``dtype`` [B, V])."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got {tuple(logits.shape)}")
    B, V = logits.shape
    if len(params) != B:
        raise ValueError(f"{len(params)} sampling params for a batch of {B}")
    x_all = apply_bitmask(logits.to(dtype), bitmask, n_valid)
    tokens = torch.empty(B, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(B, dtype=torch.float32, device=logits.device)
    dist = torch.zeros(B, V, dtype=dtype, device=logits.device)
    for b, p in enumerate(params):
        x = x_all[b]
        if p.greedy:
            t = int(torch.argmax(x))
            tokens[b] = t
            logprobs[b] = torch.log_softmax(x, dim=-1)[t].float()
            dist[b, t] = 1.0
            continue
        if noise is None:
            raise ValueError("sampled rows (temperature > 0) need noise; use draw_noise()")
        q = _row_distribution(x, p)
        t = _race(q, noise[b].to(q.device))
        tokens[b] = t
        logprobs[b] = torch.log(q[t]).float()
        dist[b] = q
    return tokens, logprobs, dist


def final_probs(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    bitmask: torch.Tensor | None = None,
    *,
    n_valid: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The distribution each row is sampled from (one-hot at the argmax for greedy rows)."""
    B, V = logits.shape
    x_all = apply_bitmask(logits.to(dtype), bitmask, n_valid)
    out = torch.zeros(B, V, dtype=dtype, device=logits.device)
    for b, p in enumerate(params):
        if p.greedy:
            out[b, int(torch.argmax(x_all[b]))] = 1.0
        else:
            out[b] = _row_distribution(x_all[b], p)
    return out


def sample_batched(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    noise: torch.Tensor | None,
    bitmask: torch.Tensor | None = None,
    *,
    n_valid: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same contract as ``sample_reference`` in fp32, for the whole batch at once (no
    per-row host syncs: what a generic engine runs). Row for row it performs the same fp32
    operations, so on CPU it equals ``sample_reference`` exactly (tested)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got {tuple(logits.shape)}")
    B, V = logits.shape
    if len(params) != B:
        raise ValueError(f"{len(params)} sampling params for a batch of {B}")
    dev = logits.device
    x = apply_bitmask(logits.float(), bitmask, n_valid)
    temp = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    greedy_h = temp <= 0
    greedy_tok = torch.argmax(x, dim=-1)
    greedy_lp = torch.log_softmax(x, dim=-1).gather(1, greedy_tok[:, None])[:, 0]
    dist = torch.zeros(B, V, dtype=torch.float32, device=dev)
    if bool(greedy_h.all()):
        dist.scatter_(1, greedy_tok[:, None], 1.0)
        return greedy_tok, greedy_lp, dist
    if noise is None:
        raise ValueError("sampled rows (temperature > 0) need noise; use draw_noise()")
    greedy = greedy_h.to(dev)
    xs = x / torch.where(greedy_h, torch.ones_like(temp), temp).to(dev)[:, None]
    top_k = torch.tensor([p.top_k for p in params], dtype=torch.int64)
    use_k_h = (top_k > 0) & (top_k < V) & ~greedy_h
    if bool(use_k_h.any()):
        kmax = int(top_k[use_k_h].max())
        vals = torch.topk(xs, kmax, dim=-1).values
        kth = vals.gather(1, (top_k.clamp(1, kmax) - 1).to(dev)[:, None])
        xs = xs.masked_fill(use_k_h.to(dev)[:, None] & (xs < kth), float("-inf"))
    probs = torch.softmax(xs, dim=-1)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
    use_p_h = (top_p < 1.0) & ~greedy_h
    if bool(use_p_h.any()):
        sorted_p = torch.sort(probs, dim=-1, descending=True).values
        csum = torch.cumsum(sorted_p, dim=-1)
        reach = csum >= top_p.to(dev)[:, None]
        first = torch.argmax(reach.to(torch.int8), dim=-1)  # first index reaching top_p
        t_star = sorted_p.gather(1, first[:, None])
        drop = (use_p_h.to(dev) & reach.any(dim=-1))[:, None] & (probs < t_star)
        probs = probs.masked_fill(drop, 0.0)
    q = probs / probs.sum(dim=-1, keepdim=True)
    e = noise.to(dev, torch.float32)
    score = torch.where(q > 0, q / e, torch.full_like(q, -1.0))
    tok = torch.argmax(score, dim=-1)
    lp = torch.log(q.gather(1, tok[:, None])[:, 0])
    tokens = torch.where(greedy, greedy_tok, tok)
    logprobs = torch.where(greedy, greedy_lp, lp)
    dist = torch.where(greedy[:, None], dist.scatter(1, greedy_tok[:, None], 1.0), q)
    return tokens, logprobs, dist


class Sampler:
    """The standard sampler (plain PyTorch, fp32, batched). ``n_valid``: ids at or above it
    (vocab padding) are always masked."""

    name = "standard"

    def __init__(self, n_valid: int | None = None):
        self.n_valid = n_valid

    def draw_noise(self, generators: Sequence[torch.Generator | None], vocab: int) -> torch.Tensor:
        return draw_noise(generators, vocab)

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        noise: torch.Tensor | None = None,
        bitmask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, logprobs, _ = sample_batched(logits, params, noise, bitmask, n_valid=self.n_valid)
        return tokens, logprobs

    def probs(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        bitmask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if all(p.greedy for p in params):
            return final_probs(logits.float(), params, bitmask, n_valid=self.n_valid)
        ones = torch.ones(logits.shape, dtype=torch.float32)
        return sample_batched(logits, params, ones, bitmask, n_valid=self.n_valid)[2]
