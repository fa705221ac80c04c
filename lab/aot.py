"""CPU pre-flight of the fast step: every distinct Triton launch compiled ahead of time for sm_90.

    python3 -m lab.aot [--config mini] [--batches 1,2,4,8,16,32,64] [--verify 1x3,...,8x7]
        [--device 'NVIDIA H100 80GB HBM3']

Runs the fast decoder of the real config on "meta" tensors with every Triton launch intercepted
(decode steps at ``--batches``; verify steps and their commit at ``--verify`` BATCHxDRAFT, by
default the spec's draft scope; the H200's tuning table, or the one ``--device`` reads), then
compiles each distinct launch for sm_90 (Triton + ptxas) and reports compile errors and
shared-memory use over the H200's 227 KB. Catches what the interpreter cannot; no GPU needed.
``record_launches`` and ``compile_launch`` also serve lab/ptx_diff.py.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from fastpath.measure import stopwatch_log

log = stopwatch_log()

H200 = "NVIDIA H200"  # the device whose tuning table the step reads unless told otherwise
_TT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "i32",
       torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}


def _meta_model(config: str):
    """A K3Model of ``config`` whose weights are meta tensors (shapes only, no memory)."""
    from optimized_model.k3.config import get_config
    from optimized_model.k3.model import K3Model
    from optimized_model.k3.weights import init_weights

    cfg = get_config(config)
    return K3Model(cfg, init_weights(cfg, device="meta", dtype=torch.bfloat16))


def record_launches(config: str, batches: list[int], context: int = 1024,
                    verify: list[tuple[int, int]] = (), device: str = H200) -> list[tuple]:
    """Every distinct Triton launch of the fast step of ``config`` at ``batches`` (and of the
    verify step and its commit at each (batch, draft) of ``verify``), recorded on the CPU (meta
    tensors; the tuning table ``device`` reads, e.g. an H100 the ``default`` one; nothing runs):
    a list of (JIT function, signature, constexprs, launch options, 16-divisible argument
    indices), sorted by name."""
    from triton.runtime.jit import JITFunction

    from optimized_model.k3.fast import tuning
    from optimized_model.k3.fast.runtime import FastDecoder
    from optimized_model.k3.state import new_state

    calls: dict = {}
    real_run = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        names = self.arg_names
        bound = dict(zip(names, args))
        bound.update({k: v for k, v in kwargs.items() if k in names})
        opts = {k: v for k, v in kwargs.items() if k not in names}
        sig, consts, div = {}, {}, []
        for i, p in enumerate(self.params):
            v = bound.get(p.name, p.default)
            if p.is_constexpr:
                sig[p.name], consts[p.name] = "constexpr", v
            elif isinstance(v, torch.Tensor):
                sig[p.name] = "*" + _TT[v.dtype]
                # like the JIT's specialisation: 16-byte aligned pointers (meta tensors: the
                # allocator's alignment; views at an offset keep it only if the offset does)
                if (v.storage_offset() * v.element_size()) % 16 == 0 and i not in self.do_not_specialize:
                    div.append(i)
            elif isinstance(v, bool):
                sig[p.name] = "i1"
            elif isinstance(v, int):
                sig[p.name] = "i64" if abs(v) >= 2 ** 31 else "i32"
                if v % 16 == 0 and i not in self.do_not_specialize:
                    div.append(i)  # ints divisible by 16 are specialised too (strides, sizes)
            elif isinstance(v, float):
                sig[p.name] = "fp32"
            else:
                sig[p.name] = "constexpr"
                consts[p.name] = v
        key = (self.fn.__name__, tuple(sorted(sig.items())), tuple(sorted(consts.items())),
               tuple(sorted(opts.items())), tuple(div))
        calls.setdefault(key, (self, sig, consts, opts, div))

    JITFunction.run = record
    orig_dev = tuning.device_name
    tuning.device_name = lambda _=None: device
    try:
        model = _meta_model(config)
        fd = FastDecoder(model, None)
        for B in batches:
            st = new_state(model.cfg, B, context + 64, device="meta", dtype=torch.bfloat16)
            fd.step_for(B)(st)
        for B, draft in verify:
            T = draft + 1
            st = new_state(model.cfg, B, context + 64, device="meta", dtype=torch.bfloat16)
            step = fd.step_for(B, T, verify=True)
            step(st)
            step.trail.commit(st, torch.full((B,), T, dtype=torch.int64, device="meta"))
    finally:
        JITFunction.run = real_run
        tuning.device_name = orig_dev
    return [calls[k] for k in sorted(calls, key=lambda k: k[0])]


def verify_shapes(text: str) -> list[tuple[int, int]]:
    """``--verify 1x3,16x3,8x7`` -> [(1, 3), (16, 3), (8, 7)]: (batch, draft) of verify steps."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        b, sep, d = item.partition("x")
        if not sep or not b.isdigit() or not d.isdigit() or int(d) < 1:
            raise SystemExit(f"--verify {item!r}: expected BATCHxDRAFT with DRAFT >= 1, e.g. 1x3,8x7")
        out.append((int(b), int(d)))
    return out


def compile_launch(fn, sig: dict, consts: dict, opts: dict, div: list, capability: int = 90):
    """Compile one recorded launch for the GPU ``capability`` (no GPU needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    options = {k: v for k, v in opts.items() if k in ("num_warps", "num_stages", "launch_pdl")}
    # the divisibility hints matter: without them Triton cannot use cp.async, does not
    # pipeline the loads and reports far less shared memory than the GPU run will need
    attrs = {(i,): [["tt.divisibility", 16]] for i in div}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                          target=GPUTarget("cuda", capability, 32), options=options)


# the spec's verify scope: drafts 3 and 7 at batch x (draft + 1) <= 64 rows
VERIFY_SCOPE = "1x3,2x3,4x3,8x3,16x3,1x7,2x7,4x7,8x7"


def aot_check(config: str, batches: list[int], context: int = 1024,
              verify: list[tuple[int, int]] = (), device: str = H200) -> int:
    """Run in a fresh process without TRITON_INTERPRET (kernels must be real JIT functions)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("aot: unset TRITON_INTERPRET (the kernels must be compiled, not interpreted)")
        return 2
    calls = record_launches(config, batches, context, verify, device)
    bad = 0
    log(f"{len(calls)} distinct Triton launches for {config} at batches {batches}, verify {list(verify)} "
        f"({device}'s table); compiling for sm_90")
    for fn, sig, consts, opts, div in calls:
        label = f"{fn.__name__} " + ",".join(f"{k}={v}" for k, v in consts.items() if k.isupper()) + f" {opts}"
        try:
            smem = compile_launch(fn, sig, consts, opts, div).metadata.shared
            flag = "OK  " if smem <= 227 * 1024 else "SMEM"
            bad += flag != "OK  "
            print(f"{flag} {smem:>7d} B smem  {label}")
        except Exception as exc:
            bad += 1
            print(f"FAIL {label}\n     {type(exc).__name__}: {str(exc)[-800:]}")
    print(f"aot: {len(calls)} launches, {bad} problems")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="mini")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--verify", default=VERIFY_SCOPE, help="verify steps BATCHxDRAFT,... ('' for none)")
    ap.add_argument("--device", default=H200, help="the GPU name whose tuning table the step reads "
                    "(e.g. 'NVIDIA H100 80GB HBM3': the default table)")
    a = ap.parse_args(argv)
    return aot_check(a.config, [int(b) for b in a.batches.split(",")], verify=verify_shapes(a.verify),
                     device=a.device)


if __name__ == "__main__":
    sys.exit(main())
