"""`fastpath check`: the CI gate over a hostile evidence bundle.

Checks are named units run in order (as in MLPerf's submission checker); each lists the rules it
depends on and is skipped, with the reason, when one of them failed. Every failure names its
rule and a specific reason. The bundle is read only after `safe_extraction` has vetted it.

The spec a bundle is judged against is the one the TREE declares (``--spec``, else the
``[tool.fastpath] default_spec`` of the source's pyproject.toml), never the path the bundle
recorded. Freshness: ``enforce`` fails on any stale attested part (fast path, validation,
subject, spec); ``warn`` still checks integrity fully but reports staleness as warnings and
judges plan, hardware and gates by the bundle's own spec.toml.
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fastpath.bundle import MANIFEST
from fastpath.check_context import FRESHNESS, TIERS, BadInput, Context, Fail, declared_spec, default_plan_cases
from fastpath.check_rules import RULES
from fastpath.check_trust import load_trust
from fastpath.safe_tar import Limits, UnsafeBundle, open_bundle

__all__ = ["FRESHNESS", "TIERS", "BadInput", "CheckReport", "check_bundle", "declared_spec", "main_check"]


# --- report ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Failure:
    rule: str
    reason: str


@dataclass
class RuleResult:
    name: str
    description: str
    status: str  # pass | fail | skipped
    reasons: list[str]


@dataclass
class CheckReport:
    bundle: str
    results: list[RuleResult]
    require_tier: str | None = None
    tier: str | None = None
    warnings: list[str] = field(default_factory=list)
    spec: str | None = None
    freshness: str = "enforce"
    signers: list[dict] = field(default_factory=list)  # {"keyid", "owner"} of each verified signature
    not_applicable: dict[str, str] = field(default_factory=dict)  # passed rule -> why it checked nothing
    incomplete: str = ""  # "incomplete: resume with ..." when the bundle is of an unfinished run
    bundle_view: dict | None = None  # gates and perf headline, read only once integrity was verified
    report_html: str | None = None  # the report page re-rendered from the verified bundle (--report)

    @property
    def passed(self) -> bool:
        return all(r.status == "pass" for r in self.results)

    def lead(self) -> str:
        """The first line a person reads: the outcome, who signed it, the tier it is good for."""
        if self.incomplete:
            return self.incomplete
        if not self.passed:
            names = ", ".join(self.failed_rules())
            return f"failed: {len(self.failures)} failure(s) in {names}"
        who = ", ".join(f"{s['owner'] or 'unnamed owner'} (key {s['keyid'][:16]})" for s in self.signers) or "nobody"
        need = f"required tier {self.require_tier}" if self.require_tier else "no tier required (--require-tier not given)"
        return f"passed: {self.tier} bundle signed by {who}; {need}"

    @property
    def failures(self) -> list[Failure]:
        return [Failure(r.name, reason) for r in self.results if r.status == "fail" for reason in r.reasons]

    def failed_rules(self) -> list[str]:
        return [r.name for r in self.results if r.status == "fail"]

    def to_dict(self) -> dict:
        return {"bundle": self.bundle, "passed": self.passed, "tier": self.tier, "require_tier": self.require_tier,
                "spec": self.spec, "freshness": self.freshness, "warnings": list(self.warnings),
                "signers": list(self.signers), "not_applicable": dict(self.not_applicable),
                "incomplete": self.incomplete, "rules": [r.__dict__ for r in self.results],
                "failures": [f.__dict__ for f in self.failures]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def render_markdown(self) -> str:
        from markupsafe import Markup

        from fastpath.report.summary import MAX_REASONS, markdown

        icon = {"pass": "✅ pass", "fail": "❌ fail", "skipped": "⏭ skipped"}
        rules = [{"name": r.name, "icon": "➖ n/a" if r.name in self.not_applicable else icon[r.status],
                  "reasons": (r.reasons or [self.not_applicable.get(r.name) or r.description])[:MAX_REASONS],
                  "more": max(0, len(r.reasons) - MAX_REASONS)} for r in self.results]
        view = self.bundle_view or {}
        return markdown({"icon": "✅" if self.passed else "❌", "word": "passed" if self.passed else "failed",
                         "lead": self.lead(), "bundle": self.bundle, "tier": self.tier,
                         "required": self.require_tier or "none (--require-tier not given)", "spec": self.spec,
                         "freshness": self.freshness, "signers": self.signers, "warnings": self.warnings[:MAX_REASONS],
                         "not_applicable": sorted(self.not_applicable.items()), "rules": rules,
                         "verdict": view.get("verdict"), "perf": view.get("perf"), "br": Markup("<br>")})

    def render_text(self, width: int = 110) -> str:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=f"fastpath check {self.bundle}", show_lines=False)
        table.add_column("check")
        table.add_column("status")
        table.add_column("reason", overflow="fold")
        style = {"pass": "green", "fail": "bold red", "skipped": "yellow"}
        for r in self.results:
            if r.name in self.not_applicable:
                table.add_row(r.name, "[dim]n/a[/]", escape(self.not_applicable[r.name]))
                continue
            table.add_row(r.name, f"[{style[r.status]}]{r.status}[/]", escape("\n".join(r.reasons) or r.description))
        buf = io.StringIO()
        console = Console(file=buf, width=width, force_terminal=False, color_system=None)
        if self.incomplete:
            console.print(f"[bold yellow]{escape(self.incomplete)}[/]", highlight=False, soft_wrap=True)
        console.print(table)
        for w in self.warnings:
            console.print(f"[bold yellow]{escape(w)}[/]", highlight=False, soft_wrap=True)
        console.print("[bold green]PASSED[/]" if self.passed else f"[bold red]FAILED[/] ({len(self.failures)} failure(s))")
        console.print(escape(self.lead()), highlight=False, soft_wrap=True)
        return buf.getvalue()


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- entry points ----------------------------------------------------------------------------

SAFE_EXTRACTION = "no absolute paths, '..', links, devices, oversize, nothing after the archive's end"


def check_bundle(bundle_path: Path, *, trust_path: Path, source_root: Path, require_tier: str | None = None,
                 spec: Path | None = None, freshness: str = "enforce",
                 plan_builder: Callable[[Path, str], dict] | None = None, limits: Limits = Limits(),
                 render_report: bool = False) -> CheckReport:
    """Run every rule over the bundle (an archive or a directory) and return the report.

    ``spec``: the tree's spec, relative to ``source_root`` (default: its pyproject's
    [tool.fastpath] default_spec). Raises BadInput when the tree declares no readable spec.
    """
    if freshness not in FRESHNESS:
        raise BadInput(f"freshness {freshness!r} is not one of {', '.join(FRESHNESS)}")
    root = Path(source_root).resolve()
    ctx = Context(Path(bundle_path), Path(trust_path), root, require_tier, plan_builder or default_plan_cases,
                  declared_spec(root, spec), freshness)
    results: list[RuleResult] = []
    try:
        with open_bundle(ctx.bundle_path, limits) as d:
            ctx.dir = d
            results.append(RuleResult("safe_extraction", SAFE_EXTRACTION, "pass", []))
            _run_rules(ctx, results)
            tier = _safe_tier(ctx)
            extras = _outcome_extras(ctx, results)
            if render_report:
                extras["report_html"] = _checked_report(ctx, results, extras)
    except UnsafeBundle as e:
        results = [RuleResult("safe_extraction", SAFE_EXTRACTION, "fail", [str(e)])]
        results += [RuleResult(r.name, r.description, "skipped", ["not run: safe_extraction failed"]) for r in RULES]
        tier, extras = None, {}
    return CheckReport(str(bundle_path), results, require_tier, tier, ctx.warnings, ctx.tree_spec_rel(), freshness,
                       **extras)


def _outcome_extras(ctx: Context, results: list[RuleResult]) -> dict:
    """What the report says beside the rules: signer, rules that checked nothing, an unfinished
    run's resume hint, and (once integrity is verified) the gates and the perf headline."""
    from fastpath.report.outcome import bundle_view, incomplete_hint, not_applicable

    status = {r.name: r.status for r in results}
    try:
        trust = load_trust(ctx.trust_path)
    except Fail:
        trust = {}
    out = {"signers": [{"keyid": k, "owner": trust[k].owner if k in trust else ""} for k in ctx.signer_keyids],
           "not_applicable": not_applicable(ctx, status), "incomplete": incomplete_hint(ctx.dir)}
    if all(status.get(n) == "pass" for n in ("manifest", "signature", "statement_binding")):
        out["bundle_view"] = bundle_view(ctx.dir)
    return out


