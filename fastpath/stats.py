"""Statistics shared by the suites (DESIGN §4).

- ``g_test``: goodness of fit of observed category counts to expected probabilities (G-test,
  the log-likelihood ratio form of Pearson's chi-square), with low-count bins pooled so that
  every tested bin has an expected count >= ``min_expected``; ``g_test_pooled`` combines
  several independent tests (one per prompt) by summing G and degrees of freedom.
- ``paired_bootstrap_ci``: percentile CI of a paired statistic (default: mean difference).
- ``bootstrap_ratio_ci``: CI of median(a) / median(b) for unpaired timing samples (perf).
- ``mcnemar_exact``: exact two-sided McNemar test for paired binary outcomes.
- ``kl_divergence`` / ``top1_agreement``: per-position comparisons of logits.

Everything is deterministic given its ``seed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy import stats as _st

__all__ = [
    "GTestResult",
    "pool_low_count_bins",
    "g_test",
    "g_test_pooled",
    "paired_bootstrap_ci",
    "bootstrap_ratio_ci",
    "mcnemar_exact",
    "log_softmax",
    "kl_divergence",
    "top1_agreement",
]


@dataclass
class GTestResult:
    statistic: float  # G
    df: int
    p_value: float
    n: int  # total observations
    bins: int  # bins tested after pooling
    impossible: int = 0  # observations in categories of expected probability 0
    detail: dict = field(default_factory=dict)

    def passed(self, alpha: float) -> bool:
        return self.impossible == 0 and self.p_value >= alpha

    def as_dict(self) -> dict:
        return {
            "G": self.statistic,
            "df": self.df,
            "p_value": self.p_value,
            "n": self.n,
            "bins": self.bins,
            "impossible": self.impossible,
            **self.detail,
        }


def pool_low_count_bins(observed: Sequence[float], expected: Sequence[float], min_expected: float = 5.0):
    """Pool categories with expected count < ``min_expected``.

    Categories are sorted by expected count; the small ones are merged (smallest first) into
    one pooled bin until it reaches ``min_expected``. If the pooled bin is still too small after
    taking every small category, it is merged with the smallest remaining bin. Returns
    (observed, expected) arrays of the tested bins. Categories with expected 0 must be removed
    by the caller (they are a separate, exact check).
    """
    o = np.asarray(observed, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if o.shape != e.shape:
        raise ValueError(f"observed and expected differ in shape: {o.shape} vs {e.shape}")
    order = np.argsort(e, kind="stable")
    o, e = o[order], e[order]
    small = e < min_expected
    big_o, big_e = list(o[~small]), list(e[~small])
    if small.any():
        po, pe = float(o[small].sum()), float(e[small].sum())
        if pe < min_expected and big_e:
            # merge with the smallest big bin (big_* are sorted ascending)
            po += big_o.pop(0)
            pe += big_e.pop(0)
        big_o.insert(0, po)
        big_e.insert(0, pe)
    return np.asarray(big_o), np.asarray(big_e)


def g_test(observed: Sequence[float], probs: Sequence[float], *, min_expected: float = 5.0) -> GTestResult:
    """G-test of ``observed`` counts against category probabilities ``probs``.

    ``probs`` need not sum exactly to 1 (renormalised). Observations in categories with
    probability 0 are counted as ``impossible`` (p_value forced to 0): a correct sampler never
    produces them, whatever the sample size.
    """
    o = np.asarray(observed, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    if o.shape != p.shape:
        raise ValueError(f"observed and probs differ in shape: {o.shape} vs {p.shape}")
    if np.any(p < 0) or not np.all(np.isfinite(p)) or p.sum() <= 0:
        raise ValueError("probs must be finite, non-negative and not all zero")
    n = int(round(o.sum()))
    p = p / p.sum()
    zero = p == 0
    impossible = int(round(o[zero].sum()))
    o_pos, p_pos = o[~zero], p[~zero]
    e = p_pos * n
    po, pe = pool_low_count_bins(o_pos, e, min_expected)
    bins = len(po)
    df = max(bins - 1, 0)
    if n == 0 or df == 0:
        g, pv = 0.0, 1.0
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(po > 0, po * np.log(po / pe), 0.0)
        g = float(2.0 * terms.sum())
        pv = float(_st.chi2.sf(g, df))
    if impossible:
        pv = 0.0
    return GTestResult(g, df, pv, n, bins, impossible)


def g_test_pooled(tests: Sequence[GTestResult]) -> GTestResult:
    """Combine independent G-tests (e.g. one per prompt): G and df add up."""
    g = float(sum(t.statistic for t in tests))
    df = int(sum(t.df for t in tests))
    n = int(sum(t.n for t in tests))
    bins = int(sum(t.bins for t in tests))
    imp = int(sum(t.impossible for t in tests))
    pv = float(_st.chi2.sf(g, df)) if df > 0 else 1.0
    if imp:
        pv = 0.0
    return GTestResult(g, df, pv, n, bins, imp, {"parts": len(tests)})


def paired_bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    statistic: Callable[[np.ndarray, np.ndarray], float] | None = None,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(estimate, low, high) of ``statistic(a, b)`` (default mean(a - b)), resampling pairs."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or len(x) == 0:
        raise ValueError("paired samples must be non-empty 1-D arrays of equal length")
    stat = statistic or (lambda u, v: float(np.mean(u - v)))
    est = float(stat(x, y))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_resamples, len(x)))
    if statistic is None:
        d = x - y
        boots = d[idx].mean(axis=1)
    else:
        boots = np.array([stat(x[i], y[i]) for i in idx])
    lo, hi = np.quantile(boots, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    return est, float(lo), float(hi)


def bootstrap_ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(median(a)/median(b), low, high): unpaired percentile bootstrap (speedup = std/fast)."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if len(x) == 0 or len(y) == 0:
        raise ValueError("empty sample")
    rng = np.random.default_rng(seed)
    bx = np.median(x[rng.integers(0, len(x), size=(n_resamples, len(x)))], axis=1)
    by = np.median(y[rng.integers(0, len(y), size=(n_resamples, len(y)))], axis=1)
    r = bx / by
    lo, hi = np.quantile(r, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    return float(np.median(x) / np.median(y)), float(lo), float(hi)


def mcnemar_exact(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> dict:
    """Exact two-sided McNemar test. Returns b (a right, b wrong), c (a wrong, b right), p."""
    x = np.asarray(a_correct, dtype=bool)
    y = np.asarray(b_correct, dtype=bool)
    if x.shape != y.shape:
        raise ValueError("paired outcomes differ in length")
    nb = int(np.sum(x & ~y))
    nc = int(np.sum(~x & y))
    n = nb + nc
    p = 1.0 if n == 0 else float(min(1.0, 2.0 * _st.binom.cdf(min(nb, nc), n, 0.5)))
    return {"b": nb, "c": nc, "n_discordant": n, "p_value": p}


def log_softmax(logits) -> np.ndarray:
    """Row-wise log-softmax in float64; -inf entries stay -inf."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        lse = np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)) + m
        return x - lse


