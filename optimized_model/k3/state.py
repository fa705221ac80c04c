"""Decode state of K3-mini: a small dataclass of plain tensors (read and written in place by the
standard path, by CUDA-graph replays and by the fast path).

Layouts (B = batch rows, n_kda / n_mla = number of layers of each kind, their order = layer
order; ``cfg.slot(i)`` gives layer i's row):

    conv     [n_kda, B, 3 * d, W - 1]   model dtype. The last W-1 inputs (q|k|v channels, the
                                        pre-conv projections) of each sequence, oldest first.
    kda      [n_kda, B, H, K, V]        fp32 recurrent state S (fla convention: o = q^T S).
    latent   [n_mla, B, capacity, kv_lora]  model dtype. MLA latent cache c_t = RMSNorm(kv_a x_t)
                                        at positions 0 .. lengths[b]-1 (no positional encoding).
    lengths  [B] int64                  tokens already in the state per sequence. A decode step
                                        writes its latent at position lengths[b], attends to
                                        positions <= lengths[b], then increments lengths.

``capacity`` bounds the context (positions); a step at lengths == capacity is an error (the
runner grows the state before that, using the host-side ``max_len``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import K3Config


@dataclass
class DecodeState:
    conv: torch.Tensor
    kda: torch.Tensor
    latent: torch.Tensor
    lengths: torch.Tensor
    # host-side bookkeeping (no device sync to read it): max(lengths) as the runner knows it
    max_len: int = field(default=0, compare=False)

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    @property
    def capacity(self) -> int:
        return self.latent.shape[2]

    def tensors(self) -> list[torch.Tensor]:
        return [self.conv, self.kda, self.latent, self.lengths]

    def clone(self) -> "DecodeState":
        return DecodeState(*(t.clone() for t in self.tensors()), max_len=self.max_len)

    def to_dtype(self, dtype: torch.dtype) -> "DecodeState":
        """A copy with the model-dtype caches (conv, latent) in ``dtype``, e.g. fp32 for the
        oracle model; the KDA state is fp32 already and is copied as it is."""
        return DecodeState(self.conv.to(dtype, copy=True), self.kda.clone(), self.latent.to(dtype, copy=True),
                           self.lengths.clone(), max_len=self.max_len)

    def copy_(self, other: "DecodeState") -> "DecodeState":
        """Copy ``other`` into this state (same batch; other's capacity may be smaller)."""
        self.conv.copy_(other.conv)
        self.kda.copy_(other.kda)
        self.latent.zero_()
        self.latent[:, :, : other.capacity].copy_(other.latent[:, :, : self.capacity])
        self.lengths.copy_(other.lengths)
        self.max_len = other.max_len
        return self

    def select(self, rows) -> "DecodeState":
        """A new state holding the given batch rows (copies)."""
        idx = torch.as_tensor(rows, device=self.lengths.device)
        return DecodeState(self.conv[:, idx], self.kda[:, idx], self.latent[:, idx], self.lengths[idx],
                           max_len=self.max_len)


def new_state(cfg: K3Config, batch: int, capacity: int, *, device, dtype) -> DecodeState:
    """An empty (all-zero, lengths 0) state."""
    d, H, K = cfg.kda_dim, cfg.kda_heads, cfg.kda_head_dim
    return DecodeState(
        conv=torch.zeros(cfg.n_kda, batch, 3 * d, cfg.kda_conv - 1, device=device, dtype=dtype),
        kda=torch.zeros(cfg.n_kda, batch, H, K, K, device=device, dtype=torch.float32),
        latent=torch.zeros(cfg.n_mla, batch, capacity, cfg.kv_lora, device=device, dtype=dtype),
        lengths=torch.zeros(batch, device=device, dtype=torch.int64),
    )


def random_state(cfg: K3Config, batch: int, context: int, capacity: int, *, device, dtype, seed: int = 0) -> DecodeState:
    """A random-but-valid state of ``batch`` sequences already at ``context`` tokens, without
    running a prefill (so 32k contexts are cheap to set up for decode benchmarks):

    * latent cache: i.i.d. N(0, 1) — the statistics of RMSNorm'd latents (unit RMS);
    * KDA state S: N(0, 1/K) entries (a bounded state, as a decayed sum of k v^T updates is);
    * conv state: N(0, 1) (pre-conv projections of unit-RMS normed inputs have unit scale);
    * lengths = context.
    """
    if context > capacity:
        raise ValueError(f"context {context} exceeds the state's capacity {capacity}")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    st = new_state(cfg, batch, capacity, device=device, dtype=dtype)
    st.conv.copy_(torch.randn(st.conv.shape, generator=gen, device=device))
    st.kda.copy_(torch.randn(st.kda.shape, generator=gen, device=device) * cfg.kda_head_dim ** -0.5)
    if context:
        for j in range(cfg.n_mla):  # per layer, to bound the fp32 temporary
            st.latent[j, :, :context].copy_(
                torch.randn(batch, context, cfg.kv_lora, generator=gen, device=device))
    st.lengths.fill_(context)
    st.max_len = context
    return st
