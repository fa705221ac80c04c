"""The fast path's tuning tables are checked when they are loaded: every shipped table loads, and
a bad value fails at load with one line naming the file, the key and what is allowed."""

import json
import re

import pytest

from optimized_model.k3.fast import tuning
from optimized_model.k3.fast.tuning import TableError


def test_every_shipped_table_loads():
    names = {p.name for p in tuning.TABLE_DIR.glob("*.json")}
    assert {"default.json", "nvidia_h200.json", "cpu_interpreter.json"} <= names
    for name in sorted(names):
        table = tuning.load_table(tuning.TABLE_DIR / name)
        assert table["kernels"], name


# key in nvidia_h200.json's "kernels" (dotted; a number indexes a list) → (a bad value, what the
# message must say after "KEY = VALUE: " — or after "KEY: " for an unknown field or kernel)
BAD = {
    "gemv.buckets.0.BLOCK_N": (7, "must be a power of two"),
    "gemv.buckets.1.num_warps": ("4", "must be one of 1, 2, 4, 8, 16, 32"),
    "gemv.buckets.0.SPLIT_K": ("many", 'must be "auto" or an integer >= 1'),
    "gemv.buckets.0.variant": ("cublas", "must be one of 'triton', 'cute'"),
    "gemv.buckets.0.overrides.0.epilogue": ("gelu", "must be one of 'none', 'residual', 'swiglu', 'sigmoid_gate'"),
    "kda_decode.buckets.0.low_rank_gates": ("both", "must be one of 'fused', 'gemv'"),
    "moe_experts.buckets.1.slot_sum": ("nowhere", "must be one of 'down', 'latent_up'"),
    # the last bucket serves batch 64: beyond what the down kernel can sum
    "moe_experts.buckets.3.slot_sum": ("down", "the down kernel sums the slots for at most 4 tokens"),
    "moe_schedule.buckets.0.shared_in": ("both", "must be one of 'fused', 'separate'"),
    "launch.buckets.0.pdl": ("sometimes", "must be one of 'all', 'outside_moe', 'off'"),
    "l2_prefetch.buckets.0.kda_o": (1.5, "must be a fraction of the weight, 0 to 1"),
    "launch.buckets.1.max_batch": (1, "must be larger than the previous bucket's 1"),
    # unknown names: the message lists the known ones
    "l2_prefetch.buckets.0.kda_out": (1.0, "unknown field; known: chunk, kda_o, max_batch, mla_o, "
                                           "moe_up, next_in, note, per_program"),
    "mla_decode.buckets.0.BLOCK_HH": (32, "unknown field; known: BLOCK_H, BLOCK_T"),
    "gemm": ({"buckets": [{"max_batch": 64}]}, "unknown kernel; known: gemv, kda_decode, l2_prefetch"),
}


def _expected(key: str, value, allowed: str) -> str:
    key = re.sub(r"\.(\d+)", r"[\1]", key)  # as the message writes it: buckets[0]
    shown = key if allowed.startswith("unknown") else f"{key} = {value!r}"
    return f"tuning table nvidia_h200.json: kernels.{shown}: {allowed}"


@pytest.mark.parametrize("key", list(BAD))
def test_a_bad_value_fails_at_load_naming_file_key_and_allowed(tmp_path, key):
    value, allowed = BAD[key]
    table = json.loads((tuning.TABLE_DIR / "nvidia_h200.json").read_text())
    node = table["kernels"]
    *path, last = [int(k) if k.isdigit() else k for k in key.split(".")]
    for k in path:
        node = node[k]
    node[last] = value
    path = tmp_path / "nvidia_h200.json"
    path.write_text(json.dumps(table))
    with pytest.raises(TableError) as err:
        tuning.load_table(path)
    message = str(err.value)
    assert message.startswith(_expected(key, value, allowed)), message
    assert "\n" not in message


def test_a_file_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"device": "x", "kernels": {')
    with pytest.raises(TableError, match=r"^tuning table broken\.json: not JSON"):
        tuning.load_table(path)


def test_batch_boundaries_are_every_bucket_edge_but_each_kernels_last(monkeypatch):
    tabs = tuning.tables()
    monkeypatch.setattr(tuning, "table_for", lambda device=None: tabs["NVIDIA H200"])
    assert tuning.batch_boundaries("cuda") == [1, 2, 4, 8, 16, 32]
    assert tuning.batch_boundaries("cuda", "gemv") == [1, 2, 4, 16, 32]
    monkeypatch.setattr(tuning, "table_for", lambda device=None: tabs[tuning.CPU_DEVICE])
    assert tuning.batch_boundaries("cpu") == [1, 2, 8]


def test_gemv_boundary_shapes_cross_every_gemv_bucket_with_partial_tiles(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from optimized_model.k3.fast.kernels import gemv as G

    shapes = G.tiling_shapes("cpu")
    edges = tuning.batch_boundaries("cpu", "gemv")
    assert sorted(s["M"] for s in shapes) == sorted({m for b in edges for m in (b, b + 1)})
    for s in shapes:
        cfg = tuning.lookup("gemv", s["M"], device="cpu", N=s["N"], K=s["K"])
        bn, bk, split = cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
        assert s["N"] > bn and s["N"] % bn, (s, bn)  # several N tiles, the last one partial
        assert s["K"] > 2 * bk * split - 1 and s["K"] % bk, (s, bk)  # several K steps per split, the last partial
