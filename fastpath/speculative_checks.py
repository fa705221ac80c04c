"""Checks of speculative decoding for the features suite (gate ``features_speculative``).

Speculation is an optional engine capability: a model offers it when its ``generate`` takes
``speculative`` (fastpath/engine.py). Every check here fails rather than passes when no draft
was verified, so a check that silently decoded without speculation cannot pass.
"""

from __future__ import annotations

import inspect
from collections import Counter, defaultdict
from typing import Any, Sequence

import numpy as np

from fastpath import stats
from fastpath.engine import GenerationRequest

# Smoke-tier seed text: a random model's drafts come from its own output repeating, and the
# tiny config's greedy continuation of this text repeats a trigram 4 tokens after SMOKE_OWN_TOKENS
# (a changed model that stops repeating fails the check loudly: nothing drafted).
SMOKE_TEXT, SMOKE_OWN_TOKENS = "abc abc abc", 8


class SpeculationUnsupported(RuntimeError):
    pass


def offers_speculation(model: Any) -> bool:
    try:
        return "speculative" in inspect.signature(model.generate).parameters
    except (TypeError, ValueError):
        return False


def generate(model: Any, requests: list[GenerationRequest], speculative: dict) -> list[Any]:
    """``model.generate`` with speculation, or one line naming the cause and the fix."""
    if not offers_speculation(model):
        name = getattr(model, "engine_name", None) or type(model).__name__
        raise SpeculationUnsupported(f"engine {name} does not offer speculative decoding: "
                                     "set features.speculative_decoding = false")
    return model.generate(requests, speculative=speculative)


