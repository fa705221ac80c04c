"""fastpath.measure, the lab tools' measuring helpers: the stopwatch log, tuning-table patches,
the CPU timing path, and the one-line error the GPU-only timers give where there is no CUDA
device (their GPU paths run only on a GPU, skipped here with the reason)."""

import copy
import re
import subprocess
import sys

import pytest

from fastpath import measure as M


def _table():
    return {"device": "X", "kernels": {"k": {"buckets": [{"max_batch": 1, "a": 1}, {"max_batch": 64, "a": 2}]}}}


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_measure_imports_neither_torch_nor_the_subject():
    code = ("import sys, fastpath.measure; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'optimized_model', 'lab')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_stopwatch_log_prefixes_the_seconds_since_its_start(capsys, monkeypatch):
    monkeypatch.setattr(M.time, "time", lambda: 112.25)
    M.stopwatch_log(t0=100.0)("hello")
    assert capsys.readouterr().out == "[  12.2s] hello\n"


def test_parse_variant_and_its_errors_name_the_problem():
    assert M.parse_variant('v={"k": {"a": 3}}') == ("v", {"k": {"a": 3}})
    with pytest.raises(SystemExit, match="expected NAME=JSON"):
        M.parse_variant('{"k": {"a": 3}}')
    with pytest.raises(SystemExit, match="not JSON"):
        M.parse_variant("v={k: 1}")
    with pytest.raises(SystemExit, match="kernel: "):
        M.parse_variant('v={"k": 3}')
    with pytest.raises(SystemExit, match="--patch: not JSON"):
        M.parse_patch("{", "--patch")


def test_apply_patch_changes_only_the_bucket_serving_the_batch_and_resets_first():
    table = _table()
    base = copy.deepcopy(table["kernels"])
    M.apply_patch(table, base, {"k": {"a": 9}}, batch=8)
    assert [b["a"] for b in table["kernels"]["k"]["buckets"]] == [1, 9]
    M.apply_patch(table, base, {"k": {"b": 5}}, batch=1)  # the previous patch is gone
    assert table["kernels"]["k"]["buckets"] == [{"max_batch": 1, "a": 1, "b": 5}, {"max_batch": 64, "a": 2}]
    M.apply_patch(table, base, {"k": {"a": 0}}, batch=128)  # beyond the last bucket: the last
    assert table["kernels"]["k"]["buckets"][-1]["a"] == 0
    assert base == _table()["kernels"]
    with pytest.raises(SystemExit, match="'nope', not in the table 'X'"):
        M.apply_patch(table, base, {"nope": {"a": 1}}, batch=1)


def test_patched_holds_the_patch_inside_the_block_only_even_when_it_raises():
    table = _table()
    with M.patched(table, {"k": {"a": 9}}, batch=8) as t:
        assert t is table and [b["a"] for b in table["kernels"]["k"]["buckets"]] == [1, 9]
    assert table == _table()
    with pytest.raises(KeyError):
        with M.patched(table, {"k": {"a": 5}}, batch=1):
            raise KeyError("a variant that fails")
    assert table == _table()
    with pytest.raises(SystemExit, match="'nope'"):
        with M.patched(table, {"nope": {"a": 1}}, batch=1):
            pass
    assert table == _table()


def test_patch_every_bucket_patches_all_buckets_of_the_named_kernels_only():
    table = _table()
    table["kernels"]["other"] = {"buckets": [{"max_batch": 64, "a": 7}]}
    M.patch_every_bucket(table, {"k": {"a": 3, "c": 1}})
    assert table["kernels"]["k"]["buckets"] == [{"max_batch": 1, "a": 3, "c": 1}, {"max_batch": 64, "a": 3, "c": 1}]
    assert table["kernels"]["other"]["buckets"] == [{"max_batch": 64, "a": 7}]
    with pytest.raises(SystemExit, match="'nope'"):
        M.patch_every_bucket(table, {"nope": {"a": 1}})


def test_time_calls_on_cpu_is_the_wall_clock_per_call(monkeypatch):
    ticks = iter([10.0, 10.5])
    monkeypatch.setattr(M.time, "perf_counter", lambda: next(ticks))
    calls = []
    assert M.time_calls(lambda: calls.append(1), 5, device="cpu") == pytest.approx(0.1)
    assert len(calls) == 5


def test_copy_bandwidth_on_cpu_counts_read_and_write_bytes():
    pytest.importorskip("torch")
    assert M.copy_bandwidth("cpu", nbytes=1 << 20, rounds=2) > 0


@pytest.mark.skipif(_has_cuda(), reason="a CUDA device is present: the no-CUDA error cannot be seen here")
@pytest.mark.parametrize("call", [
    lambda: M.time_calls(lambda: None, 1),
    lambda: M.graph_time(lambda: None),
    lambda: M.copy_bandwidth(),
], ids=["time_calls", "graph_time", "copy_bandwidth"])
def test_gpu_timers_say_in_one_line_that_there_is_no_cuda(call):
    with pytest.raises(RuntimeError) as exc:
        call()
    msg = str(exc.value)
    assert "\n" not in msg and re.search(r"needs (a CUDA GPU|torch with CUDA)", msg), msg


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="no CUDA device: the CUDA-event / CUDA-graph timing runs on a GPU only")
def test_gpu_timers_measure_a_copy():
    import torch

    a = torch.ones(1 << 24, device="cuda")
    b = torch.empty_like(a)
    t_events = M.time_calls(lambda: b.copy_(a), 10)
    t_graph = M.graph_time(lambda: b.copy_(a), calls=10)
    bw = M.copy_bandwidth()
    assert 0 < t_graph and 0 < t_events and bw > 1e11  # any GPU copies faster than 100 GB/s
    assert torch.equal(a, b)
