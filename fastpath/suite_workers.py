"""Suites side by side: ``fastpath verify --jobs N`` runs up to N suites at once, each in a
worker process of its own (``python -m fastpath.suite_workers RUN_DIR SUITES_DIR SUITE I/N``).

A worker runs one suite exactly as the in-process run does (``verify._run_one_suite``: its own
``pytest.main``, rows, log and completion marker in the run directory) and prints its progress
lines on stdout, which the parent relays; a line ``CASE_DONE`` advances the suite's bar. Why
processes: the CPU tier's work is Triton's interpreter, pure Python, so threads would share one
core; a suite's models and interpreter state stay private to its worker. A long suite
(``LONG_FIRST``) with several cases runs as N shards that share its cases out as they go: each
shard walks the plan's cases in order and runs those it claims first (the plugin's
``--fastpath-claims``, an exclusive file per case), so a shard that drew short cases takes more
and the shards end together, whatever the cases cost (on the H200 the kernels suite's cases take
7-340 s: fixed positions I, I + N, ... once left one shard 514 s of work and another 126 s).
The shards are merged into the suite's rows (in plan order), log and marker when the last one
ends (``RunState.merge_shards``). A case that ran out of GPU memory in a shard (each worker holds
its own models on the one GPU) is given back, with no rows (the plugin's ``--fastpath-oom
defer``); once nothing else runs, the suite's retry (``RETRY``) runs those cases alone, and its
rows join the merge: on the H100 (80 GB), four workers ran 21 coverage cases out of memory.

Timing suites (``EXCLUSIVE``: perf) run alone, after the others: a neighbour would slow their
clock. Ctrl-C or SIGTERM in the parent, or a worker that was interrupted (exit 3), stops every
worker (SIGTERM: each stops like Ctrl-C, leaving no marker), and the run is incomplete. A worker
that dies without writing its marker gets an error row naming its exit code.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from fastpath.run_state import RETRY

CASE_DONE = "\x1efastpath-case-done"
EXCLUSIVE = ("perf",)
# started first and split into shards, so the short suites fill the gaps at the end instead of
# one long suite running alone: evals first (one session, never split), then the longest (H200:
# kernels 530 s, coverage 251 s, parity 51 s in run T, features 161 s with drafts in run V; CPU
# smoke: kernels 59 s, parity 42 s, features 41 s, coverage 10 s)
LONG_FIRST = ("evals", "kernels", "features", "coverage", "parity")
# never sharded: every case reads one session-wide computation (evals: the four lm-eval runs),
# which each shard would repeat whole (and load every model again)
ONE_SESSION = ("evals",)
WORKER_INTERRUPTED = 3
STOP_GRACE_S = 60.0


def waves(todo: list[str]) -> list[list[str]]:
    """The suites that may share the machine (the long ones first, then plan order), then each
    timing suite alone, in plan order."""
    shared = sorted((s for s in todo if s not in EXCLUSIVE),
                    key=lambda s: LONG_FIRST.index(s) if s in LONG_FIRST else len(LONG_FIRST))
    return ([shared] if shared else []) + [[s] for s in todo if s in EXCLUSIVE]


def units(wave: list[str], jobs: int, cases: dict[str, int]) -> list[tuple[str, tuple[int, int]]]:
    """(suite, shard) to run, in order: a long suite with several cases is split into ``jobs``
    shards (its cases dealt out in turn), so that no suite is left running alone at the end;
    a ``ONE_SESSION`` suite is not."""
    out = []
    for suite in wave:
        n = min(jobs, cases.get(suite, 1)) if suite in LONG_FIRST and suite not in ONE_SESSION else 1
        out += [(suite, (i, max(1, n))) for i in range(max(1, n))]
    return out


def _worker_env() -> dict[str, str]:
    """The parent's import path for the worker (a spec may name an engine the parent imported
    from a directory it added to sys.path, e.g. a test double)."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + env.get("PYTHONPATH", "").split(os.pathsep)))
    return env


