"""lab/perf_warm.py: the warm-up spec plans exactly the real spec's perf cases, with timing cut."""

import time
from pathlib import Path

import pytest

from fastpath.plan import build_plan
from fastpath.spec import load_spec
from lab import perf_warm

SPEC = Path(__file__).resolve().parents[1] / "optimized_model" / "k3" / "fastpath.toml"


def _perf_cases(spec):
    cases, waivers = build_plan(spec, "full").for_suite("perf")
    return [(c.case_id, c.config) for c in cases], [w.case.case_id for w in waivers]


def test_warm_spec_builds_every_perf_case_of_the_real_one(tmp_path):
    warm = tmp_path / "warm.toml"
    warm.write_text(perf_warm.warm_spec_text(SPEC.read_text()))
    real, cheap = load_spec(SPEC), load_spec(warm)  # the schema accepts the cut values
    assert _perf_cases(cheap) == _perf_cases(real)
    assert len(_perf_cases(real)[0]) > 10
    for key, value in perf_warm.CHEAPEST.items():
        assert cheap.perf[key] == value
    assert cheap.perf["prompt_decode"] == real.perf["prompt_decode"]
    assert real.perf["replays"] > 1 and real.perf["budget_s"] > 0  # there was something to cut


def test_absent_keys_are_added_and_comments_kept():
    text = "[fastpath]\nname = 'x'\n\n[perf]\nrounds = 20   # why twenty\n\n[evals]\nseed = 1\n"
    out = perf_warm.warm_spec_text(text)
    assert "rounds = 10   # why twenty" in out
    assert "replays = 1\n" in out and out.index("replays = 1") < out.index("[evals]")
    assert "seed = 1" in out


def test_a_spec_without_perf_is_refused():
    with pytest.raises(SystemExit, match="no \\[perf\\] table"):
        perf_warm.warm_spec_text("[fastpath]\nname = 'x'\n")


def test_run_for_leaves_no_member_of_the_group_running(tmp_path):
    marker = tmp_path / "member-alive"
    # a member the stop signal does not reach would touch the marker 4 s in (SIGTERM to the
    # leader at 0.5 s, SIGKILL to the group by 1.5 s at the latest, however slow the leader is)
    script = f"(trap '' INT TERM; sleep 4; touch {marker}) & sleep 30"
    start = time.monotonic()
    perf_warm.run_for(["bash", "-c", script], seconds=0.5, grace=1)
    assert time.monotonic() - start < 3.5
    time.sleep(max(0.0, start + 5 - time.monotonic()))
    assert not marker.exists()


def test_run_for_kills_a_leader_that_ignores_the_stop_signal():
    start = time.monotonic()
    rc = perf_warm.run_for(["bash", "-c", "trap '' INT TERM; sleep 30"], seconds=0.3, grace=0.5)
    assert rc == -9 and time.monotonic() - start < 5


def test_run_for_returns_the_exit_code_in_time():
    assert perf_warm.run_for(["bash", "-c", "exit 3"], seconds=10) == 3
