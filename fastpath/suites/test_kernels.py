"""Kernel suite: each registered fast kernel vs its fp32 oracle (DESIGN §3.5, issue 5 item 2).

For every kernel entry of ``engine.kernels()`` (the plan's ``kernel`` cases: one kernel, the whole
registry when the case names none, or the registry less the spec's ``[kernels] names`` -- the
``unnamed`` case --, per dtype of the tier), over its shapes (smoke tier:
first, last and odd/edge shapes; full tier: all) plus its ``boundary_shapes`` (both sides of
the tuning table's bucket edges, partial tiles: every tier) and value classes:

kernels_noise_floor   err(fast) <= tol, err = max |x - oracle| (non-finite oracle entries must
                      be matched exactly), tol = max(atol_floor[dtype], k * err(standard)); k
                      and atol_floor from the gate (a kernel may only declare a larger floor,
                      shown in the row). One row per kernel x shape x value class.
kernels_finite        no NaN/Inf in the fast output where the oracle is finite. Row per kernel.
kernels_deterministic a repeat on identical inputs is bitwise equal (kernels declaring
                      ``deterministic = False``: within tol). Row per kernel.
kernels_jitter        ``rounds`` runs under ``fastpath.jitter.stress`` (side-stream work and
                      random delays on GPU; random delays, delayed threads and GIL contention on
                      CPU) equal the un-jittered output (bitwise, or within tol for
                      non-deterministic kernels). Row per kernel.

Inputs are made once per (shape, value class) from a fixed seed and every call gets a fresh
copy, so kernels that update state in place are compared on identical inputs.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from fastpath import suite_helpers
from fastpath import jitter
from fastpath import launches


H = suite_helpers
SEED = 20261129


def _tensors(out) -> list[torch.Tensor]:
    return [t for t in H.as_list(out) if isinstance(t, torch.Tensor)]


# elements compared at a time: bounds the float64 temporaries (a KDA verify case's states are 67M)
CHUNK = 1 << 24


def max_error(got, ref) -> float:
    """max |got - ref| over all outputs, in float64 on the outputs' own device (on the host, one
    comparison of a KDA verify case's outputs took 17 s on a 2-core machine); shape mismatch or
    non-finite mismatch -> inf."""
    a, b = _tensors(got), _tensors(ref)
    if len(a) != len(b):
        return math.inf
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return math.inf
        x, y = x.detach().reshape(-1), y.detach().to(x.device).reshape(-1)
        for i in range(0, x.numel(), CHUNK):
            xs, ys = x[i:i + CHUNK].to(torch.float64), y[i:i + CHUNK].to(torch.float64)
            fin = torch.isfinite(ys)
            if not bool(fin.all()):  # the oracle's non-finite values must be matched exactly
                xn, yn = xs[~fin], ys[~fin]
                if not bool(((xn == yn) | (torch.isnan(xn) & torch.isnan(yn))).all()):
                    return math.inf
            d = torch.where(fin, (xs - ys).abs(), 0.0)
            if bool(torch.isnan(d).any()):
                return math.inf
            worst = max(worst, float(d.max()))
    return worst


def nonfinite_where_oracle_finite(got, ref) -> int:
    n = 0
    for x, y in zip(_tensors(got), _tensors(ref)):
        if x.shape != y.shape or not x.is_floating_point():
            continue
        n += int((~torch.isfinite(x.detach()) & torch.isfinite(y.detach().to(x.device))).sum())
    return n


def bitwise_diff(a, b) -> int:
    """Number of elements that differ bit for bit (NaN == NaN); shape mismatch -> -1 marker."""
    ta, tb = _tensors(a), _tensors(b)
    if len(ta) != len(tb):
        return 10**9
    n = 0
    for x, y in zip(ta, tb):
        if x.shape != y.shape or x.dtype != y.dtype:
            return 10**9
        x, y = x.detach(), y.detach().to(x.device)  # compared where they are: exact either way
        if x.is_floating_point():
            same = (x == y) | (torch.isnan(x) & torch.isnan(y))
            # +0.0 vs -0.0 compare equal but are different bits
            same &= torch.signbit(x) == torch.signbit(y)
        else:
            same = x == y
        n += int((~same).sum())
    return n


def select_shapes(shapes: list[dict], tier: str) -> list[dict]:
    """Full tier: every shape. Smoke: first, last, and the first shape with an odd dimension
    (tails), without duplicates."""
    if tier == "full" or len(shapes) <= 3:
        return list(shapes)
    pick = [shapes[0], shapes[-1]]
    odd = [s for s in shapes[1:-1] if any(isinstance(v, int) and v % 2 for v in s.values())]
    if odd:
        pick.insert(1, odd[0])
    else:
        pick.insert(1, shapes[len(shapes) // 2])
    return pick


def _fresh_copy(x):
    """Deep copy of an input set: tensors cloned, containers rebuilt, other values shared."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: _fresh_copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_fresh_copy(v) for v in x)
    return x


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _label(shape: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in shape.items())


