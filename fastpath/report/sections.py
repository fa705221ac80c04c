"""The report's sections as plain data for the template (one function per section).

Everything here is computed from the bundle's own files (BundleView); nothing is fetched or
run. Display strings are capped; the template escapes them.
"""

from __future__ import annotations

import tomllib
from collections import Counter

from fastpath.report import charts, perf
from fastpath.report.view import BundleView, cap, integer, loads_object, number, pretty

# The suites the report has a section for, in page order; others get a generic table.
KNOWN_SUITES = ("coverage", "kernels", "parity", "evals", "features", "perf")
MAX_TABLE_ROWS = 5000   # rows of one suite's full table (the rest: results/rows.parquet)
MAX_FAILING_SHOWN = 200
MAX_CHART_KERNELS = 60
CONFIG_KEYS = ("tp", "batch", "context", "draft", "dtype", "path", "component", "kernel")


def fmt(value: object) -> str:
    v = number(value)
    if v is None:
        return cap(value, 60) if isinstance(value, str) else ""
    if abs(v) >= 1000 and abs(v) < 1e15:
        return f"{v:,.0f}"  # tokens/s, bytes: digits grouped, no exponent (the sort script drops the commas)
    if v == int(v):
        return str(int(v))
    return f"{v:.4g}"


def config_text(row: dict) -> str:
    return " ".join(f"{k}={cap(row[k], 80)}" for k in CONFIG_KEYS if row.get(k) not in (None, ""))


def display_row(r: dict) -> dict:
    return {"case_id": cap(r.get("case_id")), "gate": cap(r.get("gate")), "metric": cap(r.get("metric")),
            "value": fmt(r.get("value")), "threshold": fmt(r.get("threshold")), "comparator": cap(r.get("comparator"), 4),
            "status": cap(r.get("status"), 20), "config": config_text(r), "message": cap(r.get("message"))}


# --- verdict and gates -------------------------------------------------------------------------

def verdict(view: BundleView) -> dict:
    s = view.json("summary.json")
    gates = s.get("gates") if isinstance(s.get("gates"), dict) else {}
    rows = []
    for name, g in sorted(gates.items(), key=lambda kv: str(kv[0])):
        g = g if isinstance(g, dict) else {"status": g}
        rows.append({"name": cap(name, 200), "suite": cap(g.get("suite"), 100), "status": cap(g.get("status"), 20),
                     "rows": fmt(g.get("rows")), "failed": fmt(g.get("failed")), "waived": fmt(g.get("waived")),
                     "reason": cap(g.get("reason"))})
    rows.sort(key=lambda g: (g["status"] not in ("fail", "missing"), g["name"]))
    failing = s.get("failing_rows") if isinstance(s.get("failing_rows"), list) else []
    shown = [_failing(f) for f in failing[:MAX_FAILING_SHOWN] if isinstance(f, dict)]
    counts = s.get("counts") if isinstance(s.get("counts"), dict) else {}
    word = cap(s.get("verdict") or "unknown", 20)
    return {"verdict": word, "complete": s.get("complete") is True, "tier": cap(s.get("tier"), 20),
            "spec": cap(s.get("spec"), 200), "gates_version": cap(s.get("gates_version"), 200),
            "gates": rows, "failing_gates": [g for g in rows if g["status"] in ("fail", "missing")],
            "failing": shown, "failing_total": len(failing),
            "counts": [(cap(k, 60), fmt(v)) for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))]}


def _failing(f: dict) -> dict:
    out = display_row(f)
    out["suite"] = cap(f.get("suite"), 100)
    out["evidence"] = pretty(f.get("evidence")) if f.get("evidence") not in (None, {}, "") else ""
    out["detail"] = pretty(f.get("detail")) if f.get("detail") not in (None, {}, "") else ""
    return out


def suite_states(view: BundleView) -> list[dict]:
    """Every known suite and every suite of the plan: done, crashed, not run, or not planned."""
    s = view.json("summary.json")
    states = s.get("suites") if isinstance(s.get("suites"), dict) else {}
    counted = Counter(str(r.get("suite")) for r in view.records())
    names = list(KNOWN_SUITES) + sorted(str(n) for n in states if n not in KNOWN_SUITES)
    out = []
    for name in names:
        state = states.get(name)
        ran = state in ("done", "crashed")
        out.append({"name": cap(name, 100), "state": cap(state or "not in this bundle's plan", 60), "ran": ran,
                    "rows": counted.get(name, 0)})
    return out


# --- scope and coverage ------------------------------------------------------------------------

