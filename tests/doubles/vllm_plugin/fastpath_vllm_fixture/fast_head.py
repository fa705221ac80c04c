"""The fixture fast path's one kernel, torch only (no vLLM): the kernels suite tests it in
isolation (kernels.py registers it), the model calls it inside vLLM (model.py)."""

from __future__ import annotations

import torch

CHUNK = 32


def fast_lm_head(hidden: torch.Tensor, weight: torch.Tensor, vocab: int) -> torch.Tensor:
    """logits = hidden @ weight.T in fp32, accumulated over CHUNK-wide slices of the hidden size."""
    h = hidden.float()
    w = weight[:vocab].float()
    out = torch.zeros(h.shape[0], vocab, dtype=torch.float32, device=h.device)
    for k0 in range(0, h.shape[1], CHUNK):
        out += h[:, k0:k0 + CHUNK] @ w[:, k0:k0 + CHUNK].T
    return out.to(hidden.dtype)
