"""The pytest plugin suites run under (docs/architecture.md "Suites ↔ plugin").

Load it with ``-p fastpath.pytest_plugin`` and ``--fastpath-spec``. It parametrizes every
test marked ``@pytest.mark.fastpath(kind=...)`` that asks for ``case`` with the plan's cases
of its suite and kind, provides the fixtures, and turns every outcome into result rows:

- ``record(...)`` writes a row and returns whether it passed;
- ``waive(gate, reason)`` writes a waiver row and skips;
- an exception writes an ``error`` row (with the traceback tail), a failed assertion with no
  failing row a ``fail`` row, a skip without a waiver a ``waived`` row with the skip reason;
- cases the plan waives are skipped with a waiver row carrying the plan's reason.

A case that runs out of GPU memory (``OUT_OF_MEMORY``) in one of several shards sharing the GPU
(``--fastpath-oom defer``) leaves no rows: its rows are held until the case ends, its claim is
released, and ``verify`` runs it again alone once the suite's shards are done (suite_workers;
``--fastpath-retry``: the released cases, not the helper tests, which shard 0 ran); run
alone (``alone``) or beside other suites (``shared``), it is an error row whose message names the
cause and the fix.

Each case's id is appended to ``--fastpath-finished`` once its rows are written; a resumed run
passes the rows of the cases an interrupted attempt finished as ``--fastpath-kept``: those cases
are deselected, and ``fp_kept_rows`` gives their rows to a case that sums the suite up.

Outcome rows are filed under the marker's ``gate=``/``gates=``, else the gates the test
recorded so far, else gate "" (which fails the verdict, so a gate-less failure is never lost).
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from fastpath.engine import switch_config
from fastpath.plan import Plan, build_plan
from fastpath.results import RowWriter, make_row, read_rows
from fastpath.run_state import RELEASED
from fastpath.spec import Spec, Tier, load_spec

TRACEBACK_TAIL = 2000  # characters of a traceback kept in an error row's message
OOM_MODES = ("alone", "shared", "defer")
# a GPU out-of-memory exception: torch.OutOfMemoryError (torch >= 2.5), or the RuntimeError older
# torch raised with this text
OUT_OF_MEMORY = ("OutOfMemoryError", "CUDA out of memory")
OOM_FIX = {
    "alone": "it ran alone on the GPU: run it on a GPU with more memory, or narrow the spec's scope",
    "shared": "other suites shared the GPU (--jobs): run this suite again with --jobs 1 (a new --out), "
              "or on a GPU with more memory",
}


def create_engine(name: str, options: dict[str, Any]) -> Any:
    """A registered engine by name, or ``module:factory`` (how tests point at a double)."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        factory: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
        return factory(**options)
    from fastpath.engine import create_engine as create_registered

    return create_registered(name, **options)


class LazyModels:
    """``fp_models["fast"]``: each path is loaded on first use, once per session. "fast" is
    loaded with the spec's switch as ``additional_config`` (fastpath.engine.Engine.load); the
    other paths without it."""

    def __init__(self, engine_getter: Callable[[], Any], switch: dict[str, str]) -> None:
        self._engine_getter = engine_getter
        self._fast_config = switch_config(switch)
        self._models: dict[str, Any] = {}

    def __getitem__(self, path: str) -> Any:
        if path not in self._models:
            engine = self._engine_getter()
            if path == "fast":
                self._models[path] = engine.load(path, additional_config=dict(self._fast_config))
            else:
                self._models[path] = engine.load(path)
        return self._models[path]

    def close(self) -> None:
        for model in self._models.values():
            close = getattr(model, "close", None)
            if close is not None:
                close()
        self._models.clear()


@dataclass
class ItemRecord:
    """What one test item wrote so far (to decide which outcome rows to add)."""

    suite: str
    case_id: str
    config: dict[str, Any]
    declared_gates: list[str]
    recorded_gates: list[str] = field(default_factory=list)
    has_case: bool = True  # False: a helper test outside the plan (only its failures become rows)
    rows: int = 0
    failing_rows: int = 0
    waived: bool = False
    released: bool = False  # ran out of GPU memory beside other shards: its retry alone reports it
    sums_up: bool = False  # marker sums_up=True: reads the suite's other cases, so never kept by a resume

    def outcome_gates(self) -> list[str]:
        return self.declared_gates or list(dict.fromkeys(self.recorded_gates)) or [""]


