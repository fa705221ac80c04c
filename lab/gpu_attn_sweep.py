"""Sweep the attention decode kernels' configurations at K3-mini's shapes (GPU only).

    python3 -m lab.gpu_attn_sweep [--batches 1,8,32,64] [--contexts 1024,32768]
                                      [--kda-baseline PATH] [--budget 200]

MLA decode (32 heads, latent 512): the split kernel's two layouts (heads or positions as the
MMA's M dimension), tile lengths, warps, stages and split counts, per batch and context.
KDA decode (32 heads, 128 x 128 fp32 state): V-tile widths; ``--kda-baseline`` names a copy of
another kda_decode.py (e.g. a candidate change) to time beside the current one. Each config is timed with
fastpath.measure.graph_time (20 calls in one CUDA graph, median of 3 replays) and checked against
the current default config's output (max |diff|). Prints µs and effective TB/s (bytes that must
move: latent cache / state read + written); writes $OUT/attn_sweep.json. The data for the
tuning table; nothing here changes it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from fastpath.measure import graph_time, stopwatch_log
from lab.sweep_util import load_module
from optimized_model.k3.fast.kernels import kda_decode as KDA
from optimized_model.k3.fast.kernels import mla_decode as MLA

MLA_CONFIGS = [
    ("head16_bt32", dict(layout="head_major", block_h=16)),
    ("head32_bt32", dict(layout="head_major", block_h=32)),
    ("head32_bt64", dict(layout="head_major", block_h=32, block_t=64)),
    ("head32_bt32_st3", dict(layout="head_major", block_h=32, num_stages=3)),
    ("kv_bt64_w4", dict(layout="kv_major", block_h=32, block_t=64, num_warps=4)),
    ("kv_bt64_w4_st3", dict(layout="kv_major", block_h=32, block_t=64, num_warps=4, num_stages=3)),
    ("kv_bt64_w8", dict(layout="kv_major", block_h=32, block_t=64, num_warps=8)),
    ("kv_bt128_w8", dict(layout="kv_major", block_h=32, block_t=128, num_warps=8)),
    ("kv_bt128_w8_st3", dict(layout="kv_major", block_h=32, block_t=128, num_warps=8, num_stages=3)),
    ("kv_bt128_w4", dict(layout="kv_major", block_h=32, block_t=128, num_warps=4)),
]
KDA_CONFIGS = [("auto", {}), ("bv16", dict(block_v=16)), ("bv32", dict(block_v=32)),
               ("bv64", dict(block_v=64)), ("bv128", dict(block_v=128))]


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def sweep_mla(batches, contexts, deadline, log) -> list[dict]:
    rows = []
    H, D = 32, 512
    for T in contexts:
        for B in batches:
            if time.time() > deadline:
                log(f"skip mla B={B} T={T}: time budget")
                continue
            inp = MLA.make_inputs(dict(batch=B, context=T, heads=H, latent=D), "normal",
                                  torch.bfloat16, "cuda")
            base = dict(q=inp["q"], cache=inp["cache"], lengths=inp["lengths"],
                        scale=inp["scale"], max_len=T)
            ref = MLA.mla_decode(**base)
            nbytes = B * T * D * 2
            auto_ns = MLA.choose_splits(B, 1, T, MLA._sm_count(inp["q"].device))
            configs = list(MLA_CONFIGS) + [
                ("kv_bt64_w4_2xsplit", dict(layout="kv_major", block_h=32, block_t=64, num_warps=4,
                                            num_splits=min(2 * auto_ns, 256)))]
            for name, cfg in configs:
                out = torch.empty_like(ref)
                fn = lambda: MLA.mla_decode(**base, out=out, **cfg)  # noqa: E731
                try:
                    us = graph_time(fn) * 1e6
                except Exception as exc:  # a config that does not compile: record, go on
                    log(f"mla B={B:3d} T={T:6d} {name:20s} FAILED {type(exc).__name__}: {str(exc)[:160]}")
                    continue
                err = _maxdiff(out, ref)
                rows.append(dict(kernel="mla", batch=B, context=T, config=name, us=us,
                                 tbps=nbytes / us / 1e6, maxdiff=err))
                log(f"mla B={B:3d} T={T:6d} {name:20s} {us:9.1f} us {nbytes / us / 1e6:5.2f} TB/s  diff {err:.2e}")
            del inp, base, ref
            torch.cuda.empty_cache()
    return rows


def sweep_kda(batches, baseline, deadline, log) -> list[dict]:
    rows = []
    H, K, V = 32, 128, 128
    for B in batches:
        if time.time() > deadline:
            log(f"skip kda B={B}: time budget")
            continue
        inp = KDA.make_inputs(dict(batch=B, heads=H, head_k=K, head_v=V), "normal", torch.bfloat16, "cuda")
        ref = KDA.fast(**inp)[0]
        nbytes = 2 * B * H * K * V * 4  # fp32 state read + written
        mods = [("", KDA)] + ([("old_", baseline)] if baseline else [])
        for prefix, mod in mods:
            for name, cfg in KDA_CONFIGS:
                args = dict(inp)
                for key in KDA._STATE_KEYS:
                    args[key] = inp[key].clone()
                check = mod.fast(**{**inp, **cfg})[0]
                pos = [args.pop(n) for n in KDA.POSITIONAL]
                out = torch.empty_like(ref)
                fn = lambda: mod.kda_decode(*pos, **args, **cfg, out=out)  # noqa: E731
                us = graph_time(fn) * 1e6
                err = _maxdiff(check, ref)
                rows.append(dict(kernel="kda", batch=B, config=prefix + name, us=us,
                                 tbps=nbytes / us / 1e6, maxdiff=err))
                log(f"kda B={B:3d} {prefix + name:14s} {us:8.1f} us {nbytes / us / 1e6:5.2f} TB/s  diff {err:.2e}")
        del inp
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--contexts", default="1024,32768")
    ap.add_argument("--kda-baseline", default="")
    ap.add_argument("--budget", type=float, default=200.0)
    args = ap.parse_args()
    t0 = time.time()
    log = stopwatch_log()
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]

    baseline = load_module(args.kda_baseline, "kda_decode_baseline") if args.kda_baseline else None
    rows = sweep_kda(batches, baseline, t0 + args.budget * 0.3, log)
    rows += sweep_mla(batches, contexts, t0 + args.budget, log)
    out_dir = os.environ.get("OUT", ".")
    with open(os.path.join(out_dir, "attn_sweep.json"), "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), fh, indent=1)
    log(f"wrote {os.path.join(out_dir, 'attn_sweep.json')}")


if __name__ == "__main__":
    main()
