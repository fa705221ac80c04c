"""Coverage suite: proof that the fast path fired.

decode   (gate coverage_fast_path_fired): the fast model's ``decode_step`` runs STEPS times
         under ``fastpath.trace.recording()``, on GPU after one warm-up call (which may capture a
         CUDA graph: replays then count as executions; on CPU there is no graph to capture and a
         step costs seconds under the Triton interpreter, so no warm-up). One row per component of
         ``engine.components()``: it passes iff the component engaged in every recorded step
         -- at every layer it declares (``Component.layers``, from the model's config: a
         layer that reports nothing is still expected; the events name their layer) -- and
         was never refused; the message names the layers that did not engage. At draft > 0 a
         component that declares ``verify_variants`` must have engaged with them alone, at every
         layer it serves (its decode kernels run T times are not a verify step); the message
         names the variants seen. A refusal
         whose reason is a property of the machine (``no_cuda`` on CPU, for the whole-step
         graph) is a waiver row for that component.
         Second source on CPU (gate coverage_profiler_kernels): the same steps run with the
         Triton interpreter's launches recorded (``fastpath.launches``, by kernel name, as the
         profiler names them on GPU). Per component, every step must launch kernels matching
         its fast patterns (at draft > 0 its ``verify_kernel_patterns``, where it declares
         them), at least one per layer it serves: a trace that says ``engaged`` while the
         standard code ran is caught without a GPU.
fallback (gate coverage_clean_fallback): prefill, mixed, out-of-scope-batch,
         out-of-scope-context and verify-rows (a verify step of more rows than the spec's
         max_verify_rows) steps. One row per component: passes iff it was refused with the
         declared reason in every step and never engaged.
A decode or fallback case in which nothing reported at all says so, naming the spec's switch
(the fast model is loaded with it as ``additional_config``; an engine whose switch differs runs
the standard path, which reports nothing).
profiler (gate coverage_profiler_kernels): on a GPU, ``torch.profiler`` captures
         (a) the PRODUCTION path: ``generate`` on real prompts, greedy, ``ignore_eos``; its decode
             steps' kernels are those of an N-token generation minus those of a 1-token one
             (same prompts: the prefill and first sample cancel), divided by N - 1. Per
             component: its fast kernels, at least one per layer it serves, in every step;
             none of its fallback kernels; and the trace agrees.
         (b) the benchmark hook ``decode_step`` (what the perf suite times) at the case's shape,
             with the same per-component checks, and at the production comparison's context:
             its kernels (those any component's patterns name) must be production's, kernel
             for kernel and count for count, or the row names the difference.
         At draft > 0 production is ``generate`` with the synthetic drafter at acceptance length
         1 (``speculative``): each step is a verify step of draft + 1 tokens that accepts none,
         and the drafter runs no model (one that looked ahead on the target would put its own
         kernels in the profile); a component's fast kernels are its ``verify_kernel_patterns``
         where it declares them.
         On CPU: a waiver row (the decode case carries the CPU second source).

Every row carries the case's coverage-matrix cell in ``detail`` (``cell``: the variants it ran,
or ``refused:<reason>``) and the whole case's matrix in ``evidence`` for the report.
"""

from __future__ import annotations

import re
from collections import Counter
from contextlib import ExitStack

import pytest

from fastpath import launches
from fastpath import suite_helpers
from fastpath import trace


H = suite_helpers
STEPS = 2
LAUNCH_GATE = "coverage_profiler_kernels"
# production comparison on GPU: tokens generated (N - 1 decode steps), and the prefill budget
# (batch x prompt tokens; as parity's max_prefill_tokens) that bounds its prompt length
PRODUCTION_TOKENS = 4
PRODUCTION_PREFILL_TOKENS = 32768


def _cell(labels: set[str]) -> str:
    return ",".join(sorted(labels)) if labels else "not_reported"


