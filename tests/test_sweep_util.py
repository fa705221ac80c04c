"""The helpers of the GPU scripts (scripts/sweep_util.py): table patches (gpu_table_ab.py's
variants, gpu_step_timeline.py's --patch) and the logit comparison (gpu_table_ab.py,
gpu_pdl_check.py)."""

import copy
import sys
from pathlib import Path

import math

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import sweep_util as S  # noqa: E402


def _table():
    return {"device": "X", "kernels": {"k": {"buckets": [{"max_batch": 1, "a": 1}, {"max_batch": 64, "a": 2}]}}}


def test_parse_variant_and_its_errors_name_the_problem():
    assert S.parse_variant('v={"k": {"a": 3}}') == ("v", {"k": {"a": 3}})
    with pytest.raises(SystemExit, match="expected NAME=JSON"):
        S.parse_variant('{"k": {"a": 3}}')
    with pytest.raises(SystemExit, match="not JSON"):
        S.parse_variant("v={k: 1}")
    with pytest.raises(SystemExit, match="kernel: "):
        S.parse_variant('v={"k": 3}')


def test_apply_patch_changes_only_the_bucket_serving_the_batch_and_resets_first():
    table = _table()
    base = copy.deepcopy(table["kernels"])
    S.apply_patch(table, base, {"k": {"a": 9}}, batch=8)
    assert [b["a"] for b in table["kernels"]["k"]["buckets"]] == [1, 9]
    S.apply_patch(table, base, {"k": {"b": 5}}, batch=1)  # the previous patch is gone
    assert table["kernels"]["k"]["buckets"] == [{"max_batch": 1, "a": 1, "b": 5}, {"max_batch": 64, "a": 2}]
    S.apply_patch(table, base, {"k": {"a": 0}}, batch=128)  # beyond the last bucket: the last
    assert table["kernels"]["k"]["buckets"][-1]["a"] == 0
    assert base == _table()["kernels"]
    with pytest.raises(SystemExit, match="'nope'"):
        S.apply_patch(table, base, {"nope": {"a": 1}}, batch=1)


def test_max_finite_diff_skips_the_masked_entries():
    inf = float("inf")
    a = torch.tensor([1.0, -inf, 3.0, float("nan")])
    b = torch.tensor([1.5, -inf, 2.0, 7.0])
    assert S.max_finite_diff(a, b) == 1.0
    assert math.isnan(S.max_finite_diff(torch.tensor([-inf]), torch.tensor([-inf])))
