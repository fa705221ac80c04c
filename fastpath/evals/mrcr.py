"""MRCR (multi-round co-reference) in the format of OpenAI's ``openai/mrcr`` data set.

A document is a long multi-turn conversation of asks ("write a poem about tapirs") and the
assistant's answers; the same ask occurs ``n_needles`` times (2, 4 or 8) with different answers,
and the last user turn asks for one of them by ordinal, prefixed with a random string:

    prompt                    JSON text of the message list [{"role", "content"}, ...]
    answer                    random_string_to_prepend + the requested answer
    random_string_to_prepend  10 letters and digits
    n_needles                 how many times the needle ask occurs
    desired_msg_index         index in the message list of the requested assistant turn
    total_messages            length of the message list (the final ask included)
    n_chars                   characters of all message contents

Grading is openai/mrcr's: 0 unless the response starts with the random string; otherwise the
``difflib.SequenceMatcher`` ratio of response and answer, the string stripped from both.
Documents are bucketed by context length in tokens (the chat-templated prompt) into power-of-two
bins: bucket B holds the prompts of B/2 < tokens <= B.
"""

from __future__ import annotations

import difflib
import json
import random
import string
from typing import Callable, Sequence

from fastpath.evals.prompts import parse_messages

FIELDS = {"prompt": str, "answer": str, "random_string_to_prepend": str, "n_needles": int,
          "desired_msg_index": int, "total_messages": int, "n_chars": int}
NEEDLES = (2, 4, 8)
RANDOM_STRING_LEN = 10
REDRAWS = 16  # draws of (target, seed) per document before a bucket is called too small

FORMATS = ("poem", "short story", "riddle", "limerick", "essay", "haiku", "social media post", "blog post",
            "song", "letter")
TOPICS = ("tapirs", "lighthouses", "glaciers", "bicycles", "owls", "copper mines", "tea ceremonies", "comets",
           "harbors", "violins", "deserts", "bees", "clocks", "rivers", "salt", "kites", "volcanoes", "maps",
           "ferns", "trains", "lanterns", "otters", "bridges", "orchards")
WORDS = ("amber", "quiet", "river", "stone", "light", "morning", "hollow", "silver", "winter", "garden",
          "slow", "bright", "shadow", "harbor", "ember", "north", "thread", "echo", "field", "lantern",
          "salt", "copper", "drift", "meadow", "spark", "tide", "wander", "cedar", "velvet", "storm",
          "paper", "iron", "bloom", "ridge", "whisper", "orbit", "glass", "fable", "marrow", "pulse")
_ORDINALS = {1: "1st", 2: "2nd", 3: "3rd"}


def grade(response: str, answer: str, random_string_to_prepend: str) -> float:
    """openai/mrcr's grader (its data card): prefix check, then SequenceMatcher ratio."""
    if not response.startswith(random_string_to_prepend):
        return 0.0
    response = response.removeprefix(random_string_to_prepend)
    answer = answer.removeprefix(random_string_to_prepend)
    return float(difflib.SequenceMatcher(None, response, answer).ratio())


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval ``process_results`` of the MRCR task (its first response)."""
    return {"mrcr_score": grade(results[0], doc["answer"], doc["random_string_to_prepend"])}


def messages(doc: dict) -> list[dict[str, str]]:
    """The conversation of a document (``prompt`` is JSON text in openai/mrcr)."""
    return parse_messages(doc["prompt"])


def doc_to_text(doc: dict) -> str:
    """Plain-text view of the conversation (what lm-eval logs as the context; the chat turns
    themselves come from ``messages``)."""
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages(doc))


def bucket_of(tokens: int) -> int:
    """The power-of-two bucket holding a prompt of ``tokens`` tokens (B/2 < tokens <= B)."""
    return 1 << max(0, int(tokens) - 1).bit_length()


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th ... (needle counts stay below 11)."""
    return _ORDINALS.get(n, f"{n}th")


def answer_text(rng: random.Random, fmt: str, topic: str, words: int) -> str:
    lines, line = [], []
    for _ in range(words):
        line.append(rng.choice(WORDS))
        if len(line) >= rng.randint(4, 8):
            lines.append(" ".join(line))
            line = []
    if line:
        lines.append(" ".join(line))
    return f"{fmt.capitalize()} about {topic}:\n" + "\n".join(lines)


def _ask(fmt: str, topic: str) -> str:
    return f"write a {fmt} about {topic}"


