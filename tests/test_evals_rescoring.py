"""Oracle rescoring (fastpath/evals/rescoring.py): the oracle teacher-forced on each path's own
generation, in calls of bounded size, and the deviation rule it feeds."""

from __future__ import annotations

import math

import pytest
import torch
from suite_modules import load_suite

from fastpath.evals import rescoring
from fastpath.evals.agreement import compare

VOCAB = 8


def next_token_logprob(position: int) -> float:
    """The fake oracle's log-probability of the true token at ``position`` (distinct per position,
    so a row taken one off gives another value)."""
    return -0.1 * position


class FakeOracle:
    """``Model.score`` of a model that gives the sequence's own next token
    exp(next_token_logprob(j + 1)) at row j, the rest spread evenly; records each call."""

    def __init__(self):
        self.calls: list[list[int]] = []

    def score(self, token_ids: list[list[int]], prefill_len: int | None = None) -> list[torch.Tensor]:
        assert prefill_len is None  # a pure prefill: the oracle is the judge, not under test
        self.calls.append([len(s) for s in token_ids])
        return [self._logits(seq) for seq in token_ids]

    @staticmethod
    def _logits(seq: list[int]) -> torch.Tensor:
        rows = torch.zeros(len(seq), VOCAB)
        for j in range(len(seq) - 1):
            p = math.exp(next_token_logprob(j + 1))
            rows[j] = math.log((1 - p) / (VOCAB - 1))
            rows[j, seq[j + 1]] = math.log(p)
        return rows


def record(prompt: list[int], tokens: list[int], logprobs: list[float]) -> dict:
    return {"prompt_ids": prompt, "token_ids": tokens, "logprobs": logprobs}


def test_deviations_are_taken_against_the_oracles_logprob_of_each_generated_token():
    prompt, tokens = [1, 2, 3], [4, 5, 6, 7]
    path_lp = [-9.0, -0.5, -0.2, -1.0]  # position 0 (the prefill's) is left out, whatever it is
    out = rescoring.rescore(FakeOracle(), {"fast": {"k": record(prompt, tokens, path_lp)}}, None)
    # token i sits at position 3 + i: the oracle gives it next_token_logprob(3 + i)
    expected = [abs(path_lp[i] - next_token_logprob(3 + i)) for i in (1, 2, 3)]
    assert out["fast"]["k"] == pytest.approx(expected, abs=1e-6)


def test_sequences_are_scored_in_groups_within_max_prefill_tokens():
    oracle = FakeOracle()
    gen = [0, 1, 2]
    recs = {i: record([5] * (n - len(gen)), gen, [-1.0] * len(gen)) for i, n in enumerate([10, 8, 6, 30, 4])}
    recs["one token"] = record([5] * 40, [1], [-1.0])  # nothing past position 0: never scored
    out = rescoring.rescore(oracle, {"fast": recs}, max_prefill_tokens=20)
    # longest first; a group holds count x longest <= 20 tokens; the 30-token sequence goes alone
    assert oracle.calls == [[30], [10, 8], [6, 4]]
    assert out["fast"]["one token"] == [] and all(len(out["fast"][i]) == 2 for i in range(5))


def test_groups_mix_paths_and_keep_them_apart():
    oracle = FakeOracle()
    runs = {"fast": {"k": record([1, 2], [3, 4, 5], [0.0, -0.3, -0.4])},
            "standard": {"k": record([1, 2], [3, 6, 7], [0.0, -0.4, -0.5])}}
    out = rescoring.rescore(oracle, runs, max_prefill_tokens=100)
    assert oracle.calls == [[5, 5]]
    assert out["fast"]["k"] == pytest.approx([0.0, 0.0], abs=1e-6)
    assert out["standard"]["k"] == pytest.approx([0.1, 0.1], abs=1e-6)


