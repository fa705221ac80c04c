"""The worker trace sink: events a model reports in another process (a vLLM worker) reach the
harness's recorders, rank-tagged, through fastpath.trace_sink.SinkReader."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from fastpath import trace
from fastpath.trace_sink import SinkReader

ROOT = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import sys
    from fastpath import trace
    assert trace.open_sink_from_env(rank=int(sys.argv[1]))
    trace.engaged("lm_head", "fixture_fp32", batch=2)
    trace.refused("attention", "prefill", batch=1)
    with trace.capturing("g"):
        trace.engaged("decode_graph", "whole_step", batch=2)
    trace.replayed("g", times=2)
""")


def _worker(reader: SinkReader, rank: int) -> None:
    env = {**os.environ, **reader.env(), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", WORKER, str(rank)], env=env, check=True, timeout=60)


def test_worker_events_reach_the_open_recorder_rank_tagged(tmp_path):
    reader = SinkReader(tmp_path)
    _worker(reader, 0)
    _worker(reader, 1)
    with trace.recording() as rec:
        got = reader.drain()
    assert len(got) == 2 * 5  # 2 eager + 1 capture + 2 replays, per rank
    assert {e.rank for e in got} == {0, 1}
    assert [e.detail for e in rec.refused("attention")] == ["prefill", "prefill"]
    # capture events are not executions; the two replays of each rank are
    assert len(rec.engaged("decode_graph")) == 4
    assert rec.engaged("lm_head")[0].shape_dict() == {"batch": 2}
    assert reader.drain() == []  # read once: a later step's recorder does not see them again


def test_the_harness_process_itself_never_writes_the_sink(tmp_path, monkeypatch):
    reader = SinkReader(tmp_path)
    for key, value in reader.env().items():
        monkeypatch.setenv(key, value)
    assert trace.open_sink_from_env(rank=0) is False
    trace.engaged("lm_head", "x")
    assert list(tmp_path.iterdir()) == []


def test_a_half_written_line_waits_for_the_next_drain(tmp_path):
    reader = SinkReader(tmp_path)
    path = tmp_path / "rank0-pid1.jsonl"
    line = '{"kind": "engaged", "component": "c", "detail": "v", "shape": {}, "phase": "eager", "rank": 0}'
    path.write_text(line[:20])
    assert reader.read_new() == []
    path.write_text(line + "\n")
    assert [e.component for e in reader.read_new()] == ["c"]


def test_nested_recorders_with_equal_events_close_in_order():
    """An engine's own per-step recording inside a suite's: closing the inner one (whose events
    equal the outer's) must not remove the outer one."""
    with trace.recording() as outer:
        with trace.recording() as inner:
            trace.engaged("lm_head", "x")
        assert outer.events == inner.events
    assert len(outer.engaged()) == 1 and not trace.is_recording()


def test_paused_hides_set_up_events_from_open_recorders():
    with trace.recording() as rec:
        with trace.paused():
            trace.refused("lm_head", "prefill")
        trace.engaged("lm_head", "x")
    assert [e.kind for e in rec.events] == ["engaged"]
