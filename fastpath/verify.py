"""``fastpath verify``: run the suites, judge the gates, write (and sign) the bundle.

Run directory (``--out DIR``)::

    DIR/state/run.json            spec path + digest, tier, suites dir (what --resume continues)
    DIR/state/plan.json           the plan the suites read
    DIR/state/rows/<suite>.jsonl  rows as they come (fsync per row)
    DIR/state/done/<suite>.json   completion marker: a suite with one is never rerun on resume
    DIR/state/finished/<suite>.txt  the cases an attempt finished, one id a line, each written
                                  after its rows (a resume keeps those cases' rows)
    DIR/state/kept/<suite>.jsonl  rows of the cases interrupted attempts finished (on resume)
    DIR/state/logs/<suite>.log    pytest output of the suite
    DIR/state/claims/<suite>/     while a sharded suite runs (--jobs): one file per case, the
                                  shard that took it (suite_workers)
    DIR/NAME.TIER.fastpath/ + DIR/NAME.TIER.fastpath.tar.gz   the bundle (NAME: the spec's name)

Each suite runs in its own ``pytest.main`` call. An interrupted suite (Ctrl-C, crash, the end
of a command's time) has no marker, so ``--resume DIR`` runs it again, skipping the suites that
finished and, within it, the cases that did (without an error row): their rows are kept
(``RunState.keep_finished``) and join the new attempt's when it ends; a case cut off mid-way
runs again whole. A run resumes only on the kind of machine it started on (its GPUs' names, or
"cpu"): one bundle attests one kind of machine. Whatever
happens, a bundle is only signed when every suite of the plan finished, and a run that did
not is "incomplete" (exit 3), never "pass". SIGTERM anywhere in a run acts as Ctrl-C; the bundle
is written, signed and packed under a temp name and renamed last, so an interrupt leaves no
temp files and no signed directory without its archive. A torn or hand-edited state file is a
usage error (exit 2) naming the file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpath.errors import FastpathError, UsageError
from fastpath.environment import machine_kind
from fastpath.gates import Verdict, evaluate
from fastpath.plan import Plan, build_plan
from fastpath.results import read_rows, rows_frame, write_json_atomic
from fastpath.run_state import RETRY, RunState
from fastpath.spec import Spec, load_spec

SUITES_DIR = Path(__file__).resolve().parent / "suites"  # shipped inside the package (package data)

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3
# pytest exit codes after which a suite counts as finished (its rows are its verdict).
PYTEST_FINISHED = (0, 1, 5)


@dataclass
class VerifyOptions:
    spec: Path | None = None
    tier: str = "auto"
    out: Path | None = None
    only: list[str] | None = None
    resume: Path | None = None
    key: Path | None = None
    suites_dir: Path | None = None
    jobs: int | None = None  # suites run at once (None: default_jobs)
    argv: list[str] = field(default_factory=lambda: list(sys.argv))


@dataclass
class VerifyResult:
    exit_code: int
    verdict: str
    run_dir: Path
    bundle_dir: Path | None = None
    archive: Path | None = None
    signed: bool = False
    message: str = ""


# --------------------------------------------------------------------------- locating things

def find_pyproject(start: Path) -> Path | None:
    for d in [start.resolve(), *start.resolve().parents]:
        if (d / "pyproject.toml").is_file():
            return d / "pyproject.toml"
    return None


def default_spec(cwd: Path) -> Path:
    """[tool.fastpath] default_spec of the nearest pyproject.toml."""
    pyproject = find_pyproject(cwd)
    if pyproject is None:
        raise UsageError(f"no spec given and no pyproject.toml above {cwd}",
                         "pass the spec: fastpath verify|plan path/to/fastpath.toml")
    try:
        value = tomllib.loads(pyproject.read_text())["tool"]["fastpath"]["default_spec"]
    except (KeyError, tomllib.TOMLDecodeError):
        raise UsageError(f"no spec given and {pyproject} has no [tool.fastpath] default_spec",
                         "pass the spec, or add default_spec = \"path/to/fastpath.toml\" under [tool.fastpath]") from None
    return pyproject.parent / value


def repo_root_for(spec_path: Path) -> Path:
    """The project the spec belongs to: the directory of the nearest pyproject.toml."""
    pyproject = find_pyproject(spec_path.parent)
    return pyproject.parent if pyproject else Path.cwd()


def detect_tier(spec: Spec) -> tuple[str, str]:
    """full when a CUDA GPU whose arch is in scope.hardware is present, else smoke (and why)."""
    if importlib.util.find_spec("torch") is None:
        return "smoke", "torch is not installed"
    import torch  # only now: importing torch costs seconds

    if not torch.cuda.is_available():
        return "smoke", "no CUDA GPU"
    major, minor = torch.cuda.get_device_capability(0)
    arch = f"sm_{major}{minor}"
    if arch not in spec.scope["hardware"]:
        return "smoke", f"GPU arch {arch} is not in scope.hardware {spec.scope['hardware']}"
    if "full" not in spec.tiers:
        return "smoke", "the spec defines no full tier"
    return "full", f"{torch.cuda.get_device_name(0)} ({arch}) is in scope"


# --------------------------------------------------------------------------- progress

MARKS = {"pass": "✓", "fail": "✗", "error": "!", "waived": "~", "info": "·"}


def progress_line(row: dict) -> str:
    """One row as a progress line: the case AND what in it was checked (component, kernel,
    dtype, path), so the rows of one case never print as identical lines; a waiver keeps its
    reason, a value its threshold."""
    where = " ".join(str(row[k]) for k in ("component", "kernel", "dtype", "path") if row.get(k) not in (None, ""))
    head = f"  {MARKS.get(row.get('status'), '?')} {row.get('case_id')}" + (f" [{where}]" if where else "")
    what = f"{row.get('gate') or '(no gate)'}: {row.get('metric')}"
    value = row.get("value")
    if isinstance(value, (int, float)) and value == value:
        what += f" = {value:.4g}"
        if row.get("comparator") and isinstance(row.get("threshold"), (int, float)):
            what += f" (needs {row['comparator']} {row['threshold']:.4g})"
    lines = [ln.strip() for ln in str(row.get("message") or "").splitlines() if ln.strip()]
    # One line per row: a traceback shows where it started and how it ended (the log has it all).
    message = "" if not lines else lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    line = f"{head}  {what}" + (f" — {message}" if message else "")
    return line if len(line) <= 300 else line[:299] + "…"


class ProgressHook:
    """A pytest plugin object: prints a line per new row, advances the suite's bar per case that
    wrote rows, and notices Ctrl-C. A test that wrote none is a helper test or a case given back
    for a retry alone (out of GPU memory beside other shards): the retry advances the bar once."""

    def __init__(self, rows_path: Path, console: Any, on_case: Any) -> None:
        self.rows_path, self.console, self.on_case = rows_path, console, on_case
        self.seen = 0
        self.interrupted = False

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        rows = read_rows(self.rows_path)
        for row in rows[self.seen:]:
            self.console.print(progress_line(row), highlight=False, markup=False, soft_wrap=True)
        if len(rows) > self.seen:
            self.on_case()
        self.seen = len(rows)

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        self.interrupted = True


# --------------------------------------------------------------------------- the run

class Interrupted(Exception):
    pass


def verify(opts: VerifyOptions, console: Any = None) -> VerifyResult:
    """Run, judge, bundle. SIGTERM anywhere acts as Ctrl-C (KeyboardInterrupt: exit 3)."""
    with _sigterm_as_interrupt():
        return _verify(opts, console)


def _verify(opts: VerifyOptions, console: Any = None) -> VerifyResult:
    from rich.console import Console

    console = console or Console(file=sys.stdout)
    # Pin the stream now: suites run with sys.stdout redirected to their log file.
    console.file = console.file
    spec, tier, run_dir, state, suites_dir, repo_root = _prepare(opts, console)
    plan = build_plan(spec, tier)
    write_json_atomic(plan.to_json(), state.root / "plan.json")

    if opts.resume is not None:
        state.all_rows(plan)  # a torn or edited state fails now, before any suite runs
    selected = _selected_suites(plan, opts.only)
    todo = [s for s in selected if (state.marker(s) or {}).get("status") != "done"]
    skipped = [s for s in selected if s not in todo]
    if skipped:
        console.print(f"[dim]already done in {run_dir}: {', '.join(skipped)}[/]")

    for suite in todo:
        kept = state.keep_finished(suite)
        if kept:
            console.print(f"[dim]{suite}: {kept} case(s) finished by an earlier attempt are kept[/]")
    interrupted = False
    try:
        _run_suites(todo, spec, plan, state, suites_dir, console, opts.jobs or default_jobs(plan.tier))
    except (Interrupted, KeyboardInterrupt):
        interrupted = True

    result = _finish(spec, plan, state, repo_root, opts, console, sign=not interrupted)
    if interrupted:
        result.exit_code, result.verdict = EXIT_INCOMPLETE, "incomplete"
        result.message = (f"interrupted: finished suites and cases are kept in {run_dir}; continue with "
                          f"`fastpath verify --resume {run_dir}`")
    return result


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Any:
    """A time limit (``timeout``, a batch scheduler) sends SIGTERM: stop like Ctrl-C, keep state."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _attested(repo_root: Path, spec: Spec) -> dict:
    from fastpath.digest import attested_parts

    try:
        return attested_parts(repo_root, spec)
    except ValueError as exc:
        raise FastpathError(f"cannot digest the attested sources: {exc}",
                            "fix [sources] globs in the spec so each matches files under the project root") from None


