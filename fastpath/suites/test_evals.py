"""Evals suite: MRCR (long context) and AIME25 (long generation) through lm-evaluation-harness,
paired between the fast path and the standard path (fastpath/evals).

One lm-eval evaluation per path runs both tasks on the same documents with the same per-request
seeds: standard, fast, the fp32 oracle, and the standard path re-batched (its requests in other
batches: the standard path's own batch noise, reported). Every plan case reads those runs:

evals/TASK/all   (per task, its documents pooled)
  evals_noninferiority     lower confidence bound of mean(fast - standard) > -margin
                           (exact binomial on discordant pairs for exact match, paired bootstrap
                           for MRCR's graded score; fastpath/evals/paired.py)
  evals_output_agreement   the fp32 oracle teacher-forced on each path's own generation: mean
                           |logprob(fast) - logprob(oracle)| over every generated token (position
                           0, the prefill's, left out) <= factor x the same for the standard path
                           (the noise floor of this run) + slack (fastpath/evals/rescoring.py)
  evals_generation_length  mean generated tokens fast / standard: its paired bootstrap CI over the
                           documents reaches into [min_ratio, max_ratio] (a few documents whose
                           lengths differ by chance widen it; a defect that stops every generation
                           early or lets it run on does not)
evals/mrcr/cB    (per MRCR prompt-length bucket B)
  evals_output_agreement   as above, over the bucket's documents
  evals_generation_length  as above, in the bucket
scores with their paired CI (buckets), shared-prefix share and identical-output rates: info rows

Agreement is judged against the fp32 oracle, as parity is: two correct low-precision paths each
stray from fp32 at different tokens, so their agreement with each other sits below either one's
agreement with fp32 (fast vs standard and standard vs re-batched standard are in the evidence).
Rescored, not compared along the shared prefix: two correct paths part at a near-tie, after which
a shared-prefix comparison sees nothing; rescoring each path's own output by the oracle sees every
token (the shared-prefix figures stay in the evidence and the prefix_fraction info rows).
On random weights every score is ~0 on both paths; the token-logprob rule still sees a decode
defect (tests/mutation: mla_past_512_dropped, caught here and by no other smoke suite).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from fastpath import progress, trace
from fastpath import suite_helpers as H
from fastpath.evals import MissingPackage, require_lm_eval

GATES = ["evals_noninferiority", "evals_output_agreement", "evals_generation_length"]


def _run_settings(spec, tier: str) -> dict:
    return {t: {"repeats": spec.evals[t][tier].get("repeats", 1), "max_gen_toks": spec.evals[t][tier]["max_gen_toks"]}
            for t in ("mrcr", "aime25")}


@pytest.fixture(scope="session")
def evals_run(fp_engine, fp_models, fp_spec, fp_tier, request, tmp_path_factory) -> dict:
    """The four lm-eval runs (once per session) and the sample logs in the bundle's artifacts."""
    try:
        require_lm_eval()
    except MissingPackage as exc:  # one line in every case's error row
        pytest.fail(f"{exc.cause}; fix: {exc.fix}", pytrace=False)
    from fastpath.evals import data, documents, run, samples, taskdir

    tier, ev = H.tier_name(fp_tier), fp_spec.evals
    t0 = time.monotonic()
    progress.note("loading the standard path")  # each path loads on first use: its note comes first
    std = fp_models["standard"]
    count = lambda msgs: len(std.tokenizer.apply_chat_template(msgs))  # noqa: E731
    work = tmp_path_factory.mktemp("evals")  # documents and laid-out tasks (pytest keeps the last few)
    spec_dir = Path(fp_spec.path).parent
    files = {"mrcr": data.write_jsonl(work / "mrcr.jsonl", documents.mrcr_docs(ev, tier, ev["seed"], count, spec_dir)),
             "aime25": data.write_jsonl(work / "aime25.jsonl", documents.aime_docs(ev, tier, ev["seed"], spec_dir))}
    tasks_dir = taskdir.lay_out(work)
    settings = _run_settings(fp_spec, tier)
    n_requests = sum(len(data.read_rows(f)) * settings[t]["repeats"] for t, f in files.items())

    def one(label: str, path: str, reverse: bool = False, max_batch: int | None = None):
        progress.note(f"lm-eval on {label}")
        return run.evaluate_path(label, fp_models[path], tasks_dir, files, settings,
                                 max_batch=max_batch or ev["max_batch"], max_prefill_tokens=ev["max_prefill_tokens"],
                                 seed=ev["seed"], reverse=reverse)

    runs = {"standard": one("standard", "standard")}
    with trace.recording() as rec:
        runs["fast"] = one("fast", "fast")
    runs["oracle"] = one("oracle", "oracle")
    budget = float(ev.get("budget_s") or 0)
    skipped = budget and time.monotonic() - t0 > budget
    if not skipped:  # the same requests in other batches: half as many per call, the other order
        runs["rebatched"] = one("standard re-batched", "standard", reverse=True,
                                max_batch=max(1, min(ev["max_batch"], n_requests) // 2))
    seconds = {k: round(r.seconds, 2) for k, r in runs.items()}
    rescored, seconds["oracle_rescoring"] = _rescore(fp_models["oracle"], runs, ev["max_prefill_tokens"])
    out = request.config.getoption("fastpath_artifacts", None)
    logs = {}
    if out:
        for label, r in runs.items():
            for name, t in r.tasks.items():
                logs[f"{label}/{name}"] = samples.write(Path(out) / "evals" / "samples" / label / f"{name}.jsonl",
                                                        t.samples)
    # generate never mixes prefill and decode (vLLM: a call's prompts fit one step's token budget):
    # a refusal other than "prefill" or one this machine explains (no_cuda on CPU) put standard
    # steps under "fast"
    refused = H.unexplained_refusals(rec, fp_engine)
    return {"runs": runs, "engaged": len(rec.engaged()), "refused": refused,
            "components": sorted({e.component for e in rec.engaged()}),
            "engine": H.engine_summary(fp_engine),  # after the loads: vLLM's engine_starts counts them
            "rebatched_skipped": bool(skipped), "seconds": seconds, "rescored": rescored,
            "sample_logs": logs, "data": {t: samples.sha256_text(Path(f).read_text(encoding="utf-8"))
                                          for t, f in files.items()}}


def _rescore(oracle, runs: dict, max_prefill_tokens: int | None) -> tuple[dict, float]:
    """{path: {key: deviations}} of the fast and standard generations, and the seconds it took."""
    from fastpath.evals import rescoring

    progress.note("oracle rescoring of the fast and standard generations")
    t0 = time.monotonic()
    rescored = rescoring.rescore(oracle, {p: runs[p].records for p in ("fast", "standard")}, max_prefill_tokens)
    return rescored, round(time.monotonic() - t0, 2)


# --------------------------------------------------------------------------- per case

def _keys(ev: dict, task: str, bucket: int | None) -> list[tuple]:
    """(lm-eval task, doc_id, repeat) of the case's samples (a bucket: its prompts' bucket)."""
    from fastpath.evals import mrcr, taskdir

    name = taskdir.TASK_NAMES[task]
    recs = ev["runs"]["standard"].records
    keys = sorted(k for k in recs if k[0] == name)
    if bucket is not None:
        keys = [k for k in keys if mrcr.bucket_of(recs[k]["prompt_tokens"]) == bucket]
    return keys


def _agreements(ev: dict, keys: list[tuple], a: str, b: str) -> list:
    from fastpath.evals.agreement import compare

    ra, rb = ev["runs"][a].records, ev["runs"][b].records
    return [compare(ra[k], rb[k]) for k in keys]


def _mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else math.nan


def _pair_summary(ev: dict, keys: list[tuple]) -> dict:
    pairs = {"fast~oracle": ("fast", "oracle"), "standard~oracle": ("standard", "oracle"),
             "fast~standard": ("fast", "standard")}
    if "rebatched" in ev["runs"]:
        pairs["standard~rebatched"] = ("standard", "rebatched")
    out = {}
    for label, (a, b) in pairs.items():
        ag = _agreements(ev, keys, a, b)
        devs = [d for x in ag for d in x.deviations]
        out[label] = {"identical_rate": _mean(x.identical for x in ag), "prefix_fraction": _mean(x.prefix_fraction for x in ag),
                      "mean_prefix_tokens": _mean(x.prefix for x in ag), "logprob_deviation": _mean(devs),
                      "positions": len(devs)}
    return out


def _rescored(ev: dict, path: str, keys: list[tuple]) -> list[float]:
    """The path's oracle-rescored deviations at every generated position of the case's keys."""
    return [d for k in keys for d in ev["rescored"][path].get(k, [])]


def _record_deviation(record, ev, gate: dict, keys: list[tuple], pairs: dict) -> None:
    from fastpath.evals import rescoring

    factor, slack = float(gate.get("factor", 4.0)), float(gate.get("slack", 0.002))
    j = rescoring.judge(_rescored(ev, "fast", keys), _rescored(ev, "standard", keys), factor, slack)
    value, floor = j["value"], j["floor"]
    fired = ev["engaged"] > 0 and not ev["refused"]
    ok = fired and j["passed"]
    msg = ("the fast path never engaged while generating on the fast model: the agreement would compare "
           "standard with itself" if not ev["engaged"] else
           f"the fast path refused decode steps of the fast run ({', '.join(ev['refused'][:5])})" if not fired else
           "the fast path generated no token past the first (nothing to compare)" if math.isnan(value) else
           "" if ok else f"mean |logprob(fast) - logprob(oracle)| over its {j['n']} generated tokens {value:.4g} > "
           f"{factor} x the standard path's {floor:.4g} + {slack}")
    record("evals_output_agreement", "logprob_deviation", value if not math.isnan(value) else None,
           threshold=j["threshold"], comparator="<=", passed=ok, message=msg, path="fast",
           detail={"agreement": value, "agreement_floor": floor, "n": j["n"], "floor_n": j["floor_n"],
                   "samples": len(keys), "factor": factor, "slack": slack,
                   "rule": "oracle-rescored fast <= factor * oracle-rescored standard + slack"},
           evidence=H.jsonable({"pairs": pairs, "fast_components": ev["components"], "refused": ev["refused"]}))


def _record_prefix_share(record, pairs: dict, n: int) -> None:
    """Information for a reviewer: the share of each generation shared with the oracle's."""
    record("evals_output_agreement", "prefix_fraction", pairs["fast~oracle"]["prefix_fraction"], status="info",
           passed=True, path="fast", detail={"agreement": pairs["fast~oracle"]["prefix_fraction"],
                                             "agreement_floor": pairs["standard~oracle"]["prefix_fraction"],
                                             "n": n, "pairs": pairs})


def _record_lengths(record, ev, gate: dict, keys: list[tuple], seed: int) -> None:
    from fastpath.evals import paired

    fast, std = ev["runs"]["fast"].records, ev["runs"]["standard"].records
    lo, hi = float(gate.get("min_ratio", 0.5)), float(gate.get("max_ratio", 2.0))
    r = paired.length_ratio([len(std[k]["token_ids"]) for k in keys], [len(fast[k]["token_ids"]) for k in keys],
                            confidence=float(gate.get("confidence", 0.95)),
                            n_resamples=int(gate.get("n_resamples", 4000)), seed=seed)
    detail = H.jsonable(r | {"min_ratio": lo, "max_ratio": hi,
                             "rule": "the ratio's CI reaches into [min_ratio, max_ratio] (outside it entirely: a defect)",
                             "fast_finish": _count(fast[k]["finish_reason"] for k in keys),
                             "standard_finish": _count(std[k]["finish_reason"] for k in keys)})
    why = (f"the fast path generates {r['estimate']:.3g}x the standard path's tokens (CI {r['ci_low']:.3g} - "
           f"{r['ci_high']:.3g} over {r['n']} documents)")
    record("evals_generation_length", "length_ratio_ci_high", r["ci_high"], threshold=lo, comparator=">=",
           path="fast", detail=detail, message=why if r["ci_high"] < lo else "")
    record("evals_generation_length", "length_ratio_ci_low", r["ci_low"], threshold=hi, comparator="<=",
           path="fast", detail=detail, message=why if r["ci_low"] > hi else "")


def _count(values) -> dict:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def _scores(ev: dict, task: str, keys: list[tuple], gate: dict, seed: int) -> dict:
    from fastpath.evals import paired, taskdir

    name = taskdir.TASK_NAMES[task]
    s, f = ev["runs"]["standard"].tasks[name], ev["runs"]["fast"].tasks[name]
    std = [s.scores[(k[1], k[2])] for k in keys]
    fast = [f.scores[(k[1], k[2])] for k in keys]
    return paired.judge(s.kind, std, fast, margin=float(gate.get("margin", 0.05)),
                        confidence=float(gate.get("confidence", 0.95)),
                        n_resamples=int(gate.get("n_resamples", 4000)), seed=seed) | {"metric": s.metric}


def _check_case(keys: list[tuple], case_id: str) -> None:
    if not keys:
        raise AssertionError(f"{case_id}: no eval sample falls in this case (documents of another size?)")


@pytest.mark.fastpath(kind="bucket", gates=GATES)
def test_bucket(case, evals_run, fp_gate, fp_spec, record):
    cfg = H.case_config(case)
    keys = _keys(evals_run, cfg["task"], int(cfg["context"]))
    _check_case(keys, H.case_id(case))
    pairs = _pair_summary(evals_run, keys)
    _record_deviation(record, evals_run, fp_gate("evals_output_agreement"), keys, pairs)
    _record_lengths(record, evals_run, fp_gate("evals_generation_length"), keys, fp_spec.evals["seed"])
    sc = _scores(evals_run, cfg["task"], keys, fp_gate("evals_noninferiority"), fp_spec.evals["seed"])
    record("evals_noninferiority", "score_difference", sc["estimate"], status="info", path="fast",
           threshold=-sc["margin"], comparator=">", passed=sc["passed"], detail=H.jsonable(sc),
           message="per bucket: reported (the gate pools the task's documents)")
    _record_prefix_share(record, pairs, len(keys))


@pytest.mark.fastpath(kind="task", gates=GATES)
def test_task(case, evals_run, fp_gate, fp_spec, record):
    cfg = H.case_config(case)
    keys = _keys(evals_run, cfg["task"], None)
    _check_case(keys, H.case_id(case))
    g = fp_gate("evals_noninferiority")
    sc = _scores(evals_run, cfg["task"], keys, g, fp_spec.evals["seed"])
    msg = "" if sc["passed"] else (f"{sc['metric']}: lower bound of mean(fast - standard) {sc['ci_low']:.4g} <= "
                                   f"-{sc['margin']} (estimate {sc['estimate']:.4g}, n {sc['n']})")
    record("evals_noninferiority", "score_difference_lower_bound", sc["ci_low"], threshold=-sc["margin"],
           comparator=">", passed=sc["passed"], path="fast", detail=H.jsonable(sc), message=msg,
           evidence=H.jsonable({"seconds": evals_run["seconds"], "sample_logs": evals_run["sample_logs"],
                                "data_sha256": evals_run["data"], "rebatched_skipped": evals_run["rebatched_skipped"],
                                "engine": evals_run["engine"]}))
    pairs = _pair_summary(evals_run, keys)
    _record_deviation(record, evals_run, fp_gate("evals_output_agreement"), keys, pairs)
    _record_prefix_share(record, pairs, len(keys))
    _record_lengths(record, evals_run, fp_gate("evals_generation_length"), keys, fp_spec.evals["seed"])
