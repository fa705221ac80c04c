"""Expand a spec into the case matrix of each suite for one tier.

A case is ``{"suite", "kind", "case_id", "config"}`` (docs/architecture.md "Plan cases").
Cases come from the Cartesian product of the tier's slice of the scope; the pruning rules
(``PRUNING_RULES``, data) and the tier rules (``TIER_RULES``) never drop a case: they turn it
into a *waiver* carrying the reason, so what was not run is always on record. A draft case
whose verify step has more rows (batch x (draft + 1)) than the spec's ``max_verify_rows`` is
such a waiver: the fast path hands it back (``verify_rows_out_of_scope``), which the
``coverage/fallback/verify_rows`` case checks.

Evals: one ``task`` case per eval task (``evals/<task>/all``: the task's documents pooled) and,
for MRCR, one ``bucket`` case per prompt-length bucket of the tier (``evals/mrcr/c<B>``); the
settings come from the spec's ``[evals]`` (fastpath/spec.py EVALS_DEFAULTS). All cases share one
lm-eval run per path (fastpath/suites/test_evals.py): the plan only says which rows it must produce.

Coverage: per decode shape of the tier's scope a ``decode`` and a ``profiler`` case, one
``fallback`` case per declared fallback; then the same for each of the tier's
``coverage_variants`` (another engine, e.g. a second model config, over its own slice of the
scope), their ids ending in ``@NAME``.

Perf: one ``speedup`` case per decode shape of the tier's scope (batch x context x draft x tp),
one ``control`` case (standard vs standard, at the smallest shape), with ``[perf] prompt_decode``
one ``prompts`` case per batch size and eval prompt set (``perf/prompts/mrcr-c<B>-b<n>`` at the
tier's smallest and largest MRCR bucket, ``perf/prompts/aime25-b<n>``; config ``engine_suite``:
whose engine decodes them), and one ``summary`` case (the K3-style table and the measured bandwidth). On the smoke tier (CPU: a fast step takes seconds
in Triton's interpreter) only the smallest batch is timed; its rows are reported, not gated.

Kernels: with ``[kernels] names`` in the spec, one case per name × dtype of the tier (cases that
``verify --jobs`` can deal out to its workers) and one ``kernels/kernel/unnamed-<dtype>`` case per
dtype that tests every registered kernel the list leaves out, so a list never narrows what is
tested; without it one ``kernels/kernel/registry-<dtype>`` case per dtype, which the suite expands
over the engine's registry.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from fastpath.spec import Spec, Tier


@dataclass(frozen=True)
class Case:
    suite: str
    kind: str
    case_id: str
    config: dict[str, Any]

    def to_json(self) -> dict:
        return {"suite": self.suite, "kind": self.kind, "case_id": self.case_id, "config": dict(self.config)}


@dataclass(frozen=True)
class Waiver:
    case: Case
    reason: str

    def to_json(self) -> dict:
        return {**self.case.to_json(), "reason": self.reason}


@dataclass
class Plan:
    spec_name: str
    spec_digest: str
    tier: str
    suites: list[str]
    cases: list[Case] = field(default_factory=list)  # runnable on this tier
    waivers: list[Waiver] = field(default_factory=list)  # planned but not runnable, with why
    engine_options: dict[str, dict] = field(default_factory=dict)  # suites with their own options

    def for_suite(self, suite: str) -> tuple[list[Case], list[Waiver]]:
        return ([c for c in self.cases if c.suite == suite], [w for w in self.waivers if w.case.suite == suite])

    def all_case_ids(self) -> list[str]:
        return [c.case_id for c in self.cases] + [w.case.case_id for w in self.waivers]

    def to_json(self) -> dict:
        out = {
            "schema": 1,
            "spec": self.spec_name,
            "spec_digest": self.spec_digest,
            "tier": self.tier,
            "suites": list(self.suites),
            "cases": [c.to_json() for c in self.cases],
            "waivers": [w.to_json() for w in self.waivers],
        }
        if self.engine_options:  # only where a suite runs with options of its own
            out["engine_options"] = {k: dict(v) for k, v in self.engine_options.items()}
        return out

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        def case(d: dict) -> Case:
            return Case(d["suite"], d["kind"], d["case_id"], dict(d["config"]))

        return cls(data["spec"], data["spec_digest"], data["tier"], list(data["suites"]),
                   [case(c) for c in data["cases"]], [Waiver(case(w), w["reason"]) for w in data["waivers"]],
                   dict(data.get("engine_options", {})))


@dataclass(frozen=True)
class Rule:
    """Turns the cases it matches into waivers with ``reason``."""

    name: str
    kinds: tuple[tuple[str, str], ...]  # (suite, kind) pairs it applies to
    applies: Callable[[dict, Spec, Tier], bool]
    reason: str


# Scope combinations that make no sense, whatever the tier.
PRUNING_RULES: tuple[Rule, ...] = (
    Rule("draft_needs_spec_decode", (("coverage", "decode"), ("coverage", "profiler"), ("perf", "speedup")),
         lambda cfg, spec, tier: cfg["draft"] > 0 and not spec.features["speculative_decoding"],
         "draft length > 0 but features.speculative_decoding is false"),
    # a verify step runs batch x (draft + 1) rows through the fast path's row-wise kernels; past
    # the rows the spec declares it serves (max_verify_rows) the fast path hands the step back
    Rule("verify_rows_over_max", (("coverage", "decode"), ("coverage", "profiler"), ("perf", "speedup")),
         lambda cfg, spec, tier: cfg["draft"] > 0 and spec.scope.get("max_verify_rows") is not None
         and cfg["batch"] * (cfg["draft"] + 1) > spec.scope["max_verify_rows"],
         "batch x (draft + 1) verify rows exceed scope.max_verify_rows, the rows the fast path declares it "
         "serves: it falls back with verify_rows_out_of_scope (coverage/fallback/verify_rows checks it)"),
    Rule("context_over_max", (("coverage", "decode"), ("coverage", "profiler"), ("parity", "parity"),
                              ("perf", "speedup")),
         lambda cfg, spec, tier: cfg["context"] + cfg.get("draft", 0) > tier.max_context,
         "context + draft exceeds the tier's max_context"),
    # an eval bucket is bounded by the fast path's scope, not by the tier's decode slice (MRCR
    # needs hundreds of tokens even on the smoke tier, whose decode cases stop at 64)
    Rule("eval_bucket_over_max", (("evals", "bucket"),),
         lambda cfg, spec, tier: cfg["context"] > spec.features["max_context"],
         "the bucket exceeds features.max_context (the fast path's scope)"),
    Rule("prompt_batch_over_docs", (("perf", "prompts"),),
         lambda cfg, spec, tier: cfg["batch"] > spec.evals[cfg["task"]][tier.name]["docs"],
         "the batch exceeds the tier's eval documents ([evals.TASK.TIER] docs, per MRCR bucket): a prompt "
         "case batches distinct documents"),
    Rule("prompt_bucket_over_max", (("perf", "prompts"),),
         lambda cfg, spec, tier: (cfg["bucket"] or 0) > spec.features["max_context"],
         "the bucket exceeds features.max_context (the fast path's scope)"),
    Rule("speculative_needs_spec_decode", (("features", "speculative"),),
         lambda cfg, spec, tier: cfg.get("draft", 0) == 0 or not spec.features["speculative_decoding"],
         "features.speculative_decoding is false or the tier declares no draft length > 0"),
)

# What a tier cannot do.
TIER_RULES: tuple[Rule, ...] = (
    Rule("profiler_needs_gpu", (("coverage", "profiler"),),
         lambda cfg, spec, tier: tier.name != "full",
         "needs a CUDA GPU: the profiler runs on the full tier only"),
    Rule("smoke_draft_smallest_batch", (("coverage", "decode"),),
         lambda cfg, spec, tier: tier.name != "full" and cfg["draft"] > 0
         and cfg["batch"] != min(tier.scope["batch_sizes"]),
         "the smoke tier verifies drafts at the smallest batch only (a verify step of batch x (draft + 1) "
         "rows takes seconds in Triton's CPU interpreter); the full tier covers every batch"),
    Rule("perf_smoke_smallest_batch", (("perf", "speedup"),),
         lambda cfg, spec, tier: tier.name != "full" and cfg["batch"] != min(tier.scope["batch_sizes"]),
         "the smoke tier times the smallest batch only (a fast step takes seconds in Triton's CPU "
         "interpreter); perf is gated on the full tier"),
    Rule("perf_prompts_smoke_smallest_batch", (("perf", "prompts"),),
         lambda cfg, spec, tier: tier.name != "full" and cfg["batch"] != min(spec.perf["prompt_decode"]["batch_sizes"]),
         "the smoke tier decodes the prompts at the smallest batch only (a fast step takes seconds in Triton's "
         "CPU interpreter)"),
    # a structured batch of 5 rows verifies 5 x (K + 1) rows a step: seconds each in the interpreter
    Rule("structured_draft_smoke_one", (("features", "structured"),),
         lambda cfg, spec, tier: tier.name != "full" and cfg["draft"] > 0
         and (cfg["mode"], cfg["structured"]) != ("greedy", _cheapest_grammar(spec)),
         "the smoke tier runs one structured case with a draft (greedy, the shorter grammar); "
         "every one runs on the full tier"),
)


def _cheapest_grammar(spec: Spec) -> str:
    kinds = list(spec.features["structured_output"])
    return "regex" if "regex" in kinds else kinds[0]


def _shape_id(cfg: dict) -> str:
    """Stable text for a decode shape: b4-c64-d0, prefixed tpN / suffixed dcpN when not 1."""
    text = f"b{cfg['batch']}-c{cfg['context']}-d{cfg['draft']}"
    if cfg.get("tp", 1) != 1:
        text = f"tp{cfg['tp']}-{text}"
    if cfg.get("dcp", 1) != 1:
        text = f"{text}-dcp{cfg['dcp']}"
    return text


def _decode_configs(tier: Tier) -> list[dict]:
    s = tier.scope
    return [
        {"tp": tp, "dcp": dcp, "batch": b, "context": c, "draft": d}
        for tp, dcp, b, c, d in itertools.product(
            s["tensor_parallel"], s["dcp_sizes"], s["batch_sizes"], s["context_lengths"], s["draft_lengths"])
    ]


def _coverage(spec: Spec, tier: Tier) -> list[Case]:
    """The tier's coverage cases, then each coverage variant's over its own slice of the scope."""
    cases = _coverage_of(spec, tier, None)
    for name in tier.coverage_variants:
        cases += _coverage_of(spec, tier.coverage_variant(name), name)
    return cases


def _coverage_of(spec: Spec, tier: Tier, variant: str | None) -> list[Case]:
    """Coverage cases on one engine: ``variant`` None (the tier's), else ids ending in @variant
    and ``config["variant"]``, which the plugin's fp_case_engine creates the engine from."""
    tail, extra = ("", {}) if variant is None else (f"@{variant}", {"variant": variant})
    cases = [Case("coverage", "decode", f"coverage/decode/{_shape_id(c)}{tail}", {**c, **extra})
             for c in _decode_configs(tier)]
    s = tier.scope
    for step, reason in s["fallbacks"].items():
        cfg = {"fallback": step, "reason": reason, "batch": min(s["batch_sizes"]),
               "context": min(s["context_lengths"]), "out_of_scope_batch": max(spec.scope["batch_sizes"]) + 1,
               "out_of_scope_context": int(spec.features["max_context"]) + 1}
        if reason == "verify_rows_out_of_scope":
            cfg.update(_verify_rows_fallback(spec, tier))
        cases.append(Case("coverage", "fallback", f"coverage/fallback/{step}{tail}", {**cfg, **extra}))
    cases += [Case("coverage", "profiler", f"coverage/profiler/{_shape_id(c)}{tail}", {**c, **extra})
              for c in _decode_configs(tier)]
    return cases


def _verify_rows_fallback(spec: Spec, tier: Tier) -> dict:
    """The smallest verify step over scope.max_verify_rows: the tier's longest draft (else the
    scope's), at the fewest sequences that exceed the limit (each row costs a step's work)."""
    drafts = [d for d in tier.scope["draft_lengths"] if d > 0] or [d for d in spec.scope["draft_lengths"] if d > 0]
    draft = max(drafts or [1])
    limit = spec.scope.get("max_verify_rows") or max(spec.scope["batch_sizes"])
    return {"draft": draft, "out_of_scope_batch": limit // (draft + 1) + 1}


def _kernels(spec: Spec, tier: Tier) -> list[Case]:
    # kernel None = "every kernel the engine registers" (less those in "except"): the suite
    # expands the registry
    if not spec.kernel_names:
        return [Case("kernels", "kernel", f"kernels/kernel/registry-{d}", {"kernel": None, "dtype": d})
                for d in tier.dtypes]
    named = [Case("kernels", "kernel", f"kernels/kernel/{n}-{d}", {"kernel": n, "dtype": d})
             for n in spec.kernel_names for d in tier.dtypes]
    return named + [Case("kernels", "kernel", f"kernels/kernel/unnamed-{d}",
                         {"kernel": None, "except": list(spec.kernel_names), "dtype": d}) for d in tier.dtypes]


def _parity(spec: Spec, tier: Tier) -> list[Case]:
    return [Case("parity", "parity", f"parity/parity/c{c}", {"context": c, "draft": 0, "dtype": tier.dtypes[0]})
            for c in tier.scope["context_lengths"]]


def _features(spec: Spec, tier: Tier) -> list[Case]:
    f = spec.features
    cases = []
    drafts = [0] + ([max(tier.scope["draft_lengths"])] if f["speculative_decoding"]
                    and max(tier.scope["draft_lengths"]) > 0 else [])
    for kind, mode, draft in itertools.product(f["structured_output"], ("greedy", "sampled"), drafts):
        suffix = f"-d{draft}" if draft else ""
        cases.append(Case("features", "structured", f"features/structured/{kind}-{mode}{suffix}",
                          {"structured": kind, "mode": mode, "draft": draft}))
    cases += _speculative(spec, tier)
    if f["temperature_sampling"]:
        cases.append(Case("features", "sampling", "features/sampling/temperature", {}))
    for mask in ("top_k", "top_p"):
        if f[mask]:
            cases.append(Case("features", "masks", f"features/masks/{mask}", {"mask": mask}))
    cases.append(Case("features", "seeded", "features/seeded/reproducible", {}))
    cases.append(Case("features", "full_context", f"features/full_context/c{tier.max_context}",
                      {"context": tier.max_context}))
    return cases


def _speculative(spec: Spec, tier: Tier) -> list[Case]:
    """Gate features_speculative: per draft length K > 0, greedy equality with n-gram drafts on
    both paths (with the n-gram acceptance length) and the synthetic drafter's acceptance length;
    at the largest K, the sampled distribution. One waiver case when nothing is speculative; none
    where the spec does not declare the gate (its plan, and the bundles made of it, stay as they were)."""
    if "features_speculative" not in spec.gates.settings:
        return []
    drafts = sorted(d for d in tier.scope["draft_lengths"] if d > 0)
    if not drafts or not spec.features["speculative_decoding"]:
        return [Case("features", "speculative", "features/speculative/none", {"check": "none", "draft": 0})]
    cases = [Case("features", "speculative", f"features/speculative/{check}-d{k}", {"check": check, "draft": k})
             for k in drafts for check in ("greedy", "synthetic")]
    k = drafts[-1]
    cases.append(Case("features", "speculative", f"features/speculative/sampled-d{k}", {"check": "sampled", "draft": k}))
    return cases


def _perf(spec: Spec, tier: Tier) -> list[Case]:
    configs = _decode_configs(tier)
    cases = [Case("perf", "speedup", f"perf/speedup/{_shape_id(c)}", c) for c in configs]
    smallest = min(configs, key=lambda c: (c["batch"], c["context"], c["draft"]))
    cases.append(Case("perf", "control", f"perf/control/{_shape_id(smallest)}", dict(smallest)))
    cases += _prompts(spec, tier)
    cases.append(Case("perf", "summary", "perf/summary/table", {}))
    return cases


def _prompts(spec: Spec, tier: Tier) -> list[Case]:
    """``[perf] prompt_decode``: per batch size, decode on the evals suite's own documents (the
    tier's smallest and largest MRCR bucket, the AIME problems) on the engine of the suite it
    names, e.g. a trained model whose routing is real."""
    p = spec.perf.get("prompt_decode")
    if not p:
        return []
    buckets = spec.evals["mrcr"][tier.name]["buckets"]
    tasks = [("mrcr", b, f"mrcr-c{b}") for b in sorted({min(buckets), max(buckets)})] + [("aime25", None, "aime25")]
    return [Case("perf", "prompts", f"perf/prompts/{name}-b{batch}",
                 {"task": task, "bucket": bucket, "batch": batch, "engine_suite": p["engine"]})
            for task, bucket, name in tasks for batch in p["batch_sizes"]]


def _evals(spec: Spec, tier: Tier) -> list[Case]:
    cases = []
    for task in ("mrcr", "aime25"):
        settings = {k: v for k, v in spec.evals[task][tier.name].items() if k != "buckets"}
        buckets = spec.evals[task][tier.name].get("buckets") if task == "mrcr" else None
        for b in buckets or []:
            cases.append(Case("evals", "bucket", f"evals/{task}/c{b}", {"task": task, "context": b, **settings}))
        cases.append(Case("evals", "task", f"evals/{task}/all",
                          {"task": task, **settings, **({"buckets": list(buckets)} if buckets else {})}))
    return cases


EXPANDERS: dict[str, Callable[[Spec, Tier], list[Case]]] = {
    "coverage": _coverage,
    "kernels": _kernels,
    "parity": _parity,
    "features": _features,
    "evals": _evals,
    "perf": _perf,
}


def build_plan(spec: Spec, tier: str | Tier) -> Plan:
    """Every case of every suite that owns a gate, runnable ones and waivers, in stable order."""
    tier_obj = tier if isinstance(tier, Tier) else spec.tier(tier)
    plan = Plan(spec.name, spec.digest, tier_obj.name, spec.suites())
    plan.engine_options = {s: tier_obj.engine_options_for(s) for s in plan.suites if s in tier_obj.suite_engine_options}
    if "coverage" in plan.suites:
        plan.engine_options.update({f"coverage@{name}": tier_obj.engine_options_for("coverage", name)
                                    for name in tier_obj.coverage_variants})
    prompts = spec.perf.get("prompt_decode") or {}
    if "perf" in plan.suites and prompts.get("engine") in tier_obj.suite_engine_options:  # their own engine
        plan.engine_options["perf@prompts"] = tier_obj.engine_options_for(prompts["engine"])
    for suite in plan.suites:
        for case in EXPANDERS[suite](spec, tier_obj):
            variant = case.config.get("variant")
            reason = _waiver_reason(case, spec, tier_obj if variant is None else tier_obj.coverage_variant(variant))
            if reason:
                plan.waivers.append(Waiver(case, reason))
            else:
                plan.cases.append(case)
    return plan


def _waiver_reason(case: Case, spec: Spec, tier: Tier) -> str | None:
    for rule in PRUNING_RULES + TIER_RULES:
        if (case.suite, case.kind) in rule.kinds and rule.applies(case.config, spec, tier):
            return rule.reason
    return None