def _part_digests(attested: dict) -> dict[str, str]:
    return {part: value["digest"] for part, value in attested["parts"].items()}


def _check_sources_unchanged(info: dict, attested: dict, run_dir: Path) -> None:
    """The bundle attests one tree: every suite of a run must have tested that code."""
    from fastpath.digest import PART_LABELS

    started = info.get("attested") or {}
    now = _part_digests(attested)
    changed = [PART_LABELS.get(p, p) for p in now if p in started and started[p] != now[p]]
    if changed:
        raise UsageError(f"the {', '.join(changed)} changed since the run in {run_dir} started",
                         "results of different code cannot be attested together: start a new run with a new --out")


def _check_same_machine(info: dict, run_dir: Path) -> None:
    """The bundle's environment is the machine that finished the run: every suite must have run
    on that kind (a run started before run.json named its machine is taken as it is)."""
    started, now = info.get("machine"), machine_kind()
    if started is not None and started != now:
        raise UsageError(f"the run in {run_dir} started on {started}; this machine is {now}",
                         "resume it on the same kind of machine, or start a new run with a new --out: "
                         "one bundle attests one kind of machine")


def _prepare(opts: VerifyOptions, console: Any) -> tuple[Spec, str, Path, RunState, Path, Path]:
    if opts.resume is not None:
        state = RunState(Path(opts.resume))
        if not state.exists:
            raise UsageError(f"{opts.resume} holds no fastpath run (no state/run.json)",
                             "pass the --out directory of an earlier `fastpath verify`")
        info = state.run_info()
        spec_path = Path(opts.spec or info["spec_path"])
        spec = load_spec(spec_path)
        if spec.digest != info["spec_digest"]:
            raise UsageError(f"the spec {spec_path} changed since the run in {opts.resume} started",
                             "results of different specs cannot be mixed: start a new run with a new --out")
        if opts.tier not in ("auto", info["tier"]):
            raise UsageError(f"the run in {opts.resume} is tier {info['tier']!r}, not {opts.tier!r}",
                             "drop --tier when resuming, or start a new run")
        tier = info["tier"]
        suites_dir = Path(opts.suites_dir or info["suites_dir"])
        repo_root = Path(info["repo_root"])
        _check_sources_unchanged(info, _attested(repo_root, spec), state.run_dir)
        _check_same_machine(info, state.run_dir)
        return spec, tier, state.run_dir, state, suites_dir, repo_root

    spec_path = Path(opts.spec) if opts.spec else default_spec(Path.cwd())
    spec = load_spec(spec_path)
    repo_root = repo_root_for(spec_path)
    why = ""
    if opts.tier == "auto":
        tier, why = detect_tier(spec)
    else:
        tier = opts.tier
    spec.tier(tier)  # a SpecError naming the defined tiers if missing
    # Every argument is judged before anything is written or printed: a usage error leaves no run.
    _selected_suites(build_plan(spec, tier), opts.only)
    run_dir = Path(opts.out) if opts.out else repo_root / "out" / f"{spec.name}-{tier}-{time.strftime('%Y%m%d-%H%M%S')}"
    state = RunState(run_dir)
    if state.exists:
        raise UsageError(f"{run_dir} already holds a run",
                         f"continue it with `fastpath verify --resume {run_dir}`, or choose another --out")
    suites_dir = Path(opts.suites_dir) if opts.suites_dir else SUITES_DIR
    attested = _part_digests(_attested(repo_root, spec))
    if why:
        console.print(f"tier [bold]{tier}[/] ({why})")
    write_json_atomic({"spec_path": str(spec_path.resolve()), "spec_digest": spec.digest, "tier": tier,
                       "suites_dir": str(suites_dir.resolve()), "repo_root": str(repo_root.resolve()),
                       "attested": attested, "machine": machine_kind()},
                      state.root / "run.json")
    return spec, tier, run_dir, state, suites_dir, repo_root


