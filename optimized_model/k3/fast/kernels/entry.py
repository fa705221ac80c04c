"""Registry entry of one fast kernel (the attributes of ``fastpath.engine.KernelEntry``).

Dependency-free on purpose: every kernel module of ``optimized_model.k3.fast.kernels`` builds
its ``kernel_entry()`` from this dataclass, and importing it must not import torch or triton.

Fields (see ``fastpath.engine.KernelEntry``):
  name             unique kernel name, e.g. "gemv"
  component        trace component (architecture.md): dense_gemv, kda_decode, mla_decode,
                   moe_router, moe_experts, shared_expert, norm_residual, lm_head, sampler
  fast             fast(**inputs) -> tensor | tuple of tensors (the fast kernel)
  standard         standard(**inputs): the standard path's way (torch ops, working dtype)
  oracle           oracle(**inputs): fp32 torch reference
  make_inputs      make_inputs(shape: dict, value_class: str, dtype, device, seed) -> dict
  shapes           list of shape dicts (scope batch sizes + edge shapes)
  boundary_shapes  shapes at the tuning table's bucket and tile edges, run on every tier (the
                   smoke tier runs them beside its pick of ``shapes``)
  value_classes    names understood by make_inputs ("normal", "large", "near_zero", ...)
  dtypes           dtype names the kernel supports on this device
  atol_floor       {dtype name: absolute tolerance floor}
  k                noise-floor multiplier
  deterministic    repeat must be bitwise equal
  kernel_patterns  regexes of GPU kernel names this kernel launches
  verify_variants  trace variants it reports when it runs a speculative verify step (empty: not
                   a verify kernel); the coverage suite expects them at draft > 0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# Default atol floors per dtype (fastpath.toml [gates.kernels_noise_floor]).
DEFAULT_ATOL_FLOOR = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}


def default_dtypes(device: Any = None) -> list[str]:
    """fp16/fp32 on CPU (Triton interpreter: bf16 loads are wrong there); + bf16 on CUDA."""
    dev = str(device) if device is not None else _default_device()
    return ["float16", "float32", "bfloat16"] if dev.startswith("cuda") else ["float16", "float32"]


def _default_device() -> str:
    try:  # lazy: keep this module importable without torch
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # pragma: no cover - torch missing
        return "cpu"


@dataclass
class KernelSpec:
    name: str
    component: str
    fast: Callable[..., Any]
    standard: Callable[..., Any]
    oracle: Callable[..., Any]
    make_inputs: Callable[..., dict]
    shapes: list[dict]
    value_classes: list[str] = field(default_factory=lambda: ["normal"])
    dtypes: list[str] = field(default_factory=default_dtypes)
    atol_floor: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_ATOL_FLOOR))
    k: float = 2.0
    deterministic: bool = True
    kernel_patterns: list[str] = field(default_factory=list)
    boundary_shapes: list[dict] = field(default_factory=list)
    verify_variants: list[str] = field(default_factory=list)


# Alias: some modules read better with the protocol's name.
KernelEntry = KernelSpec
