"""Coverage suite: proof that the fast path fired (DESIGN §3.4, issue 5 item 1).

decode   (gate coverage_fast_path_fired): the fast model's ``decode_step`` runs STEPS times
         under ``fastpath.trace.recording()``, on GPU after one warm-up call (which may capture a
         CUDA graph: replays then count as executions; on CPU there is no graph to capture and a
         step costs seconds under the Triton interpreter, so no warm-up). One row per component of
         ``engine.components()``: it passes iff the component engaged in every recorded step
         and was never refused. A refusal whose reason is a property of the machine
         (``no_cuda`` on CPU, for the whole-step graph) is a waiver row for that component.
fallback (gate coverage_clean_fallback): prefill, mixed, out-of-scope-batch and
         out-of-scope-context steps. One row per component: passes iff it was refused with the
         declared reason in every step and never engaged.
A decode or fallback case in which nothing reported at all says so, naming the spec's switch
(the fast model is loaded with it as ``additional_config``; an engine whose switch differs runs
the standard path, which reports nothing).
profiler (gate coverage_profiler_kernels): on a GPU, ``torch.profiler`` captures real steps;
         for each component, kernel names matching its fast patterns must appear and names
         matching its fallback patterns must not, and a component the trace saw engage must
         have its fast kernels in the profile. On CPU: a waiver row.

Every row carries the case's coverage-matrix cell in ``detail`` (``cell``: the variants it ran,
or ``refused:<reason>``) and the whole case's matrix in ``evidence`` for the report.
"""

from __future__ import annotations

import re

import pytest

from fastpath import suite_helpers
from fastpath import trace


H = suite_helpers
STEPS = 2


def _cell(labels: set[str]) -> str:
    return ",".join(sorted(labels)) if labels else "not_reported"


def _run_steps(step, n: int) -> list[trace.Recorder]:
    recs = []
    for _ in range(n):
        with trace.recording() as rec:
            step()
        recs.append(rec)
    return recs


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
def test_decode_fast_path_fired(case, fp_engine, fp_models, fp_spec, record):
    cfg = H.case_config(case)
    b, c, d = int(cfg["batch"]), int(cfg["context"]), int(cfg.get("draft", 0))
    model = fp_models["fast"]
    step = model.decode_step(b, c, d)
    if H.device_kind(fp_engine) == "cuda":
        step()  # warm-up: may capture a graph (capture events are not executions)
        _sync(fp_engine)
    recs = _run_steps(step, STEPS)
    _sync(fp_engine)
    components = [comp.name for comp in fp_engine.components()]
    matrix = _matrix(recs, components)
    shape = {"batch": b, "context": c, "draft": d, "tp": cfg.get("tp", 1)}
    unknown = sorted(set(matrix) - set(components))
    silent = "" if any(r.events for r in recs) else H.no_event_reason(fp_spec, fp_engine) + "; "
    for comp in components:
        steps_engaged = sum(1 for r in recs if r.engaged(comp))
        refused = [e for r in recs for e in r.refused(comp)]
        reasons = sorted({e.detail for e in refused})
        variants = sorted({e.detail for r in recs for e in r.engaged(comp)})
        detail = {"cell": matrix[comp], "variants": variants, "refused": reasons, "steps": STEPS,
                  "engaged_events": sum(len(r.engaged(comp)) for r in recs)}
        evidence = {"coverage_matrix": matrix, "case": H.case_id(case)}
        if refused and all(H.environment_refusal(x, fp_engine) for x in reasons) and steps_engaged == 0:
            H.record_waived(record, "coverage_fast_path_fired", "steps_engaged",
                            f"{comp} refused with {', '.join(reasons)}: expected on this machine "
                            f"({H.device_kind(fp_engine)}); needs a CUDA GPU", component=comp,
                            detail=detail, evidence=evidence, **shape)
            continue
        ok = steps_engaged == STEPS and not refused
        msg = ""
        if not ok:
            msg = (f"{silent}{comp}: engaged in {steps_engaged}/{STEPS} steps"
                   + (f", refused ({', '.join(reasons)})" if refused else "")
                   + " -- the fast path did not fire for this in-scope case")
        record("coverage_fast_path_fired", "steps_engaged", steps_engaged, threshold=STEPS, comparator=">=",
               passed=ok, component=comp, detail=detail, evidence=evidence, message=msg, **shape)
    if unknown:  # a component the engine does not declare: the registry is incomplete
        record("coverage_fast_path_fired", "undeclared_components", len(unknown), threshold=0,
               comparator="<=", detail={"undeclared": unknown}, evidence={"coverage_matrix": matrix},
               message=f"trace reports components missing from engine.components(): {unknown}", **shape)


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
    return None, {"batch": b, "context": c}


