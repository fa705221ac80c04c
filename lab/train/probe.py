"""What a weights file can do on the training tasks: ``python3 -m lab.train.probe WEIGHTS [--n 8]``.

Greedy generations of the standard path on documents no training step or eval draws (seeds from
``PROBE_SEED_BASE``), scored as the evals score them, with what the evals do not say:

* MRCR at a short and a long context: the official score, and how many answer words after the
  heading are the requested message's (copying) against the most common word (the first
  checkpoint's failure: one word repeated);
* AIME-format problems: exact match, the first wrong line of the worked solution and what made
  it wrong (the carried value, the operation read from the problem, or the arithmetic), and the
  share of operations each step names in its place;
* copy tasks (copy_tasks.py): exact copies, of a text named by its heading and of one named by
  its place among texts of one heading (MRCR's "the 3rd poem about owls").

Runs on CPU (the trained config: ``--n 4`` in ~20 s on 2 cores) and on the GPU after a training run, so a
run's return says what it learnt, not only its loss. ``--out`` is rewritten after each part
(``"complete": false`` until the last), so a probe killed on the way keeps what it scored.

``--eval-documents TIER`` scores the evals suite's own held-out documents of a tier instead (MRCR
per bucket, AIME), rendered and graded as above: a preview of what the tier's evals will see,
on this machine's standard path, not the suite's run (no fast path, no lm-eval, no statistics).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re
import time

from fastpath.evals import aime, mrcr
from lab.train import copy_tasks, eval_tasks

PROBE_SEED_BASE = 1 << 41  # training draws from 2^40 (a few 10^9 above it), parity from 2^39, evals below 2^31
LINE = re.compile(r"Step (\d+): (-?\d+) ([-+*]) (\d+) = (-?\d+), mod 1000 = (\d+)\.")  # "lines"
HEAD = re.compile(r"Step (\d+): x = (\d+), (add|subtract|multiply by) (\d+)\.")  # "columns"
NAMED_HEAD = re.compile(r"Step (\d+): (add|subtract|multiply by) (\d+), x = (\d+)\.")  # "numbered"
LISTING = re.compile(r"\d+\. (add|subtract|multiply by) \d+")  # "listed": the numbered operations
WORK = {" * ": "arithmetic *", " + ": "arithmetic +", "1000 - ": "arithmetic complement"}  # "columns"


def _cause(g: str, w: str) -> str:
    """Why line ``g`` of a generation is not line ``w`` of the worked solution."""
    if LINE.fullmatch(w):
        gm, wm = LINE.fullmatch(g), LINE.fullmatch(w)
        if not gm:
            return "format"
        if gm.group(2) != wm.group(2):
            return "carried value"
        if gm.group(3, 4) != wm.group(3, 4):
            return "operation"
        return f"arithmetic {wm.group(3)}" if gm.group(5) != wm.group(5) else "mod"
    if HEAD.fullmatch(w):
        gm, wm = HEAD.fullmatch(g), HEAD.fullmatch(w)
        return "format" if not gm else "carried value" if gm.group(2) != wm.group(2) else "operation"
    if NAMED_HEAD.fullmatch(w):
        gm, wm = NAMED_HEAD.fullmatch(g), NAMED_HEAD.fullmatch(w)
        return "format" if not gm else "operation" if gm.group(2, 3) != wm.group(2, 3) else "carried value"
    if LISTING.fullmatch(w):
        return "listing"
    work = w.split(":", 1)[0]
    return next((cause for sign, cause in WORK.items() if sign in work), "format")


def first_wrong_line(got: str, want: str) -> tuple[int, str] | None:
    """(index, cause) of the first line of ``got`` that differs from the worked solution ``want``
    (any style of eval_tasks.STYLES), or None if every line matches."""
    g_lines, w_lines = got.splitlines(), want.splitlines()
    for i, w in enumerate(w_lines):
        g = g_lines[i] if i < len(g_lines) else ""
        if g != w:
            return i, _cause(g, w)
    return None


def operations_in_place(got: str, problem: str) -> float:
    """Share of the problem's operations that the generation's step of the same number names
    ("columns", "listed" and "numbered" headers), whatever the values it carries: does it keep its
    place in the problem's list?"""
    want = aime.operations(problem)
    named = [m.group(3, 4) for m in HEAD.finditer(got)] or [m.group(2, 3) for m in NAMED_HEAD.finditer(got)]
    return sum(g == w for g, w in zip(named, want)) / len(want)


