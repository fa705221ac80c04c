"""Non-inferiority of the fast path's per-sample scores against the standard path's, paired.

The difference d = mean(fast) - mean(standard) over the same samples; the fast path is
non-inferior when the one-sided lower confidence bound of d exceeds -margin.

- ``exact``: 0/1 scores (exact match). Only discordant pairs carry information (McNemar's
  set-up): b = standard right and fast wrong, c = fast right and standard wrong, m = b + c.
  Given m, c ~ Binomial(m, pi) and d = m (2 pi - 1) / n, so the exact (Clopper-Pearson) bound
  on pi from ``scipy.stats.binomtest`` gives the bound on d. The p-value is that of H0: d <=
  -margin (the same binomial test at the pi where d = -margin), so ``passed`` iff p < 1 - confidence.
- ``graded``: scores in [0, 1] (MRCR). Percentile bootstrap of the mean paired difference,
  ``scipy.stats.bootstrap`` with ``alternative="greater"``; p = the share of bootstrap means at
  or below -margin.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats


def _result(method: str, n: int, estimate: float, low: float, high: float, p: float, margin: float,
            confidence: float, **extra) -> dict:
    return {"method": method, "n": n, "estimate": estimate, "ci_low": low, "ci_high": high, "p_value": p,
            "margin": margin, "confidence": confidence, "passed": bool(low > -margin), **extra}


def exact(standard: Sequence[float], fast: Sequence[float], *, margin: float, confidence: float = 0.95) -> dict:
    """Non-inferiority of paired 0/1 outcomes (exact, conditional on the discordant pairs)."""
    s, f = np.asarray(standard, dtype=float), np.asarray(fast, dtype=float)
    if s.shape != f.shape or s.ndim != 1 or not len(s):
        raise ValueError("paired outcomes must be non-empty 1-D sequences of equal length")
    if not np.isin(np.concatenate([s, f]), (0.0, 1.0)).all():
        raise ValueError("exact pairing needs 0/1 scores; use graded() for scores in [0, 1]")
    n = len(s)
    b, c = int(np.sum((s == 1) & (f == 0))), int(np.sum((s == 0) & (f == 1)))
    m = b + c
    extra = {"b": b, "c": c, "standard_mean": float(s.mean()), "fast_mean": float(f.mean())}
    if m == 0:  # the paths agree on every sample: d is 0, with nothing left to vary
        return _result("exact", n, 0.0, 0.0, 0.0, 0.0 if margin > 0 else 1.0, margin, confidence, **extra)
    low = stats.binomtest(c, m, alternative="greater").proportion_ci(confidence, "exact").low
    high = stats.binomtest(c, m, alternative="less").proportion_ci(confidence, "exact").high
    pi0 = (1.0 - margin * n / m) / 2.0  # the pi at which d = -margin
    p = 0.0 if pi0 <= 0 else float(stats.binomtest(c, m, min(pi0, 1.0), alternative="greater").pvalue)
    return _result("exact", n, (c - b) / n, m * (2 * low - 1) / n, m * (2 * high - 1) / n, p, margin, confidence,
                   mcnemar_p=float(stats.binomtest(c, m, 0.5).pvalue), **extra)


def graded(standard: Sequence[float], fast: Sequence[float], *, margin: float, confidence: float = 0.95,
           n_resamples: int = 4000, seed: int = 0) -> dict:
    """Non-inferiority of paired graded scores (percentile bootstrap of the mean difference)."""
    s, f = np.asarray(standard, dtype=float), np.asarray(fast, dtype=float)
    if s.shape != f.shape or s.ndim != 1 or not len(s):
        raise ValueError("paired scores must be non-empty 1-D sequences of equal length")
    d = f - s
    est = float(d.mean())
    extra = {"standard_mean": float(s.mean()), "fast_mean": float(f.mean())}
    if np.all(d == d[0]):  # no spread to resample (e.g. every pair equal)
        return _result("bootstrap", len(d), est, est, est, 0.0 if est > -margin else 1.0, margin, confidence, **extra)
    rng = np.random.default_rng(seed)
    kw = dict(n_resamples=n_resamples, confidence_level=confidence, method="percentile", vectorized=True)
    res = stats.bootstrap((d,), np.mean, alternative="greater", rng=rng, **kw)
    high = stats.bootstrap((d,), np.mean, alternative="less", rng=np.random.default_rng(seed + 1), **kw)
    p = float(np.mean(res.bootstrap_distribution <= -margin))
    low = float(res.confidence_interval.low)
    return _result("bootstrap", len(d), est, low if math.isfinite(low) else est,
                   float(high.confidence_interval.high), p, margin, confidence, **extra)


def length_ratio(standard: Sequence[float], fast: Sequence[float], *, confidence: float = 0.95,
                 n_resamples: int = 4000, seed: int = 0) -> dict:
    """mean(fast) / mean(standard) of paired generation lengths, with a two-sided percentile
    bootstrap CI over the documents (``scipy.stats.bootstrap``, paired). A handful of documents
    whose lengths vary by chance (a path's first divergent token can end a generation early)
    widens the interval; a defect that shortens or lengthens every generation does not."""
    s, f = np.asarray(standard, dtype=float), np.asarray(fast, dtype=float)
    if s.shape != f.shape or s.ndim != 1 or not len(s):
        raise ValueError("paired lengths must be non-empty 1-D sequences of equal length")
    ratio = float(f.mean() / s.mean()) if s.mean() else math.nan
    out = {"method": "bootstrap", "n": len(s), "estimate": ratio, "confidence": confidence,
           "fast_mean": float(f.mean()), "standard_mean": float(s.mean())}
    if len(s) < 2 or (np.all(s == s[0]) and np.all(f == f[0])) or not s.mean():
        return out | {"ci_low": ratio, "ci_high": ratio}  # nothing to resample
    res = stats.bootstrap((s, f), lambda a, b, axis=-1: b.mean(axis=axis) / np.maximum(a.mean(axis=axis), 1e-9),
                          paired=True, vectorized=True, n_resamples=n_resamples, confidence_level=confidence,
                          method="percentile", rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return out | {"ci_low": low if math.isfinite(low) else ratio, "ci_high": high if math.isfinite(high) else ratio}


def judge(kind: str, standard: Sequence[float], fast: Sequence[float], *, margin: float, confidence: float,
          n_resamples: int = 4000, seed: int = 0) -> dict:
    """``exact`` for "exact" metrics, ``graded`` otherwise."""
    if kind == "exact":
        return exact(standard, fast, margin=margin, confidence=confidence)
    return graded(standard, fast, margin=margin, confidence=confidence, n_resamples=n_resamples, seed=seed)
