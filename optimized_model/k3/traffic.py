"""Bytes a K3-mini decode step must move at least (the roofline's numerator), counted from the
real tensors of one step: ``Model.step_traffic`` (fastpath.engine.RooflineModel).

Runs the step once with the standard math on a copy of the state, reading the router's output
of every MoE layer (``K3Model.route``), and counts:

* weights: every tensor of ``model.w`` once (a decode step reads each of them), except
  - ``embed``: only the rows of the distinct input tokens,
  - ``L{i}.experts_w13`` / ``L{i}.experts_w2``: only the experts the step's tokens were routed
    to in layer i (the distinct ids of the router's top-k), each expert's slice once;
* state: the KDA recurrent state and the conv state, read and written (every batch row);
  the MLA latent cache, read at positions 0 .. lengths[b] (the new one included) and the new
  latent written; the lengths read and written;
* io: the input tokens read, the fp32 logits written.

A verify step (tokens [B, T], T = draft + 1; ``K3Model.verify`` then ``commit`` keeping all T,
as the benchmark step does) counts the same way over its B*T tokens (the experts are the
distinct ids the router picked for any of them), and moves more state: the KDA state and conv
state read once, the per-token KDA states and the conv window (W-1+T columns) written for the
rollback, the kept ones read and written back by commit; the latent cache read at 0 .. len+T-1
and T new latents written per sequence; B*T fp32 logit rows written.

The fast path routes with its own kernel; the experts it reads are the same where it computes
the same router (the kernels and parity suites hold it to that).
"""

from __future__ import annotations

import re

import torch

_EXPERTS = re.compile(r"^L(\d+)\.experts_(w13|w2)$")


def routed_experts(model, tokens: torch.Tensor, state) -> dict[int, torch.Tensor]:
    """{MoE layer: router top-k ids} of one standard decode step (tokens [B]) or verify step
    (tokens [B, T]), run on a state copy."""
    seen: dict[int, torch.Tensor] = {}
    # a twin sharing the weights: the model itself is never patched (torch.compile guards on the
    # compiled standard step's model object; touching its attributes would force recompiles)
    twin = type(model)(model.cfg, model.w, oracle=model.oracle, kda_backend=model.kda_backend,
                       moe_backend=model.moe_backend)
    route = twin.route

    def spy(i, x):
        ids, w = route(i, x)
        seen[i] = ids.detach().clone()
        return ids, w

    twin.route = spy  # instance attribute: shadows the method for this one step
    if tokens.dim() == 2:
        twin.verify(tokens, state.clone())
    else:
        twin.decode(tokens, state.clone())
    return seen


def step_bytes(model, tokens: torch.Tensor, state, routed: dict[int, torch.Tensor]) -> dict:
    """The byte count of the module docstring for ``tokens`` [B] (decode) or [B, T] (verify)
    on ``state`` with ``routed``."""
    cfg = model.cfg
    T = tokens.shape[1] if tokens.dim() == 2 else 1
    weights = experts = embedding = 0
    touched: dict[int, int] = {}
    for name, t in model.w.items():
        m = _EXPERTS.match(name)
        if m:
            layer = int(m.group(1))
            ids = torch.unique(routed[layer]) if layer in routed else torch.empty(0)
            touched[layer] = int(ids.numel())
            experts += int(ids.numel()) * t[0].nbytes
        elif name == "embed":
            embedding += int(torch.unique(tokens).numel()) * t[0].nbytes
        else:
            weights += t.nbytes
    lat = state.latent
    row = lat.shape[-1] * lat.element_size()
    cache = int(cfg.n_mla * (int(state.lengths.sum()) + state.batch * T) * row)  # read 0..len+T-1
    cache += cfg.n_mla * state.batch * T * row  # write the new latents
    recurrent = 2 * (state.kda.nbytes + state.conv.nbytes + state.lengths.nbytes)
    if T > 1:  # the rollback trail (T per-token KDA states, the conv window) written, the kept ones read
        window = state.conv.nbytes // (cfg.kda_conv - 1) * (cfg.kda_conv - 1 + T)
        recurrent += T * state.kda.nbytes + window + state.kda.nbytes + state.conv.nbytes
    io = tokens.nbytes + state.batch * T * cfg.vocab_size * 4
    total = weights + experts + embedding + cache + recurrent + io
    return {"total": int(total), "weights": int(weights), "experts": int(experts), "embedding": int(embedding),
            "state": int(recurrent), "cache": int(cache), "io": int(io),
            "experts_touched": [touched[k] for k in sorted(touched)], "n_experts": cfg.n_experts,
            "top_k": cfg.top_k}


def decode_traffic(model, tokens: torch.Tensor, state) -> dict:
    """Routes one step of ``tokens`` on (a copy of) ``state``, then counts its bytes."""
    return step_bytes(model, tokens, state, routed_experts(model, tokens, state))
