"""Fused Triton sampler of the K3-mini fast path (component ``sampler``, kernel ``fp_sampler_kernel``).

One program per row (request); the whole row is one register tile (``BLOCK`` = next power of
two >= V, up to ``MAX_VOCAB``; K3-mini's padded vocab is 320; larger vocabularies are refused
with ``refused("sampler", "vocab_out_of_scope")`` and the standard sampler runs). No sort. The
rules are exactly the standard sampler's (``optimized_model/k3/sampling.py``,
docs/architecture.md "Sampling contract"):

1. x = logits masked by the grammar bitmask and the padding limit (``n_valid``), divided by the
   temperature (1 for greedy rows); max and its lowest id (= the greedy token).
2. top-k (0 < k < V): the k-th largest x is found WITHOUT sorting by an exact bisection over
   the order-preserving int image of fp32 values (``bits ^ 0x7fffffff`` for negatives): the
   largest key t with count(key >= t) >= k. 32 halvings of the int32 range are exact (each a
   compare + sum over the tile). Keep x >= that value (boundary ties kept).
3. softmax over the kept ids (the max from step 1 is never removed by top-k).
4. top-p (p < 1): the same exact bisection over the keys of x: the largest x-threshold t with
   sum(p where x >= t) >= top_p; keep x >= t (boundary ties kept). In exact arithmetic this is
   the standard sampler's set (p is monotone in x); in fp32 it differs only where distinct
   logits round to equal probabilities at the boundary, which the standard path keeps as a
   tie and the fp64 oracle does not (the H200 kernels suite saw one such row: near-zero
   logits, vocab 1000). If rounding leaves the total mass below top_p, everything is kept.
5. renormalise, then the exponential race: token = argmax(where(q > 0, q / E, -1)), lowest id
   on ties, with E the request's Exp(1) noise row drawn on the CPU (the same E as the standard
   path); logprob = log(q[token]) (greedy rows: log_softmax(x)[token]).

Cost per row: one read of logits/noise/bitmask, then register-only work: 32 reductions per
active threshold. The whole batch is one launch (B programs), graph-capturable with static
buffers (``sample_tensors``). On CPU it runs under Triton's interpreter (TRITON_INTERPRET=1,
fp32). The ``@triton.jit`` decoration is deferred to the first launch so that the interpreter
switch set by the engine (or a test) before that launch takes effect even when this module was
imported earlier.

Tokens agree with the standard sampler except at float near-ties: the two paths sum
probabilities in different orders (and on GPU ``tl.exp`` is not bit-identical to torch's exp),
so a top-p boundary or two race scores within ~1 ulp of each other can resolve differently.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import torch
import triton
import triton.language as tl

from fastpath import trace

from ...sampling import Sampler, SamplingParams, draw_noise, sample_batched, sample_reference
from .entry import KernelSpec

KERNEL_NAME = "fp_sampler_kernel"
_INT32_MAX = tl.constexpr(2147483647)


# --------------------------------------------------------------------------------------------
# Triton source (decorated lazily by _kernels()).
# --------------------------------------------------------------------------------------------
def fp_sampler_kernel(
    logits_ptr, noise_ptr, bitmask_ptr, temp_ptr, topk_ptr, topp_ptr, tok_ptr, lp_ptr,
    n_valid, stride_l, stride_n, stride_m,
    V: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    temp = tl.load(temp_ptr + row).to(tl.float32)
    k = tl.load(topk_ptr + row).to(tl.int32)
    top_p = tl.load(topp_ptr + row).to(tl.float32)
    sampled = temp > 0.0
    t_eff = tl.where(sampled, temp, 1.0)
    offs = tl.arange(0, BLOCK)
    inb = offs < V

    # 1. masked, temperature-scaled logits; max and its lowest id (= the greedy token)
    x = tl.load(logits_ptr + row * stride_l + offs, mask=inb, other=float("-inf")).to(tl.float32)
    if HAS_MASK:
        w = tl.load(bitmask_ptr + row * stride_m + (offs >> 5), mask=inb, other=0)
        x = tl.where(((w >> (offs & 31)) & 1) != 0, x, float("-inf"))
    x = tl.where(inb & (offs < n_valid), x, float("-inf"))
    x = x / t_eff
    best = tl.max(x, axis=0)
    best_i = tl.min(tl.where(x == best, offs, _INT32_MAX), axis=0)

    # 2. top-k: exact bisection over order-preserving int keys of x (-0.0 folded onto +0.0);
    #    ids outside the row get a key below every fp32 key
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
    key = tl.where(inb, key, -_INT32_MAX - 2)
    kth = tl.min(tl.where(inb, key, _INT32_MAX), axis=0)  # keeps the whole row
    if sampled & (k > 0) & (k < V):
        lo = kth
        hi = tl.max(key, axis=0) + 1
        for _ in range(32):  # invariant: count(key >= lo) >= k > count(key >= hi)
            mid = lo + (hi - lo) // 2
            ok = tl.sum((key >= mid).to(tl.int32), axis=0) >= k
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid)
        kth = lo

    # 3. softmax over the kept ids (the max is never removed by top-k)
    e = tl.where(key >= kth, tl.exp(x - best), 0.0)
    denom = tl.sum(e, axis=0)
    tok = best_i
    lp = -tl.log(denom)  # greedy: log_softmax(x)[argmax] = 0 - log(denom)
    if sampled:
        # 4. top-p: exact bisection over the keys of x (p is monotone in x), not over the fp32
        #    probabilities: near-equal logits can round to equal probabilities, and a tie at
        #    the boundary would keep ids the exact (fp64) rule drops
        p = e / denom
        pth = kth  # keeps every id top-k kept
        if top_p < 1.0:
            lo_p = kth
            hi_p = tl.max(key, axis=0) + 1
            for _ in range(32):  # invariant: mass(key >= lo_p) >= top_p > mass(key >= hi_p)
                mid_p = lo_p + (hi_p - lo_p) // 2
                ok_p = tl.sum(tl.where(key >= mid_p, p, 0.0), axis=0) >= top_p
                lo_p = tl.where(ok_p, mid_p, lo_p)
                hi_p = tl.where(ok_p, hi_p, mid_p)
            pth = lo_p
        # 5. renormalise; 6. exponential race (lowest id on ties)
        p = tl.where(key >= pth, p, 0.0)
        q = p / tl.sum(p, axis=0)
        noise = tl.load(noise_ptr + row * stride_n + offs, mask=inb, other=1.0)
        s = tl.where(q > 0.0, q / noise, -1.0)
        s = tl.where(inb, s, float("-inf"))
        s_best = tl.max(s, axis=0)
        tok = tl.min(tl.where(s == s_best, offs, _INT32_MAX), axis=0)
        lp = tl.log(tl.sum(tl.where(offs == tok, q, 0.0), axis=0))
    tl.store(tok_ptr + row, tok.to(tl.int64))
    tl.store(lp_ptr + row, lp)


_JIT: dict[str, Any] = {}
MAX_VOCAB = 16384  # the whole row lives in one tile; larger vocabularies are refused


def _kernels() -> Any:
    """Decorate the Triton kernel on first use (see module docstring)."""
    if "kernel" not in _JIT:
        _JIT["kernel"] = triton.jit(fp_sampler_kernel)
    return _JIT["kernel"]


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def _block_for(V: int) -> int:
    return max(16, triton.next_power_of_2(V))


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------
def sample_tensors(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    noise: torch.Tensor,
    bitmask: torch.Tensor | None = None,
    *,
    n_valid: int | None = None,
    out_tokens: torch.Tensor | None = None,
    out_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the fused sampler on device tensors (static-buffer friendly: no host syncs).

    logits [B, V] fp32/fp16; temperature/top_p fp32 [B]; top_k int32 [B]; noise fp32 [B, V];
    bitmask int32 [B, ceil(V/32)] or None. Returns (tokens int64 [B], logprobs fp32 [B])."""
    if logits.device.type == "cpu" and not interpreter_on():
        raise RuntimeError(
            "the fused Triton sampler needs a CUDA device, or TRITON_INTERPRET=1 set before the "
            "first launch to run under Triton's interpreter on CPU"
        )
    B, V = logits.shape
    if V > MAX_VOCAB:
        raise ValueError(f"fused sampler: vocab {V} > MAX_VOCAB {MAX_VOCAB} (one tile per row)")
    dev = logits.device
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    noise = noise.to(dev, torch.float32).contiguous()
    tok = out_tokens if out_tokens is not None else torch.empty(B, dtype=torch.int64, device=dev)
    lp = out_logprobs if out_logprobs is not None else torch.empty(B, dtype=torch.float32, device=dev)
    has_mask = bitmask is not None
    mask_arg = bitmask.to(dev, torch.int32).contiguous() if has_mask else tok  # dummy pointer
    kernel = _kernels()
    kernel[(B,)](
        logits, noise, mask_arg,
        temperature.to(dev, torch.float32).contiguous(),
        top_k.to(dev, torch.int32).contiguous(),
        top_p.to(dev, torch.float32).contiguous(),
        tok, lp,
        V if n_valid is None else int(n_valid),
        logits.stride(0), noise.stride(0), mask_arg.stride(0) if has_mask else 0,
        V=V, HAS_MASK=has_mask, BLOCK=_block_for(V), num_warps=4 if V <= 2048 else 8,
    )
    return tok, lp


