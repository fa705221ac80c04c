"""The validation suites against the test-double engine (tests/doubles/tiny_lm/), and their
helpers. The defect-by-defect proof is the mutation self-test (tests/mutation/)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fastpath import jitter

from suite_modules import load_suite

REPO = Path(__file__).resolve().parent.parent
DOUBLE_SPEC = REPO / "tests" / "doubles" / "tiny_lm" / "spec.toml"


def _suite(name: str):
    return load_suite(name)


kernels = _suite("kernels")
parity = _suite("parity")
coverage = _suite("coverage")


def test_context_out_of_scope_fallback_drives_a_decode_past_max_context():
    class Model:
        def decode_step(self, batch, context, draft=0):
            return ("decode", batch, context, draft)

    cfg = {"fallback": "context_out_of_scope", "reason": "context_out_of_scope", "batch": 1, "context": 16,
           "out_of_scope_batch": 65, "out_of_scope_context": 32769}
    step, shape = coverage._fallback_step(Model(), cfg)
    assert step == ("decode", 1, 32769, 0) and shape == {"batch": 1, "context": 32769}


def test_max_error_and_nonfinite_rules():
    o = torch.tensor([1.0, float("-inf"), 3.0])
    assert kernels.max_error(torch.tensor([1.5, float("-inf"), 3.0]), o) == pytest.approx(0.5)
    # a masked (-inf) oracle entry must be matched exactly
    assert kernels.max_error(torch.tensor([1.0, 0.0, 3.0]), o) == math.inf
    assert kernels.max_error(torch.tensor([1.0, float("-inf"), float("nan")]), o) == math.inf
    assert kernels.max_error(torch.zeros(2), torch.zeros(3)) == math.inf
    assert kernels.nonfinite_where_oracle_finite(torch.tensor([float("nan"), float("-inf"), 1.0]), o) == 1


def test_max_error_in_chunks_is_the_whole_float64_maximum(monkeypatch):
    monkeypatch.setattr(kernels, "CHUNK", 7)  # several chunks, the last one partial
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(5, 11, generator=g)
    got = (ref + 1e-3 * torch.randn(5, 11, generator=g)).to(torch.bfloat16)
    want = (got.double() - ref.double()).abs().max().item()
    assert kernels.max_error((got, ref), (ref, ref)) == want
    ref[4, 10] = float("-inf")  # the last chunk's last element: masked in the oracle only
    assert kernels.max_error(got, ref) == math.inf
    got = ref.clone()
    got[0, 3] = float("inf")  # infinite where the oracle is finite
    assert kernels.max_error(got, ref) == math.inf


def test_bitwise_diff_sees_signed_zero_and_nan():
    a = torch.tensor([0.0, float("nan"), 1.0])
    assert kernels.bitwise_diff(a, a.clone()) == 0
    assert kernels.bitwise_diff(a, torch.tensor([-0.0, float("nan"), 1.0])) == 1
    assert kernels.bitwise_diff(a, torch.tensor([0.0, float("nan"), 1.0 + 1e-7])) == 1


def test_smoke_shape_selection_keeps_edges_and_a_tail():
    shapes = [{"m": 1, "n": 64}, {"m": 2, "n": 64}, {"m": 3, "n": 67}, {"m": 4, "n": 128}, {"m": 64, "n": 256}]
    pick = kernels.select_shapes(shapes, "smoke")
    assert pick == [shapes[0], shapes[2], shapes[-1]]
    assert kernels.select_shapes(shapes, "full") == shapes


def test_parity_top1_rule_is_an_exact_paired_test_no_single_flip_decides():
    from fastpath.parity_rules import top1_verdict

    ok = np.ones(100, dtype=bool)
    one_flip = ok.copy()
    one_flip[7] = False
    v = top1_verdict(one_flip, ok, min_agreement=0.999, alpha=0.001)  # below min_agreement, yet:
    assert v["passed"] and v["fast_only_wrong"] == 1 and v["p_value"] == 0.5
    nine, ten = ok.copy(), ok.copy()
    nine[:9], ten[:10] = False, False
    assert top1_verdict(nine, ok, min_agreement=0.999, alpha=0.001)["passed"]
    v = top1_verdict(ten, ok, min_agreement=0.999, alpha=0.001)
    assert not v["passed"] and v["p_value"] < 0.001 and v["value"] < v["threshold"]
    assert top1_verdict(ten, ok, min_agreement=0.9, alpha=0.001)["passed"]  # the cap
    # flips on both sides cancel: the floor itself is noisy
    std = ok.copy()
    std[10:20] = False
    assert top1_verdict(ten, std, min_agreement=0.999, alpha=0.001)["passed"]


def test_parity_kl_slack_shrinks_with_the_positions():
    from fastpath.parity_rules import kl_verdict

    rng = np.random.default_rng(0)
    floor = rng.exponential(1e-5, 4000)
    honest = floor * rng.uniform(0.5, 2.0, 4000)
    slacks = [kl_verdict(honest[:n], floor[:n], factor=3.0, alpha=0.001)["slack"] for n in (100, 400, 4000)]
    assert slacks[0] > slacks[1] > slacks[2] > 0
    assert kl_verdict(honest, floor, factor=3.0, alpha=0.001)["passed"]
    assert not kl_verdict(4 * floor, floor, factor=3.0, alpha=0.001)["passed"]  # 4x the floor everywhere
    # a broken path's scattered KL does not widen its own room: the slack is the floor's
    scattered = np.where(np.arange(4000) % 50 == 0, 300 * floor, floor)
    v = kl_verdict(scattered, floor, factor=3.0, alpha=0.001)
    assert not v["passed"] and v["slack"] == kl_verdict(floor, floor, factor=3.0, alpha=0.001)["slack"]
    assert not kl_verdict(np.array([1e-5, np.inf]), np.array([1e-5, 1e-5]), factor=3.0, alpha=0.001)["passed"]
    # equal to float rounding with a floor of exactly 0 (fp32 standard and oracle, as on vLLM's CPU build)
    zero = np.zeros(40)
    assert kl_verdict(np.full(40, 2.7e-13), zero, factor=4.0, alpha=0.001)["passed"]
    assert not kl_verdict(np.full(40, 1e-6), zero, factor=4.0, alpha=0.001)["passed"]


def test_parity_kl_is_not_decided_by_a_handful_of_positions():
    """One routing near-tie flip (KL ~1e3 x the floor at one position) must not fail a correct
    fast path; ten such positions, the least the top-1 rule needs to fail, must."""
    from fastpath.parity_rules import kl_verdict, outliers_allowed

    rng = np.random.default_rng(1)
    floor = rng.exponential(1e-5, 118)
    honest = floor * rng.uniform(0.5, 2.0, 118)
    one_flip = honest.copy()
    one_flip[7] = 0.06  # as seen on the smoke tier: 46 x the floor in the mean of 118 positions
    v = kl_verdict(one_flip, floor, factor=3.0, alpha=0.001)
    assert v["passed"] and v["left_out"] == outliers_allowed(0.001, 118) == 9 and v["largest"][0] == 0.06
    assert v["mean_all"] > 40 * v["floor_all"]  # the untrimmed mean would have failed
    ten = honest.copy()
    ten[:10] = 0.06
    assert not kl_verdict(ten, floor, factor=3.0, alpha=0.001)["passed"]
    # at most a tenth of the positions is left out: with 40 positions, 4
    assert outliers_allowed(0.001, 40) == 4 and outliers_allowed(0.001, 5) == 0


def test_parity_buckets_cross_every_tuning_boundary_and_run_a_long_horizon():
    assert parity.crossing_batches([1, 2, 8], 64) == [1, 2, 3, 8, 9]
    assert parity.crossing_batches([1, 2, 4, 8, 16, 32, 64], 64) == [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64]
    scope = [1, 2, 4, 8, 16, 32, 64]
    assert parity.ladder_sizes([1, 2, 8], scope, 64) == [1, 2, 3, 8, 9]
    assert parity.ladder_sizes([], [1, 2, 4], 64) == [1, 2, 4]  # no buckets named: the scope's sizes
    assert parity.ladder_sizes([1, 2, 4, 8, 16, 32], scope, 1024, 32768) == [1, 2, 3, 4, 5, 8, 9, 16, 17, 32]
    assert parity.ladder_sizes([1, 2, 4, 8, 16, 32], scope, 32768, 32768) == [1]
    # smoke: one 32-step continuation, the others share the rest of 100 positions
    groups = parity.bucket_groups([1, 2, 3, 8, 9], 64, 100, 32)
    assert groups[0] == (1, 32) and {s for _, s in groups[1:]} == {4}
    assert sum(b * s for b, s in groups) >= 100
    assert parity.bucket_groups([1, 2, 3, 8, 9], 16, 100, 32)[0] == (1, 8)  # at most half the context
    assert parity.bucket_groups([1], 32768, 2048, 512) == [(1, 2048)]  # a lone group reaches the tokens
    for ctx, sizes in ((1024, [1, 2, 3, 4, 5, 8, 9, 16, 17, 32]), (8192, [1, 2, 3, 4])):
        groups = parity.bucket_groups(sizes, ctx, 2048, 512)
        assert groups[0] == (1, 512) and sum(b * s for b, s in groups) >= 2048


def test_score_teacher_forced_calls_the_model_once_per_group():
    from fastpath import suite_helpers as H

    calls = []

    class Model:
        def score(self, chunk, prefill_len):
            calls.append((len(chunk), prefill_len))
            return [f"row{len(calls)}.{j}" for j in range(len(chunk))]

    seqs = [[1, 2, 3]] * 4 + [[1, 2]]
    out = H.score_teacher_forced(Model(), seqs, None, groups=[1, 2, 2])
    assert calls == [(1, 2), (2, 2), (2, 1)] and len(out) == 5
    calls.clear()
    H.score_teacher_forced(Model(), seqs, 0, max_batch=2)
    assert calls == [(2, 0), (2, 0), (1, 0)]
    with pytest.raises(ValueError, match="do not split 5 sequences"):
        H.score_teacher_forced(Model(), seqs, 0, groups=[2, 2])


def _racy(out: list) -> list:
    """Writes its result from a worker thread and does not wait for it (a planted race)."""
    res = [0]

    def work():
        res[0] = 42

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=0.001)
    out.append(res[0])
    return out


def test_jitter_reveals_a_race_and_restores_state():
    switch = sys.getswitchinterval()
    run = threading.Thread.run
    calm = [_racy([])[0] for _ in range(5)]
    with jitter.stress(seed=1) as j:
        stressed = [j.call(_racy, [])[0] for _ in range(5)]
    time.sleep(0.05)
    assert 0 in stressed, "the jitter stress did not delay the worker thread"
    assert calm.count(42) >= 4, "without stress the racy helper should normally win the race"
    assert sys.getswitchinterval() == switch and threading.Thread.run is run and not jitter.is_active()


def test_jitter_leaves_correct_code_alone():
    x = torch.randn(64, 64)
    ref = x @ x
    with jitter.stress(seed=2) as j:
        for _ in range(3):
            assert torch.equal(j.call(torch.matmul, x, x), ref)


@pytest.fixture(scope="module")
def double_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("double") / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "tests" / "doubles")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    proc = subprocess.run([sys.executable, "-m", "fastpath.cli", "verify", str(DOUBLE_SPEC), "--tier", "smoke",
                           "--only", "coverage,kernels", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for f in sorted((out / "state" / "rows").glob("*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]
    plan = json.loads((out / "state" / "plan.json").read_text())
    return proc, rows, plan


def test_double_coverage_and_kernels_pass_and_cover_the_plan(double_run):
    proc, rows, plan = double_run
    failing = [r for r in rows if r["status"] in ("fail", "error")]
    assert not failing, failing[:3]
    ids = {r["case_id"] for r in rows}
    planned = {c["case_id"] for c in plan["cases"] + [w for w in plan["waivers"]] if c["suite"] in ("coverage", "kernels")}
    assert planned and planned <= ids, planned - ids
    gates = {r["gate"] for r in rows if r["status"] == "pass"}
    assert {"coverage_fast_path_fired", "coverage_clean_fallback", "kernels_noise_floor", "kernels_finite",
            "kernels_deterministic", "kernels_jitter"} <= gates


def test_double_coverage_matrix_in_rows(double_run):
    _, rows, _ = double_run
    fired = [r for r in rows if r["gate"] == "coverage_fast_path_fired"]
    cells = {(r["case_id"], r["component"]): json.loads(r["detail"])["cell"] for r in fired}
    assert cells[("coverage/decode/b4-c16-d0", "gemv")] == "splitk"
    assert cells[("coverage/decode/b1-c16-d0", "gemv")] == "smallm"
    fb = [r for r in rows if r["gate"] == "coverage_clean_fallback" and r["case_id"].endswith("/prefill")]
    assert fb and all(json.loads(r["detail"])["cell"] == "refused:prefill" for r in fb)
    assert "coverage_matrix" in json.loads(fired[0]["evidence"])
    # per layer: the double's block (layer 0) is declared and named by its events
    detail = json.loads(next(r for r in fired if r["component"] == "gemv")["detail"])
    assert detail["layers_declared"] == [0] and detail["layers_engaged"] == [0]
    head = json.loads(next(r for r in fired if r["component"] == "lm_head")["detail"])
    assert head["layers_declared"] is None
    # no Triton interpreter in the double: the CPU second source is a visible waiver
    launch = [r for r in rows if r["gate"] == "coverage_profiler_kernels" and "/decode/" in r["case_id"]]
    assert launch and all(r["status"] == "waived" and "interpreter" in r["message"] for r in launch)


def test_kernels_unnamed_case_tests_what_the_spec_list_leaves_out():
    """``[kernels] names`` splits the suite into cases; a registered kernel the list omits is
    tested in the ``unnamed`` case, and with none omitted that case says so in a passing row."""
    from types import SimpleNamespace

    class Kernel(SimpleNamespace):
        def make_inputs(self, shape, vc, dtype, dev, seed):
            return {"x": torch.full((shape["n"],), 1.5, dtype=torch.float32)}

    def entry(name):
        return Kernel(name=name, component="c", fast=lambda x: x * 2, standard=lambda x: x * 2,
                      oracle=lambda x: x + x, shapes=[{"n": 4}], value_classes=["normal"],
                      dtypes=["float32"], deterministic=True, kernel_patterns=[])

    engine = SimpleNamespace(kernels=lambda: [entry("gemv"), entry("kda")],
                             info=lambda: {"device": "cpu", "dtype": "float32"})

    def run(config):
        rows = []
        kernels.test_kernel({"case_id": "kernels/kernel/unnamed-float32", "config": config}, engine,
                            {"name": "smoke"}, lambda gate: {}, lambda gate, metric, value, **kw:
                            rows.append({"gate": gate, "metric": metric, "value": value, **kw}), None)
        return rows

    rows = run({"kernel": None, "except": ["gemv"], "dtype": "float32"})
    assert {r.get("kernel") for r in rows} == {"kda"}  # the omitted kernel, every gate
    assert {r["gate"] for r in rows} >= {"kernels_noise_floor", "kernels_finite", "kernels_deterministic"}
    [row] = run({"kernel": None, "except": ["gemv", "kda"], "dtype": "float32"})
    assert (row["metric"], row["value"], row["threshold"]) == ("unnamed_kernels", 0, 0)
