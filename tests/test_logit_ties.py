"""lab.logit_ties: what rounding the logits to bf16 alone does to the top-1 token."""

import numpy as np

from lab.logit_ties import rounding_flips


def test_close_call_above_bf16_resolution_flips_to_the_lower_id():
    # 22.01 and 22.05 both round to 22.0 in bf16 (step 0.125 there): a tie, argmax takes id 0
    logits = np.array([[22.01, 22.05, 1.0], [1.0, 30.0, 2.0]], dtype=np.float32)
    r = rounding_flips(logits)
    assert r["positions"] == 2
    assert r["flipped"] == 0.5 and r["tied"] == 0.5
    assert r["gap_below_0.125"] == 0.5


def test_clear_calls_do_not_flip():
    logits = np.array([[0.0, 5.0, -np.inf], [9.0, 1.0, -np.inf]], dtype=np.float32)
    r = rounding_flips(logits)
    assert r["flipped"] == 0.0 and r["tied"] == 0.0