def kl_divergence(p_logits, q_logits) -> np.ndarray:
    """KL(P || Q) per row, P and Q the softmax of the given logits (float64).

    Terms with p == 0 contribute 0; p > 0 where q == 0 gives +inf; NaN input gives NaN.
    """
    lp = log_softmax(p_logits)
    lq = log_softmax(q_logits)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        diff = np.where(p > 0, lp - lq, 0.0)
        terms = np.where(p > 0, p * diff, 0.0)
    out = terms.sum(axis=-1)
    bad = np.isnan(np.asarray(p_logits, dtype=np.float64)).any(axis=-1) | np.isnan(
        np.asarray(q_logits, dtype=np.float64)
    ).any(axis=-1)
    out = np.where(bad, np.nan, out)
    return np.maximum(out, 0.0)  # rounding can give -1e-17; NaN propagates


def top1_agreement(a_logits, b_logits) -> float:
    """Fraction of rows whose argmax (lowest id on ties) agrees."""
    a = np.asarray(a_logits, dtype=np.float64)
    b = np.asarray(b_logits, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"logit shapes differ: {a.shape} vs {b.shape}")
    if a.shape[0] == 0:
        return math.nan
    return float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))


def randomized_pit(probs, token: int, u: float) -> float:
    """Randomized probability integral transform of a discrete draw: with categories ordered by
    descending probability (ties: lower id first), F(before token) + u * p(token). Uniform on
    [0, 1] iff ``token`` was drawn from ``probs`` (u ~ U(0, 1) independent), so draws made in
    different contexts can be pooled into one uniformity test."""
    p = np.asarray(probs, dtype=np.float64)
    p = p / p.sum()
    order = np.lexsort((np.arange(len(p)), -p))
    rank = int(np.nonzero(order == token)[0][0])
    before = float(p[order[:rank]].sum())
    return min(1.0, before + u * float(p[token]))


def uniformity_g_test(values: Sequence[float], bins: int = 10, *, min_expected: float = 5.0) -> GTestResult:
    """G-test that ``values`` are uniform on [0, 1] over ``bins`` equal bins (pooled if low)."""
    v = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0 - 1e-12)
    counts = np.bincount((v * bins).astype(int), minlength=bins)[:bins]
    return g_test(counts, np.full(bins, 1.0 / bins), min_expected=min_expected)
