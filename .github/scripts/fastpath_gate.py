#!/usr/bin/env python3
"""The PR gate's decision, run by .github/workflows/fastpath-gate.yml.

For every gated spec of the BASE branch (`[tool.fastpath] gated_specs` in base/pyproject.toml,
default: its `default_spec`), compare the attested digests of the base tree and of the PR tree
(`fastpath digest --json`, both computed by the base's fastpath). Unchanged: skipped. Changed:
the PR must carry `bundles/<spec name>.full.fastpath.tar.gz`, and the base's `fastpath check`
must accept it against the PR's tree with the base's trust policy.

Everything under --pr is hostile data: it is read, never executed or imported, and no PR string
reaches a shell. Standard library only, so it runs with whichever python runs the checker.

Exit: 0 every gated spec passed or was unchanged, 1 a spec failed, 2 the base's set-up is broken.
Writes a markdown table (spec, parts changed, bundle, verdict) to --summary or
$GITHUB_STEP_SUMMARY; with --reports DIR, each checked bundle's report page (re-rendered by the
base's checker from the rows it verified) lands in DIR for the workflow to upload.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# A spec name becomes part of a file name: keep it to a conservative alphabet.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TIER = "full"
TAIL = 2000  # characters of a failing command's stderr kept in the summary
# $GITHUB_STEP_SUMMARY takes at most 1 MiB per step: each spec's check report is capped well below.
REPORT_CAP = 200_000

UNCHANGED, PASS, FAIL, MISSING = "unchanged (skipped)", "pass", "fail", "missing bundle"
ICON = {UNCHANGED: "⏭", PASS: "✅", FAIL: "❌", MISSING: "❌"}


class GateError(Exception):
    """The base branch's own set-up is unusable (exit 2): cause and fix."""

    def __init__(self, cause: str, fix: str):
        super().__init__(cause)
        self.cause, self.fix = cause, fix


@dataclass
class Result:
    spec: str
    verdict: str
    changed: list[str] = field(default_factory=list)
    bundle: str = ""
    reason: str = ""
    report: str = ""  # the checker's markdown report, when it ran

    @property
    def ok(self) -> bool:
        return self.verdict in (UNCHANGED, PASS)


# --- inputs ---------------------------------------------------------------------------------

def repo_relative(rel: object, what: str) -> str:
    """A path that must stay inside a checkout (no absolute path, no '..')."""
    if not isinstance(rel, str) or not rel:
        raise GateError(f"{what} {rel!r} is not a path", "list repository-relative paths")
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or "\\" in rel:
        raise GateError(f"{what} {rel!r} leaves the repository", "list repository-relative paths")
    return p.as_posix()