def _run_steps(step, n: int, with_launches: bool = False) -> tuple[list[trace.Recorder], list[launches.Launches]]:
    """Run ``step`` n times, each under its own trace recorder (and, ``with_launches``, its own
    record of the Triton interpreter's launches)."""
    recs, launched = [], []
    for _ in range(n):
        with ExitStack() as stack:
            rec = stack.enter_context(trace.recording())
            if with_launches:
                launched.append(stack.enter_context(launches.recording()))
            step()
        recs.append(rec)
    return recs, launched


def declared_layers(comp) -> list[int] | None:
    """The layers the engine declares ``comp`` serves (None: once per step, or undeclared)."""
    layers = getattr(comp, "layers", None)
    return None if layers is None else sorted(int(i) for i in layers)


def layer_gaps(recs: list[trace.Recorder], name: str, layers: list[int]) -> dict[int, list[int]]:
    """Step number (1-based) -> the declared layers at which ``name`` did not engage in it."""
    gaps = {}
    for n, rec in enumerate(recs, 1):
        missing = sorted(set(layers) - rec.engaged_layers(name))
        if missing:
            gaps[n] = missing
    return gaps


def _layers_text(layers: list[int]) -> str:
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(str(i) for i in layers)


def launch_shortfall(per_step: list[int], need: int) -> dict[int, int]:
    """Step number (1-based) -> launches counted, for the steps with fewer than ``need``."""
    return {n: k for n, k in enumerate(per_step, 1) if k < need}


def verify_expectation(comp, draft: int) -> tuple[list[str], list[str]]:
    """(the trace variants, the kernel patterns) that prove ``comp`` ran a verify step at
    ``draft`` > 0; both empty at draft 0 or for a component that runs the same kernels at
    B*T rows (it declares none)."""
    if draft <= 0:
        return [], []
    return list(getattr(comp, "verify_variants", None) or []), list(getattr(comp, "verify_kernel_patterns", None) or [])


def fast_patterns(comp, draft: int) -> list[str]:
    """The kernel names that prove ``comp``'s fast path ran a step at ``draft``."""
    return verify_expectation(comp, draft)[1] or list(comp.fast_kernel_patterns)


def verify_gaps(recs: list[trace.Recorder], name: str, variants: list[str], layers: list[int] | None
                ) -> tuple[list[str], dict[int, list[int]]]:
    """(the variants ``name`` engaged with that are not ``variants``, step number -> declared
    layers at which it engaged with none of ``variants``)."""
    wrong = sorted({e.detail for r in recs for e in r.engaged(name) if e.detail not in variants})
    gaps = {}
    for n, rec in enumerate(recs, 1):
        hit = [e for e in rec.engaged(name) if e.detail in variants]
        if layers:
            missing = sorted(set(layers) - {e.layer for e in hit})
            if missing:
                gaps[n] = missing
        elif not hit:
            gaps[n] = []
    return wrong, gaps


def _matrix(recs: list[trace.Recorder], components: list[str]) -> dict[str, str]:
    labels: dict[str, set[str]] = {c: set() for c in components}
    for r in recs:
        for comp, ls in r.components().items():
            labels.setdefault(comp, set()).update(ls)
    return {c: _cell(ls) for c, ls in labels.items()}


def _sync(engine) -> None:
    if H.device_kind(engine) == "cuda":
        import torch

        torch.cuda.synchronize()