@pytest.mark.fastpath(kind="fallback", gate="coverage_clean_fallback")
def test_clean_fallback(case, fp_engine, fp_models, fp_spec, record):
    cfg = H.case_config(case)
    want = cfg.get("reason") or cfg.get("fallback")
    model = fp_models["fast"]
    step, shape = _fallback_step(model, cfg)
    if step is None:
        record("coverage_clean_fallback", "driven", 0, passed=False,
               message=f"fallback kind {cfg.get('fallback')!r} has no step the Engine protocol can drive")
        return
    recs = _run_steps(step, STEPS)
    _sync(fp_engine)
    components = [comp.name for comp in fp_engine.components()]
    matrix = _matrix(recs, components)
    silent = "" if any(r.events for r in recs) else H.no_event_reason(fp_spec, fp_engine) + "; "
    for comp in components:
        engaged = sum(len(r.engaged(comp)) for r in recs)
        steps_declared = sum(1 for r in recs if any(e.detail == want for e in r.refused(comp)))
        other = sorted({e.detail for r in recs for e in r.refused(comp)
                        if e.detail != want and not H.environment_refusal(e.detail, fp_engine)})
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
               comparator=">=", passed=ok, component=comp, draft=0,
               detail={"cell": matrix[comp], "expected_reason": want, "engaged_events": engaged,
                       "other_reasons": other, "fallback": cfg.get("fallback")},
               evidence={"coverage_matrix": matrix, "case": H.case_id(case)}, message=msg, **shape)


def _profile_kernel_names(step, n: int) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    names = set()
    for ev in prof.events():
        dt = getattr(ev, "device_type", None)
        if dt is not None and "CUDA" in str(dt):
            names.add(ev.name)
    return sorted(names)


@pytest.mark.fastpath(kind="profiler", gate="coverage_profiler_kernels")
def test_profiler_kernels(case, fp_engine, fp_models, record, waive):
    if H.device_kind(fp_engine) != "cuda":
        waive("coverage_profiler_kernels", "needs a CUDA GPU: torch.profiler kernel names exist only on GPU")
    cfg = H.case_config(case)
    b, c, d = int(cfg["batch"]), int(cfg["context"]), int(cfg.get("draft", 0))
    model = fp_models["fast"]
    step = model.decode_step(b, c, d)
    step()
    with trace.recording() as rec:
        names = _profile_kernel_names(step, STEPS)
    shape = {"batch": b, "context": c, "draft": d, "tp": cfg.get("tp", 1)}
    matrix = {comp: _cell(ls) for comp, ls in rec.components().items()}
    for comp in fp_engine.components():
        fast = [n for n in names if any(re.search(p, n) for p in comp.fast_kernel_patterns)]
        slow = [n for n in names if any(re.search(p, n) for p in comp.fallback_kernel_patterns)]
        traced = bool(rec.engaged(comp.name))
        problems = []
        if comp.fast_kernel_patterns and not fast:
            problems.append("no kernel matches its fast patterns")
        if slow:
            problems.append(f"fallback kernels present: {slow[:5]}")
        if traced and comp.fast_kernel_patterns and not fast:
            problems.append("the trace says it engaged but the profile has none of its kernels")
        if not comp.fast_kernel_patterns and not comp.fallback_kernel_patterns:
            note = "declares no kernel patterns: confirmed by the trace only"
            ok = traced
            if not traced:
                problems.append("declares no kernel patterns and the trace did not see it engage")
        else:
            note = ""
            ok = not problems
        record("coverage_profiler_kernels", "fast_kernels_present", len(fast), passed=ok, component=comp.name,
               detail={"cell": matrix.get(comp.name, "not_reported"), "fast_kernels": fast[:20],
                       "fallback_kernels": slow[:20], "note": note, "traced": traced},
               evidence={"profile_kernel_names": names[:400], "coverage_matrix": matrix},
               message="; ".join(problems), **shape)