def gated_specs(base: Path) -> list[str]:
    """The specs the gate protects, read from the BASE branch's pyproject.toml."""
    py = base / "pyproject.toml"
    try:
        tool = tomllib.loads(py.read_text(encoding="utf-8")).get("tool", {}).get("fastpath", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise GateError(f"cannot read {py}: {e}", "the base branch needs a valid pyproject.toml") from e
    specs = tool.get("gated_specs")
    if specs is None:
        if "default_spec" not in tool:
            raise GateError(f"{py} has neither [tool.fastpath] gated_specs nor default_spec",
                            "add gated_specs = [\"path/to/fastpath.toml\"] to [tool.fastpath]")
        specs = [tool["default_spec"]]
    if not isinstance(specs, list) or not specs:
        raise GateError(f"{py}: [tool.fastpath] gated_specs must be a non-empty list of paths",
                        "gated_specs = [\"path/to/fastpath.toml\"]")
    return [repo_relative(s, "gated spec") for s in specs]


def inside(root: Path, rel: str) -> Path | None:
    """root/rel when it is a regular file inside root, not reached through a link; else None."""
    p = root / rel
    try:
        if p.is_symlink() or not p.is_file() or not p.resolve().is_relative_to(root.resolve()):
            return None
    except OSError:
        return None
    return p


# --- running the base's fastpath --------------------------------------------------------------

def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GITHUB_STEP_SUMMARY", None)  # the gate writes the summary itself, once
    env["PYTHONSAFEPATH"] = "1"           # never import from the working directory
    return env


class DigestFailed(Exception):
    pass


def digest(fastpath: list[str], spec: Path, source: Path, cwd: Path) -> dict:
    """`fastpath digest SPEC --source DIR --json` -> {"name", "parts": {...}}."""
    proc = subprocess.run([*fastpath, "digest", str(spec), "--source", str(source), "--json"],
                          capture_output=True, text=True, env=_env(), cwd=cwd)
    if proc.returncode != 0:
        raise DigestFailed(f"`fastpath digest` exited {proc.returncode}: {proc.stderr.strip()[-TAIL:]}")
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise DigestFailed(f"`fastpath digest --json` printed no JSON ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("parts"), dict) or not isinstance(data.get("name"), str):
        raise DigestFailed("`fastpath digest --json` output lacks name or parts")
    return data


def judge(spec: str, base: Path, pr: Path, fastpath: list[str], trust: Path, reports: Path | None = None) -> Result:
    """The verdict for one gated spec; with ``reports``, the checker also writes the reviewer's
    page, re-rendered from the bundle it checked, to reports/<spec name>.report.html."""
    pr_spec = inside(pr, spec)
    if pr_spec is None:
        return Result(spec, FAIL, reason=f"the PR has no regular file {spec} inside its tree (removed, or a link): "
                      "drop it from [tool.fastpath] gated_specs in a reviewed change of its own first")
    base_spec = inside(base, spec)
    try:
        before = digest(fastpath, base_spec, base, base)["parts"] if base_spec else {}
    except DigestFailed as e:
        raise GateError(f"the base branch's digest of {spec} failed: {e}", "fix the base branch") from e
    try:
        after = digest(fastpath, pr_spec, pr, base)
    except DigestFailed as e:
        return Result(spec, FAIL, reason=f"cannot compute the PR's attested digests: {e}")
    changed = sorted(p for p in set(before) | set(after["parts"]) if before.get(p) != after["parts"].get(p))
    if not changed:
        return Result(spec, UNCHANGED, reason="no attested part differs from the base")
    name = after["name"]
    if not NAME_RE.match(name):
        return Result(spec, FAIL, changed, reason=f"spec name {name!r} is not usable in a file name "
                      "(letters, digits, '.', '_', '-')")
    rel = f"bundles/{name}.{TIER}.fastpath.tar.gz"
    bundle = pr / rel
    if not bundle.exists() and not bundle.is_symlink():
        return Result(spec, MISSING, changed, rel,
                      f"attested parts changed ({', '.join(changed)}) but the PR has no {rel}: run "
                      f"`fastpath verify {spec} --tier full --key KEY` on a GPU in the spec's scope and commit the bundle")
    if inside(pr, rel) is None:
        return Result(spec, FAIL, changed, rel, f"{rel} is not a regular file inside the PR's tree")
    page = ["--report", str(reports / f"{name}.report.html")] if reports is not None else []
    proc = subprocess.run([*fastpath, "check", str(bundle), "--require-tier", TIER, "--freshness", "enforce",
                           "--trust", str(trust), "--source", str(pr), "--spec", str(pr_spec),
                           "--format", "markdown", *page], capture_output=True, text=True, env=_env(), cwd=base)
    if proc.returncode == 0:
        return Result(spec, PASS, changed, rel, report=proc.stdout)
    why = {1: "fastpath check rejected the bundle"}.get(proc.returncode, f"fastpath check exited {proc.returncode}")
    return Result(spec, FAIL, changed, rel, why + (f": {proc.stderr.strip()[-TAIL:]}" if proc.stderr.strip() else ""),
                  report=proc.stdout)


# --- output ---------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def summary(results: list[Result]) -> str:
    ok = all(r.ok for r in results)
    lines = [f"## {'✅' if ok else '❌'} fastpath PR gate", "",
             "Checker and trust policy from the base branch; bundles checked against the PR's tree.", "",
             "| spec | attested parts changed | bundle | verdict |", "|---|---|---|---|"]
    for r in results:
        verdict = f"{ICON[r.verdict]} {r.verdict}" + (f": {_cell(r.reason)}" if r.reason and not r.ok else "")
        lines.append(f"| `{_cell(r.spec)}` | {_cell(', '.join(r.changed)) or 'none'} | "
                     f"{f'`{_cell(r.bundle)}`' if r.bundle else '—'} | {verdict} |")
    for r in results:
        if r.report:
            report = r.report.strip()
            if len(report) > REPORT_CAP:  # cut at a line end: a table row is never left half-written
                report = report[:report.rfind("\n", 0, REPORT_CAP)] + "\n\n… (report cut to fit the step summary)"
            lines += ["", f"<details{' open' if not r.ok else ''}><summary>fastpath check: {_cell(r.spec)}</summary>",
                      "", report, "", "</details>"]
    return "\n".join(lines) + "\n"


def print_log(results: list[Result]) -> None:
    # The reasons quote PR-controlled text: stop the runner from reading workflow commands in it.
    token = secrets.token_hex(16)
    print(f"::stop-commands::{token}")
    for r in results:
        print(f"{r.spec}: {r.verdict}" + (f" (changed: {', '.join(r.changed)})" if r.changed else "")
              + (f": {r.reason}" if r.reason else ""))
        if r.report and not r.ok:
            print(r.report.rstrip())
    print(f"::{token}::")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="checkout of the base branch (trusted)")
    ap.add_argument("--pr", type=Path, required=True, help="checkout of the PR (data only)")
    ap.add_argument("--fastpath", default="fastpath", help="the base's fastpath executable")
    ap.add_argument("--trust", type=Path, help="trust policy (default: BASE/bundles/trusted_keys.toml)")
    ap.add_argument("--summary", type=Path, help="markdown summary file (default: $GITHUB_STEP_SUMMARY)")
    ap.add_argument("--reports", type=Path, help="directory for each checked bundle's report page (an artifact)")
    args = ap.parse_args(argv)
    base, pr = args.base.resolve(), args.pr.resolve()
    trust = (args.trust or base / "bundles" / "trusted_keys.toml").resolve()
    try:
        if not trust.is_file():
            raise GateError(f"no trust policy at {trust}", "the base branch needs bundles/trusted_keys.toml")
        reports = args.reports.resolve() if args.reports else None
        if reports is not None:
            reports.mkdir(parents=True, exist_ok=True)
        results = [judge(spec, base, pr, [args.fastpath], trust, reports) for spec in gated_specs(base)]
    except GateError as e:
        print(f"error: {e.cause}\n  fix: {e.fix}", file=sys.stderr)
        return 2
    print_log(results)
    target = args.summary or (Path(os.environ["GITHUB_STEP_SUMMARY"]) if os.environ.get("GITHUB_STEP_SUMMARY") else None)
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(summary(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
