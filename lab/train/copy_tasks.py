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
as MRCR's final ask makes it do.
"""

from __future__ import annotations

import random

from fastpath.evals import mrcr

MAX_TEXTS = 4


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