@pytest.mark.fastpath(kind="decode", gate="coverage_fast_path_fired")
def test_decode_fast_path_fired(case, fp_case_engine, fp_case_models, fp_spec, record):
    cfg = H.case_config(case)
    b, c, d = int(cfg["batch"]), int(cfg["context"]), int(cfg.get("draft", 0))
    model = fp_case_models["fast"]
    step = model.decode_step(b, c, d)
    cuda = H.device_kind(fp_case_engine) == "cuda"
    if cuda:
        step()  # warm-up: may capture a graph (capture events are not executions)
        _sync(fp_case_engine)
    second, why_not = _cpu_second_source(fp_case_engine)
    recs, launched = _run_steps(step, STEPS, with_launches=second)
    _sync(fp_case_engine)
    comps = list(fp_case_engine.components())
    components = [comp.name for comp in comps]
    matrix = _matrix(recs, components)
    shape = {"batch": b, "context": c, "draft": d, "tp": cfg.get("tp", 1)}
    unknown = sorted(set(matrix) - set(components))
    silent = "" if any(r.events for r in recs) else H.no_event_reason(fp_spec, fp_case_engine) + "; "
    undeclared_protocol = comps and all(not hasattr(comp, "layers") for comp in comps)
    for comp_obj in comps:
        comp = comp_obj.name
        layers = declared_layers(comp_obj)
        refused = [e for r in recs for e in r.refused(comp)]
        reasons = sorted({e.detail for e in refused})
        variants = sorted({e.detail for r in recs for e in r.engaged(comp)})
        seen_layers = sorted({x for r in recs for x in r.engaged_layers(comp)}, key=str)
        gaps = layer_gaps(recs, comp, layers) if layers else {}
        if layers:
            steps_engaged = sum(1 for n, r in enumerate(recs, 1) if r.engaged(comp) and n not in gaps)
        elif layers == []:  # serves no layer of this model: nothing expected
            steps_engaged = STEPS
        else:
            steps_engaged = sum(1 for r in recs if r.engaged(comp))
        extra_layers = sorted(set(seen_layers) - set(layers or []), key=str)
        want_variants, _ = verify_expectation(comp_obj, d)
        not_verify, verify_missing = verify_gaps(recs, comp, want_variants, layers) if want_variants else ([], {})
        detail = {"cell": matrix[comp], "variants": variants, "refused": reasons, "steps": STEPS,
                  "engaged_events": sum(len(r.engaged(comp)) for r in recs),
                  "layers_declared": layers, "layers_engaged": seen_layers,
                  "layers_missing_by_step": {str(k): v for k, v in gaps.items()}}
        if want_variants:
            detail["verify_variants_expected"] = want_variants
        if undeclared_protocol:
            detail["note"] = "the engine's components declare no layers: judged per step only"
        evidence = {"coverage_matrix": matrix, "case": H.case_id(case)}
        if second:
            _record_launches(record, comp_obj, recs, launched, fp_case_engine, matrix, shape, d)
        if refused and all(H.environment_refusal(x, fp_case_engine) for x in reasons) and steps_engaged == 0:
            H.record_waived(record, "coverage_fast_path_fired", "steps_engaged",
                            f"{comp} refused with {', '.join(reasons)}: expected on this machine "
                            f"({H.device_kind(fp_case_engine)}); needs a CUDA GPU", component=comp,
                            detail=detail, evidence=evidence, **shape)
            continue
        ok = steps_engaged == STEPS and not refused and not extra_layers and not not_verify and not verify_missing
        msg = ""
        if not ok:
            parts = [f"engaged in {steps_engaged}/{STEPS} steps"]
            missing = sorted({x for v in gaps.values() for x in v})
            if missing:
                parts.append(f"{_layers_text(missing)} did not engage (of {_layers_text(layers)} it serves; "
                             f"in step(s) {', '.join(str(n) for n in gaps)})")
            if refused:
                parts.append(f"refused ({', '.join(reasons)})")
            if not_verify or verify_missing:
                where = sorted({x for v in verify_missing.values() for x in v})
                parts.append(f"at draft {d} it ran variant(s) {', '.join(variants) or 'none'}, expected its verify "
                             f"variant(s) {', '.join(want_variants)}"
                             + (f" at {_layers_text(where)}" if where else "")
                             + " (its decode kernels ran instead of the verify step?)")
            if extra_layers:
                parts.append(f"the trace names {_layers_text(extra_layers)}, which engine.components() "
                             f"does not declare for it ({layers}): fix the declaration")
            msg = f"{silent}{comp}: " + "; ".join(parts) + " -- the fast path did not fire for this in-scope case"
        record("coverage_fast_path_fired", "steps_engaged", steps_engaged, threshold=STEPS, comparator=">=",
               passed=ok, component=comp, detail=detail, evidence=evidence, message=msg, **shape)
    if not cuda and not second and comps:
        H.record_waived(record, LAUNCH_GATE, "launches_per_step",
                        f"no second source on CPU: {why_not}", detail={"case": H.case_id(case)}, **shape)
    if unknown:  # a component the engine does not declare: the registry is incomplete
        record("coverage_fast_path_fired", "undeclared_components", len(unknown), threshold=0,
               comparator="<=", detail={"undeclared": unknown}, evidence={"coverage_matrix": matrix},
               message=f"trace reports components missing from engine.components(): {unknown}", **shape)


