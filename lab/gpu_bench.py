"""GPU check + benchmark of the K3-mini fast path (one H200 run, < 5 minutes with the defaults).

    python3 -m lab.gpu_bench [--batches 1,2,4,8,16,32,64] [--contexts 1024,32768]
        [--rounds 5] [--replays 20] [--budget 215] [--kernel-budget 95] [--ktime-budget 60]
        [--skip-kernels] [--skip-ktime] [--out DIR]

1. HBM copy bandwidth (device-to-device copy, read + write bytes), measured in this run.
1b. Per-kernel timings (CUDA graph of 20 calls each) of the kernels changed after the first
   profile: router + align, experts up + down (batch 1/8/64), gemv (1/2/16/64; at 64 also the
   previous tiles), KDA decode V tiles at batch 64 — printed next to the decode table.
2. Correctness of every registered fast kernel (moe_experts, add_rmsnorm, router, kda first) (fast/registry.kernels()) vs its fp32 oracle on the
   mini shapes (bf16 + fp16), noise-floor rule: err(fast) <= max(atol_floor, k * err(standard)).
   One failing kernel is recorded and the rest still run.
3. CuTe DSL vs Triton small-M gemv (the "cute" variant of the tuning table), same shapes.
4. Decode: standard path (K3Runner, CUDA graph) vs fast path (FastDecoder, whole-step CUDA
   graph) at each batch x context: parity of one step (max |logit diff|, top-1 agreement), then
   interleaved rounds (A B B A ...) of graph replays timed with CUDA events; median step time,
   tokens/s, speedup, MBU = config.bytes_per_step / step time / copy bandwidth.
Writes results.json and table.txt under $OUT (or --out), rewritten after every section and
decode row (a killed run keeps what it measured), and prints the table last. Time budgets,
seconds from the start (ktime 60, kernel checks 95, decode cases 215: the run fits 270 s),
skip what would not fit and say so.

The CPU pre-flight of the same step (every launch compiled for sm_90, no GPU) is lab/aot.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch

from fastpath.measure import copy_bandwidth, graph_time, stopwatch_log, time_calls

T0 = time.time()
log = stopwatch_log(T0)


def _err(a, b) -> float:
    if isinstance(a, (tuple, list)):
        return max(_err(x, y) for x, y in zip(a, b))
    a, b = a.float(), b.float()
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    d = (a - b).abs().masked_fill(both_inf, 0.0)
    return float(d.max().item()) if d.numel() else 0.0


def check_kernels(budget_s: float) -> list[dict]:
    from optimized_model.k3.fast import registry

    rows = []
    # the kernels changed last (and those a budget cut lost before) first
    first = {"moe_experts": 0, "add_rmsnorm": 1, "moe_router": 2, "kda_decode": 3, "gemv": 4}
    entries = sorted(registry.kernels(), key=lambda e: first.get(e.name, 99))
    for name, err in registry.import_errors.items():
        rows.append({"kernel": name, "status": "import_error", "detail": err})
    for e in entries:
        for dt in [d for d in ("bfloat16", "float16") if d in e.dtypes]:
            worst, status, detail = 0.0, "pass", ""
            try:
                for shape in e.shapes:
                    for vc in e.value_classes[:2]:
                        if time.time() - T0 > budget_s:
                            raise TimeoutError("kernel-check time budget spent")
                        inp = e.make_inputs(shape, vc, getattr(torch, dt), "cuda", 0)
                        fast = e.fast(**inp)
                        orc = e.oracle(**inp)
                        std = e.standard(**inp)
                        ef, es = _err(fast, orc), _err(std, orc)
                        tol = max(e.atol_floor.get(dt, 0.0), e.k * es)
                        ratio = ef / tol if tol > 0 else (0.0 if ef == 0 else float("inf"))
                        if ratio > worst:
                            worst = ratio
                        if not ef <= tol:
                            status = "FAIL"
                            detail = f"{shape} {vc}: err {ef:.3g} > tol {tol:.3g} (std err {es:.3g})"
                if e.deterministic and e.shapes:
                    inp = e.make_inputs(e.shapes[0], "normal", getattr(torch, dt), "cuda", 1)
                    a, b = e.fast(**inp), e.fast(**inp)
                    same = all(torch.equal(x, y) for x, y in zip(a, b)) if isinstance(a, tuple) else torch.equal(a, b)
                    if not same:
                        status, detail = "FAIL", "not deterministic (repeat differs)"
            except Exception as exc:  # keep going: one broken kernel must not lose the rest
                status, detail = "error", f"{type(exc).__name__}: {exc}"
                traceback.print_exc(limit=3)
            torch.cuda.synchronize()
            rows.append({"kernel": e.name, "component": e.component, "dtype": dt, "status": status,
                         "worst_err_over_tol": round(worst, 4), "detail": detail})
            log(f"kernel {e.name:24s} {dt:9s} {status:6s} worst err/tol {worst:.3f} {detail}")
    return rows


def kernel_timings(budget_s: float, dev: str = "cuda", dtype=torch.bfloat16, dims=None,
                   timer=None) -> list[dict]:
    """Per-kernel µs of the kernels changed after the first profile (mini shapes, bf16),
    each in a CUDA graph of 20 calls: router (+ fused align), routed experts up + down, gemv
    (tuning-table config; candidates at batch 1/2/8 and the previous table's tiles at 64: data
    for the next tuning), KDA decode V tiles at batch 64."""
    from optimized_model.k3.fast import tuning
    from optimized_model.k3.fast.kernels import gemv as G
    from optimized_model.k3.fast.kernels import kda_decode as KDA
    from optimized_model.k3.fast.kernels import moe as MOE

    bf = dtype
    timer = timer or graph_time
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(0)

    def add(row):
        rows.append(row)
        log("ktime " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))

    def guard(name, f):
        if time.time() - T0 > budget_s:
            add({"kernel": name, "status": "skipped (time budget)"})
            return
        try:
            f()
        except Exception as exc:
            add({"kernel": name, "status": f"error {type(exc).__name__}: {exc}"[:300]})
            traceback.print_exc(limit=3)

    D, E, k, Lt, I, NS, HK = dims or (4096, 64, 8, 2048, 1024, (4096, 14336), (32, 128))
    w13 = (torch.randn(E, 2 * I, Lt, device=dev, dtype=bf) / Lt ** 0.5)
    w2 = (torch.randn(E, Lt, I, device=dev, dtype=bf) / I ** 0.5)
    rw = torch.randn(E, D, device=dev) / D ** 0.5
    rb = torch.randn(E, device=dev) * 0.1
    nw = torch.ones(D, device=dev, dtype=bf)
    for M in (1, 8, 64):
        def moe_case(M=M):
            x = torch.randn(M, D, device=dev, dtype=bf)
            ecfg = tuning.lookup("moe_experts", M, device=dev)
            al = MOE.MoeAlign(M, k, E, MOE.experts_block_m(M, ecfg), dev)
            sc = MOE.RouterScratch(M, E, dev)
            ids = torch.empty(M, k, dtype=torch.int32, device=dev)
            wts = torch.empty(M, k, dtype=torch.float32, device=dev)
            rcfg = tuning.lookup("moe_router", M, device=dev)
            t_r = timer(lambda: MOE.moe_router(x, rw, rb, k, routed_scaling=2.5, norm_weight=nw, ids=ids,
                                                     weights=wts, config=rcfg, scratch=sc, align=al))
            ids.copy_(torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(M)]).to(torch.int32))
            MOE.moe_align(ids, E, al.block_m, al)
            lat = torch.randn(M, Lt, device=dev, dtype=bf)
            h = torch.empty(M * k, I, device=dev, dtype=bf)
            o = torch.empty(M, k, Lt, device=dev, dtype=torch.float32)
            t_e = timer(lambda: MOE.moe_experts(lat, ids, wts, w13, w2, h_buf=h, out=o, config=ecfg, align=al))
            n_exp = int(torch.unique(ids).numel())
            nbytes = n_exp * 3 * I * Lt * 2
            add({"kernel": "moe_router+align", "M": M, "us": t_r * 1e6})
            add({"kernel": "moe_experts_up+down", "M": M, "us": t_e * 1e6, "experts": n_exp,
                 "GBps": nbytes / t_e / 1e9, "variant": MOE.variant_name(M, ecfg)})
        guard(f"moe M{M}", moe_case)
    del w13, w2
    for B in (1, 64):
        def kda_case(B=B):
            H, Kh = HK
            inp = KDA.make_inputs(dict(batch=B, heads=H, head_k=Kh, head_v=Kh), "normal", bf, dev, 0)
            out = torch.empty(B, H * Kh, device=dev, dtype=bf)
            for bv in ((None, 32, 64, 128) if B == 64 and Kh == 128 else (None,)):
                kw = dict(inp)
                kw["block_v"] = bv
                t = timer(lambda: KDA.kda_decode(**kw, out=out))
                add({"kernel": "kda_decode", "M": B, "block_v": bv or "auto", "us": t * 1e6,
                     "GBps": B * H * Kh * Kh * 4 * 2 / t / 1e9})
        guard(f"kda B{B}", kda_case)
    old64 = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": "auto", "target_programs": 264,
             "min_k_iters": 2, "max_split": 8, "num_warps": 4, "num_stages": 3}
    ws_ = {N: torch.randn(N, D, device=dev, dtype=bf) / D ** 0.5 for N in NS}
    # pass 0: the table's configs (what the decode step runs); pass 1: candidates (next tuning)
    for pass_, N in [(p_, n_) for p_ in (0, 1) for n_ in NS]:
        w = ws_[N]
        for M in (1, 2, 4, 8, 16, 64):
            def gemv_case(M=M, N=N, w=w, pass_=pass_):
                x = torch.randn(M, D, device=dev, dtype=bf)
                y = torch.empty(M, N, device=dev, dtype=bf)
                cfgs = [("table", tuning.lookup("gemv", M, device=dev, N=N, K=D))]
                if N == max(NS) and M <= 2:  # candidates for the small-M table (data for the next tuning)
                    for label, upd in (("cand_no_prefetch", dict(prefetch=0)),
                                       ("cand_bn32_bk256", dict(BLOCK_N=32, BLOCK_K=256)),
                                       ("cand_bn8_t1056", dict(BLOCK_N=8, BLOCK_K=512, target_programs=1056)),
                                       ("cand_bk1024_w8", dict(BLOCK_N=16, BLOCK_K=1024, num_warps=8))):
                        e = tuning.entry("gemv", M, device=dev)
                        e.update(upd)
                        if M == 2 and label == "cand_bn8_t1056":
                            continue
                        cfgs.append((label, tuning.resolve_split(e, M, N, D)))
                if N == max(NS) and M == 8:  # small-M per-row form at batch 8 (vs the tl.dot tiles)
                    e = tuning.entry("gemv", 4, device=dev)
                    e.update(BLOCK_M=8)
                    cfgs.append(("cand_small_bm8", tuning.resolve_split(e, M, N, D)))
                if M == 64:
                    e = dict(old64)
                    prog = -(-N // 64)
                    e["SPLIT_K"] = int(min(max(1, -(-264 // prog)), max(1, (D // 64) // 2), 8))
                    cfgs.append(("previous", e))
                cfgs = cfgs[:1] if pass_ == 0 else cfgs[1:]
                for label, c in cfgs:
                    sc = G.GemvScratch(M, N, int(c.get("SPLIT_K", 1)), False, dev) if int(c.get("SPLIT_K", 1)) > 1 else None
                    t = timer(lambda: G.gemv(x, w, out=y, config=c, scratch=sc))
                    add({"kernel": "gemv", "M": M, "N": N, "K": D, "config": label, "us": t * 1e6,
                         "GBps": N * D * 2 / t / 1e9, "variant": G.variant_name(M, c)})
            guard(f"gemv M{M} N{N} pass {pass_}", gemv_case)
    del ws_
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return rows


def cute_vs_triton() -> list[dict]:
    from optimized_model.k3.fast.kernels import cute_gemv
    from optimized_model.k3.fast.kernels import gemv as G

    rows = []
    ok, why = cute_gemv.available()
    for M, N, K in ((1, 4096, 4096), (1, 8192, 256), (1, 14336, 4096), (2, 4096, 4096), (2, 14336, 4096)):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        row = {"M": M, "N": N, "K": K}
        try:
            yt = G.gemv(x, w)
            row["triton_us"] = statistics.median(time_calls(lambda: G.gemv(x, w, out=yt), 50) for _ in range(3)) * 1e6
            if ok:
                yc = cute_gemv.gemv(x, w)
                row["cute_us"] = statistics.median(time_calls(lambda: cute_gemv.gemv(x, w, out=yc), 50) for _ in range(3)) * 1e6
                row["max_diff"] = _err(yc, yt)
            else:
                row["cute"] = why
            row["GBps_triton"] = N * K * 2 / (row["triton_us"] / 1e6) / 1e9
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
        log(f"gemv M{M} N{N} K{K}: {row}")
    return rows


def bench_decode(batches, contexts, rounds, replays, budget_s, bw, rows=None, on_row=None) -> list[dict]:
    from optimized_model.k3 import config as C
    from optimized_model.k3.fast import dispatch
    from optimized_model.k3.model import K3Model
    from optimized_model.k3.runner import K3Runner
    from fastpath import trace

    log("building K3-mini (mini, bf16) on cuda")
    model = K3Model.build("mini", device="cuda", dtype=torch.bfloat16, seed=0)
    std_note = model.kda_backend
    try:
        import fla  # noqa: F401
    except Exception:
        model.kda_backend = "torch"
        std_note = "torch (fla-core missing: carry it for a fair baseline)"
    log(f"standard path: kda backend {std_note}, moe backend {model.moe_backend}")
    runner = K3Runner(model, use_graphs=True)
    fd = dispatch.build_fast_decoder(model, lambda b, cap: model.new_state(b, cap))
    cfg = model.cfg
    rows = [] if rows is None else rows
    for ctx in contexts:
        for B in batches:
            row = {"batch": B, "context": ctx}
            if time.time() - T0 > budget_s:
                row["status"] = "skipped (time budget)"
                rows.append(row)
                continue
            try:
                # parity of one step on the same random state (eager fast path, no graph)
                st = model.random_state(B, ctx, -(-(ctx + 1) // 64) * 64, seed=3)
                st2 = st.clone()
                tok = torch.randint(0, cfg.n_real_tokens, (B,), device="cuda")
                n = cfg.n_real_tokens
                ref = model.decode(tok, st)[:, :n]
                use_graphs, fd.use_graphs = fd.use_graphs, False
                out = fd.decode(tok, st2)[:, :n]
                fd.use_graphs = use_graphs
                row["max_logit_diff"] = _err(out, ref)
                row["top1_agree"] = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
                del st, st2
                # timing: interleaved A B B A rounds of graph replays
                std_step = runner.decode_step(B, ctx)
                with trace.recording() as rec:
                    fast_step = fd.decode_step(B, ctx)
                    fast_step()
                comps = rec.components()
                row["fast_components"] = sorted(comps)
                row["fast_refused"] = sorted(c for c, v in comps.items() if any(x.startswith("refused") for x in v))
                for f in (std_step, fast_step):
                    time_calls(f, 3)
                ts, tf = [], []
                for r in range(rounds):
                    order = (std_step, fast_step) if r % 2 == 0 else (fast_step, std_step)
                    for f in order:
                        t = time_calls(f, replays)
                        (ts if f is std_step else tf).append(t)
                ms, mf = statistics.median(ts), statistics.median(tf)
                nbytes = C.bytes_per_step(cfg, B, ctx)
                row.update({
                    "std_ms": ms * 1e3, "fast_ms": mf * 1e3,
                    "std_tok_s": B / ms, "fast_tok_s": B / mf, "speedup": ms / mf,
                    "std_mbu": nbytes / ms / bw, "fast_mbu": nbytes / mf / bw,
                    "std_rounds_ms": [t * 1e3 for t in ts], "fast_rounds_ms": [t * 1e3 for t in tf],
                    "status": "ok",
                })
                del std_step, fast_step
            except Exception as exc:
                row["status"] = f"error {type(exc).__name__}: {exc}"
                traceback.print_exc(limit=4)
            runner.clear_graph_cache()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            rows.append(row)
            if on_row is not None:
                on_row()
            log(f"decode b{B} c{ctx}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                 for k, v in row.items() if not k.endswith("rounds_ms")))
    return rows


def render(res: dict, bw: float) -> str:
    lines = [f"device {res['device']}  copy bw {bw / 1e9:.0f} GB/s  torch {res['torch']}  triton {res.get('triton')}"]
    if "kernels" in res:
        bad = [r for r in res["kernels"] if r["status"] != "pass"]
        lines.append(f"kernels: {len(res['kernels']) - len(bad)} pass, {len(bad)} not: "
                     + "; ".join(f"{r['kernel']}/{r.get('dtype', '')} {r['status']} {r.get('detail', '')[:80]}" for r in bad))
        for r in res.get("cute_vs_triton", []):
            lines.append(f"  gemv M{r.get('M')} N{r.get('N')} K{r.get('K')}: triton {r.get('triton_us', float('nan')):.1f} us"
                         f"  cute {r.get('cute_us', float('nan')):.1f} us  {r.get('cute', r.get('error', ''))}")
    for r in res.get("kernel_timings", []):
        lines.append("  ktime " + " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in r.items()))
    hdr = f"{'batch':>5} {'ctx':>6} {'std tok/s':>10} {'fast tok/s':>10} {'speedup':>8} {'std MBU':>8} {'fast MBU':>8} {'maxdiff':>8} {'top1':>5}  status"
    lines.append(hdr)
    for r in res.get("decode", []):
        if r.get("status") == "ok":
            lines.append(f"{r['batch']:>5} {r['context']:>6} {r['std_tok_s']:>10.1f} {r['fast_tok_s']:>10.1f} "
                         f"{r['speedup']:>7.2f}x {r['std_mbu']:>7.1%} {r['fast_mbu']:>7.1%} "
                         f"{r['max_logit_diff']:>8.3g} {r['top1_agree']:>5.2f}  ok {('refused: ' + ','.join(r['fast_refused'])) if r['fast_refused'] else ''}")
        else:
            lines.append(f"{r['batch']:>5} {r['context']:>6}  {r.get('status')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--contexts", default="1024,32768")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--budget", type=float, default=215.0)
    ap.add_argument("--kernel-budget", type=float, default=95.0)
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--skip-ktime", action="store_true", help="skip the per-kernel timings")
    ap.add_argument("--ktime-budget", type=float, default=60.0,
                    help="seconds from the start by which the per-kernel timings stop")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu_bench_out"))
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA device here (this script measures the H200 fast path); nothing to do")
        return 2
    os.makedirs(a.out, exist_ok=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "argv": sys.argv}
    try:
        import triton

        res["triton"] = triton.__version__
    except Exception:
        pass
    bw = copy_bandwidth()
    res["copy_bw_GBps"] = bw / 1e9
    log(f"copy bandwidth {bw / 1e9:.0f} GB/s")

    def dump() -> str:  # after every section and decode row: a killed run keeps what it measured
        table = render(res, bw)
        with open(os.path.join(a.out, "results.json"), "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        with open(os.path.join(a.out, "table.txt"), "w") as fh:
            fh.write(table + "\n")
        return table

    if not a.skip_ktime:
        res["kernel_timings"] = kernel_timings(a.ktime_budget)
        dump()
    if not a.skip_kernels:
        res["kernels"] = check_kernels(a.kernel_budget)
        try:
            res["cute_vs_triton"] = cute_vs_triton()
        except Exception as exc:
            res["cute_vs_triton"] = [{"error": f"{type(exc).__name__}: {exc}"}]
        dump()
    batches = [int(b) for b in a.batches.split(",")]
    contexts = [int(c) for c in a.contexts.split(",")]
    res["decode"] = []
    bench_decode(batches, contexts, a.rounds, a.replays, a.budget, bw, rows=res["decode"], on_row=dump)
    table = dump()
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
