"""JSON-shaped answers, so that structured output at temperature > 0 has real content to say.

Two kinds, each a (prompt text, answer text) pair:

* the features suite's own prompts ("Answer with a JSON object: item 7." and "Answer with a
  code like ab-1: item 7.", plain text, no chat turn), answered with a value derived from the
  item number that fits the suite's schema ({"a": 0..99}) and regex ([a-z]{1,3}-[0-9]);
* records written as JSON in a chat turn ("Write this record as JSON: name Ada, age 36, city
  Lima."), with string, integer and boolean fields in the order given.
"""

from __future__ import annotations

import json
import random

NAMES = ("Ada", "Bo", "Cleo", "Dev", "Edda", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena", "Mira", "Nils")
CITIES = ("Lima", "Oslo", "Pune", "Quito", "Riga", "Sofia", "Turin", "Ulm", "Vigo", "Xian", "York", "Zug")
COLORS = ("red", "teal", "amber", "olive", "navy", "plum", "rose", "gray")


def item_value(i: int) -> int:
    return (i * 37 + 11) % 100


def item_code(i: int) -> str:
    letters = "".join(chr(97 + (i // 26 ** p) % 26) for p in range(1 + i % 3))
    return f"{letters}-{i % 10}"


def features_pair(i: int, kind: str) -> tuple[str, str]:
    """The features suite's prompt for item ``i`` and an answer that fits its constraint."""
    if kind == "json_schema":
        return f"Answer with a JSON object: item {i}.", json.dumps({"a": item_value(i)})
    return f"Answer with a code like ab-1: item {i}.", item_code(i)


def record_pair(seed: int) -> tuple[str, str]:
    rng = random.Random(seed)
    fields = [("name", rng.choice(NAMES)), ("age", rng.randint(1, 99)), ("city", rng.choice(CITIES)),
              ("color", rng.choice(COLORS)), ("active", rng.random() < 0.5), ("score", rng.randint(0, 999))]
    rng.shuffle(fields)
    fields = fields[: rng.randint(2, len(fields))]
    spoken = ", ".join(f"{k} {str(v).lower() if isinstance(v, bool) else v}" for k, v in fields)
    return f"Write this record as JSON: {spoken}.", json.dumps(dict(fields))