def copied_words(got: str, want: str) -> tuple[float, float]:
    """(share of the wanted message's words ``got`` has at the same place, share of ``got``'s words
    that are its most common word): after the heading line, word by word."""
    g = got.split("\n", 1)[1].split() if "\n" in got else []
    w = want.split("\n", 1)[1].split() if "\n" in want else []
    same = sum(a == b for a, b in zip(g, w)) / max(1, len(w))
    top = collections.Counter(g).most_common(1)[0][1] / len(g) if g else 0.0
    return same, top


# documents generated in one batch: 48 MRCR documents of ~16k tokens at once held 18.8 GB on the CPU
# (killed on a 23-GB machine); 16 at a time fit
GENERATE_BATCH = 16


def _generate(model, rendered: list[tuple[list[int], list[int]]], extra: int) -> list[str]:
    """Greedy texts of the prompts, GENERATE_BATCH at a time, each up to its answer's length + ``extra``."""
    from fastpath.engine import GenerationRequest

    requests = [GenerationRequest(prompt_ids=p, max_tokens=len(t) + extra) for p, t in rendered]
    return [r.text for i in range(0, len(requests), GENERATE_BATCH)
            for r in model.generate(requests[i:i + GENERATE_BATCH])]


# Operations per probed AIME problem, per solution style: the size whose worked solution is ~1,050
# tokens, what the full tier's aime25 task asks for (lines: its steps = 24; columns, ~130 tokens
# an operation: 8 steps, mean 1,061 tokens, max 1,319, over seeds 0-19); listed as columns, so that
# both fetch the same number of operations (its listing adds ~135: mean 1,195, max 1,470); numbered as columns
AIME_PROBE_STEPS = {"lines": 24, "columns": 8, "listed": 8, "numbered": 8}


def _solved(text: str, row: dict) -> bool:
    """Does a generation end in the AIME row's boxed answer?"""
    return text.strip().endswith(f"\\boxed{{{row['answer']}}}.")


def _copied_exactly(model, tok, pairs: list[tuple[str, str]]) -> float:
    """Share of copy tasks (prompt, answer) whose greedy answer is the text, exactly."""
    texts = _generate(model, [eval_tasks.render_chat(tok, *pair) for pair in pairs], 8)
    return sum(text == answer for text, (_, answer) in zip(texts, pairs)) / len(pairs)