def generate_doc(seed: int, target_tokens: int, n_needles: int,
                 count_tokens: Callable[[list[dict]], int], answer_words: tuple[int, int] = (12, 40)) -> dict:
    """One document whose chat-templated prompt has at most ``target_tokens`` tokens and close
    to it (unless the needles alone are longer). ``count_tokens(messages)`` is the engine
    tokenizer's length of the chat-templated conversation."""
    if n_needles not in NEEDLES:
        raise ValueError(f"n_needles {n_needles}: openai/mrcr uses {', '.join(map(str, NEEDLES))}")
    rng = random.Random(seed)
    fmt, topic = rng.choice(FORMATS), rng.choice(TOPICS)
    needles = [(fmt, topic, answer_text(rng, fmt, topic, rng.randint(*answer_words))) for _ in range(n_needles)]
    which = rng.randint(1, n_needles)
    secret = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(RANDOM_STRING_LEN))
    final = {"role": "user", "content": (f"Prepend {secret} to the {ordinal(which)} (1 indexed) {fmt} about "
                                         f"{topic}. Do not include any other text in your response.")}
    others = [(f, t) for f in FORMATS for t in TOPICS if (f, t) != (fmt, topic)]

    def pair(turn: tuple[str, str, str]) -> list[dict]:
        return [{"role": "user", "content": _ask(turn[0], turn[1])}, {"role": "assistant", "content": turn[2]}]

    # fillers are added on a per-turn token estimate (a full count per turn would be quadratic
    # in the context); the exact count then trims them from the end. A turn's cost is measured
    # beside the final ask, not against an empty conversation: Hugging Face chat templates refuse
    # one (the same numbers for a template that renders turn by turn).
    alone = count_tokens([final])
    estimate = count_tokens([m for t in needles for m in pair(t)] + [final])
    fillers: list[tuple[str, str, str]] = []
    while estimate <= target_tokens:
        f, t = rng.choice(others)
        fillers.append((f, t, answer_text(rng, f, t, rng.randint(*answer_words))))
        estimate += count_tokens(pair(fillers[-1]) + [final]) - alone
    slots = sorted(rng.randint(0, len(fillers)) for _ in range(n_needles))
    while True:
        turns = list(fillers)
        for k, pos in enumerate(min(x, len(fillers)) for x in slots):
            turns.insert(pos + k, needles[k])
        msgs = [m for t in turns for m in pair(t)] + [final]
        if not fillers or count_tokens(msgs) <= target_tokens:
            break
        fillers.pop()
    asks = [i for i, m in enumerate(msgs) if m["role"] == "user" and m["content"] == _ask(fmt, topic)]
    return {
        "prompt": json.dumps(msgs, ensure_ascii=False),
        "answer": secret + needles[which - 1][2],
        "random_string_to_prepend": secret,
        "n_needles": n_needles,
        "desired_msg_index": asks[which - 1] + 1,
        "total_messages": len(msgs),
        "n_chars": sum(len(m["content"]) for m in msgs),
    }


def answer_words(bucket: int) -> tuple[int, int]:
    """Word range of one answer in a bucket: short in small buckets so that the needles fit."""
    return min(12, max(3, bucket // 160)), min(40, max(6, bucket // 50))


def generate(seed: int, buckets: Sequence[int], docs_per_bucket: int, count_tokens: Callable[[list[dict]], int],
             needles: Sequence[int] = NEEDLES, max_gen_toks: int = 0) -> list[dict]:
    """``docs_per_bucket`` documents per bucket (power-of-two upper bounds, in tokens), the
    needle counts cycling through ``needles`` (a count whose needles alone overflow the bucket
    gives way to the next smaller one). A bucket-B document's prompt has more than B/2 and at
    most B - ``max_gen_toks`` tokens, so prompt and answer fit the bucket."""
    rows = []
    for bucket in buckets:
        if bucket != bucket_of(bucket):
            raise ValueError(f"bucket {bucket} is not a power of two")
        rng = random.Random(f"{seed}/{bucket}")
        top = bucket - max_gen_toks
        if top <= bucket // 2:
            raise ValueError(f"bucket {bucket} cannot hold a prompt and {max_gen_toks} generated tokens")
        for i in range(docs_per_bucket):
            # a draw whose trimmed conversation misses the bucket (a long filler popped below B/2)
            # draws again; the first draw is what it always was, so documents that fit never change
            for _ in range(REDRAWS):
                target = rng.randint(bucket // 2 + (top - bucket // 2) // 4 + 1, top)
                doc_seed = rng.randrange(2**31)
                for n in sorted((n for n in needles if n <= needles[i % len(needles)]), reverse=True):
                    doc = generate_doc(doc_seed, target, n, count_tokens, answer_words(bucket))
                    if bucket // 2 < count_tokens(messages(doc)) <= top:
                        break
                else:
                    continue
                break
            else:
                raise ValueError(f"bucket {bucket} is too small for an MRCR document: {min(needles)} needles "
                                 f"alone take {count_tokens(messages(doc))} tokens")
            rows.append(doc)
    return rows


def check_row(row: dict) -> None:
    """Raise ValueError naming the field if ``row`` is not an openai/mrcr row."""
    missing = [k for k in FIELDS if k not in row]
    if missing:
        raise ValueError(f"MRCR row lacks {', '.join(missing)} (openai/mrcr fields: {', '.join(FIELDS)})")
    for key, kind in FIELDS.items():
        if not isinstance(row[key], kind) or isinstance(row[key], bool):
            raise ValueError(f"MRCR field {key} is {type(row[key]).__name__}, expected {kind.__name__}")