@pytest.mark.fastpath(kind="kernel", gates=["kernels_noise_floor", "kernels_finite", "kernels_deterministic",
                                             "kernels_jitter"])
def test_kernel(case, fp_engine, fp_tier, fp_gate, record, waive):
    cfg = H.case_config(case)
    dtype = cfg.get("dtype") or fp_engine.info().get("dtype")
    want, named = cfg.get("kernel"), set(cfg.get("except") or ())
    entries = [e for e in fp_engine.kernels() if e.name == want or (want is None and e.name not in named)]
    if not entries and named:  # the spec's [kernels] names list every registered kernel
        record("kernels_noise_floor", "unnamed_kernels", 0, threshold=0, comparator="<=", dtype=dtype,
               detail={"named": sorted(named)}, message="")
        return
    if not entries:
        record("kernels_noise_floor", "kernels_found", 0, threshold=1, comparator=">=", dtype=dtype,
               message=f"no registered kernel named {want!r}" if want else "the engine registers no kernels")
        return
    device = H.device_kind(fp_engine)
    dev = "cuda" if device == "cuda" else "cpu"
    tier = H.tier_name(fp_tier)
    nf = fp_gate("kernels_noise_floor")
    gate_k = float(nf.get("k", 2.0))
    gate_floor = dict(nf.get("atol_floor", {}))
    rounds = int(fp_gate("kernels_jitter").get("rounds", 3))
    # which kernels each entry's fast call launches: it must be the fast kernel itself
    source, no_source = launches.source_for(dev, fp_engine.info())

    for e in entries:
        run_dtype = dtype
        if dtype not in list(e.dtypes) and list(e.dtypes):
            # e.g. a sampler that always takes fp32 logits: test it in the dtype it declares
            run_dtype = list(e.dtypes)[0]
        base = {"kernel": e.name, "component": e.component, "dtype": run_dtype}
        if run_dtype not in list(e.dtypes):
            for gate in ("kernels_noise_floor", "kernels_finite", "kernels_deterministic", "kernels_jitter"):
                why = getattr(e, "unavailable", "") or "e.g. a CUDA-only kernel on CPU"
                H.record_waived(record, gate, "dtype_supported", f"{e.name} declares no dtype that runs here "
                                f"(tier dtype {dtype}; {why})", **base)
            continue
        dtype_k = run_dtype
        declared = float(getattr(e, "atol_floor", {}).get(dtype_k, 0.0) or 0.0)
        floor = max(float(gate_floor.get(dtype_k, 0.0)), declared)
        picked = select_shapes(list(e.shapes), tier)
        shapes = picked + [b for b in getattr(e, "boundary_shapes", None) or [] if b not in picked]
        started = time.monotonic()
        nonfinite: list[dict] = []
        det_worst, jit_worst = 0.0, 0.0
        det_cases: list[dict] = []
        jit_cases: list[dict] = []
        launch_calls: list[dict] = []
        for si, shape in enumerate(shapes):
            for vi, vc in enumerate(e.value_classes):
                seed = SEED + 1000 * si + vi

                made = e.make_inputs(dict(shape), vc, dtype_k, dev, seed)

                def inputs(made=made):
                    # a fresh copy of the same inputs for every call (kernels may update state
                    # in place); built once: generating e.g. 64 experts' weights takes seconds
                    return _fresh_copy(made)

                oracle = e.oracle(**inputs())
                standard = e.standard(**inputs())
                observe = source == "triton_interpreter" or (si, vi) == (0, 0)  # profiler: once
                with launches.observing(source if observe else None) as seen:
                    fast = e.fast(**inputs())
                    _sync(dev)
                if seen is not None:
                    launch_calls.append({"shape": _label(shape), "value_class": vc, "launched": sorted(set(seen.names)),
                                         "fast": seen.count(list(e.kernel_patterns or []))})
                err_f = max_error(fast, oracle)
                err_s = max_error(standard, oracle)
                tol = max(floor, gate_k * err_s) if math.isfinite(err_s) else floor
                detail = {"shape": shape, "shape_label": _label(shape), "value_class": vc, "err_fast": err_f,
                          "err_standard": err_s, "atol_floor": floor, "k": gate_k,
                          "declared_atol_floor": declared, "tier_dtype": dtype}
                msg = "" if err_f <= tol else (f"{e.name} {_label(shape)} {vc}: fast error {err_f:.3g} > "
                                               f"tolerance {tol:.3g} (standard error {err_s:.3g})")
                record("kernels_noise_floor", "max_abs_err", err_f if math.isfinite(err_f) else float("inf"),
                       threshold=tol, comparator="<=", detail=H.jsonable(detail), message=msg, **base)
                bad = nonfinite_where_oracle_finite(fast, oracle)
                if bad:
                    nonfinite.append({"shape": shape, "value_class": vc, "count": bad})
                # determinism: repeat on identical inputs
                again = e.fast(**inputs())
                _sync(dev)
                d = bitwise_diff(fast, again) if e.deterministic else max_error(again, fast)
                if (e.deterministic and d) or (not e.deterministic and d > tol):
                    det_cases.append({"shape": shape, "value_class": vc, "diff": d})
                det_worst = max(det_worst, float(d))
                # jitter: normal values only (timing, not numerics, is under test)
                if vi == 0:
                    for r in range(rounds):
                        with jitter.stress(seed=seed + r, device=dev) as j:
                            out = j.call(e.fast, **inputs())
                        dj = bitwise_diff(fast, out) if e.deterministic else max_error(out, fast)
                        if (e.deterministic and dj) or (not e.deterministic and dj > tol):
                            jit_cases.append({"shape": shape, "round": r, "diff": dj})
                        jit_worst = max(jit_worst, float(dj))
        n_checked = len(shapes) * len(e.value_classes)
        _record_fast_kernel_launches(record, e, source, no_source, launch_calls, base)
        record("kernels_finite", "nonfinite_where_oracle_finite", sum(x["count"] for x in nonfinite), threshold=0,
               comparator="<=", detail={"cases_checked": n_checked, "seconds": round(time.monotonic() - started, 2)},
               evidence=H.jsonable({"failures": nonfinite}),
               message="" if not nonfinite else f"{e.name}: NaN/Inf where the oracle is finite in "
               f"{len(nonfinite)} of {n_checked} cases", **base)
        mode = "bitwise" if e.deterministic else "within tolerance"
        record("kernels_deterministic", "repeat_diff", det_worst, passed=not det_cases,
               detail={"mode": mode, "cases_checked": n_checked}, evidence=H.jsonable({"failures": det_cases}),
               message="" if not det_cases else f"{e.name}: repeat differs ({mode}) in {len(det_cases)} cases",
               **base)
        record("kernels_jitter", "jitter_diff", jit_worst, passed=not jit_cases,
               detail={"mode": mode, "rounds": rounds, "shapes": len(shapes)},
               evidence=H.jsonable({"failures": jit_cases}),
               message="" if not jit_cases else f"{e.name}: output changes under jitter stress in "
               f"{len(jit_cases)} of {rounds * len(shapes)} runs (race?)", **base)


