"""The rules of `fastpath check`, as data: named units run in order, each with the rules it
needs (skipped, with the reason, when one of them failed) and a one-line description."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from typing import Any, Callable

from fastpath.bundle import ATTESTED, ENVELOPE, MANIFEST, ROWS, STATEMENT, UNLISTED, build_manifest, canonical_tar_digest
from fastpath.check_context import TIERS, Context
from fastpath.check_trust import load_trust
from fastpath.digest import PART_LABELS, PARTS, SourceDigestError, attested_parts, sha256_file, stale_parts, tree_digest
from fastpath.safe_tar import Limits, UnsafeBundle, check_name, tar_stream_digest
from fastpath.signing import PREDICATE_TYPE, SUBJECT_PREFIX, SignatureError, verify_envelope_keys


def rule_canonical_archive(ctx: Context) -> list[str]:
    """The archive's tar stream must be exactly what `pack` writes for its members: no extra
    headers, padding, metadata or order that another extractor could read differently."""
    if ctx.bundle_path.is_dir():
        return []
    have = tar_stream_digest(ctx.bundle_path)
    want = canonical_tar_digest(ctx.dir, ctx.dir.name)
    if have != want:
        return [f"the archive's tar stream ({have[1]} bytes, sha256 {have[0][:12]}…) is not what `fastpath pack` "
                f"writes for its members ({want[1]} bytes, sha256 {want[0][:12]}…): re-pack it with fastpath"]
    return []


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


def _claims(ctx: Context) -> list[tuple[str, Any, Any]]:
    """(claim, what the signed statement says, what the bundle's own files say)."""
    st = ctx.statement or {}
    pred = st.get("predicate") if isinstance(st.get("predicate"), dict) else {}
    summary, env, attested = ctx.json("summary.json"), ctx.json("environment.json"), ctx.json(ATTESTED)
    parts = attested.get("parts") if isinstance(attested.get("parts"), dict) else {}
    spec = pred.get("spec") if isinstance(pred.get("spec"), dict) else {}
    tool = pred.get("tool") if isinstance(pred.get("tool"), dict) else {}
    spec_sha = sha256_file(ctx.dir / "spec.toml")[0] if (ctx.dir / "spec.toml").is_file() else None
    gates = summary.get("gates") if isinstance(summary.get("gates"), dict) else {}
    claims = [
        ("predicateType", st.get("predicateType"), PREDICATE_TYPE),
        ("subject manifest.json", _subject(st, MANIFEST), sha256_file(ctx.dir / MANIFEST)[0]),
        *((f"subject {SUBJECT_PREFIX}{p}", _subject(st, SUBJECT_PREFIX + p), (parts.get(p) or {}).get("digest"))
          for p in PARTS),
        ("tier", pred.get("tier"), summary.get("tier")),
        ("verdict", pred.get("verdict"), summary.get("verdict")),
        ("complete", pred.get("complete"), summary.get("complete")),
        ("hardware", pred.get("hardware"), env.get("hardware")),
        ("gates", pred.get("gates"), {n: (g.get("status") if isinstance(g, dict) else g) for n, g in gates.items()}),
        ("spec.path", spec.get("path"), env.get("spec_path")),
        ("spec.name", spec.get("name"), summary.get("spec")),
        ("spec.sha256", spec.get("sha256"), spec_sha),
        ("tool.version", tool.get("version"), attested.get("harness_version")),
        ("invocation", pred.get("invocation"), {"argv": env.get("argv"), "git": env.get("git"), "seeds": env.get("seeds")}),
    ]
    return claims


def _internal_consistency(ctx: Context) -> list[str]:
    """The bundle's files must agree with each other (a file the predicate does not restate)."""
    summary, env, attested, plan = (ctx.json("summary.json"), ctx.json("environment.json"), ctx.json(ATTESTED),
                                    ctx.json("plan.json"))
    spec_sha = sha256_file(ctx.dir / "spec.toml")[0] if (ctx.dir / "spec.toml").is_file() else None
    try:
        spec_name = (tomllib.loads((ctx.dir / "spec.toml").read_text(encoding="utf-8")).get("fastpath") or {}).get("name")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        spec_name = None
    parts = attested.get("parts") if isinstance(attested.get("parts"), dict) else {}
    spec_files = (parts.get("spec") or {}).get("files") or [{}]
    pairs = [
        ("summary.json spec_digest", summary.get("spec_digest"), "sha256 of spec.toml", spec_sha),
        ("plan.json spec_digest", plan.get("spec_digest"), "sha256 of spec.toml", spec_sha),
        (f"{ATTESTED} spec digest", (spec_files[0] or {}).get("sha256") if isinstance(spec_files[0], dict) else None,
         "sha256 of spec.toml", spec_sha),
        ("summary.json spec", summary.get("spec"), "spec.toml [fastpath] name", spec_name),
        ("plan.json spec", plan.get("spec"), "summary.json spec", summary.get("spec")),
        ("plan.json tier", plan.get("tier"), "summary.json tier", summary.get("tier")),
        (f"{ATTESTED} spec_path", attested.get("spec_path"), "environment.json spec_path", env.get("spec_path")),
    ]
    reasons = [f"{a} {va!r} != {b} {vb!r}" for a, va, b, vb in pairs if va != vb]
    for p in PARTS:
        part = parts.get(p) if isinstance(parts.get(p), dict) else {}
        files = part.get("files")
        try:
            ok = isinstance(files, list) and tree_digest(files) == part.get("digest")
        except (KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            reasons.append(f"{ATTESTED} part {p}: its file list does not hash to its digest")
    counts = summary.get("counts") if isinstance(summary.get("counts"), dict) else {}
    if counts.get("rows") != len(ctx.rows()):
        reasons.append(f"summary.json counts.rows {counts.get('rows')!r} != {len(ctx.rows())} rows in {ROWS}")
    return reasons


def rule_statement_binding(ctx: Context) -> list[str]:
    """Every claim of the signed statement equals what the bundle's own files say."""
    reasons = [f"statement {name} {signed!r} contradicts the bundle's {actual!r}"
               for name, signed, actual in _claims(ctx) if signed != actual]
    # statement.json is a readable copy of the signed payload; a copy that differs misleads readers.
    if (ctx.dir / STATEMENT).is_file() and ctx.json(STATEMENT) != ctx.statement:
        reasons.append("statement.json differs from the signed statement in statement.dsse.json")
    return reasons + _internal_consistency(ctx)


def rule_result_rows(ctx: Context) -> list[str]:
    """Only documented row statuses (fastpath.results.STATUS_TABLE), `passed` consistent with them."""
    from fastpath.results import row_status_problem

    problems: dict[str, list[str]] = {}
    for r in ctx.rows()[["case_id", "status", "passed"]].to_dict("records"):
        problem = row_status_problem(r["status"], r["passed"])
        if problem:
            problems.setdefault(problem, []).append(str(r["case_id"]))
    return [f"{len(cases)} row(s) invalid: {problem} (e.g. {cases[0]})" for problem, cases in sorted(problems.items())]


def rule_spec_is_tree_spec(ctx: Context) -> list[str]:
    """The bundle is a run of the spec this tree declares (never the path the bundle recorded)."""
    bundled = ctx.dir / "spec.toml"
    if not bundled.is_file():
        return ["spec.toml is missing from the bundle"]
    from fastpath.spec import load_spec

    try:
        tree_name = load_spec(ctx.spec_path).name
    except Exception as e:
        return [f"the tree's spec {ctx.tree_spec_rel()} is invalid: {e}"]
    bundle_name = ctx.json("summary.json").get("spec")
    if bundle_name != tree_name:
        return [f"the bundle is for spec {bundle_name!r}, the tree declares {tree_name!r} ({ctx.tree_spec_rel()})"]
    recorded = ctx.json("environment.json").get("spec_path")
    if recorded != ctx.tree_spec_rel():
        message = f"the bundle's spec was at {recorded!r}, the tree declares {ctx.tree_spec_rel()!r}"
        if ctx.freshness == "enforce":
            return [message]
        ctx.warnings.append(f"warning: stale spec: {message}")
    return []


def rule_attested_digests(ctx: Context) -> list[str]:
    """The tree's four attested parts hash to what the statement attests; name each stale part."""
    from fastpath.spec import load_spec

    try:
        tree = attested_parts(ctx.source_root, load_spec(ctx.spec_path))
    except SourceDigestError as e:
        return [f"cannot digest the tree: {e}"]
    except Exception as e:
        return [f"cannot digest the tree for its spec {ctx.tree_spec_rel()}: {e}"]
    attested = {p: _subject(ctx.statement or {}, SUBJECT_PREFIX + p) for p in PARTS}
    recorded_parts = ctx.json(ATTESTED).get("parts")
    recorded = {p: (v or {}).get("files") for p, v in recorded_parts.items()} if isinstance(recorded_parts, dict) else {}
    reasons = []
    for part, diffs in stale_parts(tree, attested, recorded).items():
        shown = ", ".join(diffs[:10]) + (f", … {len(diffs) - 10} more" if len(diffs) > 10 else "")
        text = f"{PART_LABELS[part]} changed since the bundle" + (f": {shown}" if shown else "")
        if ctx.freshness == "enforce":
            reasons.append(f"stale: {text}")
        else:
            ctx.warnings.append(f"warning: stale {part}: {text}")
    return reasons


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
    spec = ctx.judging_spec_data()
    tier_scope = (spec.get("tiers") or {}).get("full") or {}
    allowed = tier_scope.get("hardware") or (spec.get("scope") or {}).get("hardware") or []
    archs = [d.get("arch") for d in ((env.get("gpu") or {}).get("devices") or []) if isinstance(d, dict)] or [hw]
    bad = sorted({str(a) for a in archs if a not in allowed})
    if bad:
        return [f"hardware {', '.join(bad)} is outside the spec's scope.hardware {allowed}"]
    return []


def recompute_verdict(ctx: Context):
    """The verdict recomputed from the bundle's rows by fastpath.gates, over the judging plan."""
    from fastpath.gates import evaluate
    from fastpath.plan import Plan

    return evaluate(ctx.judging_spec_obj(), ctx.rows(), Plan.from_json(ctx.plan()), ctx.tier)


def rule_gates_passed(ctx: Context) -> list[str]:
    from fastpath.gates import gate_status_ok

    summary = ctx.json("summary.json")
    reasons = []
    if summary.get("complete") is not True:
        reasons.append("summary.json says the run is incomplete")
    if summary.get("verdict") != "pass":
        reasons.append(f"verdict is {summary.get('verdict')!r}, not 'pass'")
    gates = [g for g in (ctx.judging_spec_data().get("gates") or {}) if g != "version"]
    recorded = summary.get("gates") or {}
    # Never trust the summary alone: the rows decide (a buggy or edited run may claim a pass).
    recomputed = recompute_verdict(ctx)
    for g in gates:
        entry = recorded.get(g)
        status = entry.get("status") if isinstance(entry, dict) else entry
        if status is None:
            reasons.append(f"gate {g}: absent from summary.json")
        elif not gate_status_ok(status, ctx.tier):
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
    Rule("canonical_archive", "the archive's tar stream is byte-identical to what `pack` writes for its members",
         rule_canonical_archive),
    Rule("manifest", "every file listed with the right size and sha256, nothing unlisted", rule_manifest),
    Rule("signature", "DSSE envelope signed by a key the trust policy allows for this tier", rule_signature),
    Rule("statement_binding", "every claim of the signed statement matches the bundle's own files",
         rule_statement_binding, ("signature",)),
    Rule("result_rows", "only documented row statuses, `passed` consistent with each", rule_result_rows),
    Rule("spec_is_tree_spec", "the bundle is a run of the spec the tree declares", rule_spec_is_tree_spec),
    Rule("attested_digests", "fast path, validation, subject and spec in the tree hash to the attested digests",
         rule_attested_digests, ("signature",)),
    Rule("plan_covers_scope", "plan.json has every case and waiver of the spec's plan", rule_plan_covers_scope),
    Rule("results_cover_plan", "every planned case has a result row; waivers only where allowed",
         rule_results_cover_plan),
    Rule("hardware_in_scope", "full-tier runs on hardware the spec's scope lists", rule_hardware_in_scope),
    Rule("gates_passed", "run complete, verdict pass, every gate passed (recomputed from the rows)",
         rule_gates_passed),
    Rule("tier_sufficient", "bundle tier at least the required tier", rule_tier_sufficient),
)
