"""GPU check of the fast path's attention decode kernels and the CuTe DSL GEMV (one H200 run,
< 3 minutes). Run from the repository root:

    python3 -m lab.gpu_attn_check            # writes $OUT/gpu_attn_check.json

Pieces (each in its own try/except; a missing package is recorded as a skip with the reason):

1. copy bandwidth: fastpath.measure.copy_bandwidth (device-to-device copy of 2 GiB, read + write bytes) — the roofline
   for every "% copy BW" figure below, measured in the same run;
2. KDA decode (H=32, K=V=128, bf16, batch 1..64): fused Triton step vs fla ``naive_recurrent_kda``
   (fp32 oracle) and vs the standard path (torch conv/norm + fla ``fused_recurrent_kda``):
   max errors, noise-floor verdict, µs per step (CUDA-graph replay) for fast (auto and each
   block_v), standard, and fla's recurrence kernel alone; bytes = fp32 state read + write;
3. MLA absorbed decode (H=32, kv_lora=512, bf16) at contexts 1k/8k/32k, batch 1/8/64: split-KV
   Triton vs torch (the standard path's ops) and vs the fp32 oracle; µs; bytes = latent read;
4. dense GEMV, M = 1, 2, N x K = 14336 x 4096 and 4096 x 4096 (bf16, weights rotated over
   copies larger than L2): CuTe DSL (config sweep) vs Triton (``kernels/gemv.py``) vs torch
   matmul: max error vs fp32, µs, % of copy bandwidth.

Timings: CUDA-graph capture of ``iters`` back-to-back calls, median over ``reps`` replays.

``GPU_ATTN_CHECK_SMOKE=1`` runs the same code paths on CPU (Triton interpreter, fp16, tiny
shapes, wall-clock "timings") — a dry run of this script, not a measurement.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
import time
import traceback

SMOKE = os.environ.get("GPU_ATTN_CHECK_SMOKE") == "1"
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from fastpath.measure import copy_bandwidth as measure_copy_bandwidth, graph_time, stopwatch_log  # noqa: E402

DEV = "cpu" if SMOKE else "cuda"
DT = torch.float16 if SMOKE else torch.bfloat16
SM = 132 if SMOKE else None

RESULTS: dict = {"pieces": {}, "errors": {}, "skips": {}}
T0 = time.time()
_log = stopwatch_log(T0)


def log(*a):
    _log(" ".join(str(x) for x in a))


def bench(fn, iters: int = 20, reps: int = 7) -> float:
    """µs per call of ``fn(i)`` (``i`` counts the calls: it rotates weight copies): a CUDA graph
    of ``iters`` calls, median of ``reps`` replays (eager where capture fails); in the CPU smoke
    run one wall-clock call."""
    if SMOKE:
        t = time.perf_counter()
        fn(0)
        return (time.perf_counter() - t) * 1e6
    calls = itertools.count()
    return graph_time(lambda: fn(next(calls)), calls=iters, replays=reps, eager_fallback=True) * 1e6


def maxerr(a, b) -> float:
    return (a.float() - b.float()).abs().max().item()


def piece(name):
    def deco(f):
        def wrapped(*a, **k):
            log(f"== {name}")
            try:
                RESULTS["pieces"][name] = f(*a, **k)
            except ImportError as exc:
                RESULTS["skips"][name] = f"{type(exc).__name__}: {exc}"
                log(f"  skipped: {exc}")
            except Exception as exc:  # noqa: BLE001
                RESULTS["errors"][name] = traceback.format_exc()[-3000:]
                log(f"  ERROR: {exc!r}")
        return wrapped
    return deco


@piece("copy_bw")
def copy_bandwidth():
    bw = measure_copy_bandwidth(DEV, nbytes=2 ** 20 if SMOKE else None)
    RESULTS["copy_bw_Bps"] = bw
    log(f"  copy bandwidth {bw / 1e12:.2f} TB/s")
    return {"TBps": bw / 1e12}


def pct_bw(nbytes: float, us: float) -> float:
    bw = RESULTS.get("copy_bw_Bps")
    return float("nan") if not bw else 100.0 * nbytes / (us * 1e-6) / bw


@piece("kda_decode")
def check_kda():
    import fla.ops.kda  # noqa: F401  (ImportError -> skip with the reason)
    from optimized_model.k3.fast.kernels import kda_decode as kda

    rows = []
    H, K, V = (2, 16, 16) if SMOKE else (32, 128, 128)
    sms = SM or torch.cuda.get_device_properties(0).multi_processor_count
    for B in (1, 2) if SMOKE else (1, 2, 4, 8, 16, 32, 64):
        shape = dict(batch=B, heads=H, head_k=K, head_v=V)
        inp = kda.make_inputs(shape, "normal", DT, DEV, seed=B)
        fo, so, oo = kda.fast(**inp), kda.standard(**inp), kda.oracle(**inp)
        e_fast = [maxerr(a, b) for a, b in zip(fo, oo)]
        e_std = [maxerr(a, b) for a, b in zip(so, oo)]
        ok = all(ef <= max(8e-3, 2 * es) for ef, es in zip(e_fast, e_std))
        det = all(torch.equal(a, b) for a, b in zip(fo, kda.fast(**inp)))
        # timings on persistent buffers (in-place updates; the state stays bounded)
        st = {k_: (v_.clone() if torch.is_tensor(v_) else v_) for k_, v_ in inp.items()}
        names = ("q", "k", "v", "f", "b", "gate", "conv_q", "conv_k", "conv_v", "conv_wq",
                 "conv_wk", "conv_wv", "A_log", "dt_bias", "state", "norm_weight")
        args = [st[n] for n in names]
        kw = dict(num_heads=H, head_k=K, head_v=V)
        t_fast = bench(lambda i: kda.kda_decode(*args, **kw))
        t_bv = {bv: bench(lambda i, bv=bv: kda.kda_decode(*args, **kw, block_v=bv))
                for bv in ((8, 16) if SMOKE else (32, 64, 128))}
        t_std = bench(lambda i: kda.standard(**st))
        t_fla = float("nan")
        if not SMOKE:  # fla's Triton kernel does not run on CPU
            from fla.ops.kda import fused_recurrent_kda

            q4 = torch.nn.functional.normalize(torch.randn(B, 1, H, K, device=DEV), dim=-1).to(DT)
            k4 = torch.nn.functional.normalize(torch.randn(B, 1, H, K, device=DEV), dim=-1).to(DT)
            v4 = torch.randn(B, 1, H, V, device=DEV).to(DT)
            g4 = torch.randn(B, 1, H, K, device=DEV).to(DT)
            b4 = torch.randn(B, 1, H, device=DEV).to(DT)
            S = st["state"]
            t_fla = bench(lambda i: fused_recurrent_kda(
                q4, k4, v4, g4, b4, A_log=st["A_log"], dt_bias=st["dt_bias"], initial_state=S,
                output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                use_beta_sigmoid_in_kernel=True, lower_bound=-5.0))
        nbytes = 2 * B * H * K * V * 4
        row = dict(batch=B, err_fast=e_fast, err_std=e_std, noise_floor_ok=ok, deterministic=det,
                   block_v_auto=kda.choose_block_v(B, H, V, sms),
                   us_fast=t_fast, us_fast_by_block_v=t_bv, us_standard=t_std, us_fla_recurrence=t_fla,
                   state_bytes=nbytes, pct_copy_bw_fast=pct_bw(nbytes, t_fast),
                   speedup_vs_standard=t_std / t_fast)
        log(f"  B={B:3d} err fast {e_fast[0]:.2e}/{e_fast[1]:.2e} std {e_std[0]:.2e}/{e_std[1]:.2e} "
            f"ok={ok} det={det} | fast {t_fast:.1f}us ({row['pct_copy_bw_fast']:.0f}% bw) "
            f"bv {', '.join(f'{k_}:{v_:.1f}' for k_, v_ in t_bv.items())} | std {t_std:.1f}us fla {t_fla:.1f}us")
        rows.append(row)
    return rows


@piece("mla_decode")
def check_mla():
    from optimized_model.k3.fast.kernels import mla_decode as mla

    rows = []
    H, D = (2, 16) if SMOKE else (32, 512)
    sms = SM or torch.cuda.get_device_properties(0).multi_processor_count
    for T in (40, 300) if SMOKE else (1024, 8192, 32768):
        for B in (1, 3) if SMOKE else (1, 8, 64):
            shape = dict(batch=B, heads=H, latent=D, context=T)
            inp = mla.make_inputs(shape, "normal", DT, DEV, seed=T + B)
            fo, so, oo = mla.fast(**inp), mla.standard(**inp), mla.oracle(**inp)
            e_fast, e_std = maxerr(fo, oo), maxerr(so, oo)
            ok = e_fast <= max(8e-3, 2 * e_std)
            det = torch.equal(fo, mla.fast(**inp))
            minp = mla.make_inputs(shape, "masked", DT, DEV, seed=1)
            e_mask = maxerr(mla.fast(**minp), mla.oracle(**minp))
            e_mask_std = maxerr(mla.standard(**minp), mla.oracle(**minp))
            del oo, so, minp
            q, cache, lengths = inp["q"], inp["cache"], inp["lengths"]
            t_bh, e_bh = {}, {}
            for bh in (16, 32):  # head block: 32 reads the latent once for all 32 heads
                e_bh[bh] = maxerr(mla.mla_decode(q, cache, lengths, scale=inp["scale"], max_len=T,
                                                 block_h=bh), fo)
                t_bh[bh] = bench(lambda i, bh=bh: mla.mla_decode(q, cache, lengths, scale=inp["scale"],
                                                                 max_len=T, block_h=bh))
            t_fast = t_bh[16]
            t_std = bench(lambda i: mla.standard(**inp), iters=5, reps=5)
            ns = mla.split_plan(B, math.ceil(H / 16), T, 32, sm_count=sms)[0]
            nbytes = B * T * D * 2
            row = dict(batch=B, context=T, num_splits=ns, err_fast=e_fast, err_std=e_std,
                       err_fast_masked=e_mask, err_std_masked=e_mask_std, noise_floor_ok=ok,
                       deterministic=det, us_fast=t_fast, us_by_block_h=t_bh,
                       diff_by_block_h=e_bh, pct_copy_bw_block_h32=pct_bw(nbytes, t_bh[32]),
                       us_standard=t_std,
                       pct_copy_bw_fast=pct_bw(nbytes, t_fast), speedup_vs_standard=t_std / t_fast)
            log(f"  T={T:5d} B={B:2d} splits={ns:2d} err {e_fast:.2e} (std {e_std:.2e}) masked {e_mask:.2e} "
                f"ok={ok} det={det} | fast {t_fast:.1f}us ({row['pct_copy_bw_fast']:.0f}% bw) "
                f"bh32 {t_bh[32]:.1f}us (diff {e_bh[32]:.1e}) std {t_std:.1f}us")
            rows.append(row)
            del inp, q, cache
            if not SMOKE:
                torch.cuda.empty_cache()
    return rows


@piece("dense_gemv")
def check_gemv():
    from optimized_model.k3.fast.kernels import cute_gemv as cg

    try:
        from optimized_model.k3.fast.kernels import gemv as tg
    except Exception as exc:  # noqa: BLE001
        tg = None
        RESULTS["skips"]["triton_gemv"] = repr(exc)
    ok_cute, why = cg.available()
    if not ok_cute:
        RESULTS["skips"]["cute_gemv"] = why
        log("  cute unavailable:", why)
    l2 = 50 * 1024 ** 2
    rows = []
    for N, K in ((48, 64),) if SMOKE else ((14336, 4096), (4096, 4096)):
        wbytes = N * K * 2
        ncopy = 2 if SMOKE else max(2, math.ceil(4 * l2 / wbytes))
        ws = [torch.randn(N, K, device=DEV).mul_(K ** -0.5).to(DT) for _ in range(ncopy)]
        for M in (1, 2):
            x = torch.randn(M, K, device=DEV).to(DT)
            ref = x.float() @ ws[0].float().t()
            row = dict(m=M, n=N, k=K, weight_copies=ncopy)
            e_std = maxerr(x @ ws[0].t(), ref)
            t = bench(lambda i: torch.matmul(x, ws[i % ncopy].t()))
            row.update(err_torch=e_std, us_torch=t, pct_bw_torch=pct_bw(wbytes, t))
            if tg is not None:
                try:
                    row["err_triton"] = maxerr(tg.gemv(x, ws[0]), ref)
                    t = bench(lambda i: tg.gemv(x, ws[i % ncopy]))
                    row.update(us_triton=t, pct_bw_triton=pct_bw(wbytes, t))
                except Exception as exc:  # noqa: BLE001
                    row["triton_error"] = repr(exc)[:300]
            if ok_cute:
                sweep = {}
                for warps in (4, 8):
                    for rpw in (1, 2, 4):
                        try:
                            y = cg.gemv(x, ws[0], warps=warps, rows_per_warp=rpw)
                            err = maxerr(y, ref)
                            det = torch.equal(y, cg.gemv(x, ws[0], warps=warps, rows_per_warp=rpw))
                            t = bench(lambda i: cg.gemv(x, ws[i % ncopy], warps=warps, rows_per_warp=rpw))
                            sweep[f"w{warps}r{rpw}"] = dict(err=err, us=t, det=det, pct_bw=pct_bw(wbytes, t))
                        except Exception as exc:  # noqa: BLE001
                            sweep[f"w{warps}r{rpw}"] = dict(error=repr(exc)[:300])
                good = {k_: v_ for k_, v_ in sweep.items() if "us" in v_ and v_["err"] <= max(8e-3, 2 * e_std)}
                row["cute_sweep"] = sweep
                if good:
                    best = min(good, key=lambda k_: good[k_]["us"])
                    row.update(cute_best=best, err_cute=good[best]["err"], us_cute=good[best]["us"],
                               pct_bw_cute=good[best]["pct_bw"])
            log("  " + " ".join(f"{k_}={v_:.3g}" if isinstance(v_, float) else f"{k_}={v_}"
                                for k_, v_ in row.items() if k_ != "cute_sweep"))
            rows.append(row)
        del ws
        if not SMOKE:
            torch.cuda.empty_cache()
    return rows


def table() -> str:
    lines = []
    bw = RESULTS.get("copy_bw_Bps")
    lines.append(f"copy BW: {bw / 1e12:.2f} TB/s" if bw else "copy BW: n/a")
    for r in RESULTS["pieces"].get("kda_decode") or []:
        lines.append(f"KDA  B={r['batch']:<3d} fast {r['us_fast']:7.1f}us ({r['pct_copy_bw_fast']:3.0f}%bw) "
                     f"std {r['us_standard']:7.1f}us x{r['speedup_vs_standard']:.2f} "
                     f"err {r['err_fast'][0]:.1e}<=2x{r['err_std'][0]:.1e} ok={r['noise_floor_ok']}")
    for r in RESULTS["pieces"].get("mla_decode") or []:
        lines.append(f"MLA  T={r['context']:<5d} B={r['batch']:<2d} S={r['num_splits']:<2d} fast {r['us_fast']:8.1f}us "
                     f"({r['pct_copy_bw_fast']:3.0f}%bw) bh32 {r['us_by_block_h'][32]:8.1f}us "
                     f"({r['pct_copy_bw_block_h32']:3.0f}%bw) std {r['us_standard']:8.1f}us "
                     f"x{r['speedup_vs_standard']:.2f} ok={r['noise_floor_ok']}")
    for r in RESULTS["pieces"].get("dense_gemv") or []:
        def f(k_):
            return f"{r[k_]:6.1f}" if k_ in r else "   n/a"
        lines.append(f"GEMV M={r['m']} {r['n']}x{r['k']} torch {f('us_torch')}us {f('pct_bw_torch')}% | "
                     f"triton {f('us_triton')}us {f('pct_bw_triton')}% | cute {f('us_cute')}us "
                     f"{f('pct_bw_cute')}% ({r.get('cute_best', '-')})")
    for k_, v_ in RESULTS["skips"].items():
        lines.append(f"SKIP {k_}: {v_[:160]}")
    for k_ in RESULTS["errors"]:
        lines.append(f"ERROR {k_}: see JSON")
    return "\n".join(lines)


def main() -> int:
    if not torch.cuda.is_available() and not SMOKE:
        print("gpu_attn_check: no CUDA device — nothing to measure (this script is for the GPU "
              "machine; GPU_ATTN_CHECK_SMOKE=1 dry-runs it on CPU)")
        return 2
    RESULTS["device"] = "cpu (smoke dry run)" if SMOKE else torch.cuda.get_device_name(0)
    RESULTS["torch"] = torch.__version__
    try:
        import triton

        RESULTS["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        pass
    for mod in ("fla", "cutlass"):
        try:
            m = __import__(mod)
            RESULTS[mod] = getattr(m, "__version__", "installed")
        except Exception as exc:  # noqa: BLE001
            RESULTS[mod] = f"missing ({exc})"
    copy_bandwidth()
    check_kda()
    check_mla()
    check_gemv()
    RESULTS["wall_s"] = time.time() - T0
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gpu_attn_check.json"), "w") as fh:
            json.dump(RESULTS, fh, indent=1, default=str)
    print("\n" + table())
    return 1 if RESULTS["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
