"""The documents one run evaluates, per task: generated from the spec's seed, or chosen from the
user's files (``[evals.TASK] data``, relative to the spec's folder)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

from fastpath.evals import aime, mrcr
from fastpath.evals.data import read_rows


def _data_path(spec_dir: Path, value: str) -> str:
    p = Path(value)
    return str(p if p.is_absolute() else spec_dir / p)


def mrcr_docs(settings: dict, tier: str, seed: int, count_tokens: Callable[[list[dict]], int],
              spec_dir: Path) -> list[dict]:
    """``docs`` per bucket: generated, or the first of the data rows (seeded order) whose
    prompt falls in the bucket with room for ``max_gen_toks``."""
    task, t = settings["mrcr"], settings["mrcr"][tier]
    if not task.get("data"):
        return mrcr.generate(seed, t["buckets"], t["docs"], count_tokens, task["needles"], t["max_gen_toks"])
    rows = read_rows(_data_path(spec_dir, task["data"]))
    for row in rows:
        mrcr.check_row(row)
    random.Random(seed).shuffle(rows)
    chosen: dict[int, list[dict]] = {b: [] for b in t["buckets"]}
    for row in rows:
        n = count_tokens(mrcr.messages(row))
        b = mrcr.bucket_of(n)
        if b in chosen and len(chosen[b]) < t["docs"] and n + t["max_gen_toks"] <= b:
            chosen[b].append(row)
    short = {b: len(v) for b, v in chosen.items() if len(v) < t["docs"]}
    if short:
        raise ValueError(f"MRCR data {task['data']}: too few documents for buckets {short} "
                         f"(need {t['docs']} each; lower [evals.mrcr.{tier}] docs or change its buckets)")
    return [r for b in t["buckets"] for r in chosen[b]]


def aime_docs(settings: dict, tier: str, seed: int, spec_dir: Path) -> list[dict]:
    """``docs`` problems: generated long-arithmetic ones, or the first of the data rows (seeded order)."""
    task, t = settings["aime25"], settings["aime25"][tier]
    if not task.get("data"):
        return aime.generate(seed, t["docs"], t.get("steps", 3))
    rows = read_rows(_data_path(spec_dir, task["data"]))
    for row in rows:
        if isinstance(row.get("answer"), int):  # integer answers in the user's file are fine
            row["answer"] = str(row["answer"])
        aime.check_row(row)
    random.Random(seed).shuffle(rows)
    return rows[:t["docs"]]
