"""fastpath.trace semantics (docs/architecture.md "Trace")."""

import threading

import pytest

from fastpath import trace


@pytest.fixture(autouse=True)
def _clean_graphs():
    yield
    for key in ("g", "g1", "g2", "t-graph", "warm"):
        trace.forget(key)


def test_eager_events_are_recorded_with_shape():
    with trace.recording() as rec:
        trace.engaged("kda_decode", "triton_small_m", batch=2, heads=4)
        trace.refused("decode_graph", "no_cuda")
    assert [(e.kind, e.component, e.detail, e.phase) for e in rec.events] == [
        ("engaged", "kda_decode", "triton_small_m", "eager"), ("refused", "decode_graph", "no_cuda", "eager")]
    assert rec.events[0].shape_dict() == {"batch": 2, "heads": 4}
    assert rec.components() == {"kda_decode": {"triton_small_m"}, "decode_graph": {"refused:no_cuda"}}


def test_nothing_recorded_without_a_recorder():
    graphs_before = dict(trace._graphs)
    with trace.recording() as closed:
        pass
    trace.engaged("kda_decode", "v", batch=1)
    trace.refused("kda_decode", "prefill")
    assert not trace.is_recording()
    assert closed.events == []  # a closed recorder receives nothing
    assert trace._graphs == graphs_before  # and no capture bound anything


def test_capture_binds_to_graph_and_replays_count():
    with trace.recording() as rec:
        with trace.capturing("g"):
            trace.engaged("dense_gemv", "splitk", batch=8)
            trace.engaged("lm_head", "gemv")
        assert [e.phase for e in rec.events] == ["capture", "capture"]
        assert rec.executed() == []  # capturing is not running
        trace.replayed("g", times=3)
    assert rec.counts()[("engaged", "dense_gemv", "splitk")] == 3
    assert all(e.graph == "g" for e in rec.events)
    assert [e.component for e in trace.bound_events("g")] == ["dense_gemv", "lm_head"]


def test_replay_counts_after_the_capture_time_recorder_closed():
    with trace.recording():
        with trace.capturing("warm"):
            trace.engaged("kda_decode", "fused")
    with trace.recording() as later:
        trace.replayed("warm", times=2)
    assert [(e.detail, e.phase) for e in later.events] == [("fused", "replay")] * 2


def test_capture_without_any_recorder_still_binds():
    with trace.capturing("g1"):
        trace.engaged("moe_experts", "grouped")
    with trace.recording() as rec:
        trace.replayed("g1")
    assert rec.engaged("moe_experts")[0].detail == "grouped"


def test_recapture_replaces_and_forget_drops():
    with trace.capturing("g2"):
        trace.engaged("a", "old")
    with trace.capturing("g2"):
        trace.engaged("a", "new")
    assert [e.detail for e in trace.bound_events("g2")] == ["new"]
    trace.forget("g2")
    with trace.recording():
        with pytest.raises(KeyError, match="never captured"):
            trace.replayed("g2")


def test_nested_capture_is_an_error():
    with trace.capturing("g1"):
        with pytest.raises(RuntimeError, match="nested graph capture"):
            with trace.capturing("g2"):
                pass


def test_refused_events_carry_reason_and_count_once():
    with trace.recording() as rec:
        trace.refused("kda_decode", "prefill", tokens=17)
    assert rec.refused("kda_decode")[0].detail == "prefill"
    assert rec.engaged() == []
    assert rec.counts() == {("refused", "kda_decode", "prefill"): 1}


def test_capture_on_one_thread_does_not_capture_another_threads_events():
    started, done = threading.Event(), threading.Event()

    def other():
        started.wait()
        trace.engaged("sampler", "other-thread")  # eager on its own thread
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with trace.recording() as rec:
        with trace.capturing("t-graph"):
            started.set()
            done.wait(5)
            trace.engaged("dense_gemv", "mine")
        t.join()
    phases = {e.detail: e.phase for e in rec.events}
    assert phases == {"other-thread": "eager", "mine": "capture"}
    assert [e.detail for e in trace.bound_events("t-graph")] == ["mine"]


def test_events_inside_a_layer_name_it_and_replays_keep_it():
    with trace.recording() as rec:
        with trace.layer(2):
            trace.engaged("kda_decode", "v", batch=1)  # a wrapper that knows no layer
            trace.engaged("dense_gemv", "v", layer=5)  # an explicit layer wins
            with trace.layer(3):
                trace.refused("moe_router", "prefill")
        trace.engaged("lm_head", "v")  # outside any layer: a whole-step event
        with trace.capturing("g"):
            with trace.layer(1):
                trace.engaged("mla_decode", "v")
        trace.replayed("g")
    assert [e.layer for e in rec.events] == [2, 5, 3, None, 1, 1]
    assert rec.engaged_layers("mla_decode") == {1} and rec.engaged_layers("lm_head") == set()


def test_a_layer_ends_with_its_block_even_on_error_and_is_per_thread():
    seen = []
    with trace.recording() as rec:
        with pytest.raises(RuntimeError):
            with trace.layer(4):
                t = threading.Thread(target=lambda: trace.engaged("other_thread", "v"))
                t.start()
                t.join()
                raise RuntimeError("boom")
        trace.engaged("after", "v")
    seen = {e.component: e.layer for e in rec.events}
    assert seen == {"other_thread": None, "after": None}
