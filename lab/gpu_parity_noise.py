"""How far the standard path is from ITSELF, in the parity metric (GPU only).

    python3 -m lab.gpu_parity_noise --batch 32 --context 1024 --steps 64

The parity suite's top-1 agreement (fast vs standard) can only be as fine as the metric's own
resolution on K3-mini. This script measures that resolution: the same ``--batch`` random
sequences (a random state at ``--context`` tokens, ``--steps`` random tokens, teacher-forced)
decoded by the standard path in configurations that compute the same model, each changing only
what a generic engine would not call a change of numerics:

* ``rows of --split``: the sequences decoded in smaller batches (cuBLAS picks other kernels, so
  fp32 sums run in another order; every bf16 rounding point stays where it is);
* ``reduced-precision reduction flipped``: ``torch.backends.cuda.matmul.
  allow_bf16_reduced_precision_reduction`` toggled (cuBLAS split-K partials in bf16 or fp32);
* ``KDA backend torch``: the torch fp32 KDA recurrence instead of fla's kernel;
* ``MoE backend loop``: one F.linear pair per selected expert instead of grouped matmuls.

Each is compared with the default run: top-1 agreement, mean |logit difference| and KL. The
fast path (table as checked in) and the fp32 oracle are printed beside them for scale.
"""

from __future__ import annotations

import argparse

import torch

from fastpath.measure import stopwatch_log
from lab.sweep_util import compare_logits, decode_teacher_forced, teacher_forced_inputs
from optimized_model.k3.fast import dispatch
from optimized_model.k3.model import K3Model


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--split", type=int, default=1, help="rows per batch of the split run")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_parity_noise: no CUDA device here; nothing to measure")
        return 2
    log = stopwatch_log()
    model = K3Model.build("mini", device="cuda", dtype=torch.bfloat16, seed=0)
    B = args.batch
    tokens, start = teacher_forced_inputs(model, B, args.context, args.steps)
    base = decode_teacher_forced(model, tokens, start)
    runs = {f"rows of {args.split}": lambda: decode_teacher_forced(model, tokens, start, args.split)}

    def flipped():
        mm = torch.backends.cuda.matmul
        before = mm.allow_bf16_reduced_precision_reduction
        mm.allow_bf16_reduced_precision_reduction = not before
        try:
            return decode_teacher_forced(model, tokens, start)
        finally:
            mm.allow_bf16_reduced_precision_reduction = before
    runs[f"reduced-precision reduction {torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}"
         f" -> {not torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction}"] = flipped

    def backend(attr: str, value: str):
        def run():
            before = getattr(model, attr)
            setattr(model, attr, value)
            try:
                return decode_teacher_forced(model, tokens, start)
            finally:
                setattr(model, attr, before)
        return run
    runs[f"KDA backend torch (default {model.kda_backend})"] = backend("kda_backend", "torch")
    runs[f"MoE backend loop (default {model.moe_backend})"] = backend("moe_backend", "loop")

    fd = dispatch.build_fast_decoder(model, lambda b, c: model.new_state(b, c))
    runs["fast path (for scale)"] = lambda: decode_teacher_forced(fd, tokens, start)
    oracle = K3Model.build("mini", device="cuda", dtype=torch.float32, seed=0, oracle=True,
                           round_dtype=torch.bfloat16)
    runs["fp32 oracle (for scale)"] = lambda: decode_teacher_forced(oracle, tokens, start.to_dtype(torch.float32))
    log(f"standard path, batch {B}, context {args.context}, {args.steps} steps: "
        f"{B * args.steps} positions; each run vs the default standard run")
    for name, run in runs.items():
        m = compare_logits(run(), base)
        log(f"{name:45s} top1 {m['top1']:.4f}  mean|d| {m['mean_diff']:.5f}  max|d| {m['max_diff']:.4f}  "
            f"KL {m['kl']:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
