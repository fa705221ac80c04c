"""AIME-format problems with integer answers 0-999 that need long generations.

Each problem is a chain of modular arithmetic: a start value and ``steps`` operations (add,
subtract, multiply), the running value reduced modulo 1000 after each. One slip anywhere
changes the answer, and a worked solution takes one line per step, so the length of a correct
generation grows with ``steps`` (about 30 tokens a step with a byte-level tokenizer). Rows have
the fields of lm-eval's aime25 data that its task reads:

    id       int   the row's index in its set
    problem  str   the question (lm-eval renders it as "Question: {problem}\\nAnswer:")
    answer   str   the final value, 0-999, in digits

``solution(row)`` is the step-by-step worked answer ending in ``\\boxed{N}`` (training data for
a subject that should solve these).
"""

from __future__ import annotations

import random
import re

FIELDS = {"id": int, "problem": str, "answer": str}
MODULUS = 1000
_OPS = ("add", "subtract", "multiply by")
_STEP = re.compile(r"(add|subtract|multiply by) (\d+)")


def _ops(rng: random.Random, steps: int) -> list[tuple[str, int]]:
    out = []
    for _ in range(steps):
        op = rng.choice(_OPS)
        out.append((op, rng.randint(2, 97) if op == "multiply by" else rng.randint(1, 999)))
    return out


_SIGNS = {"add": "+", "subtract": "-", "multiply by": "*"}


def _raw(value: int, op: str, k: int) -> int:
    return value + k if op == "add" else value - k if op == "subtract" else value * k


def generate(seed: int, n: int, steps: int) -> list[dict]:
    """``n`` problems of ``steps`` operations each, seeded."""
    if steps < 1:
        raise ValueError(f"steps {steps}: a problem needs at least one operation")
    rng = random.Random(f"aime/{seed}")
    rows = []
    for i in range(n):
        start, ops = rng.randint(0, MODULUS - 1), _ops(rng, steps)
        listed = "; ".join(f"{op} {k}" for op, k in ops)
        problem = (f"Let x = {start}. Apply the following {steps} operations to x in order, replacing x after "
                   f"each one by its remainder when divided by {MODULUS}: {listed}. What is the final value of x?")
        value = start
        for op, k in ops:
            value = _raw(value, op, k) % MODULUS
        rows.append({"id": i, "problem": problem, "answer": str(value)})
    return rows


def solution(row: dict) -> str:
    """The worked solution of a generated problem, one line per step, ending in \\boxed{answer}."""
    m = re.match(r"Let x = (\d+)\.", row["problem"])
    listed = row["problem"].split(": ", 1)[1]
    if not m:
        raise ValueError("not a generated AIME-format problem (it does not start with 'Let x = N.')")
    value, lines = int(m.group(1)), []
    for i, (op, k) in enumerate(_STEP.findall(listed), 1):
        raw = _raw(value, op, int(k))
        lines.append(f"Step {i}: {value} {_SIGNS[op]} {k} = {raw}, mod {MODULUS} = {raw % MODULUS}.")
        value = raw % MODULUS
    if str(value) != str(row["answer"]):
        raise ValueError(f"the worked steps end at {value}, not at the row's answer {row['answer']}")
    return "\n".join(lines) + f"\nThe final value of x is \\boxed{{{value}}}."


def check_row(row: dict) -> None:
    """Raise ValueError naming the field if ``row`` lacks what lm-eval's aime25 task reads."""
    for key in ("problem", "answer"):
        if key not in row:
            raise ValueError(f"AIME row lacks {key!r} (a row needs problem and answer)")
        if not isinstance(row[key], str):
            raise ValueError(f"AIME field {key} is {type(row[key]).__name__}, expected str")
