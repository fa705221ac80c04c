"""The double's fast path: "kernels" written differently from the standard path (chunked fp32
accumulation, a worker thread for the tail, a vectorised sampler). Correct as written; the
double's mutation patches (tests/mutation/double_patches/) plant defects in this file."""

from __future__ import annotations

import threading

import torch

MAX_BATCH = 8  # the double's fast-path scope (decode batch sizes 1..8)
CHUNK = 16


def gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y = x @ w.T, accumulated in fp32 over K chunks; the output rows beyond the last full
    tile of 8 are computed by a worker thread (the double's "second stream")."""
    m, k = x.shape
    n = w.shape[0]
    out = torch.zeros(m, n, dtype=torch.float32)
    full = (n // 8) * 8

    def tail() -> None:
        if full < n:
            out[:, full:] = x.float() @ w[full:].float().T

    worker = threading.Thread(target=tail)
    worker.start()
    for k0 in range(0, k, CHUNK):
        out[:, :full] += x[:, k0:k0 + CHUNK].float() @ w[:full, k0:k0 + CHUNK].float().T
    worker.join()
    return out.to(x.dtype)


def rmsnorm(x: torch.Tensor, g: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * g.float()
    return y.to(x.dtype)


def recurrence(state: torch.Tensor, e: torch.Tensor, decay: torch.Tensor, context: int) -> torch.Tensor:
    """state <- decay * state + e, fp32 state."""
    return decay * state + e.float()


def sample(logits: torch.Tensor, temps, top_ks, top_ps, noise: torch.Tensor, allowed: torch.Tensor | None,
           n_valid: int) -> torch.Tensor:
    """Vectorised sampling contract (docs/architecture.md) for a batch."""
    x = logits.float().clone()
    B, V = x.shape
    x[:, n_valid:] = float("-inf")
    if allowed is not None:
        x = x.masked_fill(~allowed, float("-inf"))
    out = torch.empty(B, dtype=torch.int64)
    for b in range(B):
        row = x[b]
        t = float(temps[b])
        if t <= 0:
            out[b] = int(torch.argmax(row))
            continue
        row = row / t
        k = int(top_ks[b])
        if 0 < k < V:
            kth = torch.topk(row, k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        p = torch.softmax(row, -1)
        tp = float(top_ps[b])
        if tp < 1.0:
            sp, _ = torch.sort(p, descending=True)
            cs = torch.cumsum(sp, -1)
            idx = torch.nonzero(cs >= tp)
            if idx.numel():
                p = p.masked_fill(p < sp[idx[0, 0]], 0.0)
        q = p / p.sum()
        score = torch.where(q > 0, q / noise[b], torch.full_like(q, -1.0))
        out[b] = int(torch.argmax(score))
    return out
