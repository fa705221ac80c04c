"""The one place that knows how the eval tasks render their documents, and which are held out.

Documents come from the evals suite's own generators (``fastpath/evals``), on training seeds:
MRCR rows from ``mrcr.generate_doc``, AIME-format problems from ``aime.generate`` with their
worked ``aime.solution``. They are rendered exactly as the suite's lm-eval adapter sends them
(``fastpath/evals/adapter.py``, chat mode, the suite's default): the chat turns of
``prompts.chat_turns`` through the tokenizer's chat template. MRCR's turns are the document's
message list (its task names the field ``prompt``); AIME's is one user turn holding the aime25
task's ``doc_to_text`` (lm-eval's aime25.yaml, which fastpath_aime25.yaml includes).
tests/test_train.py renders through lm-eval and the adapter and compares.

Held out: the eval documents are what ``fastpath/evals/documents.py`` generates for every tier
from the spec's [evals] table and seed, so the two cannot diverge. Training seeds start at
``TRAIN_SEED_BASE`` (the suite's MRCR document seeds are below 2^31 and its AIME sets are seeded
by the spec's seed), and every training document whose content hash is an eval document's is
dropped on top (``heldout_hashes``).
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache
from pathlib import Path

from fastpath.evals import aime, documents, mrcr, sequences
from fastpath.evals.sequences import AIME_DOC_TO_TEXT, count_tokens, render_mrcr  # noqa: F401

SPEC = Path(__file__).resolve().parents[2] / "optimized_model" / "k3" / "fastpath.toml"
TIERS = ("smoke", "full")
TRAIN_SEED_BASE = 1 << 40
# operations per training AIME problem: the eval tiers' 3 and 40 inside; 3 steps are ~150 tokens
# of solution, 48 steps ~2k
AIME_STEPS = (3, 48)
# upper bounds: problem + solution per step (by solution style; 203 is the longest "columns" step
# over every value and operand, and the problem's "Step k: " label adds up to 10), and the rest
AIME_STEP_TOKENS, AIME_BASE_TOKENS = {"lines": 70, "columns": 220, "listed": 240, "numbered": 220}, 260

# A solution style on trial that the harness does not have: "listed" is "columns" after the
# problem's operations copied one per line and numbered ("The operations:", "1. add 539", ...).
# Run 3's first segment got every digit of its work right and lost its place in the problem's
# list (skipped, repeated operations: docs/k3-mini.md). A CPU fine-tune did not learn the
# listing in 300 steps; labelling the problem's operations as the steps name them
# (fastpath.evals.aime, the "numbered" style) fixed the place instead.
LISTED = "listed"
STYLES = (*aime.STYLES, LISTED)


def _listing(row: dict) -> str:
    """The "listed" style's first lines: the problem's operations, numbered, one per line."""
    ops = aime.operations(row["problem"])
    return "The operations:\n" + "".join(f"{i}. {op} {k}\n" for i, (op, k) in enumerate(ops, 1))


def solution(row: dict, style: str = aime.SOLUTION_STYLE) -> str:
    """``aime.solution`` in any of ``STYLES``."""
    return _listing(row) + aime.solution(row, "columns") if style == LISTED else aime.solution(row, style)


def render_aime(tok, row: dict, style: str = aime.SOLUTION_STYLE) -> tuple[list[int], list[int]]:
    """``sequences.render_aime`` in any of ``STYLES`` (the byte tokenizer's ids of the listing, then
    the columns solution's)."""
    if style != LISTED:
        return sequences.render_aime(tok, row, style)
    prompt, target = sequences.render_aime(tok, row, "columns")
    return prompt, tok.encode(_listing(row), bos=False) + target


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- held out ----------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _spec():
    from fastpath.spec import load_spec

    return load_spec(SPEC)


@lru_cache(maxsize=len(TIERS))
def eval_documents(tier: str) -> dict[str, list[dict]]:
    """{spec task: documents} the evals suite evaluates on ``tier``."""
    from optimized_model.k3.tokenizer import K3Tokenizer

    spec = _spec()
    ev, where = spec.evals, Path(spec.path).parent
    return {"mrcr": documents.mrcr_docs(ev, tier, ev["seed"], count_tokens(K3Tokenizer()), where),
            "aime25": documents.aime_docs(ev, tier, ev["seed"], where)}


def document_hash(task: str, doc: dict) -> str:
    """What identifies a document: MRCR's conversation, AIME's problem."""
    return content_hash(doc["prompt"] if task == "mrcr" else doc["problem"])


@lru_cache(maxsize=1)
def heldout_hashes() -> frozenset[str]:
    """Content hashes of every eval document of every tier."""
    return frozenset(document_hash(task, d) for tier in TIERS for task, docs in eval_documents(tier).items()
                     for d in docs)


# -- training documents (seeds >= TRAIN_SEED_BASE) -----------------------------------------------------
def mrcr_needle_counts() -> list[int]:
    """The needle counts of the spec's MRCR documents."""
    return sorted(_spec().evals["mrcr"]["needles"])


def mrcr_row(seed: int, target_tokens: int, tok, needle_weights: tuple[tuple[int, float], ...] | None = None) -> dict:
    """An MRCR row whose chat-templated prompt has at most about ``target_tokens`` tokens: the
    suite's generator, answer lengths of the bucket the target falls in, a needle count drawn from
    the spec's (alike, or by ``needle_weights``: (count, weight) pairs) and lowered (as the suite
    does) while the needles alone overflow the target."""
    rng = random.Random(f"train-mrcr/{seed}")
    needles = mrcr_needle_counts()
    if needle_weights:
        weight = dict(needle_weights)
        chosen = rng.choices(needles, [weight.get(n, 0.0) for n in needles])[0]
    else:
        chosen = rng.choice(needles)
    count = count_tokens(tok)
    for n in sorted((n for n in needles if n <= chosen), reverse=True):
        row = mrcr.generate_doc(seed, target_tokens, n, count, mrcr.answer_words(mrcr.bucket_of(target_tokens)))
        if count(mrcr.messages(row)) <= target_tokens:
            break
    return row


def mrcr_needles(row: dict) -> tuple[list[str], int]:
    """An MRCR document's needles (the assistant messages of the asked heading, in order) and the
    1-based place of the one it asks for."""
    msgs = mrcr.messages(row)
    ask = msgs[row["desired_msg_index"] - 1]["content"]
    texts = [msgs[i + 1]["content"] for i, m in enumerate(msgs[:-1]) if m["role"] == "user" and m["content"] == ask]
    return texts, texts.index(row["answer"].removeprefix(row["random_string_to_prepend"])) + 1


def aime_steps(seed: int, room: int, style: str = aime.SOLUTION_STYLE) -> int | None:
    """Operations of a training problem whose prompt and solution (in ``style``) fit ``room``
    tokens, or None."""
    top = min(AIME_STEPS[1], (room - AIME_BASE_TOKENS) // AIME_STEP_TOKENS[style])
    return random.Random(f"train-aime/{seed}").randint(AIME_STEPS[0], top) if top >= AIME_STEPS[0] else None


def aime_row(seed: int, steps: int) -> dict:
    return aime.generate(seed, 1, steps)[0]


# -- rendering: (prompt ids, target ids); MRCR and AIME render as fastpath.evals.sequences does ----------
def render_plain(tok, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """A features-suite prompt: plain text with bos, as the suite encodes it."""
    return tok.encode(prompt, bos=True), tok.encode(answer, bos=False) + [tok.eos_id]


def render_chat(tok, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return ids, tok.encode(answer, bos=False) + [tok.end_turn_id, tok.eos_id]