def probe(model, tok, n: int, aime_style: str, mrcr_tokens=(400, 2000), aime_steps: int | None = None,
          say=print, keep=lambda out: None) -> dict:
    """The summary; ``keep(summary so far)`` after each part, so a run cut short keeps what it scored."""
    aime_steps = aime_steps or AIME_PROBE_STEPS[aime_style]
    out: dict = {}
    for size in mrcr_tokens:
        scores, same, top = [], [], []
        seeds = [PROBE_SEED_BASE + 1000 * size + i for i in range(n)]
        rows = [eval_tasks.mrcr_row(seed, size, tok) for seed in seeds]
        texts = _generate(model, [eval_tasks.render_mrcr(tok, row) for row in rows], 8)
        for row, text in zip(rows, texts):
            scores.append(mrcr.grade(text, row["answer"], row["random_string_to_prepend"]))
            s, m = copied_words(text.removeprefix(row["random_string_to_prepend"]),
                                row["answer"].removeprefix(row["random_string_to_prepend"]))
            same.append(s)
            top.append(m)
        out[f"mrcr_{size}"] = {"score": round(sum(scores) / n, 3), "words_in_place": round(sum(same) / n, 3),
                               "most_common_word_share": round(sum(top) / n, 3)}
        say(f"mrcr ~{size} tokens: {json.dumps(out[f'mrcr_{size}'])}")
        # each document's seed, needle count and score: two weights files' probes compare paired, in
        # all or by needle count (probe_compare.py)
        out[f"mrcr_{size}"]["documents"] = [{"seed": seed, "needles": len(eval_tasks.mrcr_needles(row)[0]),
                                             "score": round(g, 3)} for seed, row, g in zip(seeds, rows, scores)]
        keep(out)
    exact, causes, reached, in_place = 0, collections.Counter(), [], []
    rows = [aime.generate(PROBE_SEED_BASE + i, 1, aime_steps)[0] for i in range(n)]
    texts = _generate(model, [eval_tasks.render_aime(tok, row, aime_style) for row in rows], 32)
    for row, text in zip(rows, texts):
        want = eval_tasks.solution(row, aime_style)
        exact += _solved(text, row)
        wrong = first_wrong_line(text, want)
        reached.append(len(want.splitlines()) if wrong is None else wrong[0])
        causes[wrong[1] if wrong else "none"] += 1
        in_place.append(operations_in_place(text, row["problem"]))
    out["aime"] = {"steps": aime_steps, "style": aime_style, "exact": exact / n,
                   "lines_right_before_the_first_error": reached, "first_error": dict(causes)}
    if aime_style != "lines":
        out["aime"]["operations_in_place"] = round(sum(in_place) / n, 3)
    say(f"aime {aime_steps} steps: {json.dumps(out['aime'])}")
    keep(out)
    out["copy"] = {"exact": _copied_exactly(model, tok, [copy_tasks.copy_pair(PROBE_SEED_BASE + i) for i in range(n)]),
                   # by its place among texts of one heading: MRCR's failure
                   "ordinal_exact": _copied_exactly(model, tok, [copy_tasks.ordinal_pair(PROBE_SEED_BASE + i)
                                                                 for i in range(n)])}
    say(f"copy: {json.dumps(out['copy'])}")
    keep(out)
    return out


def mrcr_choice(text: str, row: dict) -> dict:
    """Which same-heading message a generation copied: ``asked`` (the k-th the document wants) and
    ``chose`` (the message of the heading it matches best, graded as MRCR grades; None if it matches
    none, e.g. without the random string), of ``needles``."""
    needles, asked = eval_tasks.mrcr_needles(row)
    secret = row["random_string_to_prepend"]
    matches = [mrcr.grade(text, secret + n, secret) for n in needles]
    best = max(range(len(needles)), key=matches.__getitem__)
    return {"needles": len(needles), "asked": asked, "chose": best + 1 if matches[best] > 0 else None}


def probe_eval_documents(model, tok, tier: str, aime_style: str, max_tokens: int, say=print) -> dict:
    """MRCR per bucket (up to ``max_tokens``) and AIME on the evals suite's documents of ``tier``."""
    docs, out = eval_tasks.eval_documents(tier), {}
    buckets = collections.defaultdict(list)
    for row in docs["mrcr"]:
        rendered = eval_tasks.render_mrcr(tok, row)
        buckets[mrcr.bucket_of(len(rendered[0]))].append((row, rendered))
    for bucket in sorted(b for b in buckets if b <= max_tokens):
        rows, rendered = zip(*buckets[bucket])
        texts = _generate(model, list(rendered), 8)
        scores = [mrcr.grade(t, r["answer"], r["random_string_to_prepend"]) for t, r in zip(texts, rows)]
        out[f"mrcr_{bucket}"] = {"docs": len(rows), "score": round(sum(scores) / len(rows), 3),
                                 "documents": [dict(mrcr_choice(t, r), score=round(g, 3))
                                               for t, r, g in zip(texts, rows, scores)]}
        say(f"{tier} mrcr bucket {bucket}: {json.dumps(out[f'mrcr_{bucket}'])}")
    rows = docs["aime25"]
    rendered = [eval_tasks.render_aime(tok, row, aime_style) for row in rows]
    texts = _generate(model, rendered, 32)
    exact = sum(_solved(t, r) for t, r in zip(texts, rows))
    out["aime25"] = {"docs": len(rows), "exact": exact, "mean_target_tokens": round(
        sum(len(t) for _, t in rendered) / len(rows)), "operations_in_place": round(
        sum(operations_in_place(t, r["problem"]) for t, r in zip(texts, rows)) / len(rows), 3)}
    say(f"{tier} aime25: {json.dumps(out['aime25'])}")
    return out