def _record_fast_kernel_launches(record, e, source, no_source: str, calls: list[dict], base: dict) -> None:
    """kernels_noise_floor row: every observed ``e.fast`` call launched a kernel matching the
    entry's ``kernel_patterns`` -- the suite measured the fast kernel, not a wrapper that routed
    around it (e.g. to torch code for some shapes). Source: ``fastpath.launches``."""
    pats = list(getattr(e, "kernel_patterns", []) or [])
    if source is None:
        H.record_waived(record, "kernels_noise_floor", "calls_without_fast_kernel",
                        f"{e.name}: which kernels its fast call launches is not observable here ({no_source})", **base)
        return
    bad = [c for c in calls if not c["fast"]]
    ok = bool(pats) and bool(calls) and not bad
    msg = ""
    if not pats:
        msg = f"{e.name} declares no kernel_patterns: the suite cannot tell that its fast call runs a fast kernel"
    elif bad:
        msg = (f"{e.name}: {len(bad)} of {len(calls)} fast calls launched no kernel matching {pats} "
               f"(e.g. {bad[0]['shape']} {bad[0]['value_class']} launched {bad[0]['launched'][:5] or 'nothing'}): "
               "the entry's fast call does not run the fast kernel there")
    record("kernels_noise_floor", "calls_without_fast_kernel", len(bad), threshold=0, comparator="<=", passed=ok,
           detail={"source": source, "patterns": pats, "calls_observed": len(calls)},
           evidence=H.jsonable({"calls": calls[:50]}), message=msg, **base)
