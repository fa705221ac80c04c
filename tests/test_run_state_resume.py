"""RunState.keep_finished / join_kept: what a resume keeps of an interrupted suite's attempts."""

import json

import pytest

from fastpath.errors import UsageError
from fastpath.plan import Case, Plan
from fastpath.results import RowWriter, make_row, read_rows
from fastpath.run_state import RETRY, RunState

CASES = [f"perf/speedup/b{b}" for b in (1, 2, 4, 8)] + ["perf/summary/table"]


def state_with_plan(tmp_path) -> RunState:
    state = RunState(tmp_path / "run")
    plan = Plan("double", "0" * 64, "full", ["perf"], cases=[Case("perf", "speedup", c, {}) for c in CASES])
    state.root.mkdir(parents=True)
    (state.root / "plan.json").write_text(json.dumps(plan.to_json()))
    return state


def attempt(state: RunState, shard, rows: dict[str, str], finished: list[str]) -> None:
    """An attempt's files: one row per case (its status), and the cases it noted as finished."""
    with RowWriter(state.rows_path("perf", shard)) as writer:
        for case_id, status in rows.items():
            writer.write(make_row("perf", case_id, "perf_speedup", "m", 1.0, status=status,
                                  passed=status == "pass"))
    path = state.finished_path("perf", shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{c}\n" for c in finished))


def test_keeps_finished_cases_without_errors_from_every_shard_and_clears_the_attempt(tmp_path):
    state = state_with_plan(tmp_path)
    # shard 1: b1 finished; b4 cut off mid-way (a row, never noted). shard 2: b2 finished with an
    # error row (another try), b8 finished and failed (a measurement: kept)
    attempt(state, (0, 2), {"perf/speedup/b1": "pass", "perf/speedup/b4": "pass"}, ["perf/speedup/b1"])
    attempt(state, (1, 2), {"perf/speedup/b2": "error", "perf/speedup/b8": "fail"},
            ["perf/speedup/b2", "perf/speedup/b8"])
    assert state.keep_finished("perf") == 2
    assert [r["case_id"] for r in state.kept_rows("perf")] == ["perf/speedup/b1", "perf/speedup/b8"]
    assert not list((state.root / "rows").iterdir()) and not list((state.root / "finished").iterdir())
    # a second interruption adds to what is kept; nothing kept is lost
    attempt(state, (0, 1), {"perf/speedup/b4": "pass"}, ["perf/speedup/b4"])
    assert state.keep_finished("perf") == 3


def test_kept_rows_join_the_attempt_that_finishes_in_plan_order(tmp_path):
    state = state_with_plan(tmp_path)
    attempt(state, (0, 1), {"perf/speedup/b2": "pass", "perf/speedup/b1": "pass"}, ["perf/speedup/b2"])
    state.keep_finished("perf")
    attempt(state, (0, 1), {"perf/speedup/b1": "pass", "perf/speedup/b4": "pass", "perf/speedup/b8": "pass",
                            "perf/summary/table": "pass"}, CASES)
    state.join_kept("perf")  # no marker yet: an unfinished attempt joins nothing
    assert state.kept_path("perf").is_file()
    state.mark("perf", "done", pytest_exit=0)
    state.join_kept("perf")
    assert [r["case_id"] for r in read_rows(state.rows_path("perf"))] == CASES
    assert not state.kept_path("perf").exists() and not state.finished_path("perf").exists()


def test_a_retry_attempt_and_a_torn_kept_file(tmp_path):
    state = state_with_plan(tmp_path)
    attempt(state, RETRY, {"perf/speedup/b4": "pass"}, ["perf/speedup/b4"])
    assert state.keep_finished("perf") == 1
    state.kept_path("perf").write_text('{"case_id": 3}\n')
    with pytest.raises(UsageError, match="kept/perf.jsonl is unreadable or was edited"):
        state.keep_finished("perf")


def test_a_suite_that_crashed_shows_its_kept_cases_and_keeps_them_for_the_next_resume(tmp_path):
    state = state_with_plan(tmp_path)
    attempt(state, (0, 1), {"perf/speedup/b1": "pass"}, ["perf/speedup/b1"])
    state.keep_finished("perf")
    attempt(state, (0, 1), {"perf/speedup/b2": "pass"}, ["perf/speedup/b2"])
    state.crashed("perf", "a worker died")  # an error row of its own, and the "crashed" marker
    state.join_kept("perf")
    assert [r["case_id"] for r in read_rows(state.rows_path("perf"))] == [
        "perf/speedup/b1", "perf/speedup/b2", "perf/suite"]
    assert state.keep_finished("perf") == 2  # b1 (kept before) and b2; the crash's own row is not a case


def test_the_suite_log_keeps_the_cut_off_attempt_and_says_the_suite_was_resumed(tmp_path):
    state = state_with_plan(tmp_path)
    attempt(state, (0, 1), {"perf/speedup/b1": "pass"}, ["perf/speedup/b1"])
    state.log_path("perf").parent.mkdir(parents=True)
    state.log_path("perf").write_text("first attempt: b1 took 3 s\n")
    state.keep_finished("perf")
    assert not state.log_path("perf").exists()
    state.log_path("perf").write_text("second attempt: the rest\n")
    state.mark("perf", "done", pytest_exit=0)
    state.join_kept("perf")
    log = state.log_path("perf").read_text()
    assert log.index("cut off: 1 finished case(s) kept") < log.index("first attempt") < \
        log.index("== the attempt that ended the suite") < log.index("second attempt")
