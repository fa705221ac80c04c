"""The parity gates' rules (parity suite, and the features suite's full-context case): each
threshold follows from the noise floor (the standard path against the fp32 oracle, on the same
positions) and from how many positions were scored, through a one-sided test at ``alpha``.

top-1   Per position: does each path's top-1 token equal the oracle's? Of the positions where
        exactly one of fast and standard does, ``b`` favour the standard path and ``c`` the
        fast one; with no difference between the paths ``b ~ Binomial(b + c, 1/2)``. The exact
        McNemar test (``scipy.stats.binomtest``, one-sided: fast worse) fails the row when
        ``P(X >= b) < alpha``: at least ``log2(1 / alpha)`` positions must flip against the
        fast path before it can fail (10 at alpha = 0.001), so no single position decides a
        verdict. ``min_agreement`` caps the requirement: a fast path that agrees with the
        oracle at least that often passes even where the standard path agrees more. The row's
        threshold is the lowest fast-vs-oracle agreement the test accepts.
KL      Per position ``k = KL(standard || fast)`` and ``f = KL(oracle || standard)`` (the
        floor). Passes iff ``mean(k) <= factor * (mean(f) + slack)``, ``slack = t(1 - alpha,
        n - 1) * sd(f) / sqrt(n)``: the floor taken at its one-sided upper confidence bound
        (``scipy.stats.t``), so the room shrinks as positions are added instead of an absolute
        constant that dwarfs a small floor. The slack comes from the floor's spread, never the
        fast path's: a broken fast path's scattered KL cannot widen its own allowance.
        ``factor`` is the allowed precision loss: with rounding errors independent of the
        standard path's, ``E[k] = (1 + r^2) E[f]`` for a fast path whose error is ``r`` times the
        standard's, so ``factor = 3`` lets ``r`` reach sqrt(2).
        As in the top-1 rule, no handful of positions decides the verdict: both means leave out
        their ``outliers_allowed(alpha, n)`` largest values (9 at alpha = 0.001, at most a tenth of
        the positions). A discrete near-tie (an expert choice of the router that two correct
        implementations make differently) moves one position's KL by 10^3-10^4 x the floor; on
        the smoke tier's ~120 positions one such flip made a correct fast path's mean 46 x the
        floor. A defect has to raise at least ``log2(1 / alpha)`` positions (10) to fail the
        rule, as one must flip 10 top-1 tokens: a systematic or a recurring error still does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats as st


def top1_verdict(fast_ok: Any, standard_ok: Any, *, min_agreement: float, alpha: float) -> dict:
    """``fast_ok`` / ``standard_ok``: per position, whether that path's top-1 equals the oracle's."""
    f = np.asarray(fast_ok, dtype=bool)
    s = np.asarray(standard_ok, dtype=bool)
    n = int(f.size)
    if n == 0:
        return {"value": math.nan, "threshold": min_agreement, "passed": False, "n": 0, "floor": math.nan,
                "fast_only_wrong": 0, "fast_only_right": 0, "p_value": math.nan, "alpha": alpha,
                "min_agreement": min_agreement}
    b, c = int(np.sum(s & ~f)), int(np.sum(f & ~s))
    d = b + c
    p = float(st.binomtest(b, d, 0.5, alternative="greater").pvalue) if d else 1.0
    b_max = int(st.binom.isf(alpha, d, 0.5)) if d else 0  # the most fast-only flips the test accepts
    a_fo, a_so = float(f.mean()), float(s.mean())
    threshold = min(a_so + (d - 2 * b_max) / n, min_agreement)
    return {"value": a_fo, "threshold": threshold, "passed": bool(b <= b_max or a_fo >= min_agreement), "n": n,
            "floor": a_so, "fast_only_wrong": b, "fast_only_right": c, "p_value": p, "alpha": alpha,
            "min_agreement": min_agreement}


# KL below this is float rounding, not a difference: fp32 logits that differ only in their last
# bits give KL ~1e-13 (seen on vLLM's CPU build, where standard and oracle are both fp32 and the
# floor is exactly 0); a bf16 / fp16 floor is ~1e-5 and more, far above it.
KL_RESOLUTION = 1e-9


def kl_verdict(kl_standard_fast: Any, kl_oracle_standard: Any, *, factor: float, alpha: float) -> dict:
    """Per-position KL(standard || fast) against factor x the floor KL(oracle || standard)
    (plus KL_RESOLUTION, so two paths equal to float rounding pass when the floor is 0)."""
    k = np.asarray(kl_standard_fast, dtype=np.float64)
    f = np.asarray(kl_oracle_standard, dtype=np.float64)
    n = int(k.size)
    finite = n > 0 and bool(np.isfinite(k).all() and np.isfinite(f).all())
    if not finite:
        return {"value": float(np.mean(k)) if n else math.nan, "threshold": math.nan, "passed": False, "n": n,
                "floor": float(np.mean(f)) if n else math.nan, "slack": math.nan, "factor": factor,
                "alpha": alpha, "ratio": math.nan}
    m = outliers_allowed(alpha, n)
    kt, ft = _without_largest(k, m), _without_largest(f, m)
    nt = int(kt.size)
    sd = float(np.std(ft, ddof=1)) if nt > 1 else 0.0
    slack = float(st.t.ppf(1.0 - alpha, nt - 1)) * sd / math.sqrt(nt) if nt > 1 else 0.0
    value, floor = float(kt.mean()), float(ft.mean())
    threshold = factor * (floor + slack) + KL_RESOLUTION
    return {"value": value, "threshold": threshold, "passed": bool(value <= threshold), "n": n, "floor": floor,
            "slack": slack, "factor": factor, "alpha": alpha, "ratio": value / floor if floor > 0 else math.inf,
            "left_out": m, "mean_all": float(k.mean()), "floor_all": float(f.mean()),
            "largest": [float(x) for x in np.sort(k)[::-1][:m]]}


def outliers_allowed(alpha: float, n: int) -> int:
    """How many of the largest per-position values each KL mean leaves out: one fewer than the
    top-1 rule's least number of flips that can fail it (log2(1 / alpha)), at most n // 10."""
    return max(0, min(math.ceil(math.log2(1.0 / alpha)) - 1, n // 10))


def _without_largest(x: np.ndarray, m: int) -> np.ndarray:
    return np.sort(x)[: x.size - m] if m else x