class FastpathSession:
    """Per-pytest-session state: spec, tier, plan, the row sink and per-item records."""

    def __init__(self, spec: Spec, tier: Tier, plan: Plan, rows_path: Path | None, suite: str | None,
                 shard: tuple[int, int] = (0, 1), claims: Path | None = None, oom: str = "alone",
                 finished: Path | None = None, kept: Path | None = None, retry: bool = False) -> None:
        self.spec, self.tier, self.plan, self.suite, self.shard = spec, tier, plan, suite, shard
        self.retry = retry  # the suite's retry: only the cases its shards released (helper tests ran in shard 0)
        self.finished = finished  # each case id once its rows are all written (what a resume keeps)
        # rows of cases an earlier, interrupted attempt finished: not run again (RunState.keep_finished)
        self.kept_rows = read_rows(kept) if kept else []
        self.kept_cases = {r["case_id"] for r in self.kept_rows}
        self.claims = claims  # shared by the suite's shards: a shard runs the cases it claims first
        self.oom = oom  # what a case that runs out of GPU memory does (OOM_MODES)
        self.writer = RowWriter(rows_path) if rows_path else None
        self.rows: list[dict] = []  # kept in memory too (tests, progress)
        self.pending: list[dict] = []  # "defer": the running case's rows, written when it ends
        self.items: dict[str, ItemRecord] = {}
        self.waived_cases = {w.case.case_id: w.reason for w in plan.waivers}

    def write(self, item: ItemRecord, row: dict) -> None:
        if self.oom == "defer":
            self.pending.append(row)
        else:
            self._emit(row)
        item.rows += 1
        if row["status"] in ("fail", "error"):
            item.failing_rows += 1
        if row["gate"]:
            item.recorded_gates.append(row["gate"])

    def _emit(self, row: dict) -> None:
        if self.writer is not None:
            self.writer.write(row)
        self.rows.append(row)

    def case_ended(self, item: ItemRecord) -> None:
        """Write the case's held rows, or drop them if it was released for a retry alone."""
        for row in [] if item.released else self.pending:
            self._emit(row)
        self.pending.clear()
        if self.finished is not None and item.has_case and not item.released and not item.sums_up:
            self.finished.parent.mkdir(parents=True, exist_ok=True)
            with open(self.finished, "a", encoding="utf-8") as note:
                note.write(item.case_id + "\n")
                note.flush()
                os.fsync(note.fileno())

    def release(self, case_id: str) -> None:
        """Give the case back (it ran out of GPU memory beside other shards): a ``released/`` note
        first, then the claim goes, so the retry alone (suite_workers) claims and runs it."""
        assert self.claims is not None
        (self.claims / RELEASED).mkdir(parents=True, exist_ok=True)
        (self.claims / RELEASED / claim_name(case_id)).touch()
        (self.claims / claim_name(case_id)).unlink(missing_ok=True)

    def suite_of(self, module_path: Path) -> str:
        return self.suite or module_path.stem.removeprefix("test_")

    def in_shard(self, suite: str, case_id: str) -> bool:
        """Whether this session runs the case (every case of the suite belongs to one shard)."""
        i, n = self.shard
        if n == 1:
            return True
        ids = [c.case_id for c in [*self.plan.cases, *(w.case for w in self.plan.waivers)] if c.suite == suite]
        return ids.index(case_id) % n == i

    def claim(self, case_id: str) -> bool:
        """With a claims folder: True iff this shard is the first to claim the case (an atomic
        exclusive create), so each case runs in exactly one shard, whichever is free first."""
        if self.claims is None:
            return True
        self.claims.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.claims / claim_name(case_id), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"{self.shard[0]}/{self.shard[1]}\n")
        return True

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


STATE = pytest.StashKey[FastpathSession]()


