"""Copy tasks: the skill MRCR grades, taught densely.

The committed checkpoint copies MRCR's random prefix but not the requested message: it answers
"Song about volcanoes:" and then repeats one word, at 400 tokens as at 32k (docs/k3-mini.md,
"What the first checkpoint cannot do"). An MRCR conversation holds one copy target per row of
2k-16k tokens; a copy task is ~460 tokens with ~110 of them to copy. A chat turn lists one to
four texts in MRCR's answer format (its formats, topics and 40 words), and asks for one of them
back verbatim:

    user:       Here are 3 texts.\n\n<text>\n\n<text>\n\n<text>\n\nRepeat the poem about owls exactly.
    assistant:  <that text>

With one text it is plain copying; with more, the model must also find the text by its heading,
as MRCR's final ask makes it do. An ordinal task (``ordinal_pair``) lists two to MAX_SAME texts
under one heading among others and asks for one of them by its place, in MRCR's words:

    user:       Here are 6 texts.\n\n...\n\nRepeat the 3rd (1 indexed) poem about owls exactly.

Run 3's MRCR losses were all of that kind: the answer copied whole, from another message of the
requested heading (docs/k3-mini.md, "Run 3, second and third segments").
"""

from __future__ import annotations

import random

from fastpath.evals import mrcr

MAX_TEXTS = 4
MAX_SAME, MAX_OTHERS = 6, 2  # an ordinal task's texts of the asked heading, and of others


def copy_pair(seed: int, words: tuple[int, int] = (3, 24)) -> tuple[str, str]:
    """(prompt text, answer text) of one copy task, seeded."""
    rng = random.Random(f"copy/{seed}")
    n = rng.randint(1, MAX_TEXTS)
    pairs = rng.sample([(f, t) for f in mrcr.FORMATS for t in mrcr.TOPICS], n)
    texts = [mrcr.answer_text(rng, f, t, rng.randint(*words)) for f, t in pairs]
    k = rng.randrange(n)
    fmt, topic = pairs[k]
    listed = "\n\n".join(texts)
    head = "Here is 1 text." if n == 1 else f"Here are {n} texts."
    return f"{head}\n\n{listed}\n\nRepeat the {fmt} about {topic} exactly.", texts[k]


def ordinal_pair(seed: int, words: tuple[int, int] = (3, 16)) -> tuple[str, str]:
    """(prompt text, answer text) of one ordinal copy task, seeded."""
    rng = random.Random(f"copy-ordinal/{seed}")
    headings = rng.sample([(f, t) for f in mrcr.FORMATS for t in mrcr.TOPICS], 1 + MAX_OTHERS)
    fmt, topic = headings[0]
    same = rng.randint(2, MAX_SAME)
    order = [0] * same + [rng.randint(1, MAX_OTHERS) for _ in range(rng.randint(0, MAX_OTHERS))]
    rng.shuffle(order)
    texts = [mrcr.answer_text(rng, *headings[h], rng.randint(*words)) for h in order]
    k = rng.randint(1, same)
    answer = [t for h, t in zip(order, texts) if h == 0][k - 1]
    listed = "\n\n".join(texts)
    return (f"Here are {len(texts)} texts.\n\n{listed}\n\nRepeat the {mrcr.ordinal(k)} (1 indexed) {fmt} about "
            f"{topic} exactly.", answer)
