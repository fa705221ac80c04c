"""torchrun entry point: K3-mini over TP (x DCP) ranks against the single-rank model.

    torchrun --standalone --nproc-per-node 2 -m optimized_model.k3.parallel_check --dcp 2
    torchrun --standalone --nproc-per-node 4 -m optimized_model.k3.parallel_check \\
        --set kda_heads=4 --set kda_head_dim=16 --set mla_heads=4

TP size = the world size torchrun starts; the backend is NCCL when the ranks have GPUs, gloo
otherwise. Every rank prefills ragged random prompts and decodes ``--steps`` tokens on its
shard of the seeded full weights; the single-rank model runs the same inputs on each rank, and
each rank prints one JSON line (rank, tp, dcp, max_abs_err, ok). Exit status 1 when any rank's
logits differ beyond ``--atol`` (or differ between ranks).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

from .config import get_config
from .model import K3Model
from .parallel import K3ParallelModel, Layout
from .weights import init_weights


def generate_logits(model, prompts: torch.Tensor, lengths: torch.Tensor, steps: torch.Tensor,
                    capacity: int):
    """Prefill logits then one decode step per row of ``steps``: ([1 + len(steps), B, vocab],
    the final decode state)."""
    state = model.new_state(prompts.shape[0], capacity)
    out = [model.prefill(prompts, lengths, state)]
    out += [model.decode(t.to(model.device), state) for t in steps]
    return torch.stack(out), state


def random_inputs(lengths: list[int], n_steps: int, seed: int = 11):
    """Ragged right-padded prompts [B, max(lengths)], their lengths, decode tokens [n_steps, B]."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 256, (len(lengths), max(lengths)), generator=g)
    return prompts, torch.tensor(lengths), torch.randint(0, 256, (n_steps, len(lengths)), generator=g)


def _overrides(pairs: list[str]) -> dict[str, int | float]:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep:
            raise SystemExit(f"--set {p!r}: write KEY=VALUE, e.g. --set kda_heads=4")
        out[key] = float(value) if "." in value else int(value)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    ap.add_argument("--dcp", type=int, default=1)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--lengths", default="9,1", help="prompt lengths, comma-separated")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--capacity", type=int, default=16)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--atol", type=float, default=1e-4, help="max |logit difference| (fp32: 1e-4)")
    a = ap.parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("not started by torchrun (RANK unset); run: torchrun --standalone "
                         "--nproc-per-node N -m optimized_model.k3.parallel_check")
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if on_gpu else "gloo", timeout=datetime.timedelta(seconds=120))
    try:
        cfg = get_config(a.config, **_overrides(a.set))
        full = init_weights(cfg, device=device, dtype=getattr(torch, a.dtype), seed=a.seed)
        inputs = random_inputs([int(n) for n in a.lengths.split(",")], a.steps)
        inputs = tuple(t.to(device) for t in inputs)
        got, _ = generate_logits(K3ParallelModel(cfg, full, Layout.from_world(a.dcp)), *inputs, a.capacity)
        want, _ = generate_logits(K3Model(cfg, full), *inputs, a.capacity)
        first = got.clone()
        dist.broadcast(first, 0)
        n = cfg.n_real_tokens
        err = float((got[..., :n] - want[..., :n]).abs().max())
        ok = err <= a.atol and bool(torch.equal(got, first))
        line = json.dumps({"rank": dist.get_rank(), "tp": dist.get_world_size(), "dcp": a.dcp, "dtype": a.dtype,
                           "max_abs_err": err, "same_as_rank0": bool(torch.equal(got, first)), "ok": ok})
        # one write(2) per line: the ranks share the launcher's pipe, and print() may write the
        # text and its newline separately, so two ranks' lines could land on one (seen in CI)
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), (line + "\n").encode())
        flags = torch.tensor([0 if ok else 1], device=device)
        dist.all_reduce(flags)  # every rank exits with the group's verdict
        return int(flags.item() > 0)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