def scope(view: BundleView) -> dict:
    spec_text = view.text("spec.toml", 1 << 20) or ""
    try:
        spec = tomllib.loads(spec_text)
    except tomllib.TOMLDecodeError as e:
        view.problems.append(f"spec.toml is not valid TOML ({cap(e, 200)})")
        spec = {}
    sc = spec.get("scope") if isinstance(spec.get("scope"), dict) else {}
    plan = view.json("plan.json")
    cases = plan.get("cases") if isinstance(plan.get("cases"), list) else []
    waivers = plan.get("waivers") if isinstance(plan.get("waivers"), list) else []
    per_suite = Counter(str(c.get("suite")) for c in cases if isinstance(c, dict))
    waived = [{"case_id": cap(w.get("case_id") or (w.get("case") or {}).get("case_id")), "reason": cap(w.get("reason"))}
              for w in waivers if isinstance(w, dict)]
    tiers = spec.get("tiers") if isinstance(spec.get("tiers"), dict) else {}
    summary_tier = view.json("summary.json").get("tier")
    tier = tiers.get(summary_tier) if isinstance(summary_tier, str) else None
    narrowed = sorted((tier or {}).items()) if isinstance(tier, dict) else []
    return {"scope": [(cap(k, 60), cap(v, 400)) for k, v in sorted(sc.items())],
            "tier": [(cap(k, 60), cap(v, 400)) for k, v in narrowed], "tier_name": cap(summary_tier, 20),
            "cases": [(cap(k, 100), n) for k, n in sorted(per_suite.items())], "waivers": waived,
            "spec_text": spec_text}


def coverage(view: BundleView) -> dict:
    """Per case, the variant each component ran (or the reason it was refused)."""
    matrix: dict[str, dict[str, str]] = {}
    for r in view.records():
        if r.get("suite") != "coverage":
            continue
        m = loads_object(r.get("evidence")).get("coverage_matrix")
        case = cap(r.get("case_id"), 200)
        if isinstance(m, dict):
            matrix.setdefault(case, {}).update({cap(k, 100): cap(v, 300) for k, v in m.items()})
        elif r.get("component") and loads_object(r.get("detail")).get("cell"):
            matrix.setdefault(case, {})[cap(r["component"], 100)] = cap(loads_object(r.get("detail"))["cell"], 300)
    components = sorted({c for cells in matrix.values() for c in cells})
    table = [{"case_id": case, "cells": [cells.get(c, "") for c in components]} for case, cells in sorted(matrix.items())]
    refused = Counter(v for cells in matrix.values() for v in cells.values() if v.startswith("refused:"))
    return {"components": components, "table": table[:MAX_TABLE_ROWS],
            "refused": sorted(refused.items(), key=lambda kv: (-kv[1], kv[0]))}


# --- numerics ----------------------------------------------------------------------------------

def kernels(view: BundleView) -> dict:
    """Error vs tolerance per kernel, shape and dtype (the noise-floor rows)."""
    rows, by_kernel = [], {}
    for r in view.records():
        if r.get("suite") != "kernels" or r.get("metric") != "max_abs_err":
            continue
        d = loads_object(r.get("detail"))
        value, tol = number(r.get("value")), number(r.get("threshold"))
        kernel = cap(r.get("kernel") or r.get("component") or "?", 100)
        ratio = value / tol if value is not None and tol else None
        rows.append({"kernel": kernel, "component": cap(r.get("component"), 100), "dtype": cap(r.get("dtype"), 30),
                     "shape": cap(d.get("shape_label") or d.get("shape"), 100), "value_class": cap(d.get("value_class"), 40),
                     "err_fast": fmt(value), "err_standard": fmt(d.get("err_standard")), "tolerance": fmt(tol),
                     "ratio": fmt(ratio), "status": cap(r.get("status"), 20)})
        if ratio is not None:
            by_kernel.setdefault(kernel, []).append(ratio)
    shown = dict(list(by_kernel.items())[:MAX_CHART_KERNELS])
    chart = (charts.error_vs_tolerance(list(shown), [v[:500] for v in shown.values()], "kernels") if shown else "")
    others = [display_row(r) for r in view.records() if r.get("suite") == "kernels" and r.get("metric") != "max_abs_err"]
    return {"rows": rows[:MAX_TABLE_ROWS], "chart": chart, "checks": _check_counts(others)}


def _check_counts(rows: list[dict]) -> list[dict]:
    """Other checks of a suite (finite, deterministic, jitter...) as metric -> status counts."""
    seen: dict[str, Counter] = {}
    for r in rows:
        seen.setdefault(r["metric"], Counter())[r["status"]] += 1
    return [{"metric": m, "counts": ", ".join(f"{n} {s}" for s, n in sorted(c.items()))} for m, c in sorted(seen.items())]


def parity(view: BundleView) -> list[dict]:
    out = []
    for r in view.records():
        if r.get("suite") != "parity":
            continue
        d = loads_object(r.get("detail"))
        out.append({**display_row(r), "context_bucket": fmt(r.get("context")), "floor": fmt(d.get("floor", d.get("kl_floor"))),
                    "positions": fmt(d.get("n_positions"))})
    return sorted(out, key=lambda x: (integer(x["context_bucket"]) or 0, x["metric"]))


