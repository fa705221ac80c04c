"""Fill the compile caches of the full tier's perf phase on a fresh H200, in an earlier command, so
the phase itself fits its ``[perf] budget_s`` (cases reached after it are error rows).

    python3 -m lab.perf_warm --seconds 300 [--spec optimized_model/k3/fastpath.toml] [--out /tmp/perf-warm]
    bash lab/gpu_steps.sh "warm:330:python3 -m lab.perf_warm --seconds 300"     # on the H200

Writes the spec with ``[perf]``'s timing cut to the least the schema allows (10 rounds of one
replay, no warm-up, no pilot rounds, no extra batches, no budget) to ``.perf-warm.toml`` at the
repository root, outside every attested glob (a resumed run checks the attested tree), and runs
``fastpath verify --tier full --only perf`` on it in a throwaway directory. Every case is built as
in the real phase: the fast path's Triton kernels land in Triton's cache (``~/.triton/cache``), the
standard steps' ``torch.compile`` graphs in Inductor's FX-graph cache, both on disk, and the real
phase then builds from them. What it measures is thrown away: never a bundle. After
``--seconds`` it stops verify (SIGTERM, which verify takes like Ctrl-C; then SIGKILL to what is
left of its process group) and keeps what is cached: no process of it may outlive the command
and share the GPU with the timed phase.

Why: run Z's perf phase took 457 s, 271 s of it building (compiles, captures), on a machine whose
Triton cache the first phase had filled; the spec has 10 cases more since, and a perf phase on a
fresh machine (the first phase's run carried from an earlier one) also compiles the fast path.
Not yet run on the H200: the first use should record both phases' times in docs/perf-notes.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

# [perf] keys and the cheapest values the schema accepts (fastpath/spec.py SCHEMA)
CHEAPEST = {"rounds": 10, "replays": 1, "warmup": 0, "eager_rounds": 0, "max_extra_batches": 0,
            "n_resamples": 100, "budget_s": 0}
WARM_SPEC = ".perf-warm.toml"


def warm_spec_text(text: str) -> str:
    """``text`` (a spec) with the [perf] table's timing keys set to CHEAPEST, added where absent."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.strip() == "[perf]"), None)
    if start is None:
        raise SystemExit("perf_warm: the spec has no [perf] table; the perf suite runs with defaults, nothing to cut")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    seen = set()
    for i in range(start + 1, end):
        m = re.match(r"(\s*)(\w+)(\s*=\s*)[^#\n]*?(\s*(#.*)?)$", lines[i].rstrip("\n"))
        if m and m.group(2) in CHEAPEST:
            key = m.group(2)
            lines[i] = f"{m.group(1)}{key}{m.group(3)}{CHEAPEST[key]}{m.group(4)}\n"
            seen.add(key)
    lines[start + 1:start + 1] = [f"{k} = {v}\n" for k, v in CHEAPEST.items() if k not in seen]
    out = "".join(lines)
    perf = tomllib.loads(out)["perf"]  # a broken rewrite fails here, not on the H200
    assert all(perf[k] == v for k, v in CHEAPEST.items()), perf
    return out


def run_for(cmd: list[str], seconds: float, grace: float = 20.0) -> int:
    """Run ``cmd`` in its own process group for at most ``seconds``; then stop it. Either way no
    member of the group is left running: nothing of the warm-up may share the GPU with the timed
    phase that follows."""
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        rc = proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        print(f"perf_warm: {seconds:.0f} s reached, stopping verify", flush=True)
        # SIGTERM, not SIGINT: verify stops on it like Ctrl-C and stops its workers; SIGINT is
        # ignored by whatever a non-interactive shell started in the background (seen in CI)
        proc.terminate()
        try:
            rc = proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            rc = None
    except BaseException:  # our own interruption
        _signal_group(proc.pid, signal.SIGKILL)
        raise
    _signal_group(proc.pid, signal.SIGKILL)  # whatever is left of the group (a stray worker)
    return proc.wait() if rc is None else rc


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group is gone already
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, required=True, help="stop verify after this long")
    ap.add_argument("--spec", default="optimized_model/k3/fastpath.toml")
    ap.add_argument("--out", default="/tmp/perf-warm", help="throwaway run directory (replaced)")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # timeout(1)'s signal: stop verify too
    Path(WARM_SPEC).write_text(warm_spec_text(Path(a.spec).read_text()))
    shutil.rmtree(a.out, ignore_errors=True)
    cmd = ["fastpath", "verify", WARM_SPEC, "--tier", "full", "--only", "perf", "--out", a.out]
    print("perf_warm:", " ".join(cmd), flush=True)
    rc = run_for(cmd, a.seconds)
    # whatever verify's exit (a failed gate, incomplete, stopped): the caches hold what it built
    print(f"perf_warm: verify exited {rc}; the caches hold what it built", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
