"""The helpers of the lab tools in lab/sweep_util.py: the logit comparison (gpu_table_ab.py,
gpu_pdl_check.py) and the teacher-forced decoding of gpu_oracle_ab.py and gpu_parity_noise.py.
(The table patches moved to fastpath.measure: tests/test_measure.py.)"""

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any fast kernel module is imported (the last test)

import torch

from lab import sweep_util as S  # noqa: E402


def test_max_finite_diff_skips_the_masked_entries():
    inf = float("inf")
    a = torch.tensor([1.0, -inf, 3.0, float("nan")])
    b = torch.tensor([1.5, -inf, 2.0, 7.0])
    assert S.max_finite_diff(a, b) == 1.0
    assert math.isnan(S.max_finite_diff(torch.tensor([-inf]), torch.tensor([-inf])))


def test_teacher_forced_decoding_of_the_standard_and_fast_paths():
    """gpu_oracle_ab.py / gpu_parity_noise.py on the tiny model: the inputs are reproducible,
    the start state is never modified, a split batch computes the same logits, and a
    FastDecoder decodes through the same helper (within the interpreter's fp32 noise)."""
    import torch

    from optimized_model.k3.fast import dispatch
    from optimized_model.k3.model import K3Model

    m = K3Model.build("tiny", device="cpu", dtype=torch.float32, seed=0)
    tokens, start = S.teacher_forced_inputs(m, 3, 10, 4)
    again, _ = S.teacher_forced_inputs(m, 3, 10, 4)
    assert tokens.shape == (4, 3) and torch.equal(tokens, again) and int(tokens.max()) < m.cfg.n_real_tokens
    assert start.capacity == 64 and start.max_len == 10
    before = start.clone()
    y = S.decode_teacher_forced(m, tokens, start)
    assert y.shape == (4, 3, m.cfg.n_real_tokens) and y.dtype == torch.float32
    assert all(torch.equal(a, b) for a, b in zip(start.tensors(), before.tensors()))
    torch.testing.assert_close(S.decode_teacher_forced(m, tokens, start, split=1), y)
    fd = dispatch.build_fast_decoder(m, lambda b, c: m.new_state(b, c))
    yf = S.decode_teacher_forced(fd, tokens, start)
    c = S.compare_logits(yf, y)
    assert c["top1"] == 1.0 and c["max_diff"] < 1e-3 and 0 <= c["kl"] < 1e-6
    assert S.compare_logits(y, y) == dict(max_diff=0.0, mean_diff=0.0, top1=1.0, kl=0.0)


def _table(device: str, **kernels) -> dict:
    return {"device": device, "kernels": {k: {"buckets": b} for k, b in kernels.items()}}


def test_another_tables_settings_become_variants_kernel_by_kernel_and_all_at_once():
    mine = _table("default", gemv=[{"max_batch": 4, "BLOCK_N": 32, "prefetch": 1}, {"max_batch": 64, "BLOCK_N": 64}],
                  kda=[{"max_batch": 64, "BLOCK_V": 0}], sampler=[{"max_batch": 64, "variant": "triton"}],
                  only_mine=[{"max_batch": 64, "x": 1}])
    other = _table("h200", gemv=[{"max_batch": 2, "BLOCK_N": 128, "note": "why"}, {"max_batch": 64, "BLOCK_N": 64}],
                   kda=[{"max_batch": 64, "BLOCK_V": 32, "early": 1}], sampler=[{"max_batch": 64, "variant": "triton"}])
    # batch 2: gemv is served by mine's 4-row and other's 2-row bucket; sampler's are equal
    assert S.variants_like(mine, other, 2) == [
        ("like:gemv", {"gemv": {"BLOCK_N": 128}}), ("like:kda", {"kda": {"BLOCK_V": 32, "early": 1}}),
        ("like:all", {"gemv": {"BLOCK_N": 128}, "kda": {"BLOCK_V": 32, "early": 1}})]
    # batch 64: only kda differs, so no "all"; past every bucket the last one serves
    assert S.variants_like(mine, other, 64) == [("like:kda", {"kda": {"BLOCK_V": 32, "early": 1}})]
    assert S.variants_like(mine, other, 128) == S.variants_like(mine, other, 64)
    assert S.variants_like(mine, mine, 8) == []


def test_the_committed_tables_as_variants_reach_the_other_tables_settings():
    """The like:all variant, applied as gpu_table_ab applies it, leaves the default table's serving
    bucket with the H200 table's value of every field the H200 bucket sets."""
    import copy

    from fastpath.measure import patched
    from optimized_model.k3.fast import tuning

    mine = copy.deepcopy(tuning.tables()["default"])
    other = tuning.tables()["NVIDIA H200"]
    for batch in (1, 2, 8, 64):
        variants = S.variants_like(mine, other, batch)
        assert variants and variants[-1][0] == "like:all"
        with patched(mine, variants[-1][1], batch):
            for kernel in variants[-1][1]:
                got, want = S.serving_bucket(mine, kernel, batch), S.serving_bucket(other, kernel, batch)
                assert all(got[k] == v for k, v in want.items() if k not in ("max_batch", "note")), (batch, kernel)