def evals(view: BundleView) -> list[dict]:
    """Paired results: value with its CI, agreement of outputs vs the noise floor."""
    out = []
    for r in view.records():
        if r.get("suite") != "evals":
            continue
        d = loads_object(r.get("detail"))
        lo, hi = perf._ci(d)
        bucket = integer(r.get("context"))  # a per-bucket row: its prompt-length bucket beside the task
        task = cap(d.get("task") or r.get("case_id"), 200) + (f" c{bucket}" if bucket else "")
        out.append({**display_row(r), "task": task,
                    "ci": f"[{fmt(lo)}, {fmt(hi)}]" if lo is not None and hi is not None else "",
                    "agreement": fmt(d.get("agreement")), "noise_floor": fmt(d.get("agreement_floor", d.get("noise_floor"))),
                    "p_value": fmt(d.get("p_value")), "n": fmt(d.get("n", d.get("samples")))})
    return out


def suite_rows(view: BundleView, suite: str) -> dict:
    rows = [display_row(r) for r in view.records() if r.get("suite") == suite]
    return {"rows": rows[:MAX_TABLE_ROWS], "total": len(rows)}


# --- perf --------------------------------------------------------------------------------------

def perf_section(view: BundleView) -> dict:
    cases = perf.perf_cases(view.records())
    if not cases:
        return {"present": False}
    heatmaps = []
    for g in perf.grids(cases)[:6]:
        title = "speedup" + "".join(f", {k}={v}" for k, v in (("draft", g["draft"]), ("tp", g["tp"])) if v is not None)
        heatmaps.append(charts.speedup_heatmap(g["batches"], g["contexts"], g["speedup"], g["passed"],
                                               g["threshold"], title, f"heat-{len(heatmaps)}"))
    bw = perf.bandwidth(cases)
    points = perf.roofline_points(cases)
    paths = sorted({p for c in cases for p in c.paths} - {"fast", "standard"})
    table = []
    for c in cases:
        mbu = c.get("mbu", "fast")
        al = c.acceptance_length
        synthetic = " synthetic" if al is not None and (c.draft or 0) > 0 else ""
        table.append({"context": fmt(c.context), "batch": fmt(c.batch), "draft": fmt(c.draft), "tp": fmt(c.tp),
                      "acceptance": "" if al is None else f"{fmt(al)}{synthetic}",
                      "control": c.control, "standard": fmt(c.get("tokens_per_s", "standard")),
                      "fast": fmt(c.get("tokens_per_s", "fast")), "others": [fmt(c.get("tokens_per_s", p)) for p in paths],
                      "step_fast": fmt(c.get("step_ms", "fast")), "step_standard": fmt(c.get("step_ms", "standard")),
                      "speedup": fmt(c.speedup), "ci": f"[{fmt(c.ci[0])}, {fmt(c.ci[1])}]" if None not in c.ci else "",
                      "threshold": fmt(c.threshold), "status": cap(c.status, 20),
                      "mbu": "" if mbu is None else f"{mbu * 100 if mbu <= 1.5 else mbu:.0f} %",
                      "bytes": fmt(c.get("bytes_per_step", "fast"))})
    return {"present": True, "heatmaps": heatmaps, "roofline": charts.roofline(points, bw, "roofline") if points else "",
            "bandwidth": fmt(bw), "table": table[:MAX_TABLE_ROWS],
            # the column only where a case has one (a bundle without drafts renders as before)
            "acceptance": any(r["acceptance"] for r in table), "other_paths": [cap(p, 40) for p in paths]}


# --- environment and reproduction --------------------------------------------------------------

def environment(view: BundleView) -> dict:
    env = view.json("environment.json")
    flat = []
    for key in ("hardware", "gpu", "cpu", "os", "python", "packages", "env", "git", "seeds", "triton_interpreter",
                "spec_path"):
        if key in env:
            flat.append((key, pretty(env[key]) if isinstance(env[key], (dict, list)) else cap(env[key])))
    attested = view.json("attested.json")
    parts = attested.get("parts") if isinstance(attested.get("parts"), dict) else {}
    digests = [(cap(p, 40), cap((v or {}).get("digest") if isinstance(v, dict) else v, 100)) for p, v in sorted(parts.items())]
    return {"items": flat, "digests": digests, "harness": cap(attested.get("harness_version"), 100)}


def reproduce(view: BundleView, bundle_name: str) -> list[str]:
    env, s = view.json("environment.json"), view.json("summary.json")
    git = env.get("git") if isinstance(env.get("git"), dict) else {}
    spec = cap(env.get("spec_path") or "SPEC", 300)
    tier = cap(s.get("tier") or "TIER", 20)
    lines = []
    if git.get("commit"):
        lines.append(f"git checkout {cap(git['commit'], 64)}")
        if git.get("dirty"):
            lines.append(f"# the run's tree had uncommitted changes (diff sha256 {cap(git.get('diff_sha256'), 64)})")
    lines += [f"fastpath verify {spec} --tier {tier} --key ~/.config/fastpath/keys/fastpath-ed25519.key",
              f"fastpath check {cap(bundle_name, 300)}.tar.gz --require-tier {tier}",
              f"fastpath report {cap(bundle_name, 300)}.tar.gz"]
    argv = env.get("argv")
    if isinstance(argv, list):
        lines.append("# recorded invocation: " + cap(" ".join(str(a) for a in argv), 1000))
    return lines
