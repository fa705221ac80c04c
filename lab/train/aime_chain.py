"""AIME-format long arithmetic: a digit chain whose every step depends on the one before.

Problem: three starting digits, an offset k and a number of steps n; a step appends the last
digit of (the last three digits + k); the answer is the last three digits after n steps, read
as an integer (0-999). The map (a, b, c) -> (b, c, (a + b + c + k) mod 10) is a bijection of the
1000 states, so two different states never meet again: one wrong digit anywhere changes the
answer.

Why a small model can learn it byte by byte: every step is written out so that each new token
is a function of a few tokens close before it (local, carry-free):

    Step 12/47: 4+1=5, 5+7=2, 2+3=5; digits 175

``4``, ``1``, ``7`` are the previous line's digits, ``3`` is k (copied from the line before),
each ``=`` is a one-digit sum mod 10 of the two digits just written (a 100-entry table), the
counter increments the previous line's, and ``/47`` is copied from it; the line ``Step 47/47``
is followed by the answer. 20-40 steps make 0.9k-1.8k tokens of solution (1.35k on average).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MIN_STEPS, MAX_STEPS = 20, 40


@dataclass(frozen=True)
class Chain:
    digits: tuple[int, int, int]
    k: int
    n: int

    @property
    def problem(self) -> str:
        a, b, c = self.digits
        return (f"A list starts with the digits {a}, {b}, {c}. One step appends the last digit of the sum of "
                f"the list's last three digits and {self.k}. After {self.n} steps, the last three digits of "
                "the list, read as a three-digit number, form an integer N. Find N.")

    def states(self) -> list[tuple[int, int, int]]:
        out = [self.digits]
        for _ in range(self.n):
            a, b, c = out[-1]
            out.append((b, c, (a + b + c + self.k) % 10))
        return out

    @property
    def answer(self) -> int:
        a, b, c = self.states()[-1]
        return 100 * a + 10 * b + c

    @property
    def solution(self) -> str:
        lines = []
        states = self.states()
        for j in range(1, self.n + 1):
            a, b, c = states[j - 1]
            s1 = (a + b) % 10
            s2 = (s1 + c) % 10
            s3 = (s2 + self.k) % 10
            lines.append(f"Step {j}/{self.n}: {a}+{b}={s1}, {s1}+{c}={s2}, {s2}+{self.k}={s3}; digits {b}{c}{s3}")
        a, b, c = states[-1]
        lines.append(f"The last three digits are {a}{b}{c}, so N = \\boxed{{{self.answer}}}.")
        return " All sums are taken mod 10.\n" + "\n".join(lines)


def generate(seed: int) -> Chain:
    rng = random.Random(seed)
    return Chain((rng.randrange(10), rng.randrange(10), rng.randrange(10)), rng.randrange(10),
                 rng.randint(MIN_STEPS, MAX_STEPS))


def document(seed: int) -> dict:
    """A row in the AIME task's data format (``problem``, ``answer``) plus the worked solution."""
    ch = generate(seed)
    return {"problem": ch.problem, "answer": str(ch.answer), "solution": ch.solution}