def _selected_suites(plan: Plan, only: list[str] | None) -> list[str]:
    if not only:
        return list(plan.suites)
    unknown = [s for s in only if s not in plan.suites]
    if unknown:
        raise UsageError(f"--only names unknown suite(s): {', '.join(unknown)}",
                         f"choose from the plan's suites: {', '.join(plan.suites)}")
    return [s for s in plan.suites if s in only]


def default_jobs(tier: str) -> int:
    """Suites at once: the CPU (smoke) tier is Triton's interpreter, one core per suite, so two
    where there are two cores; the full tier shares one GPU: one at a time."""
    return 1 if tier == "full" else max(1, min(2, os.cpu_count() or 1))


def _run_suites(todo: list[str], spec: Spec, plan: Plan, state: RunState, suites_dir: Path, console: Any,
                jobs: int = 1) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fastpath import suite_workers

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task("suites", total=len(todo))
        tasks: dict[str, Any] = {}

        def start(suite: str) -> tuple[Any, Any]:
            cases, waivers = plan.for_suite(suite)
            tasks[suite] = progress.add_task(f"  {suite}", total=len(cases) + len(waivers))
            console.print(f"[bold]{suite}[/]: {len(cases)} cases, {len(waivers)} waived by the plan")
            return (lambda line: progress.console.print(line, highlight=False, markup=False, soft_wrap=True),
                    lambda: progress.advance(tasks[suite]))

        def ended(suite: str) -> None:
            state.join_kept(suite)
            progress.update(tasks[suite], completed=progress.tasks[tasks[suite]].total)
            progress.advance(overall)

        cases = {s: sum(map(len, plan.for_suite(s))) for s in todo}
        if jobs > 1 and todo and len(suite_workers.units(suite_workers.waves(todo)[0], jobs, cases)) > 1:
            if not suite_workers.run(todo, jobs, cases, state, suites_dir, start, ended):
                raise Interrupted("a suite was interrupted")
            return
        for suite in todo:
            _, on_case = start(suite)
            _run_one_suite(suite, spec, plan, state, suites_dir, progress.console, on_case)
            ended(suite)


