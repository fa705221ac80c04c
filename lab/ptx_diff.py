"""Do the fast step's kernels compile to the same code as at another commit? (CPU only.)

    python3 -m lab.ptx_diff --rev 74ed216 [--batches 1,2,4,8,16,32,64] [--verify 1x3,...,8x7] [--config mini]
        [--device 'NVIDIA H100 80GB HBM3']
    python3 -m lab.ptx_diff --pdl [--batches 1] [--verify ''] [--config tiny]

Records every distinct Triton launch of the fast step on the CPU (``lab.aot.record_launches``:
meta tensors, the H200's tuning table or ``--device``'s; decode steps at ``--batches``, verify
steps and their commit at ``--verify``, by default the spec's draft scope), compiles each for
sm_90 with the kernel of this tree and with the same-named kernel of ``--rev`` (the whole kernels
package as it was at ``--rev``, read with ``git show``, so a helper a kernel takes from another
kernel module is REV's too), and compares the PTX code (comments, line info and debug sections
aside: they name the file). A launch whose kernel or constexpr is new in this tree (e.g. ``PDL=True`` before PDL
existed) is listed as new.

Identical PTX means a GPU figure measured at ``--rev`` still describes that launch: a refactor,
or a code path kept for one configuration only, needs no new device time for it. Exit 1 when any
launch differs.

``--pdl``: for every launch the step makes with programmatic dependent launch (``PDL=True``),
compile it also with ``PDL=False`` and compare the instructions each build executes, counted
by opcode (``griddepcontrol`` aside): PDL may move a load, never change the arithmetic — a
kernel whose two builds compute differently makes the step's numbers depend on the launch
mode (KDA decode did, from f4971e2 to 678e8db: perf notes, run L). Exit 1 when any differ.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import re
import os
import subprocess
import sys
import tempfile

KERNELS_DIR = "optimized_model/k3/fast/kernels"
# REV's kernels package, imported beside the live one (its ``from ...weights`` imports resolve
# to optimized_model.k3 as the live package's do; ``from . import`` to REV's own modules)
REV_PACKAGE = "optimized_model.k3.fast._kernels_at_rev"


_DEBUG_LABEL = re.compile(r"\s*\$L__tmp\d+:\s*$")


def ptx_code(ptx: str) -> list[str]:
    """The code of a PTX module: no comments, line info, debug sections or the ``$L__tmpN:``
    labels that only the debug sections refer to (an inlined @triton.jit helper adds one)."""
    code = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    return [ln for ln in code.splitlines() if not ln.startswith("//") and ".loc" not in ln
            and ".file" not in ln and not _DEBUG_LABEL.match(ln)]


def opcodes(ptx: str) -> collections.Counter:
    """How many times each opcode occurs in a PTX module's code (``griddepcontrol`` aside)."""
    count: collections.Counter = collections.Counter()
    for ln in ptx_code(ptx):
        m = re.match(r"\s*(?:@!?%\w+\s+)?([a-z][\w.]*)", ln)
        if m and not m.group(1).startswith("griddepcontrol"):
            count[m.group(1)] += 1
    return count


def pdl_check(calls, compile_launch) -> int:
    """Compare each PDL launch's opcode counts with its non-PDL build; the number that differ."""
    bad = n = 0
    for fn, sig, consts, opts, div in calls:
        if not consts.get("PDL"):
            continue
        n += 1
        plain = {k: v for k, v in opts.items() if k != "launch_pdl"}
        with_pdl = opcodes(compile_launch(fn, sig, consts, opts, div).asm["ptx"])
        without = opcodes(compile_launch(fn, sig, dict(consts, PDL=False), plain, div).asm["ptx"])
        diff = {k: (with_pdl[k], without[k]) for k in sorted(set(with_pdl) | set(without)) if with_pdl[k] != without[k]}
        bad += bool(diff)
        label = f"{fn.__name__} " + ",".join(f"{k}={v}" for k, v in consts.items() if k.isupper())
        print(f"{'same' if not diff else 'DIFFERS':8s} {label}" + (f"\n         opcode (PDL, no PDL): {diff}" if diff else ""))
    print(f"ptx_diff --pdl: {n} PDL launches, {bad} compute differently without PDL")
    return bad


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"ptx_diff: git {' '.join(args)}: {exc.stderr.strip()}") from exc


