"""GPU check of K3-mini's standard path on the H200 (run by the lead; < 4 minutes).

    python3 -m lab.gpu_check              # writes $OUT/k3_gpu_check.json if $OUT is set
    python3 -m lab.gpu_check --paths standard,fast

Needs torch with CUDA and fla-core 0.6.0 (on the test machine it travels as a wheel:
lab/README.md says how). Steps, each timed and printed as it ends:

1. fla-core kernels vs the torch recurrence (fp32): ``chunk_kda`` (prefill, T=300, 4 heads of
   128, decays down to the -5 bound) and ``fused_recurrent_kda`` (one in-place decode step).
2. A 4-layer mini-shaped model (hidden 4096, K=V=128, 16 experts): standard path (bf16, fla,
   grouped MoE) vs the fp32 oracle (same weights) on a ragged prefill + 4 decodes; CUDA-graph
   decode vs eager decode on the same state.
3. ``mini``: build (seeded, on device), grouped-mm MoE vs the expert loop, a 32k-token prefill
   (batch 1) then graph-replayed decode steps from that real state.
4. Decode step timing at batch 1..64, contexts 1024 and 32768 (bench_decode, fewer rounds).
Prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from fastpath.measure import stopwatch_log

log = stopwatch_log()


def _err(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float(), b.float()
    d = (a - b).abs()
    return {"max_abs": float(d.max()), "rel_l2": float(d.norm() / b.norm().clamp_min(1e-30))}


def check_kernels(dev: str) -> dict:
    from fla.ops.kda import chunk_kda
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    from optimized_model.k3.kda import kda_chunked, kda_recurrent, kda_step_

    g = torch.Generator(device=dev).manual_seed(0)
    B, T, H, K = 2, 300, 4, 128
    bf = torch.bfloat16
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g, device=dev), dim=-1).to(bf)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g, device=dev), dim=-1).to(bf)
    v = torch.randn(B, T, H, K, generator=g, device=dev).to(bf)
    gate = -5.0 * torch.sigmoid(3 * torch.randn(B, T, H, K, generator=g, device=dev))
    beta = torch.rand(B, T, H, generator=g, device=dev).to(bf)
    h0 = torch.randn(B, H, K, K, generator=g, device=dev) * K ** -0.5
    o_ref, s_ref = kda_recurrent(q, k, v, gate, beta, initial_state=h0)
    out = {}
    o_t, s_t = kda_chunked(q, k, v, gate, beta, initial_state=h0)
    out["torch_chunked_vs_recurrent"] = {"o": _err(o_t, o_ref), "S": _err(s_t, s_ref)}
    o_c, s_c = chunk_kda(q, k, v, gate, beta, initial_state=h0.clone(), output_final_state=True)
    out["fla_chunk_kda_vs_recurrent"] = {"o": _err(o_c, o_ref), "S": _err(s_c, s_ref)}
    S = s_ref.clone()
    o1 = kda_step_(q[:, 0], k[:, 0], v[:, 0], gate[:, 0], beta[:, 0], S, K ** -0.5)
    S2 = s_ref.clone()
    o2, _ = fused_recurrent_kda_fwd(q=q[:, :1].contiguous(), k=k[:, :1].contiguous(), v=v[:, :1].contiguous(),
                                    g=gate[:, :1].contiguous(), beta=beta[:, :1].contiguous(), scale=K ** -0.5,
                                    initial_state=S2, inplace_final_state=True)
    out["fla_fused_recurrent_step_vs_torch"] = {"o": _err(o2[:, 0], o1), "S": _err(S2, S)}
    return out


def check_small_model(dev: str) -> dict:
    from optimized_model.k3.config import get_config
    from optimized_model.k3.model import K3Model
    from optimized_model.k3.runner import K3Runner

    cfg = get_config("mini", n_layers=4, n_experts=16, top_k=4, dense_inter=4096)
    std = K3Model.build(cfg, device=dev, dtype=torch.bfloat16, seed=0)
    orc = K3Model(cfg, {k: v.float() for k, v in std.w.items()}, oracle=True)
    assert std.kda_backend == "fla", std.kda_backend
    n = cfg.n_real_tokens
    gen = torch.Generator().manual_seed(1)
    toks = torch.randint(0, n, (2, 300), generator=gen).to(dev)
    lens = torch.tensor([300, 171], device=dev)
    nxt = torch.randint(0, n, (2, 4), generator=gen).to(dev)
    res = {"moe_backend": std.moe_backend}
    outs = {}
    for name, m in (("std", std), ("orc", orc)):
        st = m.new_state(2, 512)
        lg = [m.prefill(toks, lens, st)]
        for t in range(4):
            lg.append(m.decode(nxt[:, t], st))
        outs[name] = torch.stack(lg, 1)[..., :n]
    a, b = outs["std"], outs["orc"]
    res["std_vs_oracle_logits"] = _err(a, b)
    res["std_vs_oracle_top1_agree"] = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    pa, pb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    res["kl_oracle_std"] = float((pb.exp() * (pb - pa)).sum(-1).mean())
    # graph replay == eager on the same state
    r = K3Runner(std, use_graphs=True)
    st = std.random_state(4, 1000, 1024, seed=2)
    st2 = st.clone()
    r.adopt(st)
    tok = torch.tensor([1, 2, 3, 4], device=dev)
    lg_graph = [r.decode(tok, st) for _ in range(3)]
    lg_eager = [std.decode(tok, st2) for _ in range(3)]
    res["graph_vs_eager"] = _err(torch.stack(lg_graph)[..., :n], torch.stack(lg_eager)[..., :n])
    del std, orc, r
    torch.cuda.empty_cache()
    return res


def check_mini(engine) -> dict:
    from optimized_model.k3.config import param_counts
    from optimized_model.k3.model import K3Model
    from optimized_model.k3.runner import K3Runner

    t = time.time()
    m = engine._model(oracle=False)
    torch.cuda.synchronize()
    res = {"build_s": time.time() - t, "params": param_counts(m.cfg)["total"],
           "weight_bytes": sum(x.numel() * x.element_size() for x in m.w.values()),
           "kda_backend": m.kda_backend, "moe_backend": m.moe_backend}
    x = torch.randn(64, m.cfg.hidden, device=m.device, generator=torch.Generator(device=m.device).manual_seed(3))
    x = x.to(m.dtype)
    loop = K3Model(m.cfg, m.w, moe_backend="loop")
    res["moe_grouped_vs_loop"] = _err(m.moe(1, x), loop.moe(1, x))
    # 32k-token prefill, batch 1, then graph decode from the real state
    T = 32768
    prompt = torch.randint(0, m.cfg.n_real_tokens, (T,), generator=torch.Generator().manual_seed(4)).tolist()
    r = K3Runner(m, use_graphs=True, reserve=64)
    torch.cuda.synchronize()
    t = time.time()
    logits, st = r.prefill([prompt])
    torch.cuda.synchronize()
    res["prefill_32k_s"] = time.time() - t
    res["prefill_32k_tok_per_s"] = T / res["prefill_32k_s"]
    res["prefill_peak_GB"] = torch.cuda.max_memory_allocated() / 1e9
    lp = torch.log_softmax(logits[0, : m.cfg.n_real_tokens], -1)
    res["entropy_after_32k"] = float(-(lp.exp() * lp).sum())
    ents = []
    tok = logits.argmax(-1)
    for _ in range(8):
        logits = r.decode(tok, st)
        lp = torch.log_softmax(logits[0, : m.cfg.n_real_tokens], -1)
        ents.append(float(-(lp.exp() * lp).sum()))
        tok = logits.argmax(-1)
    res["decode_after_32k_finite"] = bool(torch.isfinite(logits[:, : m.cfg.n_real_tokens]).all())
    res["decode_after_32k_entropy"] = ents
    del r, st, logits
    torch.cuda.empty_cache()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--paths", default="standard")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--contexts", default="1024,32768")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args(argv)
    t0 = time.time()
    if not torch.cuda.is_available():
        log("gpu_check needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    try:
        import fla.ops.kda  # noqa: F401
    except Exception as exc:
        log(f"fla-core is not importable ({exc}); carry it as a wheel (lab/README.md)")
        return 2
    from lab.bench_decode import bench, format_table
    from optimized_model.k3.engine import EmbeddedEngine

    dev = "cuda"
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    def step(name, fn):
        t = time.time()
        try:
            report[name] = fn()
        except Exception as exc:  # keep going: report what failed
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        report[name + "_s"] = time.time() - t
        log(f"{name}: {json.dumps(report[name], default=str)}")

    step("kernels", lambda: check_kernels(dev))
    step("small_model", lambda: check_small_model(dev))
    engine = EmbeddedEngine(config="mini", device="cuda", dtype="bfloat16")
    report["engine_info"] = engine.info()
    step("mini", lambda: check_mini(engine))
    step("decode_bench", lambda: bench(engine, args.paths.split(","), [int(b) for b in args.batches.split(",")],
                                       [int(c) for c in args.contexts.split(",")], args.rounds, args.replays, log=log))
    report["total_s"] = time.time() - t0
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "k3_gpu_check.json"), "w") as fh:
            json.dump(report, fh, indent=2, default=str)
    # short summary last
    k = report.get("kernels", {})
    mini = report.get("mini", {})
    log("\n== K3-mini GPU check summary ==")
    for name in ("torch_chunked_vs_recurrent", "fla_chunk_kda_vs_recurrent", "fla_fused_recurrent_step_vs_torch"):
        if name in k:
            log(f"{name:36s} o max_abs {k[name]['o']['max_abs']:.2e}  S max_abs {k[name]['S']['max_abs']:.2e}")
    sm = report.get("small_model", {})
    if "std_vs_oracle_top1_agree" in sm:
        log(f"small model std vs oracle: top1 {sm['std_vs_oracle_top1_agree']:.3f}  KL {sm['kl_oracle_std']:.2e}  "
            f"graph vs eager max_abs {sm['graph_vs_eager']['max_abs']:.2e}")
    if "prefill_32k_s" in mini:
        log(f"mini: {mini['params'] / 1e9:.2f} B params, build {mini['build_s']:.1f}s, moe grouped vs loop "
            f"rel {mini['moe_grouped_vs_loop']['rel_l2']:.1e}, 32k prefill {mini['prefill_32k_s']:.2f}s "
            f"({mini['prefill_32k_tok_per_s']:.0f} tok/s, peak {mini['prefill_peak_GB']:.1f} GB), decode finite "
            f"{mini['decode_after_32k_finite']}")
    for name in ("kernels", "small_model", "mini", "decode_bench"):
        if isinstance(report.get(name), dict) and "error" in report[name]:
            log(f"ERROR in {name}: {report[name]['error']}")
    if isinstance(report.get("decode_bench"), dict) and "rows" in report["decode_bench"]:
        log(format_table(report["decode_bench"]))
    log(f"total {report['total_s']:.1f}s")
    return 0 if not any(isinstance(report.get(n), dict) and "error" in report[n]
                        for n in ("kernels", "small_model", "mini", "decode_bench")) else 1


if __name__ == "__main__":
    sys.exit(main())
