"""Diagnosis of the full tier's two failures with drafts on (perf notes, run Y), on mini as the
full tier runs it: the coverage suite's profiler case at a draft (its production generation's
drafter looked ahead on the standard path, whose kernels then sat in the profile), and the perf
suite's draft cases against the compiled standard verify step (a device-side assert: the
benchmark step's ``keep`` counts were freed while its graph still read them). Runs the suites'
own case functions and prints each row's verdict:

    python3 -m lab.gpu_draft_diag [PERF_CASES [TIER]]   # e.g. b1-c1024-d0,b1-c1024-d3 full
"""

from __future__ import annotations

import sys
import time

from fastpath.engine import create_engine
from fastpath.pytest_plugin import LazyModels
from fastpath.spec import load_spec
from fastpath.suites import test_coverage as C
from fastpath.suites import test_perf as P

SPEC = "optimized_model/k3/fastpath.toml"
COVERAGE = ("b1-c1024-d3", "b8-c8192-d7")
PERF = "b1-c1024-d0,b1-c1024-d3,b16-c1024-d3,b16-c8192-d3,b8-c8192-d7"


def _config(label: str) -> dict:
    b, c, d = label.split("-")
    return {"batch": int(b[1:]), "context": int(c[1:]), "draft": int(d[1:]), "tp": 1, "dcp": 1}


def run(label: str, fn) -> None:
    rows: list[dict] = []

    def record(gate, metric, value, **kw):
        rows.append({"gate": gate, "metric": metric, "value": value, **kw})
        return True

    t = time.monotonic()
    try:
        fn(record)
    except Exception as exc:  # report and go on: each case is evidence on its own
        print(f"{label}: raised {type(exc).__name__}: {exc}"[:600], flush=True)
    for r in rows:
        if r.get("status") == "info" and r["metric"] not in ("step_ms", "tokens_per_s"):
            continue
        print(f"{label}: {r['gate']} {r['metric']} = {r['value']} passed={r.get('passed')} "
              f"status={r.get('status')} path={r.get('path')} {(r.get('message') or '')[:300]}", flush=True)
    print(f"{label}: {time.monotonic() - t:.0f} s", flush=True)


def main() -> None:
    spec = load_spec(SPEC)
    tier = spec.tier(sys.argv[2] if len(sys.argv) > 2 else "full")
    engine = create_engine("embedded", **tier.engine_options_for("perf"))
    models = LazyModels(lambda: engine, spec.switch)
    for label in COVERAGE:
        case = {"case_id": f"coverage/profiler/{label}", "config": _config(label)}
        run(f"coverage {label}", lambda record, case=case: C.test_profiler_kernels(
            case, engine, models, record, lambda gate, why, *a, **kw: print(f"waived {gate}: {why}")))
    for label in (sys.argv[1] if len(sys.argv) > 1 else PERF).split(","):
        case = {"case_id": f"perf/speedup/{label}", "config": _config(label)}
        run(f"perf {label}", lambda record, case=case: P.test_speedup(case, models, engine, spec, tier, record))


if __name__ == "__main__":
    main()
