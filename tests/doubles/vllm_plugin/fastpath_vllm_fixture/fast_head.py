"""The fixture fast path's one kernel, torch only (no vLLM): the kernels suite tests it in
isolation (kernels.py registers it), the model calls it inside vLLM (model.py)."""

from __future__ import annotations

import torch

CHUNK = 32
# The name a torch.profiler capture shows for this kernel (its "kernel-name pattern"; on CPU it
# is a user annotation, as a GPU fast path's kernel names are its launches).
PROFILE_NAME = "fixture_lm_head_chunked_fp32"


def fast_lm_head(hidden: torch.Tensor, weight: torch.Tensor, vocab: int) -> torch.Tensor:
    """logits = hidden @ weight.T in fp32, accumulated over CHUNK-wide slices of the hidden size."""
    with torch.profiler.record_function(PROFILE_NAME):
        return _chunked(hidden, weight, vocab)


def _chunked(hidden: torch.Tensor, weight: torch.Tensor, vocab: int) -> torch.Tensor:
    h = hidden.float()
    w = weight[:vocab].float()
    out = torch.zeros(h.shape[0], vocab, dtype=torch.float32, device=h.device)
    for k0 in range(0, h.shape[1], CHUNK):
        out += h[:, k0:k0 + CHUNK] @ w[:, k0:k0 + CHUNK].T
    return out.to(hidden.dtype)