def ngram(k: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": int(k)}


def totals(results: Sequence[Any]) -> dict:
    """Summed acceptance statistics of ``results`` (each carries ``speculative``)."""
    out = {"steps": 0, "drafted": 0, "accepted": 0, "rows_without_statistics": 0}
    for r in results:
        s = getattr(r, "speculative", None)
        if s is None:
            out["rows_without_statistics"] += 1
            continue
        out["steps"] += s.steps
        out["drafted"] += s.drafted
        out["accepted"] += s.accepted
    steps = out["steps"]
    out["mean_acceptance_length"] = 1.0 + out["accepted"] / steps if steps else 0.0
    out["acceptance_rate"] = out["accepted"] / out["drafted"] if out["drafted"] else 0.0
    return out


def verify_launches(rec: Any, k: int, components: Sequence[Any] | None = None) -> int:
    """Engaged events in the trace ``rec`` that prove a verify step at K + 1 tokens per sequence:
    those of a component's declared ``verify_variants`` (fastpath/engine.py) reporting
    tokens = K + 1; where no component declares any (or none are given), any engaged event
    reporting tokens = K + 1. The features and perf suites both count with this."""
    declared = {c.name: set(c.verify_variants) for c in components or () if getattr(c, "verify_variants", None)}

    def at_k(e: Any) -> bool:
        return dict(e.shape).get("tokens") == k + 1

    if not declared:
        return sum(1 for e in rec.engaged() if at_k(e))
    return sum(1 for name, variants in declared.items() for e in rec.engaged(name)
               if e.detail in variants and at_k(e))


def prompts(model: Any, tier_name: str, n: int, n_tokens: int = 48) -> list[list[int]]:
    """Prompts on which the n-gram drafter proposes: on the full tier the trained model's held-out
    eval documents (fastpath.evals.sequences, seeds the parity suite does not use); elsewhere
    SMOKE_TEXT followed by ``model``'s own greedy continuation (a random model repeats itself)."""
    tok = model.tokenizer
    if tier_name == "full":
        from fastpath.evals.sequences import task_documents

        return [task_documents(tok, 900 + i, n_tokens) for i in range(n)]
    seed = tok.encode(SMOKE_TEXT)
    own = model.generate([GenerationRequest(prompt_ids=seed, max_tokens=SMOKE_OWN_TOKENS, ignore_eos=True)])[0]
    return [seed + list(own.token_ids)] * n


def greedy_compare(model: Any, reqs: list[GenerationRequest], k: int, components: Sequence[Any] | None = None) -> dict:
    """Greedy generation with and without n-gram speculation at draft length ``k``
    (``components``: the engine's, for ``verify_launches``)."""
    from fastpath import trace

    plain = [list(r.token_ids) for r in model.generate(reqs)]
    with trace.recording() as rec:
        spec = generate(model, reqs, ngram(k))
    ids = [list(r.token_ids) for r in spec]
    return {"identical_rows": sum(a == b for a, b in zip(plain, ids)), "rows": len(reqs),
            "first_difference": [next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
                                 if a != b else None for a, b in zip(plain, ids)],
            "plain": plain, "speculative": ids, "stats": totals(spec),
            "verify_launches": verify_launches(rec, k, components)}


def sampled_second_tokens(model: Any, prompt: list[int], *, draws: int, batch: int, temperature: float,
                          speculative: dict | None, seed0: int) -> tuple[list[tuple[int, int]], dict]:
    """``draws`` seeded two-token generations of ``prompt``: (first, second) token pairs. The first
    comes from the prefill; with speculation the second from the rejection sampler judging drafts."""
    pairs: list[tuple[int, int]] = []
    results = []
    for start in range(0, draws, batch):
        reqs = [GenerationRequest(prompt_ids=list(prompt), max_tokens=2, temperature=temperature,
                                  seed=seed0 + start + j, ignore_eos=True) for j in range(min(batch, draws - start))]
        out = generate(model, reqs, speculative) if speculative else model.generate(reqs)
        results += out
        pairs += [(r.token_ids[0], r.token_ids[1]) for r in out if len(r.token_ids) >= 2]
    return pairs, totals(results)


def distribution_test(model: Any, prompt: list[int], pairs: list[tuple[int, int]], temperature: float,
                      n_valid: int | None, score: Any = None) -> stats.GTestResult:
    """Pooled G-test of the second tokens against softmax(logits / T) of ``model`` at each
    (prompt, first token) context: the distribution normal decoding draws from. ``score(seqs)``:
    the logits per sequence (default ``model.score``)."""
    score = score or model.score
    groups: dict[int, Counter] = defaultdict(Counter)
    for t1, t2 in pairs:
        groups[t1][t2] += 1
    tests = []
    for t1, counts in sorted(groups.items()):
        row = score([list(prompt) + [t1]])[0][-1].detach().float().cpu().numpy().astype(np.float64)
        if n_valid:
            row[n_valid:] = -np.inf
        p = np.exp(stats.log_softmax(row / temperature))
        obs = np.zeros(p.shape[-1])
        for t, c in counts.items():
            obs[t] += c
        tests.append(stats.g_test(obs, p))
    return stats.g_test_pooled(tests)


def greedy_failure(res: dict, k: int, *, fast_path: bool) -> str:
    """Why a ``greedy_compare`` result fails (empty: it passes): drafts must have been proposed
    and verified on every row's path, the fast path's verify kernels must have run at K + 1
    tokens, and every row's ids must equal decoding without drafts, except rows listed in
    ``res["near_ties"]`` (their first differing token is a tie that bf16 noise can flip: a
    verify step of K + 1 rows sums in another order than a decode step; the caller judges)."""
    t = res["stats"]
    if t["drafted"] == 0 or t["rows_without_statistics"]:
        return "no draft was proposed and verified: speculation never ran"
    if fast_path and res["verify_launches"] == 0:
        return f"the fast verify kernels never ran at {k + 1} tokens per sequence"
    excused = set(res.get("near_ties", ()))
    bad = [i for i, d in enumerate(res["first_difference"]) if d is not None and i not in excused]
    bad += [i for i, (a, b) in enumerate(zip(res["plain"], res["speculative"]))
            if a != b and res["first_difference"][i] is None and i not in excused]  # one row is a prefix
    if bad:
        return (f"{len(bad)} of {res['rows']} rows differ from greedy decoding without drafts beyond a near-tie "
                f"(rows {sorted(bad)}; first differing token: {res['first_difference']})")
    return ""
