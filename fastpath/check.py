"""`fastpath check`: the CI gate over a hostile evidence bundle (DESIGN §3.8).

Checks are named units run in order (as in MLPerf's submission checker); each lists the rules it
depends on and is skipped, with the reason, when one of them failed. Every failure names its
rule and a specific reason. The bundle is read only after `safe_extraction` has vetted it.
"""

from __future__ import annotations

import io
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from fastpath.bundle import ENVELOPE, MANIFEST, ROWS, STATEMENT, UNLISTED, build_manifest
from fastpath.digest import SourceDigestError, sha256_file, source_digest
from fastpath.safe_tar import Limits, UnsafeBundle, check_name, open_bundle
from fastpath.signing import SOURCE_SUBJECT, SignatureError, keyid, parse_public_key, verify_envelope_keys

TIERS = ("smoke", "full")  # ascending strength
# Gate statuses a tier accepts; all-waived gates are allowed on smoke only (docs/architecture.md).
ACCEPTED_GATE_STATUS = {"smoke": {"pass", "waived"}, "full": {"pass"}}


class Fail(Exception):
    """Raised inside a rule: the rule fails with this reason."""


# --- trust policy ----------------------------------------------------------------------------

@dataclass(frozen=True)
class TrustedKey:
    keyid: str
    public_key: Any
    owner: str
    tiers: frozenset[str]


