"""Gate evaluation and the verdict (docs/architecture.md "Gates").

Rules, in order:
- every plan case (runnable or waived) must have >= 1 row, else an error row
  "case produced no result" is added (gate "", so it fails the verdict);
- a row naming a gate the spec does not define fails the verdict ("unknown gate");
- row statuses are those of fastpath.results.STATUS_TABLE; a row whose status is unknown or
  whose `passed` contradicts it fails the verdict ("invalid row");
- `info` rows are reported, never gated: they neither pass nor fail a gate, and may have no gate;
- a gate passes iff it has >= 1 gating row and every non-waived one passed; no rows = "missing";
  only waivers = "waived", only info rows (and waivers) = "info": both accepted on smoke only;
- above the smoke tier, a waiver row of a case the plan means to run (a *run-time* waiver:
  e.g. a kernel whose package is missing on the machine) fails its gate — ``fastpath check``
  rejects such a bundle (rule results_cover_plan), so verify must not call it a pass;
- verdict: "incomplete" unless every suite of the plan finished (partial runs never pass),
  else "pass" iff every gate is pass (or waived on smoke) and no row is orphaned.

``Verdict.to_summary()`` is the summary.json format that ``fastpath check`` reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fastpath.plan import Plan
from fastpath.results import make_row, row_status_problem, rows_frame
from fastpath.spec import Spec

SUMMARY_SCHEMA = 1
NO_RESULT = "case produced no result"
# Gate statuses: status -> (accepted on the smoke tier, accepted above it, meaning).
GATE_STATUS_TABLE: dict[str, tuple[bool, bool, str]] = {
    "pass": (True, True, "at least one gating row, every non-waived one passed"),
    "fail": (False, False, "a gating row failed or errored (or a run-time waiver above smoke)"),
    "missing": (False, False, "no row at all for this gate"),
    "waived": (True, False, "every row is a waiver"),
    "info": (True, False, "only informational rows (and waivers): nothing gated"),
}


def gate_status_ok(status: str, tier: str) -> bool:
    smoke_ok, full_ok, _ = GATE_STATUS_TABLE.get(status, (False, False, ""))
    return smoke_ok if tier == "smoke" else full_ok


@dataclass
class GateResult:
    name: str
    suite: str
    status: str  # a key of GATE_STATUS_TABLE
    rows: int
    failed: int
    waived: int
    reason: str = ""

    def ok(self, tier: str) -> bool:
        return gate_status_ok(self.status, tier)


@dataclass
class Verdict:
    verdict: str  # pass | fail | incomplete
    complete: bool
    tier: str
    spec_name: str
    spec_digest: str
    gates_version: str
    gates: dict[str, GateResult]
    failing_rows: list[dict]
    counts: dict[str, int]
    suites: dict[str, str]  # suite -> done | crashed | not_run
    rows: pd.DataFrame = field(repr=False)  # the input rows plus the rows added here

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_summary(self) -> dict[str, Any]:
        return {
            "schema": SUMMARY_SCHEMA,
            "verdict": self.verdict,
            "complete": self.complete,
            "tier": self.tier,
            "spec": self.spec_name,
            "spec_digest": self.spec_digest,
            "gates_version": self.gates_version,
            "gates": {g.name: {"status": g.status, "suite": g.suite, "rows": g.rows, "failed": g.failed,
                               "waived": g.waived, "reason": g.reason} for g in self.gates.values()},
            "failing_rows": self.failing_rows,
            "counts": self.counts,
            "suites": self.suites,
        }


def missing_result_rows(plan: Plan, rows: pd.DataFrame, suites: list[str] | None = None) -> list[dict]:
    """Error rows for plan cases (of ``suites``, default all) that have no row at all."""
    seen = set(rows["case_id"].dropna()) if len(rows) else set()
    wanted = set(suites) if suites is not None else set(plan.suites)
    out = []
    for case in [*plan.cases, *(w.case for w in plan.waivers)]:
        if case.suite in wanted and case.case_id not in seen:
            out.append(make_row(case.suite, case.case_id, "", "result", status="error", message=NO_RESULT,
                                detail={"kind": case.kind, "config": case.config}))
    return out


def _row_evidence(row: dict) -> dict:
    """A failing row as the verdict lists it: identity, numbers, message, evidence."""
    out = {k: row.get(k) for k in ("suite", "case_id", "gate", "metric", "value", "threshold",
                                   "comparator", "status", "message")}
    for k in ("value", "threshold"):
        if isinstance(out[k], float) and out[k] != out[k]:
            out[k] = None
    for k in ("evidence", "detail"):
        try:
            out[k] = json.loads(row.get(k) or "{}")
        except (TypeError, ValueError):
            out[k] = row.get(k)
    return out


def evaluate(spec: Spec, rows: pd.DataFrame, plan: Plan, tier: str | None = None,
             suite_state: dict[str, str] | None = None) -> Verdict:
    """Judge ``rows`` against the spec's gates for ``plan``.

    ``suite_state`` maps suite -> done|crashed|not_run (default: every plan suite done).
    Cases of suites that did not run are not reported missing: the verdict is incomplete.
    """
    tier = tier or plan.tier
    state = {s: "done" for s in plan.suites}
    state.update(suite_state or {})
    ran = [s for s in plan.suites if state.get(s) != "not_run"]
    complete = all(state.get(s) != "not_run" for s in plan.suites)

    rows = rows_frame(rows.to_dict("records")) if len(rows) else rows_frame([])
    added = missing_result_rows(plan, rows, ran)
    if added:
        rows = rows_frame([*rows.to_dict("records"), *added])
    records = rows.to_dict("records")

    gates: dict[str, GateResult] = {}
    failing: list[dict] = []
    run_cases = {c.case_id for c in plan.cases}

    invalid = {i: p for i, r in enumerate(records) if (p := row_status_problem(r["status"], r["passed"]))}

    def is_bad(r: dict) -> bool:
        if r["status"] == "info":
            return False
        if r["status"] == "waived":
            return tier != "smoke" and r["case_id"] in run_cases
        return r["status"] in ("fail", "error") or (r["status"] == "pass" and not r["passed"])

    for name, settings in spec.gates.settings.items():
        mine_all = [(i, r) for i, r in enumerate(records) if r["gate"] == name]
        mine = [r for i, r in mine_all if i not in invalid]
        bad = [r for r in mine if is_bad(r)]
        waived = [r for r in mine if r["status"] == "waived"]
        info = [r for r in mine if r["status"] == "info"]
        suite = settings["suite"]
        if len(mine) < len(mine_all):
            status, reason = "fail", f"{len(mine_all) - len(mine)} invalid row(s) (unknown status or contradicting passed)"
        elif not mine:
            status = "missing"
            reason = "no evidence: no row for this gate" if state.get(suite) != "not_run" else "suite not run"
        elif bad:
            late = sum(r["status"] == "waived" for r in bad)
            status, reason = "fail", f"{len(bad)} of {len(mine)} rows failed" + (
                f" ({late} waived at run time: not accepted on the {tier} tier)" if late else "")
        elif len(waived) == len(mine):
            status = "waived"
            reason = "all rows are waivers" + ("" if tier == "smoke" else f" (not accepted on the {tier} tier)")
        elif len(waived) + len(info) == len(mine):
            status = "info"
            reason = "only informational rows: nothing gated" + ("" if tier == "smoke" else f" (not accepted on the {tier} tier)")
        else:
            status, reason = "pass", ""
        gates[name] = GateResult(name, suite, status, len(mine), len(bad), len(waived), reason)
        failing += [_row_evidence(r) for r in bad]

    for i, problem in invalid.items():
        ev = _row_evidence(records[i])
        ev["message"] = f"invalid row: {problem}" + (f"; {ev['message']}" if ev["message"] else "")
        failing.append(ev)
    known = set(spec.gates.settings)
    for i, r in enumerate(records):
        if i in invalid or (r["status"] == "info" and not r["gate"]):
            continue  # reported above / an ungated comparison
        if r["gate"] not in known:
            ev = _row_evidence(r)
            if r["gate"]:
                ev["message"] = f"unknown gate {r['gate']!r}" + (f"; {ev['message']}" if ev["message"] else "")
            failing.append(ev)

    statuses = [r["status"] for r in records]
    counts = {
        "rows": len(records),
        **{s: statuses.count(s) for s in ("pass", "fail", "error", "waived", "info")},
        "cases_planned": len(plan.cases) + len(plan.waivers),
        "cases_waived_by_plan": len(plan.waivers),
        "cases_without_result": len(added),
    }
    if not complete:
        verdict = "incomplete"
    elif not failing and all(g.ok(tier) for g in gates.values()):
        verdict = "pass"
    else:
        verdict = "fail"
    return Verdict(verdict, complete, tier, spec.name, spec.digest, spec.gates.version, gates, failing,
                   counts, {s: state.get(s, "not_run") for s in plan.suites}, rows)
