"""Kernel registry of the K3-mini fast path.

``components()``: each fast-path component with the GPU kernel-name regexes that prove the fast
path ran (``fast_kernel_patterns``) and those of the standard path's kernels that must NOT
appear when it did (``fallback_kernel_patterns``). ``kernels()``: every ``kernel_entry()`` of
``optimized_model/k3/fast/kernels/*.py``.

Light on imports: dispatch.py imports COMPONENT_NAMES from here on every model load.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any

COMPONENT_NAMES = (
    "dense_gemv",
    "kda_decode",
    "mla_decode",
    "moe_router",
    "moe_experts",
    "shared_expert",
    "norm_residual",
    "lm_head",
    "sampler",
    "decode_graph",
)

# Our Triton kernels are all named fp_* so the profiler can tell them from the standard path's.
# Fast patterns of K's / S's kernels are added from their kernel entries (kernel_patterns).
_FAST = {
    "dense_gemv": [r"^fp_gemv", r"^fp_l2_prefetch"],
    "moe_router": [r"^fp_moe_router"],
    "moe_experts": [r"^fp_moe_experts"],
    "shared_expert": [r"^fp_gemv"],
    "norm_residual": [r"^fp_(add_)?rmsnorm", r"^fp_gemv.*norm"],
    "lm_head": [r"^fp_gemv"],
    "kda_decode": [],
    "mla_decode": [],
    "sampler": [],
    "decode_graph": [],
}
# Standard path (torch/cuBLAS/fla-core) kernels. cuBLAS GEMMs (nvjet / sm90_xmma / cutlass gemm)
# must not appear in a fast step: every projection of the fast path is an fp_gemv kernel.
_CUBLAS = r"(?i)^(?!fp_).*(nvjet|xmma_gemm|sm90_xmma|gemv2T|gemvx|gemmSN|cutlass.*gemm|ampere.*gemm)"
_FALLBACK = {
    "dense_gemv": [_CUBLAS],
    "shared_expert": [_CUBLAS],
    "lm_head": [_CUBLAS],
    "kda_decode": [r"fused_recurrent_kda", r"chunk_kda", r"fused_recurrent_fwd"],
    "mla_decode": [r"(?i)^(?!fp_).*softmax", r"(?i)flash_fwd|fmha|efficient_attention"],
    "moe_router": [r"(?i)^(?!fp_).*(gatherTopK|sortKeyValueInplace|topk)"],
    # (not index_select: the fast step's embedding gather is one)
    "moe_experts": [r"(?i)^(?!fp_).*(grouped_mm|scatter_add|radixSort|RadixSort)"],
    "norm_residual": [r"(?i)^(?!fp_).*(rms_norm|layer_norm)"],
    "sampler": [r"(?i)^(?!fp_).*(gatherTopK|radixSort|exponential|multinomial)"],
    "decode_graph": [],
}


@dataclass
class Component:
    name: str
    fast_kernel_patterns: list[str] = field(default_factory=list)
    fallback_kernel_patterns: list[str] = field(default_factory=list)
    layers: list[int] | None = None  # the layers it serves (None: once per step)
    # what proves a verify step (draft > 0) ran its verify kernels, not its decode kernels T
    # times: the trace variants of its verify kernels and the kernel names only they launch
    # (empty: the component runs the same kernels at B*T rows, e.g. the GEMVs)
    verify_variants: list[str] = field(default_factory=list)
    verify_kernel_patterns: list[str] = field(default_factory=list)


def layers_served(cfg: Any) -> dict[str, list[int] | None]:
    """Component -> the layers of ``cfg`` (a K3Config) it serves in every fast decode step
    (step.py: every layer's attention in/out projections and its norms run as fused gemvs;
    KDA / MLA decode at the layers of that kind; the MoE parts at the MoE layers). None: the
    components that run once per step."""
    every = list(range(cfg.n_layers))
    kinds = [cfg.layer_kind(i) for i in every]
    moe = [i for i in every if cfg.ffn_kind(i) == "moe"]
    out: dict[str, list[int] | None] = {name: None for name in COMPONENT_NAMES}
    out.update({
        "dense_gemv": every,
        "norm_residual": every,
        "kda_decode": [i for i in every if kinds[i] == "kda"],
        "mla_decode": [i for i in every if kinds[i] == "mla"],
        "moe_router": moe,
        "moe_experts": moe,
        "shared_expert": moe,
    })
    return out


# Kernel modules that failed to import (name -> error), e.g. CuTe DSL without cutlass.
import_errors: dict[str, str] = {}


def _kernel_modules() -> list[Any]:
    from . import kernels as pkg

    mods = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name in ("entry", "__init__") or info.name.startswith("_"):
            continue
        try:
            mods.append(importlib.import_module(f"{pkg.__name__}.{info.name}"))
        except Exception as exc:  # a backend that is missing here (e.g. CuTe DSL on CPU)
            import_errors[info.name] = f"{type(exc).__name__}: {exc}"
    return mods


def kernels() -> list[Any]:
    """Every fast kernel's registry entry (``kernel_entry()`` may return one entry or a list)."""
    out: list[Any] = []
    seen: set[str] = set()
    for mod in _kernel_modules():
        fn = getattr(mod, "kernel_entry", None)
        if fn is None:
            continue
        try:
            got = fn()
        except Exception as exc:  # e.g. a CUDA-only kernel asked for on CPU
            import_errors[mod.__name__.rsplit(".", 1)[-1]] = f"{type(exc).__name__}: {exc}"
            continue
        if got is None:
            continue
        for entry in got if isinstance(got, (list, tuple)) else [got]:
            if entry.name in seen:
                raise ValueError(f"duplicate kernel name {entry.name!r} in {mod.__name__}")
            seen.add(entry.name)
            out.append(entry)
    return out


def components(entries: list[Any] | None = None, cfg: Any = None) -> list[Component]:
    """Component → fast and fallback kernel-name patterns (fast ones include every registered
    kernel's own ``kernel_patterns``) and, given the model config ``cfg``, the layers it serves."""
    fast = {k: list(v) for k, v in _FAST.items()}
    variants: dict[str, list[str]] = {}
    verify_pats: dict[str, list[str]] = {}
    entries = list(entries if entries is not None else kernels())
    for e in entries:
        pats = fast.setdefault(e.component, [])
        for p in getattr(e, "kernel_patterns", []) or []:
            if p not in pats:
                pats.append(p)
        if getattr(e, "verify_variants", None):
            variants.setdefault(e.component, []).extend(v for v in e.verify_variants
                                                        if v not in variants.get(e.component, []))
    for comp in variants:  # a verify kernel's own names (mla_verify shares the decode combine kernel)
        shared = {p for e in entries if e.component == comp and not getattr(e, "verify_variants", None)
                  for p in getattr(e, "kernel_patterns", []) or []}
        verify_pats[comp] = [p for e in entries if e.component == comp and getattr(e, "verify_variants", None)
                             for p in getattr(e, "kernel_patterns", []) or [] if p not in shared]
    served = layers_served(cfg) if cfg is not None else {}
    return [Component(n, fast.get(n, []), list(_FALLBACK.get(n, [])), served.get(n),
                      variants.get(n, []), verify_pats.get(n, []))
            for n in COMPONENT_NAMES]