def claim_name(case_id: str) -> str:
    """A case's claim file name: its id with the path separators spelled out."""
    return case_id.replace("/", "__")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fastpath")
    group.addoption("--fastpath-spec", help="fastpath.toml the suites validate")
    group.addoption("--fastpath-tier", default="smoke", help="tier of the spec (smoke|full)")
    group.addoption("--fastpath-plan", help="plan.json to take cases from (default: build it from the spec)")
    group.addoption("--fastpath-rows", help="JSONL file result rows are appended to")
    group.addoption("--fastpath-suite", help="suite name (default: from the module name test_<suite>.py)")
    group.addoption("--fastpath-artifacts", help="folder a suite may write result files into (they travel "
                    "with the bundle under logs/artifacts/; e.g. perf's summary table)")
    group.addoption("--fastpath-shard", default="0/1", help="I/N: run only the suite's cases at positions "
                    "I, I + N, I + 2N, ... of the plan (verify --jobs splits a long suite across workers)")
    group.addoption("--fastpath-claims", help="with --fastpath-shard: a folder the suite's N shards share; each "
                    "runs the plan's cases in order, skipping those another shard claimed first (a shard that "
                    "drew short cases takes more), instead of the fixed positions")
    group.addoption("--fastpath-retry", action="store_true", help="with --fastpath-claims: the suite's retry alone, "
                    "after its shards: runs the cases they released (out of GPU memory), not the helper tests")
    group.addoption("--fastpath-finished", help="file each finished case's id is appended to (once its rows "
                    "are written): what `fastpath verify --resume` keeps of an interrupted attempt")
    group.addoption("--fastpath-kept", help="JSONL rows of cases an earlier attempt finished: those cases are not "
                    "run again, and the fp_kept_rows fixture gives their rows (e.g. perf's summary table)")
    group.addoption("--fastpath-oom", default="alone", choices=OOM_MODES,
                    help="a case that runs out of GPU memory: 'defer' (a shard beside others, with --fastpath-claims: "
                         "release it for verify to run alone later), else an error row naming the fix ('alone': "
                         "nothing else on the GPU; 'shared': other suites beside it)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fastpath(kind, gate=None, gates=None, sums_up=False): a test over the "
                            "plan's cases (sums_up: it reads the suite's other cases; a resume runs it again)")
    spec_path = config.getoption("fastpath_spec", None)
    if not spec_path:
        return
    spec = load_spec(spec_path)
    tier = spec.tier(config.getoption("fastpath_tier"))
    plan_path = config.getoption("fastpath_plan")
    plan = Plan.from_json(json.loads(Path(plan_path).read_text())) if plan_path else build_plan(spec, tier)
    rows = config.getoption("fastpath_rows")
    claims, finished, kept = (config.getoption(f"fastpath_{o}") for o in ("claims", "finished", "kept"))
    config.stash[STATE] = FastpathSession(spec, tier, plan, Path(rows) if rows else None,
                                          config.getoption("fastpath_suite"), _shard(config.getoption("fastpath_shard")),
                                          Path(claims) if claims else None, config.getoption("fastpath_oom"),
                                          Path(finished) if finished else None, Path(kept) if kept else None,
                                          config.getoption("fastpath_retry"))
    if config.stash[STATE].oom == "defer" and not claims:
        raise pytest.UsageError("--fastpath-oom defer needs --fastpath-claims (the retry claims the released cases)")
    if config.stash[STATE].retry and not claims:
        raise pytest.UsageError("--fastpath-retry needs --fastpath-claims (the folder where the shards released cases)")


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise pytest.UsageError(f"--fastpath-shard {text!r}: expected I/N, e.g. 0/2") from None
    if not 0 <= i < n:
        raise pytest.UsageError(f"--fastpath-shard {text!r}: I must be 0 ..= N-1")
    return i, n


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        state.close()


def _state(config: pytest.Config) -> FastpathSession:
    state = config.stash.get(STATE, None)
    if state is None:
        raise pytest.UsageError("fastpath suites need --fastpath-spec (run them with `fastpath verify`)")
    return state


