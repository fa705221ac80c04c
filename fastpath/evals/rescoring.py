"""Oracle rescoring: the fp32 oracle teacher-forced on each path's own generation.

Two correct low-precision paths part at a near-tie (a token whose top two logits a bf16 rounding
can swap), after which comparing their generations position by position sees nothing: the
contexts differ. Rescoring each path's own output by the oracle sees every generated token:
deviation_i = |logprob_path(token_i) - logprob_oracle(token_i)|, both conditioned on the path's
own context. Position 0 is left out: every path samples it from the prompt's prefill, which no
decode fast path serves (it would only dilute a decode defect).

The oracle scores with a pure prefill (``Model.score``'s default ``prefill_len``): it is the
judge, not under test. Only the Model protocol is used, so any engine's oracle serves.
"""

from __future__ import annotations

import math
from typing import Any

from fastpath import progress


def score_groups(lengths: list[int], max_tokens: int | None) -> list[list[int]]:
    """Sequence indices in groups, longest first, whose padded size (count x longest: what a
    batched prefill holds) stays within ``max_tokens``; a longer sequence goes alone."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for i in order:
        cur = groups[-1] if groups else None
        # longest first: the group's first sequence is its longest
        if cur is not None and (max_tokens is None or (len(cur) + 1) * lengths[cur[0]] <= max_tokens):
            cur.append(i)
        else:
            groups.append([i])
    return groups


def generated_logprobs(logits: Any, prompt_len: int, token_ids: list[int]) -> list[float]:
    """The scorer's log-probability of generated tokens 1.. (token i sits at position
    prompt_len + i, predicted by row prompt_len + i - 1 of ``logits``)."""
    import torch

    if len(token_ids) < 2:
        return []
    rows = torch.log_softmax(logits[prompt_len:prompt_len + len(token_ids) - 1].double(), dim=-1)
    target = torch.as_tensor(token_ids[1:], dtype=torch.long, device=rows.device)
    return [float(x) for x in rows.gather(1, target[:, None])[:, 0]]


def deviations(path_logprobs: list[float], oracle_logprobs: list[float]) -> list[float]:
    """|path - oracle| per generated position 1.. (``oracle_logprobs`` starts at position 1)."""
    return [abs(float(p) - float(o)) for p, o in zip(path_logprobs[1:], oracle_logprobs)]


def _needs_scoring(record: dict) -> bool:
    return min(len(record["token_ids"]), len(record.get("logprobs") or [])) >= 2


def rescore(oracle: Any, runs: dict[str, dict[tuple, dict]], max_prefill_tokens: int | None) -> dict[str, dict]:
    """``runs``: {path: adapter records (``prompt_ids``, ``token_ids``, ``logprobs``)}; returns
    {path: {key: [deviation per generated position 1..]}}, one ``oracle.score`` call per group."""
    out: dict[str, dict[tuple, list[float]]] = {path: {key: [] for key in recs} for path, recs in runs.items()}
    todo = [(path, key, rec) for path, recs in runs.items() for key, rec in recs.items() if _needs_scoring(rec)]
    seqs = [list(rec["prompt_ids"]) + list(rec["token_ids"]) for _, _, rec in todo]
    groups = score_groups([len(s) for s in seqs], max_prefill_tokens)
    for n, group in enumerate(groups, 1):
        progress.note(f"oracle rescoring: group {n}/{len(groups)} ({len(group)} sequences)")
        for i, logits in zip(group, oracle.score([seqs[i] for i in group])):
            path, key, rec = todo[i]
            oracle_lp = generated_logprobs(logits, len(rec["prompt_ids"]), rec["token_ids"])
            out[path][key] = deviations(rec["logprobs"], oracle_lp)
    return out


def judge(fast: list[float], standard: list[float], factor: float, slack: float) -> dict:
    """The rule: mean fast deviation <= factor x mean standard deviation (the noise floor of the
    run) + slack. ``passed`` is False when the fast path has no position to judge."""
    value = sum(fast) / len(fast) if fast else math.nan
    floor = sum(standard) / len(standard) if standard else math.nan
    threshold = factor * (0.0 if math.isnan(floor) else floor) + slack
    return {"value": value, "floor": floor, "threshold": threshold, "n": len(fast), "floor_n": len(standard),
            "passed": not math.isnan(value) and value <= threshold}
