"""Two weights files' probes, paired document by document:
``python3 -m lab.train.probe_compare A.json B.json [--target 0.8] [--by-needles]``.

Each file is a ``lab.train.probe --out`` summary. Per MRCR size (the probe's documents, paired by
seed) and per bucket of the tier's documents (``eval_documents``, paired by place, the needles
and the asked one checked), it prints each side's mean score (✓ where its CI's low end reaches the
target) and the mean of B - A, each with a 95 % percentile bootstrap CI over documents
(fastpath.stats, scipy's bootstrap): a checkpoint is adopted where the CIs say so, not on a mean
of a few documents alone. ``--by-needles`` splits every size and bucket by the documents' needle
count (2, 4, 8: how many messages share the asked heading), where a checkpoint's misses gather.
"""

from __future__ import annotations

import argparse
import json
import sys

from fastpath.stats import paired_bootstrap_ci


def _paired_documents(a: dict, b: dict, key: str) -> tuple[list[dict], list[dict]]:
    """The two sides' documents of one size or bucket, in the same order, checked to be the same."""
    da, db = a[key].get("documents"), b[key].get("documents")
    if not da or not db:
        raise SystemExit(f"{key}: a summary lacks per-document scores (a probe from before they were "
                         "kept): probe both weights files again with this tree")
    ids = lambda docs: [d.get("seed", (d.get("needles"), d.get("asked"))) for d in docs]  # noqa: E731
    if ids(da) != ids(db):
        raise SystemExit(f"{key}: the two summaries scored different documents (another --n or tier): "
                         "probe both with the same options")
    return da, db


def _needles(doc: dict, tokens: int, tok) -> int:
    """A document's needle count: kept by the probe since session 40; before, its seed makes the
    document again (the generator is seeded, no model needed)."""
    if "needles" not in doc:
        from lab.train import eval_tasks

        doc["needles"] = len(eval_tasks.mrcr_needles(eval_tasks.mrcr_row(doc["seed"], tokens, tok))[0])
    return doc["needles"]


def compare(a: dict, b: dict, target: float, by_needles: bool = False) -> list[dict]:
    """One row per MRCR size or bucket both summaries hold (per needle count too, with ``by_needles``)."""
    tok = None
    if by_needles:
        from optimized_model.k3.tokenizer import K3Tokenizer

        tok = K3Tokenizer()
    rows = []
    for where, sa, sb in (("probe", a, b), ("tier", a.get("eval_documents", {}), b.get("eval_documents", {}))):
        for key in sorted((k for k in sa if k.startswith("mrcr_") and k in sb), key=lambda k: int(k[5:])):
            da, db = _paired_documents(sa, sb, key)
            tokens = int(key[5:])
            groups = {None: range(len(da))}
            if by_needles:
                counts = [_needles(d, tokens, tok) for d in da]
                groups = {n: [i for i, c in enumerate(counts) if c == n] for n in sorted(set(counts))}
            for needles, idx in groups.items():
                xa, xb = [da[i]["score"] for i in idx], [db[i]["score"] for i in idx]
                row = {"where": where, "tokens": tokens, "needles": needles, "docs": len(xa)}
                for side, x in (("a", xa), ("b", xb)):  # one sample's mean: paired with zeros
                    row[side] = paired_bootstrap_ci(x, [0.0] * len(x))
                    row[f"{side}_meets_target"] = row[side][1] >= target
                row["b_minus_a"] = paired_bootstrap_ci(xb, xa)
                rows.append(row)
    return rows


def _fmt(est_lo_hi: tuple[float, float, float]) -> str:
    est, lo, hi = est_lo_hi
    return f"{est:.3f} [{lo:.3f}, {hi:.3f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="the probe summary of the weights to compare against (e.g. the committed)")
    ap.add_argument("b", help="the probe summary of the candidate")
    ap.add_argument("--target", type=float, default=0.8, help="the MRCR score every bucket must reach")
    ap.add_argument("--by-needles", action="store_true", help="a row per needle count of each size and bucket")
    args = ap.parse_args(argv)
    summaries = []
    for path in (args.a, args.b):
        try:
            with open(path) as f:
                summaries.append(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"{path}: not a readable probe summary ({e}): pass a file lab.train.probe --out wrote")
    for path, summary in zip((args.a, args.b), summaries):
        if summary.get("complete") is False:  # a probe cut short keeps the parts it finished
            print(f"note: {path} holds an unfinished probe (cut short or still running): "
                  "only the sizes it finished compare")
    rows = compare(*summaries, args.target, args.by_needles)
    if not rows:
        raise SystemExit("the two summaries share no MRCR size or bucket: probe both with the same --mrcr-tokens")
    print(f"A = {summaries[0].get('weights')} ({str(summaries[0].get('sha256'))[:8]}…), "
          f"B = {summaries[1].get('weights')} ({str(summaries[1].get('sha256'))[:8]}…); "
          f"mean MRCR score [95 % CI]; ✓: the CI's low end reaches {args.target}")
    split = args.by_needles
    print(f"| documents | tokens | {'needles | ' * split}n | A | B | B - A |")
    print(f"|---|---:|{'---:|' * split}---:|---:|---:|---:|")
    for r in rows:
        needles = f"{r['needles']} | " if split else ""
        print(f"| {r['where']} | {r['tokens']} | {needles}{r['docs']} | {_fmt(r['a'])}{' ✓' * r['a_meets_target']} | "
              f"{_fmt(r['b'])}{' ✓' * r['b_meets_target']} | {_fmt(r['b_minus_a'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
