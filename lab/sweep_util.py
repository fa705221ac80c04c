"""Helpers the lab tools share beyond fastpath.measure: loading a copy of a kernel module, a
verify-row scope past the spec's, another table's settings as variants (gpu_table_ab.py --like),
and the teacher-forced decoding and logit comparison of gpu_oracle_ab.py and
gpu_parity_noise.py."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from fastpath.measure import serving_bucket


def load_module(path: str, name: str) -> ModuleType:
    """Import a copy of a module from a file (e.g. the committed kernel, to time a candidate
    change beside it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # registered first, as an import would (dataclasses look it up)
    spec.loader.exec_module(mod)
    return mod


def allow_verify_rows(rows: int) -> None:
    """Lets this process build fast verify steps of up to ``rows`` rows (batch x (draft + 1)),
    past the spec's max_verify_rows (the fast path's buffers cover 64): a lab tool's measuring
    outside the declared scope. Changes the cached scope only, never the spec."""
    from optimized_model.k3.fast import dispatch

    dispatch.scope()["max_verify_rows"] = rows


def variants_like(table: dict, other: dict, batch: int) -> list[tuple[str, dict]]:
    """``other`` table's settings at ``batch`` as patches of ``table``: one variant a kernel whose
    serving bucket differs (``like:KERNEL``, the fields of ``other``'s bucket that differ), then
    all of them at once (``like:all``), so one run says which of them win on this GPU (session
    33 wrote these by hand for the H200 table on an H100). A patch adds and changes fields,
    never removes one: a field only ``table``'s bucket has stays."""
    variants = []
    for kernel in table["kernels"]:
        if kernel not in other.get("kernels", {}):
            continue
        mine, theirs = serving_bucket(table, kernel, batch), serving_bucket(other, kernel, batch)
        changed = {k: v for k, v in theirs.items() if k not in ("max_batch", "note") and mine.get(k) != v}
        if changed:
            variants.append((f"like:{kernel}", {kernel: changed}))
    if len(variants) > 1:
        variants.append(("like:all", {k: v for _, patch in variants for k, v in patch.items()}))
    return variants


def max_finite_diff(a, b) -> float:
    """The largest |a - b| over the entries finite in both (logits keep -inf padding); NaN when
    there is none."""
    import torch

    fin = torch.isfinite(a) & torch.isfinite(b)
    return float((a[fin] - b[fin]).abs().max()) if bool(fin.any()) else float("nan")


def teacher_forced_inputs(model, batch: int, context: int, steps: int):
    """(tokens [steps, batch], start state): ``batch`` random sequences already at ``context``
    tokens (the model's random state, seed = batch) and ``steps`` random tokens to feed them;
    the state has room for every step (capacity rounded up to 64)."""
    import torch

    gen = torch.Generator().manual_seed(batch)
    tokens = torch.randint(0, model.cfg.n_real_tokens, (steps, batch), generator=gen).to(model.device)
    cap = -(-(context + steps) // 64) * 64
    return tokens, model.random_state(batch, context, cap, seed=batch)


def decode_teacher_forced(decoder, tokens, start, split: int | None = None):
    """fp32 logits [steps, B, real vocab] of ``decoder.decode`` (a K3Model, the oracle, a
    FastDecoder) fed ``tokens`` [steps, B] from a copy of ``start``, the batch decoded ``split``
    rows at a time (all at once when None)."""
    import torch

    B = tokens.shape[1]
    split = split or B
    parts = []
    for lo in range(0, B, split):
        rows = list(range(lo, min(B, lo + split)))
        st = start.select(rows)
        parts.append(torch.stack([decoder.decode(t[rows], st).float() for t in tokens]))
    return torch.cat(parts, dim=1)[..., : decoder.cfg.n_real_tokens]


def compare_logits(y, ref) -> dict:
    """Logit error, top-1 agreement and KL(ref ‖ y) over every position of [..., vocab] (the KL
    in float64 and at least 0 per position: the rounding of two near-equal distributions can
    dip below, as fastpath.stats.kl_divergence allows for)."""
    lp_ref, lp = ref.double().log_softmax(-1), y.double().log_softmax(-1)
    return dict(max_diff=(y - ref).abs().max().item(), mean_diff=(y - ref).abs().mean().item(),
                top1=(y.argmax(-1) == ref.argmax(-1)).float().mean().item(),
                kl=(lp_ref.exp() * (lp_ref - lp)).sum(-1).clamp(min=0).mean().item())
