"""Check moe_align (one program per expert) on the GPU against a Python grouping (GPU only).

    python3 -m lab.gpu_align_check

Batch shapes of the fast path (64 experts, top-8, BLOCK_M 16 / 32 / 1) and a small one, random
and crowded routings, the same buffers reused across calls (as a graph replay does). Prints the
number of groupings that differ (0 expected).
"""

from __future__ import annotations

import sys

import torch

from optimized_model.k3.fast.kernels import moe as M

CASES = [(64, 8, 64, 16), (33, 8, 64, 16), (1, 8, 64, 1), (7, 2, 16, 4), (64, 8, 64, 32)]


def main() -> int:
    bad = 0
    g = torch.Generator().manual_seed(0)
    for B, k, E, bm in CASES:
        al = M.MoeAlign(B, k, E, bm, "cuda")
        for s in range(6):
            if s % 2:  # crowded: every pair on one of three experts
                ids = torch.randint(0, 3, (B, k), generator=g, dtype=torch.int32)
            else:
                ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(B)]).to(torch.int32)
            M.moe_align(ids.cuda(), E, bm, align=al)
            torch.cuda.synchronize()
            want = M.align_reference(ids, E, bm)
            bexp, brows = al.bexp.tolist(), al.brows.tolist()
            tail_ok = all(bexp[b] == -1 and brows[b] == 0 for b in range(len(want), al.max_blocks))
            if M.align_blocks(al) != want or not tail_ok:
                bad += 1
                print(f"MISMATCH batch {B} k {k} experts {E} BLOCK_M {bm} round {s}")
    print(f"align check: {bad} mismatches")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
