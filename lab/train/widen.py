"""More MLA heads for trained weights, computing what they computed:
``python3 -m lab.train.widen IN.safetensors OUT.safetensors [--heads fresh|copied] [--seed 0]``.

Session 30 found MRCR's choice among same-heading messages made by the first MLA layer's four
heads, each spread over two or three needles, and every 8-needle document of 8k and 16k missed
(docs/k3-mini.md, "Where the choice is made"). Whether four heads are too few is tested here by
widening trained weights, not by training a wider config from scratch (run 3 took ~1,200 s of
H200 time). Each MLA layer gets a second set of heads (rows of q_b, kv_b and gate_proj, columns
of o_proj) such that the wide model computes what the narrow one did: either copies sharing
their heads' outputs (``--heads copied``, with query noise against the symmetry; session 31's
stayed pairwise alike through 1,873 steps of training), or new heads with fresh queries and
gates, silent outputs (``--heads fresh``, the default). A fine-tune then starts from OUT with
``--config trained_mla8`` (h200.sh ``--init-from OUT --config trained_mla8 ...``); the config is
lab/train/configs.py's.
"""

from __future__ import annotations

import argparse
import hashlib

import torch

from lab.train.configs import TRAINED_MLA8 as WIDE
from optimized_model.k3.config import TRAINED, K3Config

FACTOR = WIDE.mla_heads // TRAINED.mla_heads
HEADS = ("fresh", "copied")


def widen(weights: dict[str, torch.Tensor], cfg: K3Config, *, heads: str = "fresh", noise: float = 0.1,
          out_scale: float = 0.0, seed: int = 0) -> dict[str, torch.Tensor]:
    """``weights`` of ``cfg`` with every MLA layer's heads doubled (head h + H beside head h).
    ``heads="copied"``: each pair shares its o_proj columns' halves, the copy's query rows moved by
    ``noise`` times the head's spread. ``heads="fresh"``: the new heads' queries and output gates
    drawn anew at the init's scales (weights.py) and their o_proj columns zero, so they start
    silent and unlike the old ones (session 31's copied heads were still pairwise alike after
    1,873 steps); ``out_scale`` > 0 draws those columns instead at ``out_scale`` times the old
    columns' spread, so the new heads speak from the first step (silent ones stayed silent and
    shut their gates through 100 CPU steps at lr 1e-3: docs/k3-mini.md), at the price of a
    model that no longer computes what the narrow one did."""
    if heads not in HEADS:
        raise ValueError(f"heads={heads!r}: choose one of {HEADS}")
    if out_scale and heads != "fresh":
        raise ValueError("out_scale is for heads='fresh' (copies share their heads' outputs)")
    gen = torch.Generator().manual_seed(seed)
    H, nope, v = cfg.mla_heads, cfg.qk_nope, cfg.v_head
    out = dict(weights)
    for i, kind in enumerate(cfg.layer_kinds):
        if kind != "mla":
            continue
        p = f"L{i}."
        q = weights[p + "q_b"].float().view(H, nope, -1)
        if heads == "copied":
            new_q = q + noise * q.std(dim=(1, 2), keepdim=True) * torch.randn(q.shape, generator=gen)
        else:
            new_q = cfg.q_lora ** -0.5 * torch.randn(q.shape, generator=gen)
        out[p + "q_b"] = torch.cat([q, new_q]).flatten(0, 1)
        kv = weights[p + "kv_b"].float().view(H, nope + v, -1)
        out[p + "kv_b"] = torch.cat([kv, kv]).flatten(0, 1)
        gate = weights[p + "gate_proj"].float().view(H, v, -1)
        # fresh heads' gates drawn anew too: a layer whose trained gates are shut (the last MLA
        # layer's are ~0 at MRCR's choice, docs/k3-mini.md) would leave copies of them shut
        new_gate = gate if heads == "copied" else cfg.hidden ** -0.5 * torch.randn(gate.shape, generator=gen)
        out[p + "gate_proj"] = torch.cat([gate, new_gate]).flatten(0, 1)
        o = weights[p + "o_proj"].float()  # [hidden, H * v]
        # drawn only when asked, so the default's later draws (and file) stay what they were
        new_o = out_scale * o.std() * torch.randn(o.shape, generator=gen) if out_scale else torch.zeros_like(o)
        out[p + "o_proj"] = torch.cat([o / FACTOR, o / FACTOR] if heads == "copied" else [o, new_o], dim=1)
        for name in ("q_b", "kv_b", "gate_proj", "o_proj"):
            out[p + name] = out[p + name].to(weights[p + name].dtype).contiguous()
    return out


def main(argv: list[str] | None = None) -> int:
    from safetensors.torch import load_file

    from lab.train import checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", help="an exported weights file of the trained config")
    ap.add_argument("out")
    ap.add_argument("--heads", choices=HEADS, default="fresh", help="the new heads: fresh queries and gates with "
                    "silent outputs, or copies of the old ones (widen's docstring)")
    ap.add_argument("--noise", type=float, default=0.1, help="--heads copied: the copies' query noise, times each "
                    "head's spread")
    ap.add_argument("--out-scale", type=float, default=0.0, help="--heads fresh: the new heads' o_proj columns "
                    "at this times the old columns' spread (default 0: silent, the model unchanged)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    meta = checkpoint.export_meta(args.weights)
    if meta.get("config", TRAINED.name) != TRAINED.name:
        raise SystemExit(f"{args.weights} holds the {meta['config']!r} config's weights: widen the {TRAINED.name!r} config's")
    source = hashlib.sha256(open(args.weights, "rb").read()).hexdigest()
    wide = widen(load_file(args.weights), TRAINED, heads=args.heads, noise=args.noise, out_scale=args.out_scale,
                 seed=args.seed)
    how = {"sha256": source, "heads": args.heads, "noise": args.noise, "seed": args.seed}
    if args.out_scale:
        how["out_scale"] = args.out_scale
    path = checkpoint.export_weights(wide, args.out, {**meta, "config": WIDE.name, "widened_from": how})
    print(f"{path}: {TRAINED.mla_heads} -> {WIDE.mla_heads} MLA heads from {args.weights} (sha256 {source[:8]}...), "
          f"sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
