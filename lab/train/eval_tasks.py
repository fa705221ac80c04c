"""The one place that knows how the eval tasks render their documents, and which are held out.

Training data must be the prompts exactly as the evals suite renders them: MRCR's message list
through the tokenizer's chat template, the AIME task's prompt text, the features suite's
prompts. Everything here that comes from the evals suite is marked STAND-IN: until that suite
lands, the MRCR rows come from ``mrcr_standin`` and the AIME prompt is lm-eval's built-in
``aime25`` ``doc_to_text``; then this module imports the suite's generator and prompt instead
and the rest of lab/train does not change.

Held out: the eval documents come from seeds below ``TRAIN_SEED_BASE`` (the evals suite's own
seeds); training draws its seeds above it, and on top of that every training document whose
content hash is an eval document's is dropped (``heldout_hashes``), so a collision of two seeds
cannot leak an eval document into training.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from lab.train import aime_chain
from lab.train import mrcr_standin as mrcr_generator  # STAND-IN: the evals suite's MRCR generator

# STAND-IN: lm-eval's aime25 task (doc_to_text "Question: {{problem}}\nAnswer:", plain text,
# no chat turn); read from the evals suite's task once it exists.
AIME_PROMPT = "Question: {problem}\nAnswer:"

TRAIN_SEED_BASE = 1 << 40
# STAND-IN: the eval documents the evals suite generates (per MRCR bucket and for AIME)
MRCR_EVAL_BUCKETS = (1024, 2048, 4096, 8192, 16384, 32768)
MRCR_EVAL_DOCS = 64
AIME_EVAL_DOCS = 512


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- documents -----------------------------------------------------------------------------------
def mrcr_row(seed: int, target_chars: int, n_needles: int | None = None) -> dict:
    """An MRCR row in openai/mrcr's format (fields ``prompt``, ``answer``, ...)."""
    return mrcr_generator.generate_row(seed, target_chars, n_needles)


def mrcr_eval_rows(bucket: int) -> list[dict]:
    """The held-out MRCR rows of one context bucket (tokens): seeds bucket * 1000 + i."""
    return [mrcr_row(bucket * 1000 + i, int(bucket * 0.85)) for i in range(MRCR_EVAL_DOCS)]


def aime_eval_docs() -> list[dict]:
    """The held-out AIME-format documents (``problem``, ``answer``): seeds 0 .. AIME_EVAL_DOCS-1;
    ``python3 -m lab.train.eval_tasks --aime-jsonl PATH`` writes them as the task's local data."""
    return [aime_chain.document(i) for i in range(AIME_EVAL_DOCS)]


@lru_cache(maxsize=1)
def heldout_hashes() -> frozenset[str]:
    """Content hashes of every eval document (the MRCR prompt, the AIME problem)."""
    out = {content_hash(r["prompt"]) for b in MRCR_EVAL_BUCKETS for r in mrcr_eval_rows(b)}
    out |= {content_hash(d["problem"]) for d in aime_eval_docs()}
    return frozenset(out)


# -- rendering: (prompt ids, target ids) as the eval tasks present them ------------------------------
def render_mrcr(tok, row: dict) -> tuple[list[int], list[int]]:
    """The message list through the chat template; the answer ends its turn, then eos (the
    generation loop stops on eos; an adapter that stops on the end of the turn stops earlier)."""
    prompt = tok.apply_chat_template(json.loads(row["prompt"]), add_generation_prompt=True)
    return prompt, tok.encode(row["answer"], bos=False) + [tok.end_turn_id, tok.eos_id]


def render_aime(tok, doc: dict) -> tuple[list[int], list[int]]:
    """The AIME task's prompt text (plain, with bos); the worked solution, then eos."""
    prompt = tok.encode(AIME_PROMPT.format(problem=doc["problem"]), bos=True)
    return prompt, tok.encode(doc["solution"], bos=False) + [tok.eos_id]


def render_plain(tok, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """A features-suite prompt: plain text with bos, as the suite encodes it."""
    return tok.encode(prompt, bos=True), tok.encode(answer, bos=False) + [tok.eos_id]


def render_chat(tok, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return ids, tok.encode(answer, bos=False) + [tok.end_turn_id, tok.eos_id]


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - a file writer
    import argparse

    ap = argparse.ArgumentParser(description="write the held-out AIME-format documents as JSONL")
    ap.add_argument("--aime-jsonl", required=True)
    args = ap.parse_args(argv)
    with open(args.aime_jsonl, "w") as f:
        for d in aime_eval_docs():
            f.write(json.dumps({"problem": d["problem"], "answer": d["answer"]}) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