def test_the_rule_catches_a_defect_the_shared_prefix_rule_missed():
    """The fast generation parts from the oracle's at token 1 (a near-tie), and its later
    log-probabilities are off by 0.5: the shared prefix holds none of those tokens, so the old
    rule saw only a short exact document; rescoring sees every one."""
    oracle_gen = [4, 5, 6, 7, 1, 2]
    prompt = [1, 2, 3]
    oracle_lp = [0.0] + [next_token_logprob(3 + i) for i in range(1, 6)]
    std_lp = [v - 0.01 for v in oracle_lp]  # a correct standard path: close to fp32 everywhere
    parted = [4, 6, 7, 1, 2, 3]
    fast_lp = [0.0] + [next_token_logprob(3 + i) - 0.5 for i in range(1, 6)]
    short = [4, 5, 6]  # a second document the fast path gets exactly right
    short_lp = [0.0] + [next_token_logprob(3 + i) for i in (1, 2)]
    fast = {"a": record(prompt, parted, fast_lp), "b": record(prompt, short, short_lp)}
    standard = {"a": record(prompt, oracle_gen, std_lp), "b": record(prompt, short, [v - 0.01 for v in short_lp])}
    oracle_run = {"a": record(prompt, oracle_gen, oracle_lp), "b": record(prompt, short, short_lp)}
    factor, slack = 4.0, 0.002

    def shared_prefix(path: dict) -> list[float]:
        return [d for k in ("a", "b") for d in compare(path[k], oracle_run[k]).deviations]

    old = rescoring.judge(shared_prefix(fast), shared_prefix(standard), factor, slack)
    assert old["passed"] and old["n"] == 2  # only document b's two tokens were compared

    out = rescoring.rescore(FakeOracle(), {"fast": fast, "standard": standard}, max_prefill_tokens=64)
    new = rescoring.judge([d for k in ("a", "b") for d in out["fast"][k]],
                          [d for k in ("a", "b") for d in out["standard"][k]], factor, slack)
    assert new["n"] == 7 and new["floor"] == pytest.approx(0.01, abs=1e-6)
    assert not new["passed"] and new["value"] == pytest.approx(5 * 0.5 / 7, abs=1e-6)


def test_a_fast_path_with_nothing_to_judge_does_not_pass():
    j = rescoring.judge([], [0.01, 0.02], 4.0, 0.002)
    assert math.isnan(j["value"]) and not j["passed"]
    assert rescoring.judge([0.05], [], 4.0, 0.002)["threshold"] == pytest.approx(0.002)


def _rows(ev: dict, keys: list) -> list[dict]:
    suite = load_suite("evals")
    rows = []
    suite._record_deviation(lambda gate, metric, value, **kw: rows.append({"metric": metric, "value": value, **kw}),
                            ev, {"factor": 4.0, "slack": 0.002}, keys, pairs={})
    return rows


def test_the_suite_gates_the_rescored_deviations_of_the_cases_keys():
    ev = {"engaged": 3, "refused": [], "components": ["mla_decode"],
          "rescored": {"fast": {"a": [0.5] * 5, "b": [0.0, 0.0], "other case": [9.0]},
                       "standard": {"a": [0.01] * 5, "b": [0.01, 0.01], "other case": [9.0]}}}
    [row] = _rows(ev, ["a", "b"])
    assert row["metric"] == "logprob_deviation" and not row["passed"]
    assert row["detail"]["n"] == 7 and row["value"] == pytest.approx(2.5 / 7)
    assert row["message"].startswith("mean |logprob(fast) - logprob(oracle)| over its 7 generated tokens")
    [row] = _rows(ev, ["b"])
    assert row["passed"] and row["message"] == ""
    [row] = _rows(ev | {"engaged": 0}, ["b"])
    assert not row["passed"] and "never engaged" in row["message"]
    [row] = _rows(ev | {"rescored": {"fast": {"b": []}, "standard": {"b": [0.01]}}}, ["b"])
    assert not row["passed"] and "nothing to compare" in row["message"] and row["value"] is None
