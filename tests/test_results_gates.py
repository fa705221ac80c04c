"""Result rows (schema, crash-safe JSONL, Parquet) and gate evaluation (verdict, summary)."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from fastpath.gates import NO_RESULT, evaluate
from fastpath.plan import build_plan
from fastpath.results import (COLUMNS, RowWriter, make_row, read_parquet, read_rows, rows_frame,
                              write_json_atomic, write_parquet)
from fastpath.spec import load_spec

DOUBLE_SPEC = Path(__file__).parent / "doubles" / "stub" / "spec.toml"


# --------------------------------------------------------------------------- rows

def test_make_row_computes_passed_from_comparator():
    assert make_row("s", "c", "g", "m", 0.5, threshold=1.0, comparator="<=")["passed"] is True
    row = make_row("s", "c", "g", "m", 1.5, threshold=1.0, comparator="<=")
    assert (row["passed"], row["status"]) == (False, "fail")
    assert make_row("s", "c", "g", "m", float("nan"), threshold=1.0, comparator="<=")["passed"] is False
    assert make_row("s", "c", "g", "m", 1, threshold=1, comparator="==")["status"] == "pass"


def test_make_row_rejects_bad_input():
    with pytest.raises(ValueError, match="comparator"):
        make_row("s", "c", "g", "m", 1, threshold=1, comparator="=<")
    with pytest.raises(ValueError, match="passed="):
        make_row("s", "c", "g", "m", 1)
    with pytest.raises(ValueError, match="status"):
        make_row("s", "c", "g", "m", 1, passed=True, status="ok")


def test_make_row_config_columns_and_detail():
    row = make_row("s", "c", "g", "m", 1, passed=True, batch=4, kernel="k", shape=[1, 2], evidence={"x": 1})
    assert set(row) == set(COLUMNS)
    assert row["batch"] == 4 and row["kernel"] == "k"
    assert json.loads(row["detail"]) == {"shape": [1, 2]}
    assert json.loads(row["evidence"]) == {"x": 1}
    waived = make_row("s", "c", "g", "waiver", status="waived", message="why")
    assert waived["passed"] is False and math.isnan(waived["value"])


def test_row_writer_appends_and_survives_a_torn_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    with RowWriter(path) as w:
        w.write(make_row("s", "a", "g", "m", 1, passed=True))
    with RowWriter(path) as w:  # a second writer appends, never truncates
        w.write(make_row("s", "b", "g", "m", float("nan"), passed=False))
    with open(path, "a") as f:
        f.write('{"suite": "s", "case_')  # the process died mid-write
    rows = read_rows(path)
    assert [r["case_id"] for r in rows] == ["a", "b"]
    assert rows[1]["value"] is None  # NaN stored as null
    assert read_rows(tmp_path / "absent.jsonl") == []


def test_frame_dtypes_and_parquet_round_trip(tmp_path):
    df = rows_frame([make_row("s", "a", "g", "m", 1, passed=True, batch=2),
                     make_row("s", "b", "g", "m", None, status="error", message="boom")])
    assert list(df.columns) == list(COLUMNS)
    assert str(df["batch"].dtype) == "Int64" and df["batch"].isna().tolist() == [False, True]
    assert df["passed"].dtype == bool and df["value"].dtype == "float64"
    write_parquet(df, tmp_path / "r" / "rows.parquet")
    back = read_parquet(tmp_path / "r" / "rows.parquet")
    pd.testing.assert_frame_equal(back, df)
    assert rows_frame([]).shape == (0, len(COLUMNS))


def test_atomic_json_leaves_no_temp_files(tmp_path):
    write_json_atomic({"a": 1}, tmp_path / "x.json")
    write_json_atomic({"a": 2}, tmp_path / "x.json")
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


# --------------------------------------------------------------------------- gates

@pytest.fixture(scope="module")
def spec():
    return load_spec(DOUBLE_SPEC)


def passing_rows(plan, spec):
    """One passing row per runnable case (its suite's first gate) + waiver rows for waived ones."""
    gate_for = {"decode": "coverage_fast_path_fired", "fallback": "coverage_clean_fallback",
                "profiler": "coverage_profiler_kernels", "kernel": "kernels_noise_floor"}
    rows = [make_row(c.suite, c.case_id, gate_for[c.kind], "m", 1, threshold=1, comparator=">=") for c in plan.cases]
    rows += [make_row(w.case.suite, w.case.case_id, gate_for[w.case.kind], "waiver", status="waived",
                      message=w.reason) for w in plan.waivers]
    return rows


def test_all_passing_smoke_run_passes(spec):
    plan = build_plan(spec, "smoke")
    v = evaluate(spec, rows_frame(passing_rows(plan, spec)), plan)
    assert v.verdict == "pass" and v.complete
    assert v.gates["coverage_profiler_kernels"].status == "waived"  # all waivers: fine on smoke
    s = v.to_summary()
    assert {"verdict", "complete", "tier", "spec_digest", "gates", "failing_rows", "counts"} <= set(s)
    assert s["gates"]["coverage_fast_path_fired"] == {"status": "pass", "suite": "coverage", "rows": 2,
                                                      "failed": 0, "waived": 0, "reason": ""}
    json.dumps(s)  # JSON-serialisable as is


def test_failing_row_fails_its_gate_and_is_listed_with_evidence(spec):
    plan = build_plan(spec, "smoke")
    rows = passing_rows(plan, spec)
    rows[1] = make_row("coverage", rows[1]["case_id"], "coverage_fast_path_fired", "components_engaged", 0,
                       threshold=1, comparator=">=", evidence={"engaged": []})
    v = evaluate(spec, rows_frame(rows), plan)
    assert v.verdict == "fail"
    assert v.gates["coverage_fast_path_fired"].status == "fail"
    assert v.gates["coverage_clean_fallback"].status == "pass"
    [bad] = v.failing_rows
    assert bad["case_id"] == "coverage/decode/b4-c16-d0" and bad["evidence"] == {"engaged": []}


def test_case_without_row_gets_error_row(spec):
    plan = build_plan(spec, "smoke")
    rows = [r for r in passing_rows(plan, spec) if r["case_id"] != "coverage/fallback/mixed"]
    v = evaluate(spec, rows_frame(rows), plan)
    assert v.verdict == "fail"
    assert [(r["case_id"], r["message"]) for r in v.failing_rows] == [("coverage/fallback/mixed", NO_RESULT)]
    assert v.counts["cases_without_result"] == 1
    assert NO_RESULT in v.rows["message"].tolist()  # the added row goes into the bundle too


def test_unknown_gate_fails(spec):
    plan = build_plan(spec, "smoke")
    rows = passing_rows(plan, spec) + [make_row("kernels", "kernels/kernel/registry-float32", "made_up", "m", 1,
                                                passed=True)]
    v = evaluate(spec, rows_frame(rows), plan)
    assert v.verdict == "fail" and "unknown gate 'made_up'" in v.failing_rows[0]["message"]


def test_gate_without_rows_is_missing(spec):
    plan = build_plan(spec, "smoke")
    rows = [r for r in passing_rows(plan, spec) if r["gate"] != "coverage_clean_fallback"]
    rows += [make_row("coverage", c, "coverage_fast_path_fired", "m", 1, passed=True)
             for c in ("coverage/fallback/prefill", "coverage/fallback/mixed")]
    v = evaluate(spec, rows_frame(rows), plan)
    assert v.gates["coverage_clean_fallback"].status == "missing"
    assert "no evidence" in v.gates["coverage_clean_fallback"].reason
    assert v.verdict == "fail"


def test_all_waived_gate_fails_on_full_tier(spec):
    plan = build_plan(spec, "full")
    rows = passing_rows(plan, spec)
    rows = [r if r["gate"] != "coverage_profiler_kernels" else
            make_row(r["suite"], r["case_id"], r["gate"], "waiver", status="waived", message="no profiler")
            for r in rows]
    v = evaluate(spec, rows_frame(rows), plan)
    assert v.gates["coverage_profiler_kernels"].status == "fail"
    assert "waived at run time: not accepted on the full tier" in v.gates["coverage_profiler_kernels"].reason
    assert v.verdict == "fail"


@pytest.mark.parametrize("tier,verdict", [("smoke", "pass"), ("full", "fail")])
def test_run_time_waiver_beside_passing_rows(spec, tier, verdict):
    """One kernel waived at run time (its package missing on the machine) among passing rows of
    the same case: accepted on smoke; on the full tier verify agrees with check's
    results_cover_plan and fails the gate."""
    plan = build_plan(spec, tier)
    rows = passing_rows(plan, spec)
    case = next(c.case_id for c in plan.cases if c.suite == "kernels")
    rows.append(make_row("kernels", case, "kernels_noise_floor", "dtype_supported", status="waived",
                         message="gemv_cute declares no dtype that runs here (package missing)"))
    v = evaluate(spec, rows_frame(rows), plan)
    assert v.verdict == verdict
    assert v.gates["kernels_noise_floor"].status == ("pass" if tier == "smoke" else "fail")
    if tier == "full":
        assert [r["message"] for r in v.failing_rows] == ["gemv_cute declares no dtype that runs here (package missing)"]


def test_error_row_fails_gate(spec):
    plan = build_plan(spec, "smoke")
    rows = passing_rows(plan, spec)
    rows.append(make_row("kernels", "kernels/kernel/registry-float32", "kernels_noise_floor", "exception",
                         status="error", message="boom"))
    v = evaluate(spec, rows_frame(rows), plan)
    assert v.gates["kernels_noise_floor"].status == "fail" and v.verdict == "fail"


def test_partial_run_is_incomplete_never_pass(spec):
    plan = build_plan(spec, "smoke")
    rows = [r for r in passing_rows(plan, spec) if r["suite"] == "kernels"]
    v = evaluate(spec, rows_frame(rows), plan, suite_state={"coverage": "not_run", "kernels": "done"})
    assert v.verdict == "incomplete" and not v.complete
    assert v.counts["cases_without_result"] == 0  # not-run suites are not reported as missing cases
    assert v.to_summary()["suites"] == {"coverage": "not_run", "kernels": "done"}
    assert v.gates["kernels_noise_floor"].status == "pass"


# --------------------------------------------------------------------------- statuses

def test_statuses_are_documented_in_one_table():
    from fastpath.results import GATING_STATUSES, STATUS_TABLE, STATUSES, row_status_problem

    assert STATUSES == ("pass", "fail", "error", "waived", "info") and "info" not in GATING_STATUSES
    assert all(isinstance(doc, str) and doc for _, _, doc in STATUS_TABLE.values())
    assert row_status_problem("skipped", False) == "row status 'skipped' is not one of pass, fail, error, waived, info"
    assert row_status_problem("fail", True) == "row passed=True contradicts its status 'fail'"
    assert row_status_problem("info", True) is None and row_status_problem("info", False) is None
    info = make_row("perf", "c", "", "speedup", 1.3, threshold=1.0, comparator=">", status="info")
    assert (info["status"], info["passed"]) == ("info", True)
    with pytest.raises(ValueError, match="contradicts"):
        make_row("s", "c", "g", "m", 1, passed=True, status="fail")


def _with_info(plan, spec, gate="coverage_fast_path_fired"):
    """The gate's rows replaced by informational rows; one ungated info row beside them."""
    rows = [r if r["gate"] != gate else make_row(r["suite"], r["case_id"], gate, "m", 1.0, status="info",
                                                 passed=True) for r in passing_rows(plan, spec)]
    return rows + [make_row("coverage", plan.cases[0].case_id, "", "side_comparison", 2.0, status="info")]


@pytest.mark.parametrize("tier,verdict", [("smoke", "pass"), ("full", "fail")])
def test_info_rows_are_reported_but_never_gate(spec, tier, verdict):
    plan = build_plan(spec, tier)
    v = evaluate(spec, rows_frame(_with_info(plan, spec)), plan)
    assert v.gates["coverage_fast_path_fired"].status == "info"
    assert v.verdict == verdict and v.counts["info"] > 0
    assert not [r for r in v.failing_rows if r["metric"] == "side_comparison"]  # no gate needed


def test_invalid_rows_fail_the_verdict_naming_the_problem(spec):
    plan = build_plan(spec, "smoke")
    rows = rows_frame(passing_rows(plan, spec))
    rows["status"] = rows["status"].astype(object)
    rows.loc[0, "status"] = "skipped"
    v = evaluate(spec, rows, plan)
    assert v.verdict == "fail"
    assert v.gates[rows.loc[0, "gate"]].status == "fail"
    assert any(r["message"].startswith("invalid row: row status 'skipped' is not one of") for r in v.failing_rows)