def _run_one_suite(suite: str, spec: Spec, plan: Plan, state: RunState, suites_dir: Path, console: Any,
                   on_case: Any, shard: tuple[int, int] = (0, 1), beside_others: bool = False) -> None:
    """The suite (or one ``shard`` = (i, n) of its cases, or its ``RETRY``) in its own
    ``pytest.main``; ``beside_others``: other suites share the GPU (suite_workers)."""
    import pytest

    rows_path = state.rows_path(suite, shard)
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    state.forget(suite, shard)
    module = suites_dir / f"test_{suite}.py"
    if not module.is_file():
        state.crashed(suite, f"no suite module {module}", shard)
        console.print(f"[red]{suite}: no suite module {module}[/]")
        return
    ini = state.root / f"pytest-{rows_path.stem}.ini"  # isolates suites from the host project's pytest settings
    ini.write_text("[pytest]\n")
    args = [str(module), "-c", str(ini), "--rootdir", str(suites_dir), "--confcutdir", str(suites_dir),
            "-p", "fastpath.pytest_plugin", "-p", "no:cacheprovider", "--import-mode=importlib",
            "--capture=sys", "-q", "-rfEs", "--tb=short", "--no-header",
            "--fastpath-spec", str(spec.path), "--fastpath-tier", plan.tier,
            "--fastpath-plan", str(state.root / "plan.json"), "--fastpath-rows", str(rows_path),
            "--fastpath-suite", suite, "--fastpath-artifacts", str(state.root / "logs" / "artifacts"),
            "--fastpath-shard", "0/1" if shard == RETRY else f"{shard[0]}/{shard[1]}",
            "--fastpath-finished", str(state.finished_path(suite, shard)),
            # the slowest cases (over a second) in the log: what a shard's time went on
            "--durations=0", "--durations-min=1"]
    if state.kept_path(suite).is_file():
        args += ["--fastpath-kept", str(state.kept_path(suite))]
    if shard[1] > 1 or shard == RETRY:  # the shards share out the cases as each gets free (suite_workers)
        args += ["--fastpath-claims", str(state.claims_dir(suite))]
    if shard == RETRY:
        args += ["--fastpath-retry"]
    # out of GPU memory: a shard gives the case back for the retry alone; otherwise an error row
    oom = "alone" if shard == RETRY else "defer" if shard[1] > 1 else "shared" if beside_others else "alone"
    args += ["--fastpath-oom", oom]
    hook = ProgressHook(rows_path, console, on_case)
    log_path = state.log_path(suite, shard)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    before = set(sys.modules)
    from fastpath.progress import reporting_to

    try:
        with open(log_path, "w", encoding="utf-8") as log:
            def note(line: str) -> None:  # to the terminal (pinned stream) and to the suite's log
                console.print(line, highlight=False, markup=False)
                log.write(line + "\n")
                log.flush()

            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), reporting_to(note):
                code = int(pytest.main(args, plugins=[hook]))
    finally:
        _forget_suite_modules(before, suites_dir)
    if hook.interrupted:
        raise Interrupted(suite)
    if code in PYTEST_FINISHED:
        state.mark(suite, "done", shard, pytest_exit=code)
    else:
        state.crashed(suite, f"pytest exit code {code} (collection or internal error); see logs/{suite}.log", shard)
        console.print(f"[red]{suite}: could not run (pytest exit {code}); see {log_path}[/]")


