"""Output agreement between two paths' generations of the same requests.

Per request: ``identical`` (the same token ids), ``prefix`` (tokens before the first difference;
the share of the longer output is ``prefix_fraction``) and the token log-probability deviations
|lp_a - lp_b| at the positions both generated from the same context: after the common prefix
the two generations condition on different tokens and their log-probabilities no longer
compare. Position 0 is left out: every path samples it from the prompt's prefill, which no
decode fast path serves (it would only dilute a decode defect).

These figures are information for a reviewer: two correct paths part at a near-tie, after which
the shared prefix holds little; the gate rescores each path's own output (rescoring.py).
"""

from __future__ import annotations

from dataclasses import dataclass


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Agreement:
    identical: bool
    prefix: int
    prefix_fraction: float
    deviations: list[float]  # |lp_a - lp_b| at the decode positions of the common prefix


def compare(a: dict, b: dict) -> Agreement:
    """Two adapter records (``token_ids``, ``logprobs``) of the same request."""
    ta, tb = a["token_ids"], b["token_ids"]
    k = common_prefix(ta, tb)
    longest = max(len(ta), len(tb))
    la, lb = a.get("logprobs") or [], b.get("logprobs") or []
    devs = [abs(float(la[i]) - float(lb[i])) for i in range(1, min(k, len(la), len(lb)))]
    return Agreement(ta == tb, k, 1.0 if longest == 0 else k / longest, devs)