def load_standard(weights: str, device: str = "cpu"):
    """(the standard path's model, the file's export metadata, its sha256) of a weights file
    lab.train.export wrote (or the committed checkpoint); fp32 on the CPU."""
    from lab.train import checkpoint
    from optimized_model.k3.engine import EmbeddedEngine

    with open(weights, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    # the config and the style the weights learnt: lab.train.export records both (a CPU trial's may be
    # tiny); the committed checkpoint's are the trained config and aime's default
    meta = checkpoint.export_meta(weights)
    engine = EmbeddedEngine(config=meta.get("config", "trained"), device=device,
                            dtype="float32" if device == "cpu" else None, weights=weights,
                            weights_sha256=digest, threads=2 if device == "cpu" else None,
                            standard_compile="off")  # no Inductor compile inside a training command's minute
    return engine.load("standard"), meta, digest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", help="a safetensors file lab.train.export wrote (or the committed checkpoint)")
    ap.add_argument("--n", type=int, default=8, help="documents per task")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None, help="write the summary here as JSON")
    ap.add_argument("--aime-steps", type=int, default=None,
                    help="operations per AIME problem (default: AIME_PROBE_STEPS of the weights' style)")
    ap.add_argument("--mrcr-tokens", default="400,2000",
                    help="the MRCR conversation sizes to probe, in tokens, comma-separated (the full tier's "
                         "buckets reach 32768)")
    ap.add_argument("--eval-documents", choices=eval_tasks.TIERS, default=None,
                    help="score the evals suite's documents of this tier instead of probe documents")
    ap.add_argument("--with-eval-documents", choices=eval_tasks.TIERS, default=None,
                    help="score the probe documents and then the evals suite's documents of this tier, in "
                         "one summary (its 'eval_documents'): one file where a command returns few")
    ap.add_argument("--max-tokens", type=int, default=32768,
                    help="with --eval-documents or --with-eval-documents: the largest MRCR bucket to score")
    args = ap.parse_args(argv)
    if args.eval_documents and args.with_eval_documents:
        ap.error("--eval-documents scores only the tier's documents; --with-eval-documents adds them to the probe: "
                 "pass one")

    model, meta, digest = load_standard(args.weights, args.device)
    style = meta.get("aime_style", aime.SOLUTION_STYLE)
    t0 = time.monotonic()
    say = lambda s: print(s, flush=True)  # noqa: E731

    def keep(summary: dict, done: bool = False) -> None:
        if args.out:  # written again after each part (whole or not at all): a run killed later keeps these
            with open(args.out + ".part", "w") as f:
                json.dump({**summary, "weights": args.weights, "sha256": digest, "complete": done,
                           "seconds": round(time.monotonic() - t0, 1)}, f, indent=1)
            os.replace(args.out + ".part", args.out)

    if args.eval_documents:
        summary = probe_eval_documents(model, model.tokenizer, args.eval_documents, style, args.max_tokens, say)
    else:
        summary = probe(model, model.tokenizer, args.n, style, aime_steps=args.aime_steps,
                        mrcr_tokens=tuple(int(x) for x in args.mrcr_tokens.split(",")), say=say, keep=keep)
        if args.with_eval_documents:
            summary["eval_documents"] = probe_eval_documents(model, model.tokenizer, args.with_eval_documents,
                                                             style, args.max_tokens, say)
    keep(summary, done=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
