"""Eval-task documents as token sequences: how a model trained on the tasks sees them, for parity.

A trained subject is confident on its tasks' documents and nearly flat on random words, so
parity scored on random words measures bf16 noise at near-ties more than the fast path. The
parity gates' ``sequences = "fastpath.evals.sequences:task_documents"`` scores continuations of
these instead: documents packed one after another, each from its own bos, as a training row
packs them, entered at a seeded offset and cut to the requested length.

Renderings are the evals suite's (its lm-eval adapter, chat mode): MRCR's message list through
the tokenizer's chat template, answered with the graded answer; an AIME-format problem as
lm-eval's aime25 prompt in one user turn, answered with its worked solution. Seeds lie in
[2^39, 2^40): apart from the suite's documents (below 2^31) and from training's (from 2^40).
"""

from __future__ import annotations

import random

from fastpath.evals import aime, mrcr
from fastpath.evals.prompts import chat_turns

SEED_BASE = 1 << 39
# lm-eval's aime25.yaml doc_to_text (fastpath_aime25.yaml includes it)
AIME_DOC_TO_TEXT = "Question: {problem}\nAnswer:"
MRCR_MESSAGES_FIELD = "prompt"  # fastpath_mrcr.yaml metadata chat_messages
AIME_STEPS = (2, 8)  # operations per packed problem: ~290 to ~1,070 tokens of solution
MRCR_NEEDLES = (2, 4, 8)
MAX_OFFSET = 512  # tokens skipped at the start of the packed documents, seeded
DOCS_PER_SEED = 4096  # document seeds of one sequence: seed * DOCS_PER_SEED + k


def _turn_end(tok) -> list[int]:
    """What ends an answer: the end of the turn (where the tokenizer has one), then eos."""
    return [i for i in (getattr(tok, "end_turn_id", None), getattr(tok, "eos_id", None)) if i is not None]


def count_tokens(tok):
    """The suite's MRCR length: the chat-templated conversation."""
    return lambda msgs: len(tok.apply_chat_template(msgs))


def render_mrcr(tok, row: dict) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids): the message list through the chat template; the answer is what
    the grader compares with (the random string, then the requested message)."""
    prompt = tok.apply_chat_template(chat_turns(mrcr.doc_to_text(row), row, MRCR_MESSAGES_FIELD))
    return prompt, tok.encode(row["answer"], bos=False) + _turn_end(tok)


def render_aime(tok, row: dict, style: str = aime.SOLUTION_STYLE) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids): the aime25 prompt as one user turn; the worked solution (in
    ``style``) ending in \\boxed{N}."""
    prompt = tok.apply_chat_template(chat_turns(AIME_DOC_TO_TEXT.format(problem=row["problem"]), row, None))
    return prompt, tok.encode(aime.solution(row, style), bos=False) + _turn_end(tok)


def _document(tok, seed: int, room: int) -> list[int]:
    """One rendered document (prompt and answer) of about ``room`` tokens or fewer (an MRCR
    conversation is sized to the room; an AIME problem is as long as its operations)."""
    rng = random.Random(f"parity-document/{seed}")
    if room >= 600 and rng.random() < 0.5:
        target = int(room * rng.uniform(0.5, 0.9))
        row = mrcr.generate_doc(seed, target, rng.choice(MRCR_NEEDLES), count_tokens(tok),
                                mrcr.answer_words(mrcr.bucket_of(target)))
        prompt, answer = render_mrcr(tok, row)
    else:
        prompt, answer = render_aime(tok, aime.generate(seed, 1, rng.randint(*AIME_STEPS))[0])
    return prompt + answer


def task_documents(tok, seed: int, n_tokens: int) -> list[int]:
    """Exactly ``n_tokens`` ids: bos, then seeded task documents packed back to back from a seeded
    offset (so that short sequences of one batch differ: identical rows would hide a row mix-up),
    the last one cut."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens {n_tokens}: a sequence needs at least one token")
    offset = random.Random(f"parity-offset/{seed}").randrange(MAX_OFFSET)
    ids: list[int] = []
    k = 0
    while len(ids) < offset + n_tokens - 1:
        if k == DOCS_PER_SEED:
            raise ValueError(f"n_tokens {n_tokens}: more than {DOCS_PER_SEED} documents to fill; too long")
        ids += _document(tok, SEED_BASE + seed * DOCS_PER_SEED + k, offset + n_tokens - len(ids))
        k += 1
    return [tok.bos_id] + ids[offset:offset + n_tokens - 1]