def _forget_suite_modules(before: set[str], suites_dir: Path) -> None:
    """Drop suite modules imported by this run: pytest would reuse a stale one next time."""
    root = suites_dir.resolve()
    for name in set(sys.modules) - before:
        file = getattr(sys.modules[name], "__file__", None)
        if file and Path(file).resolve().is_relative_to(root):
            del sys.modules[name]


def _finish(spec: Spec, plan: Plan, state: RunState, repo_root: Path, opts: VerifyOptions, console: Any,
            sign: bool) -> VerifyResult:
    """Rows -> verdict -> bundle (always, marked incomplete if so) -> signature (complete only) -> archive."""
    from fastpath import bundle as bundle_mod
    from fastpath.environment import capture

    for suite in plan.suites:  # a worker that ended "done" while the run was being interrupted was
        if (state.marker(suite) or {}).get("status") == "done":  # never joined: its kept rows join now
            state.join_kept(suite)

    verdict = evaluate(spec, rows_frame(state.all_rows(plan)), plan, plan.tier, state.suite_state(plan))
    summary = verdict.to_summary()
    write_json_atomic(summary, state.root / "summary.json")
    attested = _attested(repo_root, spec)
    _check_sources_unchanged(state.run_info(), attested, state.run_dir)
    environment = capture(opts.argv, {"plan": "seeds are fixed in the suites"}, repo_root)
    signed = bool(opts.key and sign and verdict.complete)

    def sign_staged(staged: Path) -> None:
        from fastpath.signing import sign_bundle

        sign_bundle(staged, Path(opts.key))

    # Written, signed and packed under a temp name; renamed into place last (fastpath.bundle).
    name = bundle_mod.bundle_name(spec.name, plan.tier)
    bundle_dir = bundle_mod.write_bundle(
        state.run_dir / name, spec_path=spec.path, plan=plan.to_json(),
        rows=verdict.rows, summary=summary, environment=environment, logs_dir=state.root / "logs",
        attested=attested, sign=sign_staged if signed else None, archive=True,
        report=lambda staged: _report_page(staged, name))
    archive = bundle_mod.archive_path(bundle_dir)
    _print_verdict(verdict, console)
    code = exit_code(verdict)
    message = (f"bundle {archive}" + (" (signed)" if signed else " (not signed)")
               + f"; report {bundle_dir / 'report.html'}")
    if code == EXIT_FAIL and not verdict.complete:
        message += "; a gate of the suites that ran already failed"
    if not verdict.complete:
        missing = [s for s, st in verdict.suites.items() if st == "not_run"]
        message += (f"; incomplete: suites not run yet: {', '.join(missing)}. Run them with "
                    f"`fastpath verify --resume {state.run_dir} --only {','.join(missing)}`")
    return VerifyResult(code, verdict.verdict, state.run_dir, bundle_dir, archive, signed, message)


