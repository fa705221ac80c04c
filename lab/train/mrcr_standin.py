"""STAND-IN for the evals MRCR generator: conversations in openai/mrcr's format, seeded.

This module stands in for the evals suite's MRCR generator until that lands; ``eval_tasks``
is the only module that imports it and will import the evals generator instead (then this file
goes). A row has openai/mrcr's fields: ``prompt`` (the JSON text of the message list),
``answer`` (the random string + the desired assistant message), ``random_string_to_prepend``,
``n_needles``, ``desired_msg_index``, ``total_messages``, ``n_chars``.

The conversation: users ask "write a {form} about {topic}"; the assistant answers with text
of pseudo-words (a fixed seeded vocabulary, so byte n-grams rarely repeat across messages and a
copy can follow its source). Hidden among the turns are ``n_needles`` (2, 4 or 8) identical
asks; the last user message asks for the k-th of them, in MRCR's wording.
"""

from __future__ import annotations

import json
import random
import string

FORMS = ("poem", "short story", "riddle", "blog post", "essay", "song", "letter", "speech",
         "social media post", "limerick", "haiku sequence", "diary entry")
TOPICS = ("tapirs", "rocks", "distance", "rivers", "lanterns", "glaciers", "owls", "bridges", "salt",
          "clocks", "harbors", "moss", "comets", "bread", "violins", "deserts", "kites", "ferns",
          "copper", "tides", "foxes", "maps", "storms", "honey", "mirrors", "caves", "wheat",
          "ravens", "islands", "candles", "orchards", "trains", "fog", "pearls", "bees", "ladders")
ORDINALS = {1: "1st", 2: "2nd", 3: "3rd"}
MIN_MSG, MAX_MSG = 80, 400  # bytes of one assistant message


def _vocabulary(size: int = 4096) -> list[str]:
    rng = random.Random(20261203)
    cons, vow = "bcdfghjklmnprstvwz", "aeiou"
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(cons) + rng.choice(vow) for _ in range(rng.randint(1, 3))))
    return sorted(words)


VOCAB = _vocabulary()


def ordinal(k: int) -> str:
    return ORDINALS.get(k, f"{k}th")


def _message(rng: random.Random, form: str) -> str:
    """An assistant message of MIN_MSG..MAX_MSG bytes: lines for verse, sentences for prose."""
    target = rng.randint(MIN_MSG, MAX_MSG)
    verse = form in ("poem", "song", "limerick", "haiku sequence", "riddle")
    out, line = [], []
    while sum(len(x) + 1 for x in out) < target:
        line.append(rng.choice(VOCAB))
        if len(line) >= rng.randint(4, 9):
            text = " ".join(line)
            out.append(text.capitalize() + ("" if verse else "."))
            line = []
    return ("\n" if verse else " ").join(out)


def _ask(form: str, topic: str) -> str:
    article = "an" if form[0] in "aeiou" else "a"
    return f"write {article} {form} about {topic}"


def generate_row(seed: int, target_chars: int, n_needles: int | None = None) -> dict:
    """One MRCR row whose ``n_chars`` (characters of all messages) is about ``target_chars``."""
    rng = random.Random(seed)
    n_needles = n_needles or rng.choice((2, 4, 8))
    form, topic = rng.choice(FORMS), rng.choice(TOPICS)
    needle = _ask(form, topic)
    # the filler asks never repeat the needle's (form, topic)
    pairs = [(f, t) for f in FORMS for t in TOPICS if (f, t) != (form, topic)]
    messages: list[dict] = []
    chars = 0
    budget = max(target_chars - 200, n_needles * (MAX_MSG + 40))
    turns: list[tuple[str, str]] = []
    while chars < budget or len(turns) < n_needles:
        f, t = rng.choice(pairs)
        reply = _message(rng, f)
        turns.append((_ask(f, t), reply))
        chars += len(turns[-1][0]) + len(reply)
    slots = sorted(rng.sample(range(len(turns)), n_needles))
    for s in slots:
        ask = needle
        reply = _message(rng, form)
        chars += len(reply) - len(turns[s][1]) + len(ask) - len(turns[s][0])
        turns[s] = (ask, reply)
    for ask, reply in turns:
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": reply}]
    k = rng.randint(1, n_needles)
    desired = 2 * slots[k - 1] + 1
    rand = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(10))
    thing = needle.removeprefix("write ").split(" ", 1)[1]  # "poem about tapirs" without the article
    messages.append({"role": "user", "content": f"Prepend {rand} to the {ordinal(k)} (1 indexed) {thing}. "
                                                "Do not include any other text in your response."})
    return {
        "prompt": json.dumps(messages),
        "answer": rand + messages[desired]["content"],
        "random_string_to_prepend": rand,
        "n_needles": n_needles,
        "desired_msg_index": desired,
        "total_messages": len(messages),
        "n_chars": sum(len(m["content"]) for m in messages),
    }