def _cpu_second_source(engine) -> tuple[bool, str]:
    """Whether this CPU run can record the Triton interpreter's launches (the engine says its
    fast path runs there, and the interpreter's launch entry can be intercepted)."""
    if H.device_kind(engine) == "cuda":
        return False, "on a GPU the profiler case is the second source"
    if not engine.info().get("triton_interpreter"):
        return False, "the engine runs no Triton kernel in the interpreter (info()['triton_interpreter'] is false)"
    return launches.available()


def _record_launches(record, comp, recs, launched, engine, matrix, shape, draft: int = 0) -> None:
    """One coverage_profiler_kernels row: ``comp``'s fast kernels (its verify kernels at draft
    > 0) in the interpreter's launches of every step, at least one per layer it serves,
    wherever the trace says it engaged."""
    name, pats = comp.name, fast_patterns(comp, draft)
    layers = declared_layers(comp)
    need = max(1, len(layers)) if layers else (0 if layers == [] else 1)
    per_step = [l.count(pats) for l in launched]
    traced = [bool(r.engaged(name)) for r in recs]
    # what the trace claims per step: launches below it mean it reported kernels that never ran
    claimed = [len(r.engaged_layers(name) & set(layers)) if layers else int(t) for r, t in zip(recs, traced)]
    reasons = sorted({e.detail for r in recs for e in r.refused(name)})
    detail = {"cell": matrix.get(name, "not_reported"), "source": "triton_interpreter",
              "launches_per_step": per_step, "needed_per_step": need, "traced_per_step": claimed,
              "patterns": pats, "layers_declared": layers,
              "kernels": sorted(set(launches.matching([n for l in launched for n in l.names], pats)))}
    evidence = {"launches_by_step": [dict(Counter(l.names)) for l in launched]}
    if not pats:
        if reasons and all(H.environment_refusal(x, engine) for x in reasons) and not any(traced):
            H.record_waived(record, LAUNCH_GATE, "launches_per_step",
                            f"{name} refused with {', '.join(reasons)} here and declares no kernel patterns",
                            component=name, detail=detail, **shape)
            return
        ok = all(traced) or need == 0
        detail["note"] = "declares no kernel patterns: confirmed by the trace only"
        record(LAUNCH_GATE, "launches_per_step", None, passed=ok, component=name, detail=detail,
               evidence=evidence, message="" if ok else f"{name}: declares no kernel patterns and the "
               "trace did not see it engage in every step", **shape)
        return
    short = launch_shortfall(per_step, need)
    msg = ""
    if short:
        lying = [n for n, k in short.items() if k < claimed[n - 1]]
        msg = (f"{name}: the Triton interpreter launched {', '.join(f'{k} in step {n}' for n, k in short.items())} "
               f"of its kernels ({', '.join(pats)}); expected >= {need} per step"
               + (f" (one per {_layers_text(layers)} it serves)" if layers else ""))
        if lying:
            msg += (f" -- yet the trace says it engaged {', '.join(f'{claimed[n - 1]}x in step {n}' for n in lying)}: "
                    "it reported kernels that did not run (the standard code ran?)")
    record(LAUNCH_GATE, "launches_per_step", min(per_step) if per_step else 0, threshold=need, comparator=">=",
           passed=not short, component=name, detail=detail, evidence=evidence, message=msg, **shape)