def _report_page(bundle_dir: Path, name: str) -> str:
    """report.html of the staged bundle; a renderer fault never costs the run its evidence."""
    try:
        from fastpath.report import render, unavailable_page
    except ImportError as exc:  # a missing chart/template package: say so on the page, keep the run
        import html

        return (f"<!doctype html><meta charset=utf-8><title>report not drawn</title><p>report not drawn: "
                f"{html.escape(str(exc))}; install fastpath's dependencies, then run "
                f"<code>fastpath report BUNDLE</code></p>\n")
    try:
        return render(bundle_dir, name=name)
    except Exception as exc:  # noqa: BLE001 - the evidence matters more than its page
        return unavailable_page(f"{type(exc).__name__}: {exc}")


def exit_code(verdict: Verdict) -> int:
    """0 pass, 1 fail, 3 incomplete. A partial run (``--only``) is incomplete, but a gate of a
    suite that ran and failed (or a failing row: an error, an orphan) is a failure now: exit 1,
    whatever the other suites may show later. Incomplete and passing so far: 3."""
    if verdict.verdict == "pass":
        return EXIT_PASS
    if verdict.verdict == "fail" or verdict.failing_rows:
        return EXIT_FAIL
    ran = {s for s, st in verdict.suites.items() if st != "not_run"}
    if any(g.suite in ran and not g.ok(verdict.tier) for g in verdict.gates.values()):
        return EXIT_FAIL
    return EXIT_INCOMPLETE


def _print_verdict(verdict: Verdict, console: Any) -> None:
    from rich.table import Table

    table = Table(title=f"gates ({verdict.tier} tier)")
    for col in ("gate", "suite", "status", "rows", "failed", "reason"):
        table.add_column(col)
    colour = {"pass": "green", "fail": "red", "missing": "red", "waived": "yellow", "info": "yellow"}
    for g in verdict.gates.values():
        table.add_row(g.name, g.suite, f"[{colour.get(g.status, 'yellow')}]{g.status}[/]", str(g.rows), str(g.failed), g.reason)
    console.print(table)
    for row in verdict.failing_rows[:50]:
        console.print(f"  [red]✗[/] {row['case_id']} {row['gate'] or '(no gate)'}: {row['metric']} "
                      f"{row['message'] or ''}".rstrip()[:300], highlight=False)
    if len(verdict.failing_rows) > 50:
        console.print(f"  … {len(verdict.failing_rows) - 50} more failing rows in summary.json")
    style = {"pass": "bold green", "fail": "bold red"}.get(verdict.verdict, "bold yellow")
    console.print(f"verdict: [{style}]{verdict.verdict.upper()}[/]")
