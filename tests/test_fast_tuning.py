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


def _set(path: list, value):
    def edit(table):
        node = table
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _h200(*path):
    return ["kernels", *path]


BAD = [
    # (what is bad, edit of nvidia_h200.json, the message: file, key, allowed)
    ("not a power of two", _set(_h200("gemv", "buckets", 0, "BLOCK_N"), 7),
     "tuning table nvidia_h200.json: kernels.gemv.buckets[0].BLOCK_N = 7: must be a power of two"),
    ("a string for an int", _set(_h200("gemv", "buckets", 1, "num_warps"), "4"),
     "tuning table nvidia_h200.json: kernels.gemv.buckets[1].num_warps = '4': must be one of 1, 2, 4, 8, 16, 32"),
    ("a split that is no split", _set(_h200("gemv", "buckets", 0, "SPLIT_K"), "many"),
     "kernels.gemv.buckets[0].SPLIT_K = 'many': must be \"auto\" or an integer >= 1"),
    ("an unknown variant", _set(_h200("gemv", "buckets", 0, "variant"), "cublas"),
     "kernels.gemv.buckets[0].variant = 'cublas': must be one of 'triton', 'cute'"),
    ("an override's epilogue", _set(_h200("gemv", "buckets", 0, "overrides", 0, "epilogue"), "gelu"),
     "kernels.gemv.buckets[0].overrides[0].epilogue = 'gelu': must be one of 'none', 'residual', 'swiglu', 'sigmoid_gate'"),
    ("KDA gates", _set(_h200("kda_decode", "buckets", 0, "low_rank_gates"), "both"),
     "kernels.kda_decode.buckets[0].low_rank_gates = 'both': must be one of 'fused', 'gemv'"),
    ("where the slots are summed", _set(_h200("moe_experts", "buckets", 1, "slot_sum"), "nowhere"),
     "kernels.moe_experts.buckets[1].slot_sum = 'nowhere': must be one of 'down', 'latent_up'"),
    ("slot sum in the down kernel past its batch", _set(_h200("moe_experts", "buckets", 3, "slot_sum"), "down"),
     "kernels.moe_experts.buckets[3].slot_sum = 'down': the down kernel sums the slots for at most 4 tokens"),
    ("MoE schedule", _set(_h200("moe_schedule", "buckets", 0, "shared_in"), "both"),
     "kernels.moe_schedule.buckets[0].shared_in = 'both': must be one of 'fused', 'separate'"),
    ("dependent launch", _set(_h200("launch", "buckets", 0, "pdl"), "sometimes"),
     "kernels.launch.buckets[0].pdl = 'sometimes': must be one of 'all', 'outside_moe', 'off'"),
    ("an unknown prefetch site", _set(_h200("l2_prefetch", "buckets", 0, "kda_out"), 1.0),
     "kernels.l2_prefetch.buckets[0].kda_out: unknown field; known: chunk, kda_o, max_batch, mla_o, "
     "moe_up, next_in, note, per_program"),
    ("a prefetch fraction above 1", _set(_h200("l2_prefetch", "buckets", 0, "kda_o"), 1.5),
     "kernels.l2_prefetch.buckets[0].kda_o = 1.5: must be a fraction of the weight, 0 to 1"),
    ("a misspelt field", _set(_h200("mla_decode", "buckets", 0, "BLOCK_HH"), 32),
     "kernels.mla_decode.buckets[0].BLOCK_HH: unknown field; known: BLOCK_H, BLOCK_T"),
    ("an unknown kernel", _set(_h200("gemm"), {"buckets": [{"max_batch": 64}]}),
     "kernels.gemm: unknown kernel; known: gemv, kda_decode, l2_prefetch, launch"),
    ("buckets out of order", _set(_h200("launch", "buckets", 1, "max_batch"), 1),
     "kernels.launch.buckets[1].max_batch = 1: must be larger than the previous bucket's 1"),
]


@pytest.mark.parametrize("what,edit,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_fails_at_load_naming_file_key_and_allowed(tmp_path, what, edit, message):
    table = json.loads((tuning.TABLE_DIR / "nvidia_h200.json").read_text())
    edit(table)
    path = tmp_path / "nvidia_h200.json"
    path.write_text(json.dumps(table))
    with pytest.raises(TableError, match=re.escape(message)) as err:
        tuning.load_table(path)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("tuning table nvidia_h200.json: ")


def test_a_file_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"device": "x", "kernels": {')
    with pytest.raises(TableError, match=r"^tuning table broken\.json: not JSON"):
        tuning.load_table(path)