class _Worker:
    def __init__(self, suite: str, shard: tuple[int, int], run_dir: Path, suites_dir: Path,
                 relay: Callable[[str], None], on_case: Callable[[], None]):
        self.suite, self.shard = suite, shard
        self.proc = subprocess.Popen([sys.executable, "-m", "fastpath.suite_workers", str(run_dir), str(suites_dir),
                                      suite, f"{shard[0]}/{shard[1]}"],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=_worker_env(),
                                     text=True, encoding="utf-8", errors="replace", bufsize=1)
        self.reader = threading.Thread(target=self._read, args=(relay, on_case), daemon=True)
        self.reader.start()

    def _read(self, relay: Callable[[str], None], on_case: Callable[[], None]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line == CASE_DONE:
                on_case()
            elif line:
                relay(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.reader.join(5)
        return code


def run(todo: list[str], jobs: int, cases: dict[str, int], state: Any, suites_dir: Path,
        start: Callable[[str], tuple[Callable, Callable]], ended: Callable[[str], None]) -> bool:
    """Run ``todo`` in waves (``waves``), as ``units``, up to ``jobs`` workers at a time.
    ``start(suite)`` returns (relay a line, advance the bar) for that suite's output; ``ended(suite)``
    follows its last unit (a sharded suite's shards merged, a worker that died without its
    marker recorded as a crash). Returns False when interrupted (every worker stopped)."""
    running: list[_Worker] = []
    try:
        for wave in waves(todo):
            queue = units(wave, jobs, cases)
            left = {s: sum(1 for u, _ in queue if u == s) for s in wave}
            hooks: dict[str, tuple[Callable, Callable]] = {}
            retries: list[tuple[str, int]] = []  # (suite, its shards): cases released to run alone
            shards: dict[str, int] = {}
            while queue or running or retries:
                if retries and not queue and not running:  # alone on the GPU now
                    suite, shards[suite] = retries.pop(0)
                    hooks[suite][0](f"{suite}: {len(state.released(suite))} case(s) ran out of GPU memory beside "
                                    "other workers; running them again alone")
                    queue.append((suite, RETRY))
                    left[suite] = 1
                while queue and len(running) < max(1, jobs):
                    suite, shard = queue.pop(0)
                    if suite not in hooks:
                        hooks[suite] = start(suite)
                        state.clear_claims(suite)
                    running.append(_Worker(suite, shard, state.run_dir, suites_dir, *hooks[suite]))
                time.sleep(0.2)
                for w in [w for w in running if w.proc.poll() is not None]:
                    running.remove(w)
                    code = w.wait()
                    if code == WORKER_INTERRUPTED:
                        return False
                    if state.marker(w.suite, w.shard) is None:  # died before its marker: a crash
                        state.crashed(w.suite, f"its worker process exited with code {code} before the suite "
                                               f"finished; see logs/{w.suite}.log", w.shard)
                    left[w.suite] -= 1
                    if left[w.suite]:
                        continue
                    if w.shard == RETRY:
                        state.merge_shards(w.suite, shards[w.suite], state.case_order(w.suite), retry=True)
                    elif w.shard[1] > 1 and state.released(w.suite):
                        retries.append((w.suite, w.shard[1]))
                        continue
                    elif w.shard[1] > 1:
                        state.merge_shards(w.suite, w.shard[1], state.case_order(w.suite))
                    ended(w.suite)
        return True
    except KeyboardInterrupt:
        return False
    finally:
        for w in running:
            w.stop()
        deadline = time.monotonic() + STOP_GRACE_S
        for w in running:
            w.wait(max(1.0, deadline - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    """Worker: ``RUN_DIR SUITES_DIR SUITE I/N`` (shard I of N of the suite's cases; 0/0: its
    ``RETRY``). Exit 0 when
    it ended (its marker says how), 3 when it was interrupted (no marker: a resume reruns it)."""
    from rich.console import Console

    from fastpath import verify as V
    from fastpath.plan import Plan
    from fastpath.run_state import RunState
    from fastpath.spec import load_spec

    run_dir, suites_dir, suite = Path(argv[0]), Path(argv[1]), argv[2]
    shard = tuple(int(x) for x in argv[3].split("/")) if len(argv) > 3 else (0, 1)
    state = RunState(run_dir)
    info = state.run_info()
    spec = load_spec(Path(info["spec_path"]))
    plan = Plan.from_json(json.loads((state.root / "plan.json").read_text(encoding="utf-8")))
    out = sys.stdout
    console = Console(file=out, width=10_000, soft_wrap=True, highlight=False, color_system=None)

    def case_done() -> None:
        out.write(CASE_DONE + "\n")
        out.flush()

    with V._sigterm_as_interrupt():
        try:
            V._run_one_suite(suite, spec, plan, state, suites_dir, console, case_done, shard,
                             beside_others=suite not in EXCLUSIVE)
        except (V.Interrupted, KeyboardInterrupt):
            return WORKER_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
