"""The perf suite's rows, gathered per case for the report's heatmap, roofline and K3 table.

The row shapes this reads (one case = one batch x context x draft x tp):

* ``metric = "speedup"``: value = ratio of medians (standard / fast step time), threshold =
  min_speedup, status the gate's; ``detail`` carries the CI as ``ci_low``/``ci_high`` (or
  ``ci = [low, high]``) and may carry the per-path figures below as ``{metric}_{path}`` or
  ``{metric: {path: value}}``, plus ``hbm_gbps`` (the bandwidth measured in the run) and
  ``control = true`` for the standard-vs-standard control case.
* per-path rows, ``path`` = fast | standard | standard_eager | ..., metric one of PATH_METRICS:
  tokens_per_s, step_ms, mbu, bytes_per_step, ms_per_output_token (and ``hbm_gbps`` rows
  without a path).
* ``metric = "acceptance_length"`` (or ``acceptance_length`` in the speedup row's detail): the
  tokens a step emits per sequence, synthetic at draft > 0 (the spec's declared value), by
  which the tokens/s of a draft case are counted.

Whatever is absent is simply not drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastpath.report.view import integer, loads_object, number

PATH_METRICS = ("tokens_per_s", "step_ms", "mbu", "bytes_per_step", "ms_per_output_token")
# A chart stays readable (and a hostile bundle cannot ask matplotlib for a vast figure).
MAX_AXIS = 32
MAX_POINTS = 2000


@dataclass
class PerfCase:
    batch: int | None
    context: int | None
    draft: int | None
    tp: int | None
    case_id: str = ""
    speedup: float | None = None
    ci: tuple[float | None, float | None] = (None, None)
    threshold: float | None = None
    status: str = ""
    control: bool = False
    hbm_gbps: float | None = None
    acceptance_length: float | None = None
    paths: dict[str, dict[str, float]] = field(default_factory=dict)

    def get(self, metric: str, path: str) -> float | None:
        return self.paths.get(path, {}).get(metric)


def _ci(detail: dict) -> tuple[float | None, float | None]:
    ci = detail.get("ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        return number(ci[0]), number(ci[1])
    return (number(detail.get("ci_low", detail.get("ci_lower"))),
            number(detail.get("ci_high", detail.get("ci_upper"))))


def _paths_from_detail(detail: dict, case: PerfCase) -> None:
    for metric in PATH_METRICS:
        nested = detail.get(metric)
        if isinstance(nested, dict):
            for path, v in nested.items():
                if number(v) is not None:
                    case.paths.setdefault(str(path), {})[metric] = number(v)
        for key, v in detail.items():
            if isinstance(key, str) and key.startswith(metric + "_") and number(v) is not None:
                case.paths.setdefault(key[len(metric) + 1:], {})[metric] = number(v)


def perf_cases(records: list[dict]) -> list[PerfCase]:
    """One PerfCase per (batch, context, draft, tp) of the perf rows, sorted."""
    cases: dict[tuple, PerfCase] = {}
    for r in records:
        if r.get("suite") != "perf":
            continue
        key = tuple(integer(r.get(k)) for k in ("batch", "context", "draft", "tp"))
        detail = loads_object(r.get("detail"))
        control = bool(detail.get("control") is True or "control" in str(r.get("case_id") or ""))
        key = (*key, control)
        case = cases.setdefault(key, PerfCase(*key[:4], control=control))
        metric = str(r.get("metric") or "")
        value = number(r.get("value"))
        if metric == "speedup":
            case.case_id = str(r.get("case_id") or "")
            case.speedup, case.threshold = value, number(r.get("threshold"))
            case.status, case.ci = str(r.get("status") or ""), _ci(detail)
            _paths_from_detail(detail, case)
            if number(detail.get("acceptance_length")) is not None:
                case.acceptance_length = number(detail.get("acceptance_length"))
        elif metric == "acceptance_length":
            case.acceptance_length = value
        elif metric in PATH_METRICS and value is not None:
            case.paths.setdefault(str(r.get("path") or "fast"), {})[metric] = value
        elif metric == "hbm_gbps":
            case.hbm_gbps = value
        if number(detail.get("hbm_gbps")) is not None:
            case.hbm_gbps = number(detail.get("hbm_gbps"))
    order = lambda c: tuple(-1 if v is None else v for v in (c.tp, c.draft, c.context, c.batch))  # noqa: E731
    return sorted(cases.values(), key=lambda c: (c.control, order(c)))


def bandwidth(cases: list[PerfCase]) -> float | None:
    """The run's measured HBM bandwidth (GB/s): recorded, else implied by bytes, time and MBU."""
    recorded = [c.hbm_gbps for c in cases if c.hbm_gbps]
    if recorded:
        return sorted(recorded)[len(recorded) // 2]
    implied = []
    for c in cases:
        for figures in c.paths.values():
            b, ms, mbu = figures.get("bytes_per_step"), figures.get("step_ms"), figures.get("mbu")
            if b and ms and mbu:
                implied.append(b / (ms * 1e6) / (mbu if mbu <= 1.5 else mbu / 100))
    return sorted(implied)[len(implied) // 2] if implied else None


def roofline_points(cases: list[PerfCase]) -> list[dict]:
    points = []
    for c in cases:
        if c.control:
            continue
        for path, figures in sorted(c.paths.items()):
            if figures.get("bytes_per_step") and figures.get("step_ms"):
                points.append({"path": path, "bytes": figures["bytes_per_step"], "step_ms": figures["step_ms"],
                               "batch": c.batch, "draft": c.draft})
    return [p for p in points if p["bytes"] > 0 and p["step_ms"] > 0][:MAX_POINTS]  # log axes


def grids(cases: list[PerfCase]) -> list[dict]:
    """One heatmap grid per (draft, tp): batches, contexts, speedup and pass per cell."""
    out: dict[tuple, dict] = {}
    for c in cases:
        if c.control or c.speedup is None or c.batch is None or c.context is None:
            continue
        g = out.setdefault((c.draft, c.tp), {"draft": c.draft, "tp": c.tp, "speedup": {}, "passed": {},
                                             "threshold": c.threshold if c.threshold is not None else 1.0})
        g["speedup"][(c.batch, c.context)] = c.speedup
        if c.status in ("pass", "fail", "error"):
            g["passed"][(c.batch, c.context)] = c.status == "pass"
    for g in out.values():
        g["batches"] = sorted({b for b, _ in g["speedup"]})[:MAX_AXIS]
        g["contexts"] = sorted({c for _, c in g["speedup"]})[:MAX_AXIS]
    return [out[k] for k in sorted(out, key=lambda k: tuple(-1 if v is None else v for v in k))]