def _checked_report(ctx: Context, results: list[RuleResult], extras: dict) -> str:
    from fastpath.report import render

    failures = [{"rule": r.name, "reason": x} for r in results if r.status == "fail" for x in r.reasons]
    signers = ", ".join(f"{s['owner'] or 'unnamed owner'} (key {s['keyid'][:16]})" for s in extras["signers"])
    line = (f"signed by {signers}" if signers else "no trusted signature") + f"; checked against {ctx.tree_spec_rel()}"
    name = ctx.bundle_path.name.removesuffix(".tar.gz")
    return render(ctx.dir, checked={"passed": not failures and all(r.status == "pass" for r in results),
                                    "line": line, "failures": failures[:200]}, name=name)


def _safe_tier(ctx: Context) -> str | None:
    try:
        return ctx.tier
    except Fail:
        return None


def _run_rules(ctx: Context, results: list[RuleResult]) -> None:
    status = {"safe_extraction": "pass"}
    for rule in RULES:
        blocked = [n for n in rule.needs if status.get(n) != "pass"]
        if blocked:
            results.append(RuleResult(rule.name, rule.description, "skipped", [f"not run: {', '.join(blocked)} failed"]))
            status[rule.name] = "skipped"
            continue
        try:
            reasons = rule.run(ctx)
        except Fail as e:
            reasons = [str(e)]
        except Exception as e:  # hostile input must yield a failure, never a crash
            reasons = [f"error while checking: {type(e).__name__}: {e}"]
        status[rule.name] = "fail" if reasons else "pass"
        results.append(RuleResult(rule.name, rule.description, status[rule.name], reasons))


