"""The fixture's kernel registry (the vllm engine's ``kernel_registry`` option names it): the
chunked-fp32 LM head against a plain matmul (standard) and a float64 one (oracle)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .fast_head import fast_lm_head

_DT = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Kernel:
    name: str
    component: str
    fast: Any
    standard: Any
    oracle: Any
    make_inputs: Any
    shapes: list[dict]
    value_classes: list[str]
    dtypes: list[str]
    atol_floor: dict[str, float]
    k: float = 2.0
    deterministic: bool = True
    kernel_patterns: list[str] = field(default_factory=list)


def _inputs(shape, value_class, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(shape["m"], shape["k"], generator=g)
    w = torch.randn(shape["n"], shape["k"], generator=g) * shape["k"] ** -0.5
    if value_class == "large":
        h = h * 300
    elif value_class == "near_zero":
        h = h * 1e-4
    elif value_class == "ties":
        h = torch.ones_like(h)
    return {"hidden": h.to(_DT[dtype]).to(device), "weight": w.to(_DT[dtype]).to(device)}


def registry() -> list[Kernel]:
    return [Kernel(
        "fixture_lm_head", "lm_head",
        fast=lambda hidden, weight: fast_lm_head(hidden, weight, weight.shape[0]),
        standard=lambda hidden, weight: hidden @ weight.T,
        oracle=lambda hidden, weight: (hidden.double() @ weight.double().T).float(),
        make_inputs=_inputs,
        shapes=[{"m": 1, "n": 512, "k": 128}, {"m": 4, "n": 512, "k": 128}, {"m": 3, "n": 515, "k": 96}],
        value_classes=["normal", "large", "near_zero", "ties"], dtypes=["float32"],
        atol_floor={"float32": 1e-5})]
