"""Commit of a speculative verify step on the fast path: keep the first ``keep[b]`` (1 ..= T)
tokens of sequence b, in two launches that touch only what a commit changes.

``K3Model.commit`` does it with torch ops: per KDA layer a gather of the kept states into a
temporary and a copy back, a gather of the conv windows, then a masked fill of the *whole*
latent cache (every position of every sequence read and written to clear T of them) and the
lengths. On the H200 that was ~0.8 ms of a 5.7 ms verify step at batch 16, draft 3, 8k context
(perf notes, run Z). Here:

* ``fp_keep_state_kernel``, grid (n_kda * B, NS + NC): programs ``< NS`` copy one block of the
  kept KDA state ``states[l, b, keep[b] - 1]`` (a flat [H*K*V] fp32 row) into ``kda[l, b]``;
  the others set the conv state from the window, ``conv[l, b, c, j] = window[l, b, c, keep[b] + j]``;
* ``fp_drop_rejected_kernel``, grid (B,): zero the latents of the rejected tokens,
  ``latent[m, b, lengths[b] + t]`` for keep[b] <= t < T, then ``lengths[b] += keep[b]`` (the
  one program of sequence b reads its length before it writes it).

Layouts (K3's DecodeState and the fast path's trail, verify_step.new_trail): ``kda`` fp32
[n_kda, B, H, K, V] and ``states`` fp32 [n_kda, B, T, H, K, V], each (layer, sequence[, token])
slice contiguous; ``conv`` [n_kda, B, 3d, W-1] and ``window`` [n_kda, B, 3d, W-1+T];
``latent`` [n_mla, B, capacity, C]; ``lengths`` and ``keep`` int64 [B]. Exact copies: the
result is bit for bit what ``K3Model.commit`` leaves.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import triton
import triton.language as tl

from fastpath import trace

from .entry import KernelSpec, default_dtypes

COMPONENT = "kda_decode"  # the commit closes the KDA verify step (and clears MLA's rejected latents)
VARIANT = "triton_commit"
BLOCK = 4096  # fp32 state elements per program: 16 KiB, enough to keep the copy at bandwidth
BLOCK_C = 512  # conv channels per program


@triton.jit
def fp_keep_state_kernel(
    S, sS_l, sS_b, TS, sT_l, sT_b, sT_t,
    CONV, sc_l, sc_b, sc_c, sc_j, WIN, sw_l, sw_b, sw_c, sw_j,
    KEEP, B, N, C3,
    NS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, W1: tl.constexpr, WP: tl.constexpr,
):
    lb = tl.program_id(0)
    blk = tl.program_id(1)
    lay = (lb // B).to(tl.int64)
    b = (lb % B).to(tl.int64)
    kept = tl.load(KEEP + b)
    if blk < NS:  # the kept state, a flat row of N = H*K*V fp32
        # (each branch names its own values: a compiled if needs one type per name)
        off = blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(TS + lay * sT_l + b * sT_b + (kept - 1) * sT_t + off, mask=off < N)
        tl.store(S + lay * sS_l + b * sS_b + off, x, mask=off < N)
    else:  # the conv state: the W-1 inputs that end at the last kept token
        c = (blk - NS).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
        j = tl.arange(0, WP)
        mc = (c[:, None] < C3) & (j[None, :] < W1)
        xc = tl.load(WIN + lay * sw_l + b * sw_b + c[:, None] * sw_c + (kept + j[None, :]) * sw_j, mask=mc)
        tl.store(CONV + lay * sc_l + b * sc_b + c[:, None] * sc_c + j[None, :] * sc_j, xc, mask=mc)


@triton.jit
def fp_drop_rejected_kernel(
    LAT, sl_m, sl_b, sl_p, LEN, KEEP, C,
    NM: tl.constexpr, T: tl.constexpr, CP: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    start = tl.load(LEN + b)
    kept = tl.load(KEEP + b)
    cols = tl.arange(0, CP)
    zero = tl.zeros([CP], dtype=LAT.dtype.element_ty)
    for m in tl.static_range(NM):
        for t in tl.static_range(T):
            tl.store(LAT + m * sl_m + b * sl_b + (start + t) * sl_p + cols, zero, mask=(cols < C) & (t >= kept))
    tl.store(LEN + b, start + kept)


def commit(kda: torch.Tensor, conv: torch.Tensor, latent: torch.Tensor, lengths: torch.Tensor,
           states: torch.Tensor, window: torch.Tensor, keep: torch.Tensor) -> None:
    """Keep the first ``keep[b]`` tokens of the verify step that left ``states`` and ``window``
    (module docstring): updates ``kda``, ``conv``, ``latent`` and ``lengths`` in place."""
    L, B, T = states.shape[:3]
    N = kda[0, 0].numel()
    W1, C3 = conv.shape[-1], conv.shape[2]
    assert tuple(kda.shape[:2]) == (L, B) and tuple(states.shape[3:]) == tuple(kda.shape[2:]), (kda.shape, states.shape)
    assert kda.dtype == states.dtype == torch.float32
    assert kda[0, 0].is_contiguous() and states[0, 0, 0].is_contiguous(), "commit: each state slice contiguous"
    assert tuple(window.shape) == (L, B, C3, W1 + T), (window.shape, conv.shape, T)
    assert latent.stride(-1) == 1 and keep.dtype == lengths.dtype == torch.int64 and keep.shape == (B,)
    trace.engaged(COMPONENT, VARIANT, batch=B, tokens=T, layers=L)
    NS, NC = triton.cdiv(N, BLOCK), triton.cdiv(C3, BLOCK_C)
    fp_keep_state_kernel[(L * B, NS + NC)](
        kda, kda.stride(0), kda.stride(1), states, states.stride(0), states.stride(1), states.stride(2),
        conv, *conv.stride(), window, *window.stride(),
        keep, B, N, C3, NS=NS, BLOCK=BLOCK, BLOCK_C=BLOCK_C, W1=W1, WP=triton.next_power_of_2(W1),
        num_warps=4,
    )
    C = latent.shape[-1]
    fp_drop_rejected_kernel[(B,)](
        latent, latent.stride(0), latent.stride(1), latent.stride(2), lengths, keep, C,
        NM=latent.shape[0], T=T, CP=triton.next_power_of_2(C), num_warps=4,
    )


# ----------------------------------------------------------------------------------------------
# kernel entry: the standard path's commit (K3Model.commit_tensors itself) as standard and oracle

def _state_and_trail(inputs: dict):
    from ...model import K3Model, VerifyTrail
    from ...state import DecodeState

    st = DecodeState(inputs["conv"].clone(), inputs["kda"].clone(), inputs["latent"].clone(),
                     inputs["lengths"].clone())
    T = inputs["states"].shape[2]
    trail = VerifyTrail(T)
    trail.kda, trail.conv = list(inputs["states"].unbind(0)), list(inputs["window"].unbind(0))
    owner = SimpleNamespace(cfg=SimpleNamespace(n_kda=st.kda.shape[0], kda_conv=st.conv.shape[-1] + 1))
    return K3Model, owner, st, trail


STATE_FIELDS = ("kda", "conv", "latent", "lengths")  # what a commit writes, in output order


def _outputs(st) -> tuple:
    return tuple(getattr(st, name) for name in STATE_FIELDS)


def standard(**inputs) -> tuple:
    model_cls, owner, st, trail = _state_and_trail(inputs)
    model_cls.commit_tensors(owner, st, trail, inputs["keep"])
    return _outputs(st)


oracle = standard  # a commit only copies and clears: the standard path's result is exact


def fast(**inputs) -> tuple:
    out = tuple(inputs[name].clone() for name in STATE_FIELDS)
    commit(*out, inputs["states"], inputs["window"], inputs["keep"])
    return out


def make_inputs(shape: dict, value_class: str = "normal", dtype: Any = torch.float32,
                device: Any = "cpu", seed: int = 0) -> dict:
    """A state of ``batch`` sequences at random lengths with room for T more tokens, a trail of
    T tokens and a random keep in 1 ..= T (keep = T in the first sequence, 1 in the second)."""
    if isinstance(dtype, str):  # the kernels suite passes the dtype's name
        dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(seed)
    # the states are drawn where they will live: K3-mini's trail at batch 16 is 400M values
    gd = torch.Generator(device=device).manual_seed(seed)
    L, M, B, T = shape["kda_layers"], shape["mla_layers"], shape["batch"], shape["tokens"]
    H, K, C3, cap, C = shape["heads"], shape["head_k"], shape["channels"], shape["capacity"], shape["latent"]
    scale = {"normal": 1.0, "large": 1e3, "near_zero": 1e-6}[value_class]

    def rnd(*size, dt=torch.float32):
        return (torch.randn(*size, generator=gd, device=device) * scale).to(dt)

    lengths = torch.randint(0, cap - T + 1, (B,), generator=g)
    keep = torch.randint(1, T + 1, (B,), generator=g)
    keep[0] = T
    if B > 1:
        keep[1] = 1
    return {"kda": rnd(L, B, H, K, K), "conv": rnd(L, B, C3, 3, dt=dtype), "latent": rnd(M, B, cap, C, dt=dtype),
            "lengths": lengths.to(device), "states": rnd(L, B, T, H, K, K),
            "window": rnd(L, B, C3, 3 + T, dt=dtype), "keep": keep.to(device)}


def kernel_entry(device: Any = None) -> KernelSpec:
    """``verify_commit``: K3-mini's layer counts and widths on CUDA (drafts 3 and 7, batch up to
    16), small ones in the Triton interpreter; odd sizes for the block tails."""
    on_cuda = str(device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if on_cuda:
        k3 = dict(kda_layers=6, mla_layers=2, heads=32, head_k=128, channels=12288, latent=576)
        shapes = [dict(batch=b, tokens=t, capacity=1088, **k3) for t in (4, 8) for b in (1, 4, 16)]
        shapes += [dict(batch=3, tokens=3, kda_layers=2, mla_layers=1, heads=3, head_k=96, channels=700,
                        latent=100, capacity=67)]
    else:
        small = dict(kda_layers=2, mla_layers=2, heads=2, head_k=16, channels=96, latent=40)
        shapes = [dict(batch=b, tokens=t, capacity=64, **small) for t in (4, 8) for b in (1, 3)]
        shapes += [dict(batch=2, tokens=3, kda_layers=1, mla_layers=1, heads=3, head_k=12, channels=700,
                        latent=20, capacity=13)]
    return KernelSpec(name="verify_commit", component=COMPONENT, fast=fast, standard=standard, oracle=oracle,
                      make_inputs=make_inputs, shapes=shapes, value_classes=["normal", "large", "near_zero"],
                      dtypes=default_dtypes(device), k=2.0, deterministic=True,
                      kernel_patterns=[r"fp_keep_state_kernel", r"fp_drop_rejected_kernel"],
                      verify_variants=[VARIANT])
