"""Does the fast step launch the same Triton kernels, in the same order, with the same arguments
as at another commit? (CPU only.)

    python3 -m lab.launch_log [--rev REV] [--config mini] [--batches 1,16,64] [--verify 1x3,8x7,16x3]
        [--device 'NVIDIA H100 80GB HBM3']

Runs the fast decode steps at ``--batches`` and the verify steps and their commit at ``--verify``
(BATCHxDRAFT) on "meta" tensors (the H200's tuning table, or the one ``--device`` reads) and logs
every Triton launch in order: the kernel's name, its grid and each argument (a tensor as its
shape, strides, storage offset, dtype and storage size; anything else by value). Prints the
count and a digest of the log. ``--rev``: the same log of REV's tree (a temporary git worktree,
this file run there), compared entry by entry; the first difference is printed; exit 1 when
they differ.

``lab.ptx_diff`` says each launch compiles to the same code; this says the host code launches
them the same way. Both equal: a refactor of the step changes nothing the GPU runs, so GPU figures
measured at REV still describe it. This file imports nothing from ``lab`` (it runs in REV's tree).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

H200 = "NVIDIA H200"


def _arg(value) -> object:
    import torch

    if isinstance(value, torch.Tensor):
        return ["tensor", list(value.shape), list(value.stride()), value.storage_offset(), str(value.dtype),
                value.untyped_storage().nbytes()]
    return repr(value)


def launch_log(config: str, batches: list[int], verify: list[tuple[int, int]], device: str) -> list[list]:
    """[[kernel name, grid, [argument, ...]], ...] of the steps, in launch order (nothing runs)."""
    import torch
    from triton.runtime.jit import JITFunction

    from optimized_model.k3.config import get_config
    from optimized_model.k3.fast import tuning
    from optimized_model.k3.fast.runtime import FastDecoder
    from optimized_model.k3.model import K3Model
    from optimized_model.k3.state import new_state
    from optimized_model.k3.weights import init_weights

    log: list[list] = []

    def record(self, *args, grid, warmup, **kwargs):
        log.append([self.fn.__name__, repr(grid), [_arg(a) for a in args] + [[k, _arg(kwargs[k])] for k in sorted(kwargs)]])

    real_run, real_device = JITFunction.run, tuning.device_name
    JITFunction.run = record
    tuning.device_name = lambda _=None: device
    try:
        cfg = get_config(config)
        decoder = FastDecoder(K3Model(cfg, init_weights(cfg, device="meta", dtype=torch.bfloat16)), None)
        for B in batches:
            decoder.step_for(B)(new_state(cfg, B, 1088, device="meta", dtype=torch.bfloat16))
        for B, draft in verify:
            state = new_state(cfg, B, 1088, device="meta", dtype=torch.bfloat16)
            step = decoder.step_for(B, draft + 1, verify=True)
            step(state)
            step.trail.commit(state, torch.full((B,), draft + 1, dtype=torch.int64, device="meta"))
    finally:
        JITFunction.run, tuning.device_name = real_run, real_device
    return log


def digest(log: list[list]) -> str:
    return hashlib.sha256(json.dumps(log).encode()).hexdigest()[:16]


def first_difference(a: list[list], b: list[list]) -> str | None:
    """None when the logs are equal, else where and how they part."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"launch {i}: {x[0]} {x[1]} here, {y[0]} {y[1]} at REV" + (
                "" if x[:2] != y[:2] else f" (arguments differ: {[j for j, (u, v) in enumerate(zip(x[2], y[2])) if u != v]})")
    if len(a) != len(b):
        return f"{len(a)} launches here, {len(b)} at REV"
    return None


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", help="git revision to compare with")
    ap.add_argument("--config", default="mini")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--verify", default="1x3,8x7,16x3", help="verify steps BATCHxDRAFT,... ('' for none)")
    ap.add_argument("--device", default=H200, help="the GPU name whose tuning table the step reads")
    ap.add_argument("--json", help=argparse.SUPPRESS)  # where a run in REV's tree writes its log
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = _parse(argv)
    try:
        verify = [(int(b), int(d)) for b, d in (s.split("x") for s in a.verify.split(",") if s)]
    except ValueError:
        raise SystemExit(f"launch_log: --verify {a.verify!r}: expected BATCHxDRAFT,..., e.g. 1x3,8x7") from None
    log = launch_log(a.config, [int(b) for b in a.batches.split(",") if b], verify, a.device)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(log, fh)
        return 0
    print(f"launch_log: {len(log)} launches, digest {digest(log)} ({a.config}, batches {a.batches}, "
          f"verify {a.verify or 'none'}, {a.device}'s table)")
    if not a.rev:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        tree, out = os.path.join(tmp, "tree"), os.path.join(tmp, "log.json")
        made = subprocess.run(["git", "worktree", "add", "--detach", "-q", tree, a.rev], capture_output=True, text=True)
        if made.returncode:
            raise SystemExit(f"launch_log: cannot check out {a.rev!r} in a worktree: {made.stderr.strip()}")
        try:
            env = dict(os.environ, PYTHONPATH=tree)
            args = [sys.executable, os.path.abspath(__file__), "--config", a.config, "--batches", a.batches,
                    "--verify", a.verify, "--device", a.device, "--json", out]
            r = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"launch_log: the log of {a.rev} failed: {r.stderr.strip()[-1500:]}")
            with open(out) as fh:
                then = json.load(fh)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], check=False)
    diff = first_difference(log, then)
    print(f"launch_log against {a.rev}: {len(then)} launches, digest {digest(then)}: "
          + ("identical" if diff is None else f"DIFFERS, {diff}"))
    return 0 if diff is None else 1


if __name__ == "__main__":
    sys.exit(main())