def load_trust(path: Path) -> dict[str, TrustedKey]:
    """keyid -> TrustedKey from bundles/trusted_keys.toml; a malformed entry is an error."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise Fail(f"cannot read trust policy {path}: {e}") from e
    out = {}
    for i, entry in enumerate(data.get("keys", [])):
        where = f"{path}: keys[{i}]"
        try:
            pub = parse_public_key(entry["public_key"])
        except (KeyError, ValueError, TypeError) as e:
            raise Fail(f"{where}: bad or missing public_key ({e})") from e
        kid = keyid(pub)
        if entry.get("keyid") != kid:
            raise Fail(f"{where}: keyid {entry.get('keyid')!r} does not match its public_key (expected {kid})")
        tiers = entry.get("tiers", [])
        if not tiers or not set(tiers) <= set(TIERS):
            raise Fail(f"{where}: tiers must be a non-empty subset of {list(TIERS)}, got {tiers!r}")
        out[kid] = TrustedKey(kid, pub, str(entry.get("owner", "")), frozenset(tiers))
    return out


# --- context ---------------------------------------------------------------------------------

def default_plan_cases(spec_path: Path, tier: str) -> dict:
    """Plan JSON recomputed from a spec file (part A's spec + plan modules)."""
    from fastpath.plan import build_plan
    from fastpath.spec import load_spec

    return build_plan(load_spec(spec_path), tier).to_json()


@dataclass
class Context:
    bundle_path: Path
    trust_path: Path
    source_root: Path
    require_tier: str | None
    plan_builder: Callable[[Path, str], dict]
    dir: Path | None = None
    statement: dict | None = None
    signer_keyids: list[str] = field(default_factory=list)
    _cache: dict = field(default_factory=dict)

    def json(self, name: str) -> dict:
        if name not in self._cache:
            p = self.dir / name
            if not p.is_file():
                raise Fail(f"{name} is missing from the bundle")
            try:
                value = json.loads(p.read_bytes())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise Fail(f"{name} is not valid JSON: {e}") from e
            if not isinstance(value, dict):
                raise Fail(f"{name} is not a JSON object")
            self._cache[name] = value
        return self._cache[name]

    @property
    def tier(self) -> str:
        tier = self.json("summary.json").get("tier")
        if tier not in TIERS:
            raise Fail(f"summary.json tier {tier!r} is not one of {list(TIERS)}")
        return tier

    def tree_spec(self) -> Path:
        """The reviewer's copy of the spec: same repo-relative path as recorded in the bundle."""
        if "tree_spec" in self._cache:
            return self._cache["tree_spec"]
        env = self.json("environment.json")
        rel = env.get("spec_path") or self.json("summary.json").get("spec_path")
        if not rel:
            rel = _default_spec(self.source_root)
        if not isinstance(rel, str):
            raise Fail("environment.json spec_path is not a string")
        try:
            rel = check_name(rel, Limits())
        except UnsafeBundle as e:
            raise Fail(f"recorded spec path is unsafe: {e}") from e
        path = self.source_root / rel
        if not path.is_file():
            raise Fail(f"the tree has no spec at {rel} (the path recorded in the bundle)")
        self._cache["tree_spec"] = path
        return path

    def tree_spec_data(self) -> dict:
        if "tree_spec_data" not in self._cache:
            self._cache["tree_spec_data"] = tomllib.loads(self.tree_spec().read_text(encoding="utf-8"))
        return self._cache["tree_spec_data"]

    def plan(self) -> dict:
        if "plan" not in self._cache:
            try:
                self._cache["plan"] = self.plan_builder(self.tree_spec(), self.tier)
            except Fail:
                raise
            except Exception as e:  # a bad tree spec is the reviewer's problem, but say so
                raise Fail(f"cannot build the plan from the tree's spec: {e}") from e
        return self._cache["plan"]

    def rows(self) -> pd.DataFrame:
        if "rows" not in self._cache:
            p = self.dir / ROWS
            if not p.is_file():
                raise Fail(f"{ROWS} is missing from the bundle")
            try:
                df = pd.read_parquet(p)
            except Exception as e:
                raise Fail(f"{ROWS} is not readable Parquet: {e}") from e
            missing = {"case_id", "gate", "status"} - set(df.columns)
            if missing:
                raise Fail(f"{ROWS} lacks columns {sorted(missing)}")
            self._cache["rows"] = df
        return self._cache["rows"]


def _default_spec(root: Path) -> str:
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
        return data["tool"]["fastpath"]["default_spec"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        raise Fail("bundle records no spec_path and the tree has no [tool.fastpath] default_spec") from None


# --- rules -----------------------------------------------------------------------------------

def rule_manifest(ctx: Context) -> list[str]:
    manifest = ctx.json(MANIFEST)
    listed = manifest.get("files")
    if not isinstance(listed, list):
        return ["manifest.json has no files list"]
    reasons, seen = [], set()
    for entry in listed:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            reasons.append(f"manifest entry {entry!r} is malformed")
            continue
        path = entry["path"]
        if path in seen:
            reasons.append(f"{path}: listed twice in the manifest")
        seen.add(path)
        try:
            check_name(path, Limits())
        except UnsafeBundle as e:
            reasons.append(f"manifest path {path!r} is unsafe: {e.reason}")
            continue
        p = ctx.dir / path
        if not p.is_file():
            reasons.append(f"{path}: listed in the manifest but missing")
            continue
        digest, size = sha256_file(p)
        if size != entry.get("size"):
            reasons.append(f"{path}: size {size} != manifest {entry.get('size')}")
        if digest != entry.get("sha256"):
            reasons.append(f"{path}: sha256 {digest[:12]}… != manifest {str(entry.get('sha256'))[:12]}… (content changed)")
    on_disk = {f["path"] for f in build_manifest(ctx.dir)["files"]}
    for extra in sorted(on_disk - seen - UNLISTED):
        reasons.append(f"{extra}: present in the bundle but not listed in the manifest")
    return reasons


def rule_signature(ctx: Context) -> list[str]:
    trust = load_trust(ctx.trust_path)
    if not (ctx.dir / ENVELOPE).is_file():
        return [f"no signature: {ENVELOPE} is missing (sign with `fastpath sign BUNDLE --key KEY`)"]
    if not trust:
        return [f"the trust policy {ctx.trust_path} lists no keys"]
    envelope = ctx.json(ENVELOPE)
    try:
        statement, keyids = verify_envelope_keys(envelope, {k: t.public_key for k, t in trust.items()})
    except SignatureError as e:
        return [f"signature rejected: {e}"]
    ctx.statement, ctx.signer_keyids = statement, keyids
    tier = ctx.tier
    allowed = [k for k in keyids if tier in trust[k].tiers]
    if not allowed:
        owners = ", ".join(f"{trust[k].owner or k[:12]} may attest {sorted(trust[k].tiers)}" for k in keyids)
        return [f"signing key is trusted but not for tier {tier!r} ({owners})"]
    return []


def _subject(statement: dict, name: str) -> str | None:
    for s in statement.get("subject") or []:
        if isinstance(s, dict) and s.get("name") == name:
            return (s.get("digest") or {}).get("sha256")
    return None


def rule_statement_binding(ctx: Context) -> list[str]:
    st = ctx.statement or {}
    reasons = []
    manifest_digest = sha256_file(ctx.dir / MANIFEST)[0]
    if _subject(st, MANIFEST) != manifest_digest:
        reasons.append(f"statement subject manifest.json {_subject(st, MANIFEST)} != sha256 of manifest.json {manifest_digest}")
    attested_source = ctx.json("source_digest.json").get("digest")
    if _subject(st, SOURCE_SUBJECT) != attested_source:
        reasons.append(f"statement subject {SOURCE_SUBJECT} {_subject(st, SOURCE_SUBJECT)} != source_digest.json {attested_source}")
    # statement.json is a readable copy of the signed payload; a copy that differs misleads readers.
    if (ctx.dir / STATEMENT).is_file() and ctx.json(STATEMENT) != st:
        reasons.append("statement.json differs from the signed statement in statement.dsse.json")
    pred = st.get("predicate") or {}
    if pred.get("tier") != ctx.json("summary.json").get("tier"):
        reasons.append(f"statement tier {pred.get('tier')!r} != summary.json tier")
    spec_sha = sha256_file(ctx.dir / "spec.toml")[0] if (ctx.dir / "spec.toml").is_file() else None
    if (pred.get("spec") or {}).get("sha256") != spec_sha:
        reasons.append("statement spec digest != sha256 of the bundle's spec.toml")
    return reasons


def rule_spec_matches_tree(ctx: Context) -> list[str]:
    bundled = ctx.dir / "spec.toml"
    if not bundled.is_file():
        return ["spec.toml is missing from the bundle"]
    tree = ctx.tree_spec()
    if bundled.read_bytes() != tree.read_bytes():
        return [f"bundle spec.toml ({sha256_file(bundled)[0][:12]}…) differs from the tree's "
                f"{tree.relative_to(ctx.source_root).as_posix()} ({sha256_file(tree)[0][:12]}…)"]
    return []


def rule_source_digest(ctx: Context) -> list[str]:
    globs = (ctx.tree_spec_data().get("sources") or {}).get("globs") or []
    try:
        tree = source_digest(ctx.source_root, list(globs))
    except SourceDigestError as e:
        return [f"cannot compute the tree's source digest: {e}"]
    recorded = ctx.json("source_digest.json")
    attested = _subject(ctx.statement, SOURCE_SUBJECT) if ctx.statement else recorded.get("digest")
    if tree["digest"] == attested:
        return []
    ours = {f["path"]: f["sha256"] for f in tree["files"]}
    theirs = {f.get("path"): f.get("sha256") for f in recorded.get("files") or [] if isinstance(f, dict)}
    diffs = sorted([f"{p} changed" for p in ours.keys() & theirs.keys() if ours[p] != theirs[p]]
                   + [f"{p} not in bundle" for p in ours.keys() - theirs.keys()]
                   + [f"{p} not in tree" for p in theirs.keys() - ours.keys()])
    return [f"fast-path source digest of the tree {tree['digest'][:12]}… != attested {str(attested)[:12]}…"
            + (f" ({'; '.join(diffs[:10])})" if diffs else "")]


def rule_plan_covers_scope(ctx: Context) -> list[str]:
    expected = ctx.plan()
    bundled = ctx.json("plan.json")
    reasons = []
    for key, what in (("cases", "case"), ("waivers", "waiver")):
        want = {c["case_id"]: c for c in expected.get(key, [])}
        have = {c.get("case_id"): c for c in bundled.get(key) or [] if isinstance(c, dict)}
        for cid in sorted(want.keys() - have.keys()):
            reasons.append(f"plan is missing {what} {cid}")
        for cid in sorted(have.keys() - want.keys()):
            reasons.append(f"plan has {what} {cid} that the spec's {ctx.tier} plan does not allow")
        if key == "waivers":
            for cid in sorted(want.keys() & have.keys()):
                if want[cid].get("reason") != have[cid].get("reason"):
                    reasons.append(f"waiver {cid}: reason {have[cid].get('reason')!r} != plan's {want[cid].get('reason')!r}")
    return reasons


def rule_results_cover_plan(ctx: Context) -> list[str]:
    plan = ctx.plan()
    rows = ctx.rows()
    by_case = rows.groupby("case_id")["status"].apply(set).to_dict()
    reasons = []
    for c in plan.get("cases", []):
        cid = c["case_id"]
        statuses = by_case.get(cid)
        if not statuses:
            reasons.append(f"case {cid} has no result row")
        elif "waived" in statuses and ctx.tier == "full":
            reasons.append(f"case {cid} was waived at run time; the full-tier plan allows no waiver for it")
    for w in plan.get("waivers", []):
        if not by_case.get(w["case_id"]):
            reasons.append(f"waiver {w['case_id']} has no waiver row")
    known = {c["case_id"] for c in plan.get("cases", []) + plan.get("waivers", [])}
    unknown = sorted(set(by_case) - known)
    if unknown:
        reasons.append(f"{len(unknown)} result row case id(s) not in the plan, e.g. {unknown[0]}")
    return reasons


def rule_hardware_in_scope(ctx: Context) -> list[str]:
    env = ctx.json("environment.json")
    hw = env.get("hardware")
    if ctx.tier != "full":
        return []  # smoke is CPU-capable functional evidence: hardware is not gated
    spec = ctx.tree_spec_data()
    tier_scope = (spec.get("tiers") or {}).get("full") or {}
    allowed = tier_scope.get("hardware") or (spec.get("scope") or {}).get("hardware") or []
    archs = [d.get("arch") for d in ((env.get("gpu") or {}).get("devices") or []) if isinstance(d, dict)] or [hw]
    bad = sorted({str(a) for a in archs if a not in allowed})
    if bad:
        return [f"hardware {', '.join(bad)} is outside the spec's scope.hardware {allowed}"]
    return []


def recompute_verdict(ctx: Context):
    """The verdict recomputed from the bundle's rows by fastpath.gates, over the tree's plan."""
    from fastpath.gates import evaluate
    from fastpath.plan import Plan
    from fastpath.spec import load_spec

    return evaluate(load_spec(ctx.tree_spec()), ctx.rows(), Plan.from_json(ctx.plan()), ctx.tier)


def rule_gates_passed(ctx: Context) -> list[str]:
    summary = ctx.json("summary.json")
    reasons = []
    if summary.get("complete") is not True:
        reasons.append("summary.json says the run is incomplete")
    if summary.get("verdict") != "pass":
        reasons.append(f"verdict is {summary.get('verdict')!r}, not 'pass'")
    gates = [g for g in (ctx.tree_spec_data().get("gates") or {}) if g != "version"]
    accepted = ACCEPTED_GATE_STATUS[ctx.tier]
    recorded = summary.get("gates") or {}
    # Never trust the summary alone: the rows decide (a buggy or edited run may claim a pass).
    recomputed = recompute_verdict(ctx)
    for g in gates:
        entry = recorded.get(g)
        status = entry.get("status") if isinstance(entry, dict) else entry
        if status is None:
            reasons.append(f"gate {g}: absent from summary.json")
        elif status not in accepted:
            reasons.append(f"gate {g}: {status}" + (f" ({entry.get('reason')})" if isinstance(entry, dict)
                                                     and entry.get("reason") else ""))
        mine = recomputed.gates.get(g)
        if mine is not None and mine.status != status:
            reasons.append(f"gate {g}: recomputed from the rows as {mine.status!r} ({mine.reason}), summary says {status!r}")
    if recomputed.verdict != "pass" and not reasons:
        reasons.append(f"verdict recomputed from the rows is {recomputed.verdict!r}: "
                       + "; ".join(f"{r.get('case_id')}: {r.get('message') or r.get('status')}"
                                   for r in recomputed.failing_rows[:5]))
    return reasons


def rule_tier_sufficient(ctx: Context) -> list[str]:
    if ctx.require_tier is None:
        return []
    if ctx.require_tier not in TIERS:
        return [f"required tier {ctx.require_tier!r} is not one of {list(TIERS)}"]
    if TIERS.index(ctx.tier) < TIERS.index(ctx.require_tier):
        return [f"bundle tier {ctx.tier!r} is below the required tier {ctx.require_tier!r}"]
    return []


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    run: Callable[[Context], list[str]]
    needs: tuple[str, ...] = ("safe_extraction",)


# The checks, in order; rules as data.
RULES: tuple[Rule, ...] = (
    Rule("manifest", "every file listed with the right size and sha256, nothing unlisted", rule_manifest),
    Rule("signature", "DSSE envelope signed by a key the trust policy allows for this tier", rule_signature),
    Rule("statement_binding", "statement subjects match manifest.json and source_digest.json",
         rule_statement_binding, ("signature",)),
    Rule("spec_matches_tree", "spec.toml is byte-identical to the tree's spec", rule_spec_matches_tree),
    Rule("source_digest", "fast-path sources in the tree hash to the attested digest", rule_source_digest),
    Rule("plan_covers_scope", "plan.json has every case and waiver of the tree spec's plan", rule_plan_covers_scope),
    Rule("results_cover_plan", "every planned case has a result row; waivers only where allowed",
         rule_results_cover_plan),
    Rule("hardware_in_scope", "full-tier runs on hardware the spec's scope lists", rule_hardware_in_scope),
    Rule("gates_passed", "run complete, verdict pass, every gate passed (recomputed from the rows)",
         rule_gates_passed),
    Rule("tier_sufficient", "bundle tier at least the required tier", rule_tier_sufficient),
)


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

    @property
    def passed(self) -> bool:
        return all(r.status == "pass" for r in self.results)

    @property
    def failures(self) -> list[Failure]:
        return [Failure(r.name, reason) for r in self.results if r.status == "fail" for reason in r.reasons]

    def failed_rules(self) -> list[str]:
        return [r.name for r in self.results if r.status == "fail"]

    def to_dict(self) -> dict:
        return {"bundle": self.bundle, "passed": self.passed, "tier": self.tier, "require_tier": self.require_tier,
                "rules": [r.__dict__ for r in self.results],
                "failures": [f.__dict__ for f in self.failures]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def render_markdown(self) -> str:
        head = "✅ **fastpath check passed**" if self.passed else "❌ **fastpath check failed**"
        lines = [f"### {head}", "", f"Bundle `{self.bundle}` · tier `{self.tier}` · required `{self.require_tier}`",
                 "", "| check | status | reason |", "|---|---|---|"]
        for r in self.results:
            icon = {"pass": "✅ pass", "fail": "❌ fail", "skipped": "⏭ skipped"}[r.status]
            reason = "<br>".join(_md_escape(x) for x in r.reasons) or _md_escape(r.description)
            lines.append(f"| `{r.name}` | {icon} | {reason} |")
        return "\n".join(lines) + "\n"

    def render_text(self, width: int = 110) -> str:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"fastpath check {self.bundle}", show_lines=False)
        table.add_column("check")
        table.add_column("status")
        table.add_column("reason", overflow="fold")
        style = {"pass": "green", "fail": "bold red", "skipped": "yellow"}
        for r in self.results:
            table.add_row(r.name, f"[{style[r.status]}]{r.status}[/]", "\n".join(r.reasons) or r.description)
        buf = io.StringIO()
        console = Console(file=buf, width=width, force_terminal=False, color_system=None)
        console.print(table)
        console.print("[bold green]PASSED[/]" if self.passed else f"[bold red]FAILED[/] ({len(self.failures)} failure(s))")
        return buf.getvalue()


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- entry points ----------------------------------------------------------------------------

def check_bundle(bundle_path: Path, *, trust_path: Path, source_root: Path, require_tier: str | None = None,
                 plan_builder: Callable[[Path, str], dict] | None = None, limits: Limits = Limits()) -> CheckReport:
    """Run every rule over the bundle (an archive or a directory) and return the report."""
    ctx = Context(Path(bundle_path), Path(trust_path), Path(source_root).resolve(), require_tier,
                  plan_builder or default_plan_cases)
    results: list[RuleResult] = []
    try:
        with open_bundle(ctx.bundle_path, limits) as d:
            ctx.dir = d
            results.append(RuleResult("safe_extraction", "no absolute paths, '..', links, devices, oversize", "pass", []))
            _run_rules(ctx, results)
            tier = _safe_tier(ctx)
    except UnsafeBundle as e:
        results = [RuleResult("safe_extraction", "no absolute paths, '..', links, devices, oversize", "fail", [str(e)])]
        results += [RuleResult(r.name, r.description, "skipped", ["not run: safe_extraction failed"]) for r in RULES]
        tier = None
    return CheckReport(str(bundle_path), results, require_tier, tier)


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


def main_check(bundle: Path, *, trust: Path = Path("bundles/trusted_keys.toml"), source: Path = Path("."),
               require_tier: str | None = None, fmt: str = "text", out=None) -> int:
    """CLI body: print the report in ``fmt`` (text|markdown|json), append markdown to
    $GITHUB_STEP_SUMMARY when set; return the exit code (0 pass, 1 fail)."""
    import sys

    out = out or sys.stdout
    report = check_bundle(bundle, trust_path=trust, source_root=source, require_tier=require_tier)
    rendered = {"text": report.render_text, "markdown": report.render_markdown, "json": report.to_json}
    if fmt not in rendered:
        raise ValueError(f"format {fmt!r} is not one of {sorted(rendered)}")
    out.write(rendered[fmt]() + ("\n" if fmt == "json" else ""))
    summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_file:
        with open(summary_file, "a", encoding="utf-8") as f:
            f.write(report.render_markdown())
    return 0 if report.passed else 1
