"""Helpers of the GPU sweep scripts (scripts/gpu_*_sweep.py), run as ``python3 scripts/X.py``."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import time
from types import ModuleType
from typing import Callable


def load_module(path: str, name: str) -> ModuleType:
    """Import a copy of a module from a file (e.g. the committed kernel, to time a candidate
    change beside it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # registered first, as an import would (dataclasses look it up)
    spec.loader.exec_module(mod)
    return mod


def stopwatch_log() -> Callable[[str], None]:
    """A print that prefixes the seconds since it was made and flushes (logs read live)."""
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    return log


def parse_patch(text: str, what: str = "--variant") -> dict:
    """A table patch {kernel: {field: value}} from JSON text (SystemExit names the problem)."""
    try:
        patch = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{what}: not JSON ({exc}): {text!r}") from None
    if not isinstance(patch, dict) or not all(isinstance(v, dict) for v in patch.values()):
        raise SystemExit(f"{what}: JSON must be {{kernel: {{field: value}}}}, got {text!r}")
    return patch


def parse_variant(text: str) -> tuple[str, dict]:
    """NAME=JSON → (name, patch)."""
    name, sep, body = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant {text!r}: expected NAME=JSON, e.g. 'w4={{\"moe_router\": {{\"num_warps\": 4}}}}'")
    return name, parse_patch(body, f"--variant {name}")


def apply_patch(table: dict, base: dict, patch: dict, batch: int) -> None:
    """Reset ``table``'s kernels to ``base``, then patch the buckets serving ``batch`` (the
    table's other buckets are untouched)."""
    table["kernels"] = copy.deepcopy(base)
    for kernel, fields in patch.items():
        if kernel not in table["kernels"]:
            raise SystemExit(f"the patch names kernel {kernel!r}, not in the table {table['device']!r}")
        buckets = table["kernels"][kernel]["buckets"]
        bucket = next((b for b in buckets if batch <= b["max_batch"]), buckets[-1])
        bucket.update(fields)


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
    """Logit error, top-1 agreement and KL(ref ‖ y) over every position of [..., vocab]."""
    lp_ref, lp = ref.log_softmax(-1), y.log_softmax(-1)
    return dict(max_diff=(y - ref).abs().max().item(), mean_diff=(y - ref).abs().mean().item(),
                top1=(y.argmax(-1) == ref.argmax(-1)).float().mean().item(),
                kl=(lp_ref.exp() * (lp_ref - lp)).sum(-1).mean().item())