def _validate_inputs(bundle: Path, trust: Path) -> None:
    """Exit-2 conditions: nothing to check, or no trust policy to check it with."""
    bundle = Path(bundle)
    if bundle.is_dir():
        if not (bundle / MANIFEST).is_file() and not any((d / MANIFEST).is_file() for d in bundle.iterdir() if d.is_dir()):
            raise BadInput(f"{bundle} is not a bundle directory (no {MANIFEST})")
    elif bundle.is_file():
        with open(bundle, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                raise BadInput(f"{bundle} is not a bundle (not a .tar.gz file)")
        if not _starts_like_tar(bundle):
            raise BadInput(f"{bundle} is not a bundle (gzip, but not of a tar archive)")
    else:
        raise BadInput(f"no such bundle: {bundle}")
    try:
        load_trust(trust)
    except Fail as e:
        raise BadInput(str(e)) from None


def _starts_like_tar(path: Path) -> bool:
    """Whether the gzip's first block is a POSIX tar header (what `pack` writes): a cheap look
    before the safe extraction, so a stray .tar.gz gets one line instead of a table of rules."""
    import gzip
    import zlib

    try:
        with gzip.open(path, "rb") as f:
            head = f.read(512)
    except (OSError, EOFError, zlib.error):
        return True  # a broken archive is the safe extraction's to explain
    return len(head) == 512 and head[257:262] == b"ustar"


def main_check(bundle: Path, *, trust: Path = Path("bundles/trusted_keys.toml"), source: Path = Path("."),
               require_tier: str | None = None, fmt: str = "text", spec: Path | None = None,
               freshness: str = "enforce", out=None, err=None, report_out: Path | None = None) -> int:
    """CLI body: print the report in ``fmt`` (text|markdown|json), append markdown to
    $GITHUB_STEP_SUMMARY when set; return the exit code (0 pass, 1 fail, 2 unusable input)."""
    import sys

    out, err = out or sys.stdout, err or sys.stderr
    rendered = {"text": "render_text", "markdown": "render_markdown", "json": "to_json"}
    try:
        if fmt not in rendered:
            raise BadInput(f"format {fmt!r} is not one of {', '.join(rendered)}")
        if require_tier is not None and require_tier not in TIERS:
            raise BadInput(f"--require-tier {require_tier!r} is not one of {', '.join(TIERS)}")
        _validate_inputs(bundle, trust)
        report = check_bundle(bundle, trust_path=trust, source_root=source, require_tier=require_tier, spec=spec,
                              freshness=freshness, render_report=report_out is not None)
    except BadInput as e:
        err.write(f"error: {e}\n")
        return 2
    out.write(getattr(report, rendered[fmt])() + ("\n" if fmt == "json" else ""))
    if report_out is not None and report.report_html is not None:
        from fastpath.report.rerender import write_page

        write_page(report.report_html, Path(report_out))
        err.write(f"report (re-rendered from the checked bundle): {report_out}\n")
    if fmt == "json":  # warnings are in the JSON; repeat them where a person reads the log
        for w in report.warnings:
            err.write(w + "\n")
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_file:
        with open(summary_file, "a", encoding="utf-8") as f:
            f.write(report.render_markdown())
    return 0 if report.passed else 1
