"""Router balancing without an auxiliary loss (DeepSeek-V3): after each step, every MoE layer's
correction bias moves by ``rate`` towards balance, up for experts that got fewer tokens than the
mean, down for those that got more. The bias only selects the top-k (model.route), so the
gating weights, and the loss, never see it; no auxiliary loss pulls on the router.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def update_router_biases(model, rate: float) -> dict[int, float]:
    """Apply one update from the loads the model recorded (and clear them). Returns each
    layer's imbalance, max load / mean load (1.0 = perfectly balanced)."""
    out = {}
    for i, load in sorted(model.loads.items()):
        load = load.float()
        mean = load.mean()
        model.master[f"L{i}.router_bias"].add_(rate * torch.sign(mean - load))
        out[i] = float(load.max() / mean.clamp_min(1e-9))
    model.loads.clear()
    return out