def _fallback_step(model, cfg: dict):
    kind = cfg.get("fallback")
    b, c = int(cfg.get("batch", 1)), int(cfg.get("context", 16))
    if kind == "prefill":
        return model.prefill_step(b, c), {"batch": b, "context": c}
    if kind in ("mixed", "mixed_batch"):
        b = max(2, b)  # one prefill plus at least one decode
        return model.mixed_step(b, c), {"batch": b, "context": c}
    if kind == "batch_out_of_scope":
        b = int(cfg["out_of_scope_batch"])
        return model.decode_step(b, c, 0), {"batch": b, "context": c}
    if kind == "context_out_of_scope":
        c = int(cfg["out_of_scope_context"])
        return model.decode_step(b, c, 0), {"batch": b, "context": c}
    if kind in ("verify_rows", "verify_rows_out_of_scope"):  # batch x (draft + 1) over max_verify_rows
        b, d = int(cfg["out_of_scope_batch"]), int(cfg["draft"])
        return model.decode_step(b, c, d), {"batch": b, "context": c, "draft": d}
    return None, {"batch": b, "context": c}


@pytest.mark.fastpath(kind="fallback", gate="coverage_clean_fallback")
def test_clean_fallback(case, fp_case_engine, fp_case_models, fp_spec, record):
    cfg = H.case_config(case)
    want = cfg.get("reason") or cfg.get("fallback")
    model = fp_case_models["fast"]
    step, shape = _fallback_step(model, cfg)
    shape.setdefault("draft", 0)
    if step is None:
        record("coverage_clean_fallback", "driven", 0, passed=False,
               message=f"fallback kind {cfg.get('fallback')!r} has no step the Engine protocol can drive")
        return
    recs, _ = _run_steps(step, STEPS)
    _sync(fp_case_engine)
    components = [comp.name for comp in fp_case_engine.components()]
    matrix = _matrix(recs, components)
    silent = "" if any(r.events for r in recs) else H.no_event_reason(fp_spec, fp_case_engine) + "; "
    for comp in components:
        engaged = sum(len(r.engaged(comp)) for r in recs)
        steps_declared = sum(1 for r in recs if any(e.detail == want for e in r.refused(comp)))
        other = sorted({e.detail for r in recs for e in r.refused(comp)
                        if e.detail != want and not H.environment_refusal(e.detail, fp_case_engine)})
        ok = engaged == 0 and steps_declared == STEPS and not other
        msg = ""
        if not ok:
            parts = []
            if engaged:
                parts.append(f"engaged {engaged}x")
            if steps_declared < STEPS:
                parts.append(f"refused with {want!r} in {steps_declared}/{STEPS} steps")
            if other:
                parts.append(f"other reasons {other}")
            msg = f"{silent}{comp}: " + "; ".join(parts)
        record("coverage_clean_fallback", "steps_refused_with_reason", steps_declared, threshold=STEPS,
               comparator=">=", passed=ok, component=comp,
               detail={"cell": matrix[comp], "expected_reason": want, "engaged_events": engaged,
                       "other_reasons": other, "fallback": cfg.get("fallback")},
               evidence={"coverage_matrix": matrix, "case": H.case_id(case)}, message=msg, **shape)


