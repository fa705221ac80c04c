"""How long can a weights file's KDA channels remember? The per-channel decay g (log of the factor a
token multiplies the state by) on one of the evals suite's MRCR documents, prefilled on the standard
path on the CPU, as half-lives in tokens (ln 2 / -mean g over the document's positions), per layer.

    python3 -m lab.train.decay optimized_model/k3/checkpoints/trained.safetensors --bucket 16384 --doc 2

An MRCR document asks for the k-th of several same-heading messages thousands of tokens apart;
channels whose half-life is far below that span cannot carry what came before.
"""

from __future__ import annotations

import argparse
import hashlib
import math

import torch

from fastpath.engine import GenerationRequest
from fastpath.evals import mrcr
from lab.train import eval_tasks
from optimized_model.k3.engine import EmbeddedEngine


def half_lives(g: torch.Tensor) -> torch.Tensor:
    """Per-channel half-lives in tokens of log-decays g [positions, channels] (mean over positions)."""
    return math.log(2) / (-g.float().mean(0)).clamp_min(1e-9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights")
    ap.add_argument("--tier", default="full", choices=eval_tasks.TIERS)
    ap.add_argument("--bucket", type=int, default=16384, help="the MRCR bucket of the document")
    ap.add_argument("--doc", type=int, default=0, help="which of the bucket's documents")
    args = ap.parse_args(argv)
    with open(args.weights, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    engine = EmbeddedEngine(config="trained", device="cpu", dtype="float32", weights=args.weights,
                            weights_sha256=digest, threads=2, standard_compile="off")
    loaded = engine.load("standard")
    tok, k3 = loaded.tokenizer, loaded.model
    rows = [r for r in eval_tasks.eval_documents(args.tier)["mrcr"]
            if mrcr.bucket_of(len(eval_tasks.render_mrcr(tok, r)[0])) == args.bucket]
    if not 0 <= args.doc < len(rows):
        raise SystemExit(f"decay: the {args.tier} tier has {len(rows)} MRCR documents in bucket {args.bucket}; "
                         f"--doc {args.doc} is not one of them")
    row = rows[args.doc]
    prompt, _ = eval_tasks.render_mrcr(tok, row)
    seen: dict[int, torch.Tensor] = {}
    gates = k3._kda_gates

    def recording(i, x):  # the prefill's call: g [1, positions, H, K]
        g, beta = gates(i, x)
        seen.setdefault(i, g.detach().flatten(0, -3).flatten(1))
        return g, beta

    k3._kda_gates = recording
    loaded.generate([GenerationRequest(prompt_ids=prompt, max_tokens=1)])
    print(f"{args.tier} MRCR document {args.doc} of bucket {args.bucket}: {len(prompt)} tokens, "
          f"{row['n_needles']} needles")
    print("| layer | channels | half-life max | 5th | 20th | median | > 2k | > 8k |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, g in sorted(seen.items()):
        hl = half_lives(g)
        top = hl.sort(descending=True).values
        print(f"| {i} | {hl.numel()} | {top[0]:.0f} | {top[4]:.0f} | {top[19]:.0f} | {top[len(top) // 2]:.1f} | "
              f"{int((hl > 2048).sum())} | {int((hl > 8192).sum())} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