def _param_tensors(params: Sequence[SamplingParams]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    temp = torch.tensor([max(float(p.temperature), 0.0) for p in params], dtype=torch.float32)
    top_k = torch.tensor([int(p.top_k) for p in params], dtype=torch.int32)
    top_p = torch.tensor([float(p.top_p) for p in params], dtype=torch.float32)
    return temp, top_k, top_p


class FastSampler(Sampler):
    """The fused Triton sampler. Noise and ``probs`` (the distribution rows are sampled from:
    by contract the standard one, which the features suite checks the kernel's sampled
    frequencies against) are the standard ``Sampler``'s; ``sample`` runs the kernel."""

    name = "fast"
    variant = "triton_bisect"

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        noise: torch.Tensor | None = None,
        bitmask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        B, V = logits.shape
        if len(params) != B:
            raise ValueError(f"{len(params)} sampling params for a batch of {B}")
        if noise is None:
            if any(not p.greedy for p in params):
                raise ValueError("sampled rows (temperature > 0) need noise; use draw_noise()")
            noise = torch.ones(B, V, dtype=torch.float32)
        if V > MAX_VOCAB:  # out of the kernel's scope: the standard sampler, recorded
            trace.refused("sampler", "vocab_out_of_scope", batch=B, vocab=V)
            return sample_batched(logits, params, noise, bitmask, n_valid=self.n_valid)[:2]
        temp, top_k, top_p = _param_tensors(params)
        variant = self.variant + ("_interp" if logits.device.type == "cpu" else "")
        tok, lp = sample_tensors(logits, temp, top_k, top_p, noise, bitmask, n_valid=self.n_valid)
        trace.engaged("sampler", variant, batch=B, vocab=V)
        return tok, lp


# --------------------------------------------------------------------------------------------
# Registry entry (kernel suite)
# --------------------------------------------------------------------------------------------
VALUE_CLASSES = ["normal", "large", "near_zero", "ties", "masked_inf"]
BATCHES = [1, 2, 3, 4, 8, 16, 32, 64]
VOCABS = [320, 1000, 4096]  # 320 = K3-mini's padded vocab; 1000 is no multiple of any block


def _row_params(B: int, gen: torch.Generator) -> list[SamplingParams]:
    """A deterministic mix of greedy / temperature / top-k / top-p / combined rows."""
    out = []
    for b in range(B):
        kind = b % 5
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        if kind == 0:
            out.append(SamplingParams(0.0, 1.0, 0, seed))
        elif kind == 1:
            out.append(SamplingParams(1.0, 1.0, 0, seed))
        elif kind == 2:
            out.append(SamplingParams(0.7, 1.0, 1 + b % 40, seed))
        elif kind == 3:
            out.append(SamplingParams(1.3, 0.5 + 0.4 * ((b * 7) % 10) / 10, 0, seed))
        else:
            out.append(SamplingParams(0.9, 0.8, 50, seed))
    return out


def make_inputs(shape: dict, value_class: str, dtype: Any, device: Any, seed: int) -> dict:
    B, V = int(shape["batch"]), int(shape["vocab"])
    gen = torch.Generator().manual_seed(int(seed))
    if value_class == "normal":
        logits = torch.randn(B, V, generator=gen) * 2.0
    elif value_class == "large":
        logits = torch.randn(B, V, generator=gen) * 1.0e3
    elif value_class == "near_zero":
        logits = torch.randn(B, V, generator=gen) * 1.0e-3
    elif value_class == "ties":
        logits = torch.randint(-3, 4, (B, V), generator=gen).float()
    elif value_class == "masked_inf":
        logits = torch.randn(B, V, generator=gen) * 2.0
        logits[torch.rand(B, V, generator=gen) < 0.5] = float("-inf")
        logits[:, 0] = 0.5  # at least one finite id per row
    else:
        raise ValueError(f"unknown value class {value_class!r}; known: {VALUE_CLASSES}")
    params = _row_params(B, gen)
    words = math.ceil(V / 32)
    bitmask = None
    if value_class in ("masked_inf", "ties"):
        bitmask = torch.randint(-(2**31), 2**31 - 1, (B, words), generator=gen, dtype=torch.int64)
        bitmask = bitmask.to(torch.int32)
        bitmask[:, 0] |= 1  # id 0 always allowed
    noise = draw_noise([torch.Generator().manual_seed(p.seed) for p in params], V)
    tdt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return {
        "logits": logits.to(device=device, dtype=tdt),
        "params": params,
        "noise": noise,
        "bitmask": None if bitmask is None else bitmask.to(device),
    }


def _fast(logits, params, noise, bitmask):
    tok, lp = FastSampler().sample(logits, params, noise, bitmask)
    return tok.cpu(), lp.cpu()


def _standard(logits, params, noise, bitmask):
    tok, lp, _ = sample_batched(logits, params, noise, bitmask)
    return tok.cpu(), lp.cpu()


def _oracle(logits, params, noise, bitmask):
    tok, lp, _ = sample_reference(logits.float(), params, noise, bitmask, dtype=torch.float64)
    return tok.cpu(), lp.cpu()


def kernel_entry() -> KernelSpec:
    """Outputs of fast/standard/oracle: (tokens int64 [B], logprobs fp32 [B]); tokens must be
    equal (any difference is an error of >= 1 id), logprobs within the noise floor."""
    return KernelSpec(
        name="sampler",
        component="sampler",
        fast=_fast,
        standard=_standard,
        oracle=_oracle,
        make_inputs=make_inputs,
        shapes=[{"batch": b, "vocab": v} for v in VOCABS for b in BATCHES],
        value_classes=list(VALUE_CLASSES),
        dtypes=["float32"],
        atol_floor={"float32": 1e-5},
        k=2.0,
        deterministic=True,
        kernel_patterns=[r"^fp_sampler_kernel"],
    )