def _marker_gates(marker: pytest.Mark | None) -> list[str]:
    if marker is None:
        return []
    gates = marker.kwargs.get("gates") or []
    if marker.kwargs.get("gate"):
        gates = [marker.kwargs["gate"], *gates]
    return [gates] if isinstance(gates, str) else list(gates)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("fastpath")
    if marker is None or "case" not in metafunc.fixturenames:
        return
    state = _state(metafunc.config)
    kind = marker.kwargs.get("kind") or (marker.args[0] if marker.args else None)
    if not kind:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.fastpath needs kind=")
    suite = state.suite_of(Path(str(metafunc.definition.path)))
    cases = [c for c in state.plan.cases if c.suite == suite and c.kind == kind]
    cases += [w.case for w in state.plan.waivers if w.case.suite == suite and w.case.kind == kind]
    metafunc.parametrize("case", [c.to_json() for c in cases], ids=[c.case_id for c in cases])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without --fastpath-suite, the suite whose engine options fp_engine uses is the one suite
    module collected (several suites in one session share one engine, so none may have its own);
    ``--fastpath-shard I/N``: keep this shard's cases (helper tests without a case: shard 0); with
    ``--fastpath-claims`` every case stays, and ``pytest_runtest_protocol`` runs those it claims."""
    state = config.stash.get(STATE, None)
    if state is None:
        return
    # a kind the plan has no case of (e.g. features_speculative in a spec without that gate) is
    # parametrized with an empty set: nothing of the plan to run, so not an item at all
    empty = [i for i in items if _no_case(i)]
    kept = [i for i in items if (_case(i) or {}).get("case_id") in state.kept_cases]
    if empty or kept:
        config.hook.pytest_deselected(items=empty + kept)
        items[:] = [i for i in items if not _no_case(i) and i not in kept]
    if state.suite is None:
        suites = {state.suite_of(Path(str(i.path))) for i in items if i.get_closest_marker("fastpath")}
        if len(suites) == 1:
            state.suite = suites.pop()
        elif suites & set(state.tier.suite_engine_options):
            raise pytest.UsageError(f"suites {', '.join(sorted(suites))} collected in one session, and the tier gives "
                                    "some of them engine options of their own: run each with --fastpath-suite")
    if state.shard[1] == 1:
        return
    keep, drop = [], []
    for item in items:
        case = _case(item)
        if case:
            mine = state.claims is not None or state.in_shard(state.suite_of(Path(str(item.path))), case["case_id"])
        else:
            mine = state.shard[0] == 0
        (keep if mine else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """Shards with a claims folder: a case another shard claimed first is not run here (nor
    reported: it is that shard's). Returning True ends the protocol for the item."""
    state = item.config.stash.get(STATE, None)
    if state is None or state.claims is None:
        return None
    case = _case(item)
    if case is None and state.retry:
        return True  # its helper tests ran in the suite's shard 0
    if case and not state.claim(case["case_id"]):
        return True
    return None


def _case(item: pytest.Item) -> dict | None:
    """The plan case an item runs (its ``case`` parameter), or None for a helper test."""
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case") if callspec else None
    return case if isinstance(case, dict) else None


def _no_case(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "case" in callspec.params and not isinstance(callspec.params["case"], dict)


def _item_record(item: pytest.Item) -> ItemRecord:
    state = _state(item.config)
    if item.nodeid not in state.items:
        case = _case(item)
        suite = state.suite_of(Path(str(item.path)))
        case_id = case["case_id"] if case else f"{suite}/test/{item.name}"
        marker = item.get_closest_marker("fastpath")
        state.items[item.nodeid] = ItemRecord(suite, case_id, dict(case["config"]) if case else {},
                                              _marker_gates(marker), has_case=case is not None,
                                              sums_up=bool(marker and marker.kwargs.get("sums_up")))
    return state.items[item.nodeid]


def _outcome_rows(item: pytest.Item, status: str, metric: str, message: str) -> None:
    state, rec = _state(item.config), _item_record(item)
    for gate in rec.outcome_gates():
        text = message if gate else f"{message} [the test names no gate: add gate= to @pytest.mark.fastpath]"
        state.write(rec, make_row(rec.suite, rec.case_id, gate, metric, status=status, passed=False,
                                  message=text, **_config_columns(rec.config)))


def _config_columns(config: dict[str, Any]) -> dict[str, Any]:
    """Case config as row keyword arguments (non-column keys end up in ``detail``)."""
    return {k: v for k, v in config.items() if k not in ("suite", "case_id", "gate", "metric", "value")}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    state = item.config.stash.get(STATE, None)
    if state is None:
        return
    rec = _item_record(item)
    reason = state.waived_cases.get(rec.case_id)
    if reason is not None:
        rec.waived = True
        _outcome_rows(item, "waived", "waiver", reason)
        pytest.skip(f"waived by the plan: {reason}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    state = item.config.stash.get(STATE, None)
    if state is None:
        return report
    rec = _item_record(item)
    if not rec.released:
        _file_outcome(item, rec, report, call, state.oom)
    if call.when == "teardown":
        state.case_ended(rec)
    return report


def _file_outcome(item: pytest.Item, rec: ItemRecord, report: pytest.TestReport, call: pytest.CallInfo,
                  oom: str) -> None:
    """The outcome rows a phase's report adds (or, for a case out of GPU memory beside other
    shards, its release for a retry alone)."""
    if report.skipped and not rec.has_case:
        pass  # e.g. a kind with no case on this plan ("empty parameter set"): nothing to file
    elif report.skipped and not rec.waived:
        reason = call.excinfo.value.msg if call.excinfo is not None and hasattr(call.excinfo.value, "msg") \
            else str(report.longrepr)
        rec.waived = True
        _outcome_rows(item, "waived", "skipped", f"skipped without a waiver: {reason}")
    elif report.failed:
        excinfo = call.excinfo
        is_assert = excinfo is not None and excinfo.errisinstance(AssertionError) and call.when == "call"
        if is_assert and rec.failing_rows == 0:
            _outcome_rows(item, "fail", "assertion", f"assertion failed: {excinfo.exconly()[:TRACEBACK_TAIL]}")
        elif _out_of_memory(excinfo) and oom == "defer" and rec.has_case:
            rec.released = True
            _state(item.config).release(rec.case_id)
            _free_gpu_cache()
        elif _out_of_memory(excinfo):
            tail = str(report.longrepr)[-TRACEBACK_TAIL // 2:]
            _outcome_rows(item, "error", "out_of_memory",
                          f"{call.when} ran out of GPU memory; fix: {OOM_FIX['shared' if oom == 'defer' else oom]}. "
                          f"The traceback's end: {tail}")
        elif not is_assert:
            tail = str(report.longrepr)[-TRACEBACK_TAIL:]
            _outcome_rows(item, "error", "exception", f"{call.when} raised: {tail}")
    elif call.when == "teardown" and rec.rows == 0 and rec.has_case:
        # Passed without recording anything: the case produced no evidence.
        _outcome_rows(item, "error", "result", "test passed but recorded no row (call record())")


def _out_of_memory(excinfo: pytest.ExceptionInfo | None) -> bool:
    """A GPU out-of-memory exception, by its class's name or torch's message (no torch import)."""
    if excinfo is None:
        return False
    names = {cls.__name__ for cls in type(excinfo.value).__mro__}
    return OUT_OF_MEMORY[0] in names or OUT_OF_MEMORY[1] in str(excinfo.value)


def _free_gpu_cache() -> None:
    """After a released case: give its blocks back, so this shard's next cases have room."""
    import gc
    import sys

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def fp_spec(request: pytest.FixtureRequest) -> Spec:
    return _state(request.config).spec


@pytest.fixture(scope="session")
def fp_tier(request: pytest.FixtureRequest) -> Tier:
    return _state(request.config).tier


@pytest.fixture(scope="session")
def fp_plan(request: pytest.FixtureRequest) -> Plan:
    return _state(request.config).plan


@pytest.fixture(scope="session")
def fp_engine(request: pytest.FixtureRequest) -> Any:
    state = _state(request.config)
    engine = create_engine(state.spec.engine, state.tier.engine_options_for(state.suite))
    yield engine
    _close(engine)


def _close(engine: Any) -> None:
    """Close an engine that has a ``close`` (the protocol does not require one)."""
    close = getattr(engine, "close", None)
    if close is not None:
        close()


@pytest.fixture(scope="session")
def fp_models(request: pytest.FixtureRequest) -> LazyModels:
    models = LazyModels(lambda: request.getfixturevalue("fp_engine"), _state(request.config).spec.switch)
    yield models
    models.close()


class VariantEngines:
    """The engines a case may name instead of its suite's: a coverage variant's
    (``config["variant"]``) or another suite's (``config["engine_suite"]``: perf's prompt cases
    on the evals suite's model). Each is created on first use, once per session, with its models
    (LazyModels)."""

    def __init__(self, state: "FastpathSession") -> None:
        self._state = state
        self._engines: dict[str, Any] = {}
        self._models: dict[str, LazyModels] = {}

    def get(self, variant: str | None = None, *, suite: str | None = None) -> tuple[Any, LazyModels]:
        state = self._state
        key = f"suite:{suite}" if suite is not None else f"variant:{variant}"
        if key not in self._engines:
            options = (state.tier.engine_options_for(suite) if suite is not None
                       else state.tier.engine_options_for(state.suite, variant))
            engine = create_engine(state.spec.engine, options)
            self._engines[key] = engine
            self._models[key] = LazyModels(lambda: engine, state.spec.switch)
        return self._engines[key], self._models[key]

    def close(self) -> None:
        for models in self._models.values():
            models.close()
        for engine in self._engines.values():
            _close(engine)


@pytest.fixture(scope="session")
def fp_kept_rows(request: pytest.FixtureRequest) -> list[dict]:
    """Rows of the suite's cases an earlier, interrupted attempt of the run finished (not run
    again): a case that sums the suite up (perf's summary) reads theirs from here."""
    return list(_state(request.config).kept_rows)


@pytest.fixture(scope="session")
def fp_variants(request: pytest.FixtureRequest) -> VariantEngines:
    variants = VariantEngines(_state(request.config))
    yield variants
    variants.close()


def _of_case_variant(request: pytest.FixtureRequest, case: dict, tier_fixture: str, part: int) -> Any:
    """The tier's fixture ``tier_fixture``, or for a case that names another engine (a coverage
    variant's, ``config["variant"]``, or another suite's, ``config["engine_suite"]``) the same
    ``part`` (0 engine, 1 models) of that engine."""
    cfg = case["config"]
    variant, suite = cfg.get("variant"), cfg.get("engine_suite")
    if variant is None and suite is None:
        return request.getfixturevalue(tier_fixture)
    variants = request.getfixturevalue("fp_variants")
    return (variants.get(suite=suite) if suite is not None else variants.get(variant))[part]


@pytest.fixture
def fp_case_engine(request: pytest.FixtureRequest, case: dict) -> Any:
    """The engine the case names (coverage variant, another suite's), else fp_engine."""
    return _of_case_variant(request, case, "fp_engine", 0)


@pytest.fixture
def fp_case_models(request: pytest.FixtureRequest, case: dict) -> LazyModels:
    """The models of the engine the case names, else fp_models."""
    return _of_case_variant(request, case, "fp_models", 1)


@pytest.fixture(scope="session")
def fp_gate(request: pytest.FixtureRequest) -> Callable[[str], dict[str, Any]]:
    spec = _state(request.config).spec

    def settings(name: str) -> dict[str, Any]:
        if name not in spec.gates.settings:
            raise KeyError(f"gate {name!r} is not in the spec (gates: {', '.join(spec.gates.settings)})")
        return dict(spec.gates.settings[name])

    return settings


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[..., bool]:
    state, rec = _state(request.config), _item_record(request.node)

    def _record(gate: str, metric: str, value: Any, *, threshold: float | None = None,
                comparator: str | None = None, passed: bool | None = None, evidence: Any = None,
                **config: Any) -> bool:
        row = make_row(rec.suite, rec.case_id, gate, metric, value, threshold=threshold, comparator=comparator,
                       passed=passed, evidence=evidence, **{**_config_columns(rec.config), **config})
        state.write(rec, row)
        return row["passed"]

    return _record


@pytest.fixture
def waive(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    state, rec = _state(request.config), _item_record(request.node)

    def _waive(gate: str, reason: str) -> None:
        state.write(rec, make_row(rec.suite, rec.case_id, gate, "waiver", status="waived", message=reason,
                                  **_config_columns(rec.config)))
        rec.waived = True
        pytest.skip(reason)

    return _waive


@pytest.fixture
def case() -> dict:
    raise pytest.UsageError("`case` comes from @pytest.mark.fastpath(kind=...) and --fastpath-spec")