def _profile_kernels(run) -> list[str]:
    """The CUDA kernel names ``run()`` launched (one entry per launch; graph replays included),
    from ``torch.profiler``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    names = []
    for ev in prof.events():
        dt = getattr(ev, "device_type", None)
        if dt is not None and "CUDA" in str(dt):
            names.append(ev.name)
    return names


def _named_kernels(counts: Counter, comps) -> Counter:
    """The part of ``counts`` any component's fast or fallback patterns name (copies, fills and
    other glue are left out: production and the benchmark hook may differ there harmlessly)."""
    pats = [re.compile(p) for comp in comps for p in (*comp.fast_kernel_patterns, *comp.fallback_kernel_patterns)]
    return Counter({n: k for n, k in counts.items() if any(p.search(n) for p in pats)})


def _per_step(total: Counter, steps: int) -> tuple[Counter, list[str]]:
    """``total`` / ``steps`` per kernel name, and the names whose count does not divide."""
    uneven = sorted(n for n, k in total.items() if k % steps)
    return Counter({n: k // steps for n, k in total.items() if k > 0}), uneven


def production_decode_kernels(model, tokenizer, batch: int, prompt: int, tokens: int = PRODUCTION_TOKENS,
                              profile=None, draft: int = 0):
    """(kernels per decode step of ``generate`` on real prompts as a Counter, the names whose
    count is not a whole number per step, the trace of the N-token run). The decode steps'
    kernels = those of an N-token generation minus those of a 1-token one of the same prompts
    (the prefill and the first sample cancel), over N - 1 steps. ``profile(run)`` -> the kernel
    names ``run()`` launched (default: torch.profiler's). ``draft`` > 0: each of the N - 1
    steps is a verify step of draft + 1 tokens emitting one (the synthetic drafter at
    acceptance length 1: drafts the target never picks, made without running any model)."""
    profile = profile or _profile_kernels
    from fastpath.engine import GenerationRequest

    steps = tokens - 1
    spec = ({"method": "synthetic", "num_speculative_tokens": draft, "acceptance_length": 1}
            if draft > 0 else None)
    gen = (lambda reqs: model.generate(reqs, speculative=spec)) if spec else model.generate

    def requests(n):
        return [GenerationRequest(prompt_ids=H.prompt_ids(tokenizer, 100 + i, prompt), max_tokens=n,
                                  temperature=0.0, ignore_eos=True) for i in range(batch)]

    tokens = 1 + steps
    gen(requests(tokens))  # warm-up: graphs of this shape captured, tables loaded
    one = Counter(profile(lambda: gen(requests(1))))
    with trace.recording() as rec:
        many = Counter(profile(lambda: gen(requests(tokens))))
    diff = Counter({n: many[n] - one.get(n, 0) for n in many})
    negative = sorted(n for n, k in diff.items() if k < 0)
    per_step, uneven = _per_step(Counter({n: k for n, k in diff.items() if k > 0}), steps)
    return per_step, sorted(set(uneven) | set(negative)), rec


def production_tokens(draft: int = 0) -> int:
    """Tokens the production comparison's generation reserves: PRODUCTION_TOKENS (the prefill's
    first, then one per step), plus (at draft > 0) the draft a verify window runs past them."""
    return PRODUCTION_TOKENS + draft


def production_prompt(batch: int, context: int, draft: int = 0) -> int:
    """The production comparison's prompt length: its capacity (prompt + tokens + 1, rounded up
    to 256 by the runner) equals the benchmark hook's at that context (context + draft + 1
    rounded up to 64) when prompt + tokens + 1 is a multiple of 256, so both run the same
    attention span; within the prefill budget and (for contexts of 251 tokens or more) at most
    ``context``."""
    n = production_tokens(draft)
    cap = min(int(context) + n + 1, max(256, PRODUCTION_PREFILL_TOKENS // max(1, batch)))
    cap = max(256, cap // 256 * 256)
    return cap - n - 1


def _component_row(record, comp, per_step: Counter, traced: bool, matrix: dict, shape: dict, metric: str,
                   source: str, evidence: dict) -> None:
    """One coverage_profiler_kernels row: per step, ``comp``'s fast kernels (its verify kernels at
    draft > 0; >= one per layer it serves), none of its fallback kernels, and the trace agreeing."""
    names = sorted(per_step)
    pats = fast_patterns(comp, int(shape.get("draft", 0)))
    fast = [n for n in names if any(re.search(p, n) for p in pats)]
    slow = [n for n in names if any(re.search(p, n) for p in comp.fallback_kernel_patterns)]
    layers = declared_layers(comp)
    need = max(1, len(layers)) if layers else (0 if layers == [] else 1)
    n_fast = sum(per_step[n] for n in fast)
    problems = []
    if pats and n_fast < need:
        problems.append(f"{n_fast} launch(es) of its fast kernels per step, expected >= {need}"
                        + (f" (one per {_layers_text(layers)} it serves)" if layers else ""))
    if slow:
        problems.append(f"fallback kernels present: {slow[:5]}")
    if traced and pats and not fast:
        problems.append("the trace says it engaged but the profile has none of its kernels")
    note = ""
    if not pats and not comp.fallback_kernel_patterns:
        note = "declares no kernel patterns: confirmed by the trace only"
        if not traced and need:
            problems.append("declares no kernel patterns and the trace did not see it engage")
    record(LAUNCH_GATE, metric, n_fast, threshold=need, comparator=">=", passed=not problems, component=comp.name,
           detail={"cell": matrix.get(comp.name, "not_reported"), "source": source, "fast_kernels": fast[:20],
                   "patterns": pats,
                   "fallback_kernels": slow[:20], "note": note, "traced": traced, "layers_declared": layers},
           evidence=evidence, message="; ".join(f"{comp.name} ({source}): {p}" for p in problems), **shape)


@pytest.mark.fastpath(kind="profiler", gate="coverage_profiler_kernels")
def test_profiler_kernels(case, fp_case_engine, fp_case_models, record, waive):
    if H.device_kind(fp_case_engine) != "cuda":
        waive("coverage_profiler_kernels", "needs a CUDA GPU: torch.profiler kernel names exist only on GPU "
              "(on CPU the decode case records the Triton interpreter's launches)")
    cfg = H.case_config(case)
    b, c, d = int(cfg["batch"]), int(cfg["context"]), int(cfg.get("draft", 0))
    model = fp_case_models["fast"]
    comps = list(fp_case_engine.components())
    shape = {"batch": b, "context": c, "draft": d, "tp": cfg.get("tp", 1)}

    # (a) production: generate on real prompts
    prompt = production_prompt(b, c, d)
    prod, uneven, prod_rec = production_decode_kernels(model, model.tokenizer, b, prompt, draft=d)
    prod_matrix = {comp: _cell(ls) for comp, ls in prod_rec.components().items()}
    for comp in comps:
        _component_row(record, comp, prod, bool(prod_rec.engaged(comp.name)), prod_matrix, shape,
                       "production_fast_kernels", f"generate, prompt {prompt}",
                       {"kernels_per_decode_step": dict(prod), "coverage_matrix": prod_matrix})

    # (b) the benchmark hook at the case's shape
    step = model.decode_step(b, c, d)
    step()
    with trace.recording() as rec:
        names = _profile_kernels(lambda: [step() for _ in range(STEPS)])
    per_step, _ = _per_step(Counter(names), STEPS)
    matrix = {comp: _cell(ls) for comp, ls in rec.components().items()}
    for comp in comps:
        _component_row(record, comp, per_step, bool(rec.engaged(comp.name)), matrix, shape, "fast_kernels_present",
                       "decode_step", {"profile_kernel_names": sorted(set(names))[:400], "coverage_matrix": matrix})

    # the benchmark hook launches what production does (at the production comparison's context)
    hook = model.decode_step(b, prompt, d)
    hook()
    hook_step, hook_uneven = _per_step(Counter(_profile_kernels(lambda: [hook() for _ in range(STEPS)])), STEPS)
    want, got = _named_kernels(prod, comps), _named_kernels(hook_step, comps)
    differ = {n: {"production": want.get(n, 0), "decode_step": got.get(n, 0)}
              for n in sorted(set(want) | set(got)) if want.get(n, 0) != got.get(n, 0)}
    ragged = sorted(set(uneven) | set(hook_uneven))
    ok = not differ and not ragged and bool(want)
    msg = ""
    if not ok:
        parts = []
        if differ:
            parts.append("per-step kernel counts differ: " + "; ".join(
                f"{n} production {v['production']} vs decode_step {v['decode_step']}" for n, v in list(differ.items())[:8]))
        if ragged:
            parts.append(f"counts not a whole number per step (a capture or a second graph inside the "
                         f"profile?): {ragged[:8]}")
        if not want:
            parts.append("the production profile names none of the components' kernels")
        msg = (f"decode_step(batch {b}, context {prompt}) does not launch production's kernel sequence "
               f"(generate, prompt {prompt}): " + "; ".join(parts))
    record(LAUNCH_GATE, "decode_step_matches_production", len(differ) + len(ragged), threshold=0, comparator="<=",
           passed=ok, detail={"prompt": prompt, "tokens": PRODUCTION_TOKENS, "differences": differ,
                              "uneven": ragged},
           evidence={"production": dict(want), "decode_step": dict(got)}, message=msg, **shape)
