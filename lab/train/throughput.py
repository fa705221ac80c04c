"""CPU micro-benchmark behind the H200 training-throughput estimate (docs/k3-mini.md).

    python3 -m lab.train.throughput [--config trained] [--lengths 512,1024]

Runs one training step (forward + backward, fp32, the torch KDA) of one row per length and
counts, per token: matmul FLOPs (torch's FlopCounterMode), bytes written by every op (a
dispatch-mode tally; reads are about as many again) and ops executed. The FLOPs split into a
part per token and a part that grows with the row length (attention): two lengths separate them.
The H200 estimate = FLOPs / (790 TFLOP/s x efficiency) + 2 x bytes / (4.3 TB/s x efficiency),
the H200 facts of docs/perf-notes.md and the device notes; the efficiencies are assumptions the
output states (small matmuls and elementwise kernels at hidden 256 are far from peak).
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

PEAK_FLOPS, HBM_BYTES_S = 790e12, 4.3e12


class _Tally(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops, self.bytes = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                self.bytes += t.numel() * t.element_size()
        return out


def _kda_core_outside(q, k, v, g, beta, *a, **kw):
    """Stand-in for the chunked KDA core with its inputs' and output's traffic only: on the GPU
    fla's chunk_kda keeps its [chunk, chunk, K] decay tiles on chip, where the CPU form writes them."""
    o = (q * g.exp() + k * beta.unsqueeze(-1)) * v
    return o, o.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])


def measure(config: str, T: int) -> dict:
    from lab.train.trainable import TrainableK3
    from optimized_model.k3 import model as model_mod
    from optimized_model.k3.config import get_config

    m = TrainableK3.create(get_config(config), device="cpu", compute_dtype=torch.float32, moe_backend="loop")
    tokens = torch.randint(0, 256, (1, T))
    flops = FlopCounterMode(display=False)
    tally = _Tally()
    with flops:
        loss, _ = m.loss(tokens, torch.tensor([T]), torch.ones(1, T))
        loss.backward()
    real = model_mod.kda_chunked
    model_mod.kda_chunked = _kda_core_outside
    try:
        with tally:
            loss, _ = m.loss(tokens, torch.tensor([T]), torch.ones(1, T))
            loss.backward()
    finally:
        model_mod.kda_chunked = real
    cfg = m.cfg
    # causal attention of the MLA layers, forward + backward (~3.5 x the forward's 2 matmuls):
    # FlopCounterMode does not see the CPU's fused attention kernel
    attn = 3.5 * T * cfg.mla_heads * (cfg.qk_nope + cfg.v_head) * cfg.n_mla
    return {"T": T, "flops_per_token": flops.get_total_flops() / T + attn,
            "bytes_written_per_token_outside_kda_core": tally.bytes / T, "ops_outside_kda_core": tally.ops}


def estimate(rows: list[dict], row_len: int, flop_eff: float = 0.25, bw_eff: float = 0.5) -> dict:
    (a, b) = rows[0], rows[-1]
    per_len = (b["flops_per_token"] - a["flops_per_token"]) / (b["T"] - a["T"])  # attention: grows with T
    base = a["flops_per_token"] - per_len * a["T"]
    flops = base + per_len * row_len
    # read ~ written; the GPU keeps most activations in bf16 (about 0.6 x the CPU's fp32 bytes)
    byts = 2 * 0.6 * b["bytes_written_per_token_outside_kda_core"]
    s_per_tok = flops / (PEAK_FLOPS * flop_eff) + byts / (HBM_BYTES_S * bw_eff)
    return {"row_len": row_len, "flops_per_token": flops, "bytes_per_token": byts,
            "tokens_per_s": 1 / s_per_tok, "tokens_in_900_s": 900 / s_per_tok,
            "assumed": {"flop_efficiency": flop_eff, "bandwidth_efficiency": bw_eff}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="trained")
    ap.add_argument("--lengths", default="512,1024")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(args.config, int(t)) for t in args.lengths.split(",")]
    print(json.dumps({"measured": rows,
                      "h200_estimate": [estimate(rows, L) for L in (2048, 4096, 8192, 16384)]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
