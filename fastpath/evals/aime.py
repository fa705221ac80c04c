"""AIME-format problems with integer answers 0-999 that need long generations.

Each problem is a chain of modular arithmetic: a start value and ``steps`` operations (add,
subtract, multiply), the running value reduced modulo 1000 after each. One slip anywhere
changes the answer, and a worked solution takes one or more lines per step, so the length of a
correct generation grows with ``steps`` (about 30 tokens a step in the ``lines`` style, 130 in
``numbered``, with a byte-level tokenizer). The problem labels each operation as the worked
solution names its step (``...: Step 1: add 539; Step 2: multiply by 38; ...``), so that a
solver finds step k's operation by its label, not by counting the list. Rows have the fields of
lm-eval's aime25 data that its task reads:

    id       int   the row's index in its set
    problem  str   the question (lm-eval renders it as "Question: {problem}\\nAnswer:")
    answer   str   the final value, 0-999, in digits

``solution(row, style)`` is the step-by-step worked answer ending in ``\\boxed{N}`` (training data
for a subject that should solve these), in one of ``STYLES``:

* ``lines``: one line per operation, ``Step 7: 437 * 83 = 36271, mod 1000 = 271.``;
* ``columns``: each operation worked digit by digit from the right, every carry written out, so
  that each token of the work is a lookup in the times or addition table of two digits and a
  carry written just before it (a small model gets whole products wrong: docs/k3-mini.md);
  a subtraction adds the complement modulo 1000, a product by ``10a + b`` adds the last three
  digits of ``x * b`` and of ``x * a`` shifted by one:

      Step 7: x = 437, multiply by 83.
      437 * 3: 7*3=21, 3*3+2=11, 4*3+1=13, so 1311.
      437 * 8: 7*8=56, 3*8+5=29, 4*8+2=34, so 3496.
      311 + 960: 1+0=1, 1+6=7, 3+9=12, so 1271, mod 1000 = 271.

* ``numbered``: ``columns`` whose step line names the operation first, as the problem labels it,
  then the value it applies to: ``Step 7: multiply by 83, x = 437.``

``SOLUTION_STYLE`` is the style the trained checkpoint learnt: parity scores it (sequences.py).
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
        listed = "; ".join(f"Step {j}: {op} {k}" for j, (op, k) in enumerate(ops, 1))
        problem = (f"Let x = {start}. Apply the following {steps} operations to x in order, replacing x after "
                   f"each one by its remainder when divided by {MODULUS}: {listed}. What is the final value of x?")
        value = start
        for op, k in ops:
            value = _raw(value, op, k) % MODULUS
        rows.append({"id": i, "problem": problem, "answer": str(value)})
    return rows


def operations(problem: str) -> list[tuple[str, str]]:
    """A generated problem's operations in order: ``[("add", "539"), ("multiply by", "38"), ...]``."""
    return _STEP.findall(problem.split(": ", 1)[1])


STYLES = ("lines", "columns", "numbered")
SOLUTION_STYLE = "numbered"


def _digits(n: int) -> list[int]:
    """The three decimal digits of 0 <= ``n`` < 1000, least significant first."""
    return [n % 10, n // 10 % 10, n // 100]


def _column_sum(a: int, b: int) -> str:
    """``a + b`` column by column from the right, the operands written with three digits:
    ``311 + 960: 1+0=1, 1+6=7, 3+9=12, so 1271``."""
    cols, carry = [], 0
    for x, y in zip(_digits(a), _digits(b)):
        cols.append(f"{x}+{y}{'+1' if carry else ''}={x + y + carry}")
        carry = (x + y + carry) // 10
    return f"{a:03d} + {b:03d}: {', '.join(cols)}, so {a + b}"


def _column_product(a: int, m: int) -> str:
    """``a * m`` for one digit ``m``, ``a`` written with three digits:
    ``437 * 3: 7*3=21, 3*3+2=11, 4*3+1=13, so 1311``."""
    cols, carry = [], 0
    for x in _digits(a):
        cols.append(f"{x}*{m}{f'+{carry}' if carry else ''}={x * m + carry}")
        carry = (x * m + carry) // 10
    return f"{a:03d} * {m}: {', '.join(cols)}, so {a * m}"


def _complement(k: int) -> str:
    """``1000 - k`` digit by digit from the right (trailing zeros stay, the first other digit d
    becomes 10-d, the rest 9-d): ``1000 - 560: 0, 10-6=4, 9-5=4, so 440``."""
    cols, seen = [], False
    for d in _digits(k):
        if not seen and d == 0:
            cols.append("0")
        else:
            cols.append(f"{9 if seen else 10}-{d}={(9 if seen else 10) - d}")
            seen = True
    return f"{MODULUS} - {k:03d}: {', '.join(cols)}, so {MODULUS - k}"


def _worked_columns(value: int, op: str, k: int) -> list[str]:
    """The work of one operation in the columns style, after its ``Step`` line."""
    if op == "add":
        return [f"{_column_sum(value, k)}, mod {MODULUS} = {(value + k) % MODULUS}."]
    if op == "subtract":
        c = MODULUS - k
        return [f"{_complement(k)}.", f"{_column_sum(value, c)}, mod {MODULUS} = {(value + c) % MODULUS}."]
    tens, ones = divmod(k, 10)
    if not tens:
        return [f"{_column_product(value, ones)}, mod {MODULUS} = {value * ones % MODULUS}."]
    low, high = value * ones % MODULUS, value * tens % 100 * 10
    return [f"{_column_product(value, ones)}.", f"{_column_product(value, tens)}.",
            f"{_column_sum(low, high)}, mod {MODULUS} = {(low + high) % MODULUS}."]


def solution(row: dict, style: str = SOLUTION_STYLE) -> str:
    """The worked solution of a generated problem in ``style`` (STYLES), ending in \\boxed{answer}."""
    if style not in STYLES:
        raise ValueError(f"solution style {style!r}: use one of {', '.join(STYLES)}")
    m = re.match(r"Let x = (\d+)\.", row["problem"])
    if not m:
        raise ValueError("not a generated AIME-format problem (it does not start with 'Let x = N.')")
    value, lines = int(m.group(1)), []
    for i, (op, k) in enumerate(operations(row["problem"]), 1):
        raw = _raw(value, op, int(k))
        if style == "lines":
            lines.append(f"Step {i}: {value} {_SIGNS[op]} {k} = {raw}, mod {MODULUS} = {raw % MODULUS}.")
        else:
            head = f"Step {i}: x = {value}, {op} {k}." if style == "columns" else f"Step {i}: {op} {k}, x = {value}."
            lines += [head, *_worked_columns(value, op, int(k))]
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
