"""Features suite: production features still work on the fast path (issue 5 item 4).

structured    (features_structured_output) JSON schema / regex through the engine's structured
              output (xgrammar), greedy or sampled at temperature 0.9, in one heterogeneous batch
              of 5 (``structured_batch``): rows of the case's grammar and of the other one
              interleaved, an unconstrained row between them, rows finishing at different steps;
              every constrained row valid against its own grammar (jsonschema / re.fullmatch),
              the unconstrained one ended by its length: valid rate >= min_valid_rate (a mask
              applied to another row breaks one of them); the batch really mixed; the trace
              proves the fast path ran (sampler and every decode component engaged); greedy
              outputs identical between the standard and the fast path, row by row, or parted
              at a near-tie (``_greedy_row``: on the H200 a regex row's last digit flipped
              between two near-equal logits; a masked-out or clearly worse token is not a tie).
sampling      (features_sampling_distribution) fixed prompts, many seeds, temperature 0.6,
              max_tokens 2, batched at the fast path's largest batch. The first token comes from
              the prefill (outside the fast path); the second is drawn by the fast decode step and
              fast sampler, so the second tokens are tested against softmax(logits / T) of the
              logits the fast decoder computes for that context (``score`` with teacher-forced
              decode rows, padding ids masked). Not the standard path's logits: at 10^5 draws the
              G-test detects the bf16 difference between the two paths' logits (seen on the H200:
              G=1446, df=568), which is parity's to bound (parity_kl), not the sampler's. This
              row isolates the sampler (temperature, masks, noise): (1) frequencies per (prompt, first token)
              context, pooled G-test with low-count bins pooled; (2) randomized PIT of every draw
              under its context's distribution, G-test of uniformity; each at alpha / 2
              (Bonferroni). draws = smoke_draws / full_draws. The fast sampler must have run.
seeded        (features_seeded_reproducible) same seeds twice on the fast path -> identical;
              fast vs standard with the same seeds: token agreement (up to each sequence's first
              divergence) >= the floor measured standard vs oracle (parity rule, min 1.0).
masks         (features_sampling_masks) top_k = 2 / top_p = 0.3 at temperature 1.2, batch = the
              fast path's largest: every sampled token lies in the standard path's top-k set /
              nucleus at its position (boundary tolerance: 4 x the standard-vs-oracle logit /
              probability difference at that position).
full_context  (features_full_context) a request at the tier's largest context completes on the
              fast path (trace), with finite logits, and parity (top-1, KL) within the floor
              on the positions scored by teacher-forced decode steps, by the parity gates' rules
              (fastpath/parity_rules.py).
speculative   (features_speculative) per draft length, on both paths: greedy ids with n-gram
              drafts equal those without, row by row, or parted at a near-tie (``_greedy_row``
              again: a verify step of K + 1 rows sums in another order than a decode step);
              drafts verified, the fast verify kernels at K + 1 tokens; sampled second tokens
              keep normal decoding's distribution (G-test); acceptance lengths reported.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict

import numpy as np
import pytest

from fastpath import parity_rules as rules
from fastpath import speculative_checks as SC
from fastpath import stats, suite_helpers, trace
from fastpath.engine import GenerationRequest


H = suite_helpers

# Small on purpose: with a byte-level tokenizer every character is one decode step, and on the
# CPU smoke tier a fast decode step runs under the Triton interpreter (seconds).
JSON_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{1,3}-[0-9]"
STRUCT_TEMPERATURE = 0.9
SAMPLING_TEMPERATURE = 0.6
N_SAMPLING_PROMPTS = 4
MASK_NOISE_FACTOR = 4.0  # boundary tolerance: this many times the standard-vs-oracle difference
NEAR_TIE_RULE = ("identical, or at the first divergent token the fp32 oracle's margin for the reference row's "
                 f"token is within {MASK_NOISE_FACTOR} x max |standard - oracle| logit there (a tie bf16 noise can flip)")


def _tier_max_batch(fp_tier) -> int:
    return int(max(fp_tier.scope["batch_sizes"]))


def _n_valid(tok, vocab: int) -> int:
    n = getattr(tok, "n_real_tokens", None)
    return int(n) if n else vocab


def _masked(logits: np.ndarray, n_valid: int) -> np.ndarray:
    x = np.array(logits, dtype=np.float64)
    x[..., n_valid:] = -np.inf
    return x


def _softmax(x: np.ndarray) -> np.ndarray:
    return np.exp(stats.log_softmax(x))


def _decode_components(engine) -> list[str]:
    return [c.name for c in engine.components()]


def _engagement(rec, engine) -> tuple[list[str], dict]:
    """Components that never engaged (environment refusals excused) and a summary."""
    missing = []
    for comp in _decode_components(engine):
        if rec.engaged(comp):
            continue
        reasons = {e.detail for e in rec.refused(comp)}
        # e.g. the whole-step CUDA graph refused with "no_cuda" on CPU at every decode step
        # (the prefill's own "prefill" refusals are expected alongside)
        if any(H.environment_refusal(r, engine) for r in reasons):
            continue
        missing.append(comp)
    summary = {c: sorted(v) for c, v in rec.components().items()}
    return missing, summary


def _valid(kind: str, text: str) -> tuple[bool, str]:
    if kind == "json_schema":
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), JSON_SCHEMA)
            return True, ""
        except Exception as exc:  # json or schema error
            return False, f"{type(exc).__name__}: {str(exc)[:120]}"
    ok = re.fullmatch(REGEX, text) is not None
    return ok, "" if ok else "no re.fullmatch"


def structured_batch(kind: str, temperature: float, tok) -> list[tuple[str | None, GenerationRequest]]:
    """The case's batch: one mixed batch per case, so that a mask applied to the wrong row shows
    -- rows of the case's grammar and of the other one, interleaved, an unconstrained row
    between them that stops after a few tokens, and rows that finish at different steps (a
    regex answer is shorter than a JSON object). (grammar kind or None, request) per row."""
    other = "regex" if kind == "json_schema" else "json_schema"
    rows = []
    for i, k in enumerate((kind, other, None, kind, other)):
        if k is None:
            rows.append((None, GenerationRequest(prompt_ids=tok.encode(f"Say anything, item {i}."), max_tokens=3,
                                                 temperature=temperature, seed=100 + i, ignore_eos=True)))
            continue
        text = "Answer with a JSON object:" if k == "json_schema" else "Answer with a code like ab-1:"
        constraint = {"json_schema": JSON_SCHEMA} if k == "json_schema" else {"regex": REGEX}
        rows.append((k, GenerationRequest(prompt_ids=tok.encode(f"{text} item {i}."), max_tokens=32,
                                          temperature=temperature, seed=100 + i, structured=constraint)))
    return rows


def _row_valid(kind: str | None, req: GenerationRequest, result) -> tuple[bool, str]:
    """A constrained row against ITS grammar; an unconstrained row must end by its length."""
    if kind:
        return _valid(kind, result.text)
    ok = result.finish_reason == "length"
    return ok, "" if ok else f"unconstrained row ended with {result.finish_reason!r}, not after {req.max_tokens} tokens"


@pytest.mark.fastpath(kind="structured", gate="features_structured_output")
def test_structured_output(case, fp_engine, fp_spec, fp_tier, fp_models, fp_gate, record):
    cfg = H.case_config(case)
    kind, mode = cfg["structured"], cfg["mode"]
    draft = int(cfg.get("draft", 0))
    gate = fp_gate("features_structured_output")
    min_valid = float(gate.get("min_valid_rate", 1.0))
    fast, std = fp_models["fast"], fp_models["standard"]
    temp = 0.0 if mode == "greedy" else STRUCT_TEMPERATURE
    rows = structured_batch(kind, temp, fast.tokenizer)
    # with a draft, the verify steps' rows within the spec's max_verify_rows (its first 4 rows
    # still mix both grammars, an unconstrained row and different finishing steps)
    rows = rows[:H.verify_batch(fp_spec, fp_tier, draft, len(rows))] if draft else rows
    reqs = [r for _, r in rows]
    with trace.recording() as rec:
        out_fast = SC.generate(fast, reqs, SC.ngram(draft)) if draft else fast.generate(reqs)
    checks = [_row_valid(k, req, r) for (k, req), r in zip(rows, out_fast)]
    n_ok = sum(ok for ok, _ in checks)
    rate = n_ok / len(reqs)
    steps = [len(r.token_ids) for r in out_fast]
    base = {"batch": len(reqs), "draft": draft, "path": "fast"}
    outputs = [{"row": i, "grammar": k or "none", "text": r.text[:200], "finish_reason": r.finish_reason,
                "tokens": len(r.token_ids), "valid": ok, "error": why}
               for i, ((k, _), r, (ok, why)) in enumerate(zip(rows, out_fast, checks))]
    record("features_structured_output", "valid_rate", rate, threshold=min_valid, comparator=">=",
           detail={"structured": kind, "mode": mode, "temperature": temp, "rows": [k or "none" for k, _ in rows],
                   "finished_at_steps": steps},
           evidence={"outputs": outputs},
           message="" if rate >= min_valid else
           f"{len(reqs) - n_ok}/{len(reqs)} rows invalid: " + "; ".join(
               f"row {o['row']} ({o['grammar']}): {o['error'] or 'invalid'}" for o in outputs if not o["valid"]),
           **base)
    mixed = len(set(steps)) > 1 and {k for k, _ in rows} >= {kind, None}
    record("features_structured_output", "heterogeneous_batch", 1.0 if mixed else 0.0, threshold=1.0,
           comparator=">=", detail={"finished_at_steps": steps, "rows": [k or "none" for k, _ in rows]},
           message="" if mixed else "the batch did not mix grammars, unconstrained rows and finishing steps: "
           "a mask applied to the wrong row would go unseen", **base)
    missing, summary = _engagement(rec, fp_engine)
    sampler_runs = len(rec.engaged("sampler"))
    ok = not missing and sampler_runs > 0
    record("features_structured_output", "fast_path_engaged", 1.0 if ok else 0.0, threshold=1.0, comparator=">=",
           detail={"structured": kind, "mode": mode, "not_engaged": missing, "sampler_runs": sampler_runs},
           evidence={"trace": summary},
           message="" if ok else f"fast path not engaged during constrained generation: {missing or ['sampler']}",
           **base)
    if draft:
        _record_drafts_verified("features_structured_output", record, out_fast, rec, draft, base,
                                fp_engine.components())
    if mode == "greedy":
        out_std = SC.generate(std, reqs, SC.ngram(draft)) if draft else std.generate(reqs)
        rows_cmp = [_greedy_row(std, fp_models["oracle"], req.prompt_ids, list(a.token_ids), list(b.token_ids))
                    for req, a, b in zip(reqs, out_fast, out_std)]
        frac = sum(r["identical"] for r in rows_cmp) / len(rows_cmp)
        bad = [i for i, r in enumerate(rows_cmp) if not r["identical"] and not r["near_tie"]]
        record("features_structured_output", "greedy_identical", frac, threshold=1.0, comparator=">=",
               passed=not bad, detail={"structured": kind, "mode": mode, "rows": H.jsonable(rows_cmp),
                                       "rule": NEAR_TIE_RULE},
               evidence={"fast": [r.text[:200] for r in out_fast], "standard": [r.text[:200] for r in out_std]},
               message="" if not bad else "greedy outputs differ between standard and fast beyond a near-tie in rows "
               + ", ".join(f"{i} (at token {rows_cmp[i]['position']}: oracle margin {rows_cmp[i]['oracle_margin']:.3g} > "
                           f"tolerance {rows_cmp[i]['tolerance']:.3g})" for i in bad), **base)


def _record_drafts_verified(gate: str, record, results, rec, k: int, base: dict, components) -> int:
    """A case that claims draft length k must have drafted, and (fast path) run the verify
    kernels; returns the verify launches counted."""
    t = SC.totals(results)
    launches = SC.verify_launches(rec, k, components)
    ok = t["drafted"] > 0 and t["rows_without_statistics"] == 0 and launches > 0
    record(gate, "drafts_verified", t["drafted"], threshold=1, comparator=">=", passed=ok,
           detail={**t, "verify_launches_at_k_plus_1": launches},
           message="" if ok else ("no draft was proposed and verified: the case did not speculate"
                                  if t["drafted"] == 0 or t["rows_without_statistics"] else
                                  f"the fast verify kernels never ran at {k + 1} tokens per sequence"), **base)
    return launches


def _greedy_row(std, orc, prompt: list[int], fast_ids: list[int], std_ids: list[int]) -> dict:
    """Whether two greedy rows agree, and where they do not, whether their first divergent token
    is a near-tie: the oracle's logit margin of the reference row's token (``std_ids``: the
    standard path's, or decoding without drafts) over the tested row's (``fast_ids``) no larger
    than the standard path's own logit error there (times MASK_NOISE_FACTOR). A wrong mask, a
    broken kernel or a bad rollback picks a token the oracle ranks clearly lower."""
    if fast_ids == std_ids:
        return {"identical": True, "near_tie": True}
    j = next((i for i, (x, y) in enumerate(zip(fast_ids, std_ids)) if x != y), min(len(fast_ids), len(std_ids)))
    if j >= min(len(fast_ids), len(std_ids)):  # one row stopped earlier: no token pair to weigh
        return {"identical": False, "near_tie": False, "position": j, "oracle_margin": math.inf, "tolerance": 0.0,
                "why": "one path's row ended where the other's went on"}
    seq = list(prompt) + std_ids[:j + 1]
    row = len(seq) - 2  # the logits that predict seq[-1]
    ls = std.score([seq])[0].detach().float().cpu().numpy().astype(np.float64)[row]
    lo = orc.score([seq])[0].detach().float().cpu().numpy().astype(np.float64)[row]
    fin = np.isfinite(ls) & np.isfinite(lo)
    tol = MASK_NOISE_FACTOR * float(np.max(np.abs(ls[fin] - lo[fin]))) if fin.any() else 0.0
    a, b = std_ids[j], fast_ids[j]
    margin = float(lo[a] - lo[b])
    return {"identical": False, "near_tie": margin <= tol, "position": j, "standard_token": a, "fast_token": b,
            "oracle_margin": margin, "tolerance": tol}


def _draws_for_tier(fp_gate, fp_tier) -> tuple[int, float]:
    g = fp_gate("features_sampling_distribution")
    key = "full_draws" if H.tier_name(fp_tier) == "full" else "smoke_draws"
    return int(g.get(key, 20000)), float(g.get("alpha", 0.001))


@pytest.mark.fastpath(kind="sampling", gate="features_sampling_distribution")
def test_sampling_distribution(case, fp_engine, fp_spec, fp_tier, fp_models, fp_gate, record):
    draws, alpha = _draws_for_tier(fp_gate, fp_tier)
    fast = fp_models["fast"]
    tok = fast.tokenizer
    T = SAMPLING_TEMPERATURE
    batch = H.scope_max_batch(fp_spec, fp_tier)
    prompts = [tok.encode(f"Sample {i}: the next letter is") for i in range(N_SAMPLING_PROMPTS)]
    per_prompt = -(-draws // len(prompts))
    draws_list: list[tuple[int, int, int]] = []  # (prompt, first token, second token)
    calls = 0
    with trace.recording() as rec:
        for pi, p in enumerate(prompts):
            for start in range(0, per_prompt, batch):
                n = min(batch, per_prompt - start)
                reqs = [GenerationRequest(prompt_ids=list(p), max_tokens=2, temperature=T,
                                          seed=1_000_000 * (pi + 1) + start + j) for j in range(n)]
                for r in fast.generate(reqs):
                    ids = list(r.token_ids)
                    if len(ids) >= 2:
                        draws_list.append((pi, ids[0], ids[1]))
                calls += 1
    sampler_runs = len(rec.engaged("sampler"))
    groups: dict[tuple[int, int], Counter] = defaultdict(Counter)
    for pi, t1, t2 in draws_list:
        groups[(pi, t1)][t2] += 1
    keys = sorted(groups)
    # the fast decoder's logits after (prompt, first token): the distribution the sampler drew from
    logits = H.score_teacher_forced(fast, [list(prompts[pi]) + [t1] for pi, t1 in keys], None, batch)
    expected: dict[tuple[int, int], np.ndarray] = {}
    tests = []
    for key, lg in zip(keys, logits):
        row = lg[-1].detach().float().cpu().numpy().astype(np.float64)
        p = _softmax(_masked(row, _n_valid(tok, row.shape[-1])) / T)
        expected[key] = p
        obs = np.zeros(p.shape[-1])
        for t, c in groups[key].items():
            obs[t] += c
        tests.append(stats.g_test(obs, p))
    # (1) frequencies per (prompt, first token) context, pooled G-test; (2) the randomized PIT of
    # every draw under its own context's distribution, G-test of uniformity (power when the
    # draws spread over many contexts). Bonferroni: each at alpha / 2.
    res = stats.g_test_pooled(tests) if tests else None
    rng = np.random.default_rng(20261129)
    pit = [stats.randomized_pit(expected[(pi, t1)], t2, float(rng.random())) for pi, t1, t2 in draws_list]
    bins = int(min(20, max(2, len(pit) // 10)))
    res_pit = stats.uniformity_g_test(pit, bins) if pit else None
    n = len(draws_list)
    p_min = min(res.p_value, res_pit.p_value) if res and res_pit else None
    passed_stats = res is not None and res_pit is not None and res.passed(alpha / 2) and res_pit.passed(alpha / 2)
    ok = passed_stats and n >= 0.9 * draws and sampler_runs > 0
    msg = ""
    if sampler_runs == 0:
        msg = "the fast sampler never engaged during the draws"
    elif n < 0.9 * draws:
        msg = f"only {n} second-token draws of {draws} (generation stopped at the first token)"
    elif not passed_stats:
        msg = (f"sampled frequencies differ from softmax(fast decoder logits / {T}): frequency G={res.statistic:.1f} "
               f"df={res.df} p={res.p_value:.3g}; PIT uniformity G={res_pit.statistic:.1f} df={res_pit.df} "
               f"p={res_pit.p_value:.3g}; alpha/2={alpha / 2}"
               + (f"; {res.impossible} draws of zero-probability tokens" if res.impossible else ""))
    record("features_sampling_distribution", "g_test_p_value_min", p_min, threshold=alpha / 2,
           comparator=">=", passed=ok, batch=batch, path="fast",
           detail={"temperature": T, "draws": n, "draws_required": draws, "prompts": len(prompts),
                   "contexts": len(keys), "alpha": alpha, "per_test_alpha": alpha / 2, "sampler_runs": sampler_runs,
                   "generate_calls": calls, "seeds": "1e6*(prompt+1) + i", "token": "second (first fast decode step)"},
           evidence=H.jsonable({"frequency_test": res.as_dict() if res else {},
                                "pit_test": res_pit.as_dict() if res_pit else {}}), message=msg)


def _agreement_until_divergence(a: list[list[int]], b: list[list[int]]) -> float:
    total = match = 0
    for x, y in zip(a, b):
        total += max(len(x), len(y))
        for u, v in zip(x, y):
            if u != v:
                break
            match += 1
    return match / total if total else math.nan


def _parity_threshold(floor: float, n: int, min_agreement: float) -> tuple[float, float]:
    """The parity suite's rule (fastpath/suites/test_parity.py): min_agreement, or the floor minus two
    binomial standard errors when the floor itself is below it."""
    if n <= 0 or math.isnan(floor):
        return min_agreement, 0.0
    margin = 2.0 * math.sqrt(max(floor * (1.0 - floor), 1.0 / n) / n)
    return (min_agreement, margin) if floor >= min_agreement else (floor - margin, margin)


@pytest.mark.fastpath(kind="seeded", gate="features_seeded_reproducible")
def test_seeded_reproducible(case, fp_models, fp_tier, record):
    fast, std, orc = fp_models["fast"], fp_models["standard"], fp_models["oracle"]
    tok = fast.tokenizer
    batch = min(4, _tier_max_batch(fp_tier))
    reqs = [GenerationRequest(prompt_ids=tok.encode(f"Seeded request {i} says"), max_tokens=3, temperature=0.9,
                              top_p=0.95, seed=4242 + i) for i in range(batch)]
    with trace.recording() as rec:
        f1 = [list(r.token_ids) for r in fast.generate(reqs)]
    f2 = [list(r.token_ids) for r in fast.generate(reqs)]
    s = [list(r.token_ids) for r in std.generate(reqs)]
    o = [list(r.token_ids) for r in orc.generate(reqs)]
    same = sum(x == y for x, y in zip(f1, f2)) / len(reqs)
    fired = len(rec.engaged("sampler")) > 0
    record("features_seeded_reproducible", "fast_repeat_identical", same, threshold=1.0, comparator=">=",
           passed=same >= 1.0 and fired, batch=batch, path="fast", evidence={"first": f1, "second": f2},
           message="" if same >= 1.0 and fired else
           ("fast sampler did not engage" if not fired else "same seed twice gave different samples on the fast path"))
    agree = _agreement_until_divergence(f1, s)
    floor = _agreement_until_divergence(s, o)
    n = sum(max(len(x), len(y)) for x, y in zip(f1, s))
    thr, margin = _parity_threshold(floor, n, 1.0)
    record("features_seeded_reproducible", "fast_vs_standard_agreement", agree, threshold=thr, comparator=">=",
           batch=batch, path="fast", detail={"floor_standard_vs_oracle": floor, "margin": margin, "tokens": n},
           evidence={"fast": f1, "standard": s, "oracle": o},
           message="" if agree >= thr else f"same seeds: fast agrees with standard on {agree:.3f} of tokens "
           f"(floor standard vs oracle {floor:.3f})")


MASK_TOP_K = 2
MASK_TOP_P = 0.3
MASK_TEMPERATURE = 1.2


@pytest.mark.fastpath(kind="masks", gate="features_sampling_masks")
def test_sampling_masks(case, fp_models, fp_spec, fp_tier, record):
    mask = H.case_config(case)["mask"]
    fast, std, orc = fp_models["fast"], fp_models["standard"], fp_models["oracle"]
    tok = fast.tokenizer
    batch = H.scope_max_batch(fp_spec, fp_tier)
    kw = {"top_k": MASK_TOP_K} if mask == "top_k" else {"top_p": MASK_TOP_P}
    T = MASK_TEMPERATURE
    prompts = [tok.encode(f"Mask test {i}: once upon a time") for i in range(batch)]
    reqs = [GenerationRequest(prompt_ids=prompts[i], max_tokens=3, temperature=T, seed=777 + i, **kw)
            for i in range(batch)]
    with trace.recording() as rec:
        outs = [list(r.token_ids) for r in fast.generate(reqs)]
    seqs = [p + o for p, o in zip(prompts, outs) if o]
    starts = [len(p) for p, o in zip(prompts, outs) if o]
    ls, lo = std.score(seqs), orc.score(seqs)
    violations = []
    checked = 0
    for seq, st, a, b in zip(seqs, starts, ls, lo):
        la = a.detach().float().cpu().numpy().astype(np.float64)
        lb = b.detach().float().cpu().numpy().astype(np.float64)
        nv = _n_valid(tok, la.shape[-1])
        for pos in range(st, len(seq)):
            t = seq[pos]
            xa, xo = _masked(la[pos - 1], nv) / T, _masked(lb[pos - 1], nv) / T
            fin = np.isfinite(xa) & np.isfinite(xo)
            tol = MASK_NOISE_FACTOR * float(np.max(np.abs(xa[fin] - xo[fin]))) + 1e-6 if fin.any() else 1e-6
            checked += 1
            if t >= nv:
                violations.append({"pos": pos, "token": t, "why": "padding id"})
                continue
            if mask == "top_k":
                kth = np.sort(xa)[::-1][MASK_TOP_K - 1]
                if not xa[t] >= kth - tol:
                    violations.append({"pos": pos, "token": t, "logit": xa[t], "kth": kth, "tol": tol})
            else:
                pa, po = _softmax(xa), _softmax(xo)
                tv = MASK_NOISE_FACTOR * 0.5 * float(np.abs(pa - po).sum()) + 1e-6
                above = float(pa[pa > pa[t]].sum())
                if not above < MASK_TOP_P + tv:
                    violations.append({"pos": pos, "token": t, "mass_above": above, "top_p": MASK_TOP_P, "tol": tv})
    fired = len(rec.engaged("sampler")) > 0
    ok = fired and not violations and checked > 0
    record("features_sampling_masks", "tokens_outside_mask", len(violations), threshold=0, comparator="<=",
           passed=ok, batch=batch, path="fast",
           detail={"mask": mask, "top_k": kw.get("top_k"), "top_p": kw.get("top_p"), "temperature": T,
                   "tokens_checked": checked, "boundary_tolerance": f"{MASK_NOISE_FACTOR} x |standard - oracle|"},
           evidence=H.jsonable({"violations": violations[:50]}),
           message="" if ok else ("fast sampler did not engage" if not fired else
                                  f"{len(violations)} of {checked} sampled tokens outside the {mask} set"))


@pytest.mark.fastpath(kind="full_context", gate="features_full_context")
def test_full_context(case, fp_engine, fp_models, fp_gate, record):
    context = int(H.case_config(case)["context"])
    fast, std, orc = fp_models["fast"], fp_models["standard"], fp_models["oracle"]
    tok = fast.tokenizer
    # positions scored by teacher-forced decode steps near the full context (the parity rules
    # judge them; parity's bucket at this context has the many positions)
    n_gen = 32 if H.device_kind(fp_engine) == "cuda" else 8
    prompt = H.prompt_ids(tok, 31337, context - n_gen)
    with trace.recording() as rec:
        res = fast.generate([GenerationRequest(prompt_ids=prompt, max_tokens=n_gen, temperature=0.0)])[0]
    missing, _ = _engagement(rec, fp_engine)
    fired = bool(rec.engaged()) and not missing
    ids = list(res.token_ids)
    completed = len(ids) == n_gen or res.finish_reason == "stop"
    base = {"context": context, "batch": 1, "path": "fast"}
    record("features_full_context", "completed_on_fast_path", 1.0 if (completed and fired) else 0.0, threshold=1.0,
           comparator=">=", detail={"finish_reason": res.finish_reason, "generated": len(ids),
                                    "engaged_components": sorted({e.component for e in rec.engaged()}),
                                    "not_engaged": missing},
           message="" if completed and fired else
           ("fast path did not engage at full context" if not fired else "generation did not complete"), **base)
    seq = prompt + ids
    start = len(prompt) - 1  # rows start.. come from teacher-forced decode steps
    with trace.recording() as rec2:
        lf = H.score_teacher_forced(fast, [seq], start)[0]
    ls = H.score_teacher_forced(std, [seq], start)[0]
    lo = H.score_teacher_forced(orc, [seq], start)[0]
    ls, lf, lo = (x.detach().float().cpu().numpy().astype(np.float64)[start:len(seq) - 1] for x in (ls, lf, lo))
    n_pos = ls.shape[0]
    finite = bool(np.isfinite(lf).any(axis=-1).all()) and not bool(np.isnan(lf).any())
    scored_fast = bool(rec2.engaged())
    record("features_full_context", "finite_logits", 1.0 if finite and scored_fast else 0.0, threshold=1.0,
           comparator=">=", detail={"positions": n_pos, "fast_engaged_while_scoring": scored_fast},
           message="" if finite and scored_fast else
           ("non-finite fast logits at full context" if not finite else "fast path did not engage while scoring"),
           **base)
    g1, gk = fp_gate("parity_top1_agreement"), fp_gate("parity_kl")
    # judged against the oracle by the parity gates' rules (fastpath/parity_rules.py)
    top_o = lo.argmax(axis=-1)
    top = rules.top1_verdict(lf.argmax(axis=-1) == top_o, ls.argmax(axis=-1) == top_o,
                             min_agreement=float(g1.get("min_agreement", 0.99)), alpha=float(g1.get("alpha", 0.001)))
    record("features_full_context", "top1_agreement_vs_oracle", top["value"], threshold=top["threshold"],
           comparator=">=", passed=top["passed"],
           detail=H.jsonable({**top, "positions": n_pos, "fast_vs_standard": stats.top1_agreement(lf, ls)}),
           message="" if top["passed"] else
           f"top-1 fast vs oracle {top['value']:.3f} < {top['threshold']:.3f} at full context", **base)
    kl = rules.kl_verdict(stats.kl_divergence(ls, lf), stats.kl_divergence(lo, ls),
                          factor=float(gk.get("factor", 3.0)), alpha=float(gk.get("alpha", 0.001)))
    record("features_full_context", "kl_standard_fast", kl["value"] if math.isfinite(kl["value"]) else float("inf"),
           threshold=kl["threshold"], comparator="<=", passed=kl["passed"],
           detail=H.jsonable({**kl, "kl_floor": kl["floor"], "positions": n_pos}),
           message="" if kl["passed"] else
           f"KL(standard||fast) {kl['value']:.3g} > {kl['threshold']:.3g} at full context", **base)


# -- speculative decoding (gate features_speculative) ----------------------------------------------
# Sized for the smoke tier's interpreter: one prompt, a few tokens (a verify step of K + 1 rows
# costs about a decode step of that many rows, ~1.5 s per row-step); the full tier uses the
# trained model's held-out eval documents, a batch of 8 and longer generations.
# max_tokens per path: the standard path is cheap on CPU, and a rollback that keeps a rejected
# token's state shows only tokens later (24 catch it in tests/test_features_speculative.py).
SPEC_SIZES = {"smoke": {"batch": 1, "max_tokens": {"standard": 24, "fast": 6}, "synthetic_steps": 2, "draws": 256},
              "full": {"batch": 8, "max_tokens": {"standard": 64, "fast": 64}, "synthetic_steps": 16, "draws": 4000}}
SPEC_TEMPERATURE = 0.8
SYNTHETIC_ACCEPTANCE = 0.5  # the synthetic drafter's acceptance length: this fraction of K + 1


def _spec_sizes(fp_tier) -> dict:
    return SPEC_SIZES["full" if H.tier_name(fp_tier) == "full" else "smoke"]


def _spec_greedy(k, sizes, fp_models, fp_tier, record, components, batch):
    """Per path: greedy token ids identical with and without n-gram drafts, drafts verified
    (fast path: the verify kernels at K + 1 tokens); the n-gram acceptance length reported."""
    prompts = SC.prompts(fp_models["standard"], H.tier_name(fp_tier), batch)
    for path in ("standard", "fast"):
        n = sizes["max_tokens"][path]
        reqs = [GenerationRequest(prompt_ids=p, max_tokens=n, ignore_eos=True) for p in prompts]
        res = SC.greedy_compare(fp_models[path], reqs, k, components)
        judged = {i: _greedy_row(fp_models["standard"], fp_models["oracle"], prompts[i], res["speculative"][i],
                                 res["plain"][i])
                  for i in range(res["rows"]) if res["plain"][i] != res["speculative"][i]}
        res["near_ties"] = [i for i, r in judged.items() if r["near_tie"]]
        t = res["stats"]
        why = SC.greedy_failure(res, k, fast_path=path == "fast")
        base = {"batch": len(reqs), "draft": k, "path": path}
        record("features_speculative", "greedy_identical_rows", res["identical_rows"] / res["rows"], threshold=1.0,
               comparator=">=", passed=not why, detail={**t, "verify_launches_at_k_plus_1": res["verify_launches"],
                                                   "method": "ngram", "max_tokens": n,
                                                   "differing_rows": H.jsonable(judged), "rule": NEAR_TIE_RULE},
               evidence={"plain": res["plain"], "speculative": res["speculative"]}, message=why, **base)
        record("features_speculative", "ngram_mean_acceptance_length", t["mean_acceptance_length"], status="info",
               detail={**t, "method": "ngram", "prompts": "eval documents" if H.tier_name(fp_tier) == "full"
                       else f"{SC.SMOKE_TEXT!r} + the model's own greedy continuation"}, **base)


def _spec_synthetic(k, sizes, fp_models, fp_tier, record, components, batch):
    """The synthetic drafter's acceptance length on the fast path, measured (labelled synthetic)."""
    fast = fp_models["fast"]
    target = max(1.0, SYNTHETIC_ACCEPTANCE * (k + 1))
    steps = sizes["synthetic_steps"]
    reqs = [GenerationRequest(prompt_ids=p, max_tokens=1 + int(target * steps), ignore_eos=True)
            for p in SC.prompts(fp_models["standard"], H.tier_name(fp_tier), batch)]
    cfg = {"method": "synthetic", "num_speculative_tokens": k, "acceptance_length": target}
    with trace.recording() as rec:
        out = SC.generate(fast, reqs, cfg)
    t = SC.totals(out)
    base = {"batch": len(reqs), "draft": k, "path": "fast"}
    launches = _record_drafts_verified("features_speculative", record, out, rec, k, base, components)
    record("features_speculative", "synthetic_mean_acceptance_length", t["mean_acceptance_length"], status="info",
           detail={**t, "method": "synthetic", "synthetic": True, "acceptance_length_set": target,
                   "verify_launches_at_k_plus_1": launches}, **base)


def _spec_sampled(k, sizes, fp_engine, fp_models, fp_gate, record, batch):
    """Second tokens sampled at temperature > 0 with drafts (the rejection sampler judged them) keep normal decoding's distribution: pooled G-test against softmax(logits / T) of the
    same path's teacher-forced logits, at alpha. On CPU the standard path draws them: a verify
    step takes seconds in Triton's interpreter, and the acceptance rule is the same code on both
    paths (optimized_model/k3/generate.py); the fast path's logits are the greedy rows' to check."""
    alpha = float(fp_gate("features_speculative").get("alpha", 0.001))
    path = "fast" if H.device_kind(fp_engine) == "cuda" else "standard"
    model = fp_models[path]
    tok = model.tokenizer
    prompt = SC.prompts(model, "smoke", 1)[0]
    draws = sizes["draws"]
    batch = min(draws, batch)
    # the synthetic drafter at full acceptance drafts the target's greedy continuation at every
    # step (an n-gram match after a random first token is rare): the rejection rule always judges
    drafter = {"method": "synthetic", "num_speculative_tokens": k, "acceptance_length": k + 1}
    pairs, t = SC.sampled_second_tokens(model, prompt, draws=draws, batch=batch, temperature=SPEC_TEMPERATURE,
                                        speculative=drafter, seed0=5_000_000)
    # the path's own decode logits (teacher-forced), as the sampling case: what its sampler draws from
    res = SC.distribution_test(model, prompt, pairs, SPEC_TEMPERATURE, getattr(tok, "n_real_tokens", None),
                               score=lambda seqs: H.score_teacher_forced(model, seqs, None, batch))
    verified = t["drafted"] > 0 and t["rows_without_statistics"] == 0
    ok = verified and len(pairs) >= 0.9 * draws and res.passed(alpha)
    why = ("no draft was proposed and verified: speculation never ran" if not verified else
           f"only {len(pairs)} second tokens of {draws}" if len(pairs) < 0.9 * draws else
           f"tokens sampled with drafts differ from softmax(logits / {SPEC_TEMPERATURE}): G={res.statistic:.1f} "
           f"df={res.df} p={res.p_value:.3g} < alpha={alpha}" if not ok else "")
    record("features_speculative", "sampled_g_test_p_value", res.p_value, threshold=alpha, comparator=">=",
           passed=ok, batch=batch, draft=k, path=path,
           detail={**t, "draws": len(pairs), "temperature": SPEC_TEMPERATURE, "alpha": alpha, "method": "synthetic",
                   "synthetic": True, "token": "second (the first verify step's)"},
           evidence=H.jsonable(res.as_dict()), message=why)


@pytest.mark.fastpath(kind="speculative", gate="features_speculative")
def test_speculative(case, fp_engine, fp_spec, fp_tier, fp_models, fp_gate, record):
    cfg = H.case_config(case)
    k, sizes = int(cfg["draft"]), _spec_sizes(fp_tier)
    # verify steps the fast path serves: batch x (K + 1) rows within the spec's max_verify_rows
    if cfg["check"] == "greedy":
        _spec_greedy(k, sizes, fp_models, fp_tier, record, fp_engine.components(),
                     H.verify_batch(fp_spec, fp_tier, k, sizes["batch"]))
    elif cfg["check"] == "synthetic":
        _spec_synthetic(k, sizes, fp_models, fp_tier, record, fp_engine.components(),
                        H.verify_batch(fp_spec, fp_tier, k, sizes["batch"]))
    elif cfg["check"] == "sampled":  # as many rows as fit: draws / batch generations
        _spec_sampled(k, sizes, fp_engine, fp_models, fp_gate, record, H.verify_batch(fp_spec, fp_tier, k, sizes["draws"]))
    else:
        raise ValueError(f"speculative check {cfg['check']!r}: the plan makes greedy, synthetic or sampled")