def kernels_at(rev: str, tmp: str) -> dict:
    """{kernel name: JIT function} of every module of the fast kernels package at ``rev``."""
    folder = os.path.join(tmp, "_kernels_at_rev")
    os.makedirs(folder)
    names = [n for n in _git("ls-tree", "--name-only", f"{rev}:{KERNELS_DIR}").split() if n.endswith(".py")]
    for name in names:
        with open(os.path.join(folder, name), "w") as fh:
            fh.write(_git("show", f"{rev}:{KERNELS_DIR}/{name}"))
    import optimized_model.k3.fast  # noqa: F401  (the parent package of REV_PACKAGE)

    spec = importlib.util.spec_from_file_location(REV_PACKAGE, os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    package = importlib.util.module_from_spec(spec)
    sys.modules[REV_PACKAGE] = package
    spec.loader.exec_module(package)
    from triton.runtime.jit import JITFunction

    out = {}
    for name in sorted(names):
        if name == "__init__.py":
            continue
        mod = importlib.import_module(f"{REV_PACKAGE}.{name[:-3]}")
        out.update({n: f for n in dir(mod) if n.endswith("_kernel") and isinstance(f := getattr(mod, n), JITFunction)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", help="git revision to compare with")
    ap.add_argument("--pdl", action="store_true", help="compare each PDL launch with its non-PDL build")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--verify", default=None, help="verify steps BATCHxDRAFT,... ('' for none; "
                    "default: the spec's draft scope with --rev, none with --pdl)")
    ap.add_argument("--config", default="mini")
    ap.add_argument("--device", default=None, help="the GPU name whose tuning table the step reads "
                    "(default the H200's; e.g. 'NVIDIA H100 80GB HBM3': the default table)")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("ptx_diff: unset TRITON_INTERPRET (the kernels must be compiled, not interpreted)")
    if bool(args.rev) == args.pdl:
        raise SystemExit("ptx_diff: give --rev REV or --pdl (one of them)")
    from lab.aot import H200, VERIFY_SCOPE, compile_launch, record_launches, verify_shapes

    verify = verify_shapes(args.verify if args.verify is not None else ("" if args.pdl else VERIFY_SCOPE))
    calls = record_launches(args.config, [int(b) for b in args.batches.split(",")], verify=verify,
                            device=args.device or H200)
    if args.pdl:
        return 1 if pdl_check(calls, compile_launch) else 0
    counts = {"identical": 0, "differs": 0, "new": 0}
    with tempfile.TemporaryDirectory() as tmp:
        old = kernels_at(args.rev, tmp)
        for fn, sig, consts, opts, div in calls:
            label = f"{fn.__name__} " + ",".join(f"{k}={v}" for k, v in consts.items() if k.isupper())
            before = old.get(fn.__name__)
            extra = [k for k in consts if before is None or k not in before.arg_names]
            if before is None or any(consts[k] for k in extra):
                counts["new"] += 1
                print(f"new       {label}")
                continue
            keep = lambda d: {k: v for k, v in d.items() if k in before.arg_names}  # noqa: E731
            old_div = [before.arg_names.index(fn.arg_names[i]) for i in div if fn.arg_names[i] in before.arg_names]
            now = ptx_code(compile_launch(fn, sig, consts, opts, div).asm["ptx"])
            then = ptx_code(compile_launch(before, keep(sig), keep(consts), opts, old_div).asm["ptx"])
            verdict = "identical" if now == then else "differs"
            counts[verdict] += 1
            print(f"{verdict:9s} {label} {opts}")
    print(f"ptx_diff against {args.rev}: {counts['identical']} identical, {counts['differs']} differ, "
          f"{counts['new']} new in this tree ({len(calls)} launches)")
    return 1 if counts["differs"] else 0


if __name__ == "__main__":
    sys.exit(main())
