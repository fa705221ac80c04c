"""How often rounding the logits to bf16 alone changes the top-1 token (CPU, fp32 model).

    python3 -m lab.logit_ties [--weights optimized_model/k3/checkpoints/trained.safetensors] \\
        [--tokens 1024] [--sequences 6]

The standard path's LM head returns bf16 logits (``F.linear`` in bf16, then ``.float()``); the
fast path's GEMV writes fp32. On a confident model the top logits sit near 20-30, where a bf16
step is 0.125, so close calls become ties that argmax breaks towards the lower id. This scores
held-out task documents (parity's sequences, seeds no parity case uses) with the fp32 model and
prints the share of positions whose argmax moves when only the logits are rounded: an estimate
of how much of the standard path's disagreement with the fp32 oracle its head alone makes (the
other bf16 roundings of the step come on top, or by chance undo it).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from fastpath.evals.sequences import task_documents
from fastpath.stats import top1_agreement
from lab.train.probe import load_standard


def rounding_flips(logits: np.ndarray) -> dict:
    """Top-1 changes and top ties when fp32 logits [N, V] are rounded to bf16."""
    rounded = torch.from_numpy(logits).to(torch.bfloat16).float().numpy()
    finite = np.where(np.isfinite(logits), logits, -np.inf)
    two = np.sort(finite, -1)[:, -2:]
    return {"positions": int(len(logits)),
            "flipped": 1.0 - top1_agreement(rounded, logits),  # parity's metric and tie rule
            "tied": float(((rounded == rounded.max(-1, keepdims=True)).sum(-1) > 1).mean()),
            "top_logit_median": float(np.median(two[:, 1])),
            "gap_below_0.125": float((two[:, 1] - two[:, 0] < 0.125).mean())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", default="optimized_model/k3/checkpoints/trained.safetensors")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--sequences", type=int, default=6)
    ap.add_argument("--seed", type=int, default=900, help="first task-document seed")
    args = ap.parse_args(argv)
    model, _, digest = load_standard(args.weights)
    rows = []
    for s in range(args.sequences):
        seq = task_documents(model.tokenizer, args.seed + s, args.tokens)
        out = model.score([seq], prefill_len=len(seq) - 1)[0]
        rows.append(out.detach().float().cpu().numpy()[: len(seq) - 1])
    r = rounding_flips(np.concatenate(rows).astype(np.float32))
    print(f"weights {digest[:8]}…, {r['positions']} positions of {args.sequences} x {args.tokens} tokens: "
          f"bf16 logits change the top-1 token at {r['flipped']:.2%}, tie the top at {r['tied']:.2%} "
          f"(top logit median {r['top_logit_median']:.1f}; top-2 gap < 0.125 at {r['gap_below_0.125']:.2%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
