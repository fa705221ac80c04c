"""What `fastpath check` reports beside its rules (fastpath.check calls these).

* the rules that passed without checking anything here (a directory has no archive framing,
  no tier was required, a smoke bundle's hardware is not gated), so "pass" is never claimed for
  a check that did not apply;
* the one line an unfinished run leads with: which suites are missing, and how to resume;
* the gates and the perf headline for the markdown summary, read from the bundle's files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastpath.report import sections
from fastpath.report.view import BundleView, cap


def not_applicable(ctx: Any, status: dict[str, str]) -> dict[str, str]:
    out = {}
    if status.get("canonical_archive") == "pass" and Path(ctx.bundle_path).is_dir():
        out["canonical_archive"] = "a directory was checked, not an archive"
    if status.get("tier_sufficient") == "pass" and ctx.require_tier is None:
        out["tier_sufficient"] = "no --require-tier given"
    if status.get("hardware_in_scope") == "pass" and _tier(ctx) == "smoke":
        out["hardware_in_scope"] = "a smoke-tier bundle's hardware is not gated"
    return out


def _tier(ctx: Any) -> str | None:
    try:
        return ctx.tier
    except Exception:  # noqa: BLE001 - a bad tier is reported by the rules themselves
        return None


def incomplete_hint(bundle_dir: Path | None) -> str:
    """'incomplete: ...' for a bundle of an unfinished run, else ''."""
    if bundle_dir is None:
        return ""
    view = BundleView(Path(bundle_dir))
    summary = view.json("summary.json")
    if summary.get("complete") is not False and summary.get("verdict") != "incomplete":
        return ""
    suites = summary.get("suites") if isinstance(summary.get("suites"), dict) else {}
    missing = [cap(s, 60) for s, state in sorted(suites.items()) if state == "not_run"]
    argv = view.json("environment.json").get("argv")
    run_dir = "RUN_DIR"
    if isinstance(argv, list) and "--out" in argv[:-1]:
        run_dir = cap(argv[argv.index("--out") + 1], 300)
    only = f" --only {','.join(missing)}" if missing else ""
    return (f"incomplete: suites not run: {', '.join(missing) or 'unknown'}; resume with "
            f"`fastpath verify --resume {run_dir}{only}` (RUN_DIR: the run's --out), then sign the finished bundle")


def bundle_view(bundle_dir: Path) -> dict:
    """Gates and the K3-style perf table, capped, for the step summary."""
    from fastpath.report.summary import MAX_PERF_ROWS

    view = BundleView(Path(bundle_dir))
    v = sections.verdict(view)
    perf = sections.perf_section(view)
    rows = [r for r in perf.get("table", []) if not r["control"]][:MAX_PERF_ROWS] if perf.get("present") else []
    return {"verdict": {"verdict": v["verdict"], "gates": v["gates"][:64]}, "perf": rows}
