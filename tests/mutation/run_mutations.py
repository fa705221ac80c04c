#!/usr/bin/env python
"""Mutation self-test of the harness: every planted defect must fail `fastpath verify`, and by
the gate that names it; the unpatched fast path must pass.

A defect is a data file (``patches/*.toml`` for the K3-mini fast path, ``double_patches/*.toml``
for the suites' test double)::

    name = "temperature_ignored"
    kind = "temperature ignored"                  # what sort of defect (distinct per file)
    expected_gate = "features_sampling_distribution"
    only = "features"                             # suites to run (comma list); "" = all
    select = "sampling"                           # optional: pytest -k within that one suite
    kernel = "gemv"                               # optional: kernels suite narrowed to one kernel
    [[edit]]
    file = "optimized_model/k3/fast/kernels/sampler.py"   # relative to the copy's root
    old = '''exact text, must occur exactly once'''
    new = '''the defect'''

For each mutant the runner copies the package (``optimized_model`` or ``tests/doubles/tiny_lm``)
into a temporary directory, applies the edits to the COPY, and runs
``python -m fastpath.cli verify SPEC --tier smoke [--only SUITES]`` in a subprocess whose working
directory and PYTHONPATH put the copy first (the real files are never modified). Failing gates
are read from the run's result rows. Mutants run ``--jobs`` at a time.

A full smoke run per mutant does not fit 10 minutes on 2 CPU cores (a fast decode step runs in
Triton's interpreter: seconds), so a mutant may narrow its run, and the table says how:
``only`` (``verify --only SUITE``), ``select`` (the suite's pytest module run directly with the
fastpath plugin, ``-k SELECT``: same plan, same fixtures, same rows, no bundle) and ``kernel``
(the plan's kernels case narrowed to that kernel). The clean (unpatched) copy runs the union of
the mutants' selections, per suite, in parallel with them; ``--full`` runs plain
``verify --tier smoke`` everywhere instead.

    python tests/mutation/run_mutations.py                 # K3-mini set
    python tests/mutation/run_mutations.py --set double    # the test double's set
    python tests/mutation/run_mutations.py --mutant NAME --keep

Exit status 0 iff the clean run passes and every mutant is caught by its expected gate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SUITES = REPO / "fastpath" / "suites"  # the suites verify runs (package data of fastpath)

SETS = {
    # name: (package dir to copy, spec inside the copy or the repo, patch dir, allowed edit prefix)
    "real": {
        "package": REPO / "optimized_model",
        "spec": "optimized_model/k3/fastpath.toml",  # relative to the copy
        "patches": HERE / "patches",
        "allowed": "optimized_model/k3/fast/",
        "probe": "optimized_model",
        # the spec's [sources] validation globs attest these: the copy must hold them too
        "attested_dirs": [REPO / "fastpath"],
    },
    "double": {
        "package": REPO / "tests" / "doubles" / "tiny_lm",
        "spec": "tiny_lm/spec.toml",
        "patches": HERE / "double_patches",
        "allowed": "tiny_lm/",
        "probe": "tiny_lm",
    },
}


class PatchError(ValueError):
    pass


@dataclass
class Mutant:
    name: str
    kind: str
    expected_gate: str
    only: list[str]
    edits: list[dict]
    path: Path | None = None
    note: str = ""
    select: str = ""
    kernel: str = ""


@dataclass
class Outcome:
    name: str
    kind: str
    expected_gate: str
    only: list[str]
    exit_code: int | None
    select: str = ""
    kernel: str = ""
    failing_gates: list[str] = field(default_factory=list)
    rows: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def caught(self) -> bool:
        return not self.error and self.expected_gate in self.failing_gates

    @property
    def clean_pass(self) -> bool:
        return not self.error and self.rows > 0 and not self.failing_gates


def load_mutant(path: Path) -> Mutant:
    data = tomllib.loads(path.read_text())
    for key in ("name", "kind", "expected_gate", "edit"):
        if key not in data:
            raise PatchError(f"{path.name}: missing key {key!r}")
    only = [s for s in str(data.get("only", "")).split(",") if s.strip()]
    edits = data["edit"]
    if not isinstance(edits, list) or not edits:
        raise PatchError(f"{path.name}: [[edit]] must list at least one edit")
    for e in edits:
        for key in ("file", "old", "new"):
            if key not in e:
                raise PatchError(f"{path.name}: an edit lacks {key!r}")
        if e["old"] == e["new"]:
            raise PatchError(f"{path.name}: an edit changes nothing")
    m = Mutant(data["name"], data["kind"], data["expected_gate"], [s.strip() for s in only], edits, path,
               data.get("note", ""), data.get("select", ""), data.get("kernel", ""))
    if (m.select or m.kernel) and len(m.only) != 1:
        raise PatchError(f"{path.name}: select/kernel need exactly one suite in only")
    if m.kernel and m.only != ["kernels"]:
        raise PatchError(f"{path.name}: kernel= narrows the kernels suite only")
    return m


def load_mutants(directory: Path) -> list[Mutant]:
    return [load_mutant(p) for p in sorted(directory.glob("*.toml"))]


def apply_edits(root: Path, edits: list[dict], allowed: str) -> None:
    """Apply edits to the copy under ``root``. Each ``old`` must occur exactly once."""
    for e in edits:
        rel = str(e["file"])
        if not rel.startswith(allowed) or ".." in Path(rel).parts or Path(rel).is_absolute():
            raise PatchError(f"edit target {rel!r} is outside {allowed!r}")
        target = root / rel
        if not target.is_file():
            raise PatchError(f"edit target {rel} does not exist (stale patch?)")
        text = target.read_text()
        n = text.count(e["old"])
        if n != 1:
            raise PatchError(f"{rel}: the old text occurs {n} times (must be exactly once; stale patch?)")
        target.write_text(text.replace(e["old"], e["new"]))


# ``--gate-override GATE.KEY=VALUE``: try a gate setting before the spec changes (the table
# prints every override; the CI test never uses one).
GATE_OVERRIDES: list[tuple[str, str, str]] = []


def make_copy(set_cfg: dict, workdir: Path) -> Path:
    root = workdir / "src"
    src: Path = set_cfg["package"]
    shutil.copytree(src, root / src.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for extra in set_cfg.get("attested_dirs", []):
        shutil.copytree(extra, root / extra.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if GATE_OVERRIDES:
        spec = root / set_cfg["spec"]
        text = spec.read_text()
        for gate, key, value in GATE_OVERRIDES:
            head = f"[gates.{gate}]\n"
            if head not in text:
                raise PatchError(f"gate override: no [gates.{gate}] in the spec")
            i = text.index(head) + len(head)
            j = text.find("\n[", i)
            j = len(text) if j < 0 else j + 1
            body = "\n".join(line for line in text[i:j].splitlines() if not line.startswith(f"{key} ="))
            text = text[:i] + f"{key} = {value}\n" + body.strip("\n") + "\n\n" + text[j:]
        spec.write_text(text)
    return root


def subprocess_env(root: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def probe_copy(set_cfg: dict, root: Path) -> str:
    """The file the subprocess imports the package from (must be inside the copy)."""
    code = f"import {set_cfg['probe']} as m; print(m.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=subprocess_env(root), capture_output=True,
                         text=True, timeout=120)
    return out.stdout.strip() or out.stderr.strip()[-300:]


def failing_gates(run_dir: Path) -> tuple[list[str], int]:
    gates, rows = set(), 0
    for f in sorted((run_dir / "state" / "rows").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            rows += 1
            if row.get("status") in ("fail", "error"):
                gates.add(row.get("gate") or "(no gate)")
    return sorted(gates), rows


@dataclass
class Selection:
    only: list[str]
    select: str = ""  # pytest -k (direct plugin run of the one suite in ``only``)
    kernel: str = ""  # kernels case narrowed to this kernel

    def describe(self) -> str:
        if not self.select and not self.kernel:
            return "verify --tier smoke" + (f" --only {','.join(self.only)}" if self.only else "")
        text = f"suite {self.only[0]} via the plugin"
        if self.kernel:
            text += f", kernel {self.kernel}"
        if self.select:
            text += f", -k '{self.select}'"
        return text


def _narrowed_plan(root: Path, spec: Path, env: dict, run_dir: Path, sel: Selection) -> Path:
    proc = subprocess.run([sys.executable, "-m", "fastpath.cli", "plan", str(spec), "--tier", "smoke", "--json"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"fastpath plan failed: {proc.stderr[-400:]}")
    plan = json.loads(proc.stdout)
    if sel.kernel:
        # the spec's case of that kernel ([kernels] names), else its registry case narrowed to it
        kernel_cases = [c for c in plan["cases"] if c["suite"] == "kernels" and c["kind"] == "kernel"]
        named = [c for c in kernel_cases if c["config"].get("kernel") == sel.kernel]
        keep = named or [c for c in kernel_cases if c["config"].get("kernel") is None and not c["config"].get("except")]
        for c in keep:
            c["config"]["kernel"] = sel.kernel
            c["case_id"] = f"kernels/kernel/{sel.kernel}-{c['config'].get('dtype')}"
        plan["cases"] = [c for c in plan["cases"] if c not in kernel_cases or c in keep]
    path = run_dir / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def _run_selection(root: Path, spec: Path, env: dict, run_dir: Path, sel: Selection, timeout: int):
    if not sel.select and not sel.kernel:
        cmd = [sys.executable, "-m", "fastpath.cli", "verify", str(spec), "--tier", "smoke",
               "--out", str(run_dir), "--suites-dir", str(SUITES)]
        if sel.only:
            cmd += ["--only", ",".join(sel.only)]
        return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    suite = sel.only[0]
    rows = run_dir / "state" / "rows"
    rows.mkdir(parents=True, exist_ok=True)
    plan = _narrowed_plan(root, spec, env, run_dir, sel)
    ini = run_dir / "pytest.ini"
    ini.write_text("[pytest]\n")
    suites = SUITES
    cmd = [sys.executable, "-m", "pytest", str(suites / f"test_{suite}.py"), "-c", str(ini), "--rootdir", str(suites),
           "--confcutdir", str(suites), "-p", "fastpath.pytest_plugin", "-p", "no:cacheprovider",
           "--import-mode=importlib", "-q", "--tb=short", "--no-header",
           "--fastpath-spec", str(spec), "--fastpath-tier", "smoke", "--fastpath-plan", str(plan),
           "--fastpath-rows", str(rows / f"{suite}.jsonl"), "--fastpath-suite", suite]
    if sel.select:
        cmd += ["-k", sel.select]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def run_one(set_cfg: dict, mutant: Mutant | None, sel: Selection, keep: bool, timeout: int) -> Outcome:
    name = mutant.name if mutant else "clean (unpatched)"
    out = Outcome(name, mutant.kind if mutant else "-", mutant.expected_gate if mutant else "-", sel.only, None,
                  sel.select, sel.kernel)
    t0 = time.time()
    workdir = Path(tempfile.mkdtemp(prefix=f"fp-mutant-{name.split()[0]}-"))
    try:
        root = make_copy(set_cfg, workdir)
        if mutant is not None:
            apply_edits(root, mutant.edits, set_cfg["allowed"])
        else:
            where = probe_copy(set_cfg, root)
            if not where.startswith(str(root)):
                out.error = f"the subprocess imports {set_cfg['probe']} from {where}, not from the copy"
                return out
        run_dir = workdir / "run"
        run_dir.mkdir()
        try:
            proc = _run_selection(root, root / set_cfg["spec"], subprocess_env(root), run_dir, sel, timeout)
            out.exit_code = proc.returncode
            ok_codes = (0, 1, 3) if not (sel.select or sel.kernel) else (0, 1)
            if proc.returncode not in ok_codes:
                out.error = f"exit {proc.returncode}: {(proc.stdout + proc.stderr)[-400:]}"
        except subprocess.TimeoutExpired:
            out.error = f"timed out after {timeout}s"
        except RuntimeError as exc:
            out.error = str(exc)
        out.failing_gates, out.rows = failing_gates(run_dir)
        if not out.error and out.rows == 0:
            out.error = "the run produced no result rows"
    except PatchError as exc:
        out.error = f"patch: {exc}"
    finally:
        out.seconds = time.time() - t0
        if keep:
            print(f"kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


def table(outcomes: list[Outcome], clean: Outcome | None) -> str:
    lines = ["| defect | kind | expected gate | run | failing gates | caught | s |",
             "|---|---|---|---|---|---|---|"]
    for o in outcomes:
        run = Selection(o.only, o.select, o.kernel).describe()
        gates = ", ".join(o.failing_gates) or "-"
        if o.error:
            gates = f"ERROR: {o.error[:160]}"
        lines.append(f"| {o.name} | {o.kind} | {o.expected_gate} | {run} | {gates} | "
                     f"{'yes' if o.caught else 'NO'} | {o.seconds:.0f} |")
    for c in clean or []:
        run = Selection(c.only, c.select, c.kernel).describe()
        verdict = "pass" if c.clean_pass else f"FAIL: {c.error or ', '.join(c.failing_gates)}"
        lines.append(f"| (unpatched) | - | - | {run} | {verdict} | - | {c.seconds:.0f} |")
    return "\n".join(lines)


def clean_selections(sels: list[Selection]) -> list[Selection]:
    """The unpatched runs covering every mutant's selection: whole-suite verify runs for the
    suites some mutant runs whole, plus one direct run per other suite with the union (``or``)
    of the -k selections and the narrowed kernels."""
    if any(not s.only for s in sels):
        return [Selection([])]
    whole = sorted({x for s in sels if not s.select and not s.kernel for x in s.only})
    out = [Selection(whole)] if whole else []
    narrowed: dict[str, list[Selection]] = {}
    for s in sels:
        if (s.select or s.kernel) and s.only[0] not in whole:
            narrowed.setdefault(s.only[0], []).append(s)
    for suite, group in sorted(narrowed.items()):
        kernels = sorted({s.kernel for s in group if s.kernel})
        if len(kernels) > 1 or (kernels and any(not s.kernel for s in group)):
            out.append(Selection([suite]))  # mixed narrowing: run the whole suite
            continue
        selects = [s.select for s in group if s.select]
        expr = "" if len(selects) < len(group) else " or ".join(f"({x})" for x in dict.fromkeys(selects))
        out.append(Selection([suite], expr, kernels[0] if kernels else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=sorted(SETS), default="real")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--mutant", action="append", help="run only this mutant (repeatable)")
    ap.add_argument("--no-clean", action="store_true", help="skip the unpatched run")
    ap.add_argument("--full", action="store_true", help="run every suite for every mutant (no --only)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per verify run")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies")
    ap.add_argument("--json", type=Path, help="write the outcomes as JSON here")
    ap.add_argument("--gate-override", action="append", default=[], metavar="GATE.KEY=VALUE",
                    help="change a gate setting in the copies' spec (printed with the table)")
    args = ap.parse_args(argv)
    GATE_OVERRIDES.clear()
    for item in args.gate_override:
        lhs, _, value = item.partition("=")
        gate, _, key = lhs.partition(".")
        if not (gate and key and value):
            ap.error(f"--gate-override {item!r}: expected GATE.KEY=VALUE")
        GATE_OVERRIDES.append((gate, key, value))

    cfg = SETS[args.set]
    mutants = load_mutants(cfg["patches"])
    if args.mutant:
        mutants = [m for m in mutants if m.name in args.mutant]
    if not mutants:
        print(f"no mutants in {cfg['patches']}", file=sys.stderr)
        return 2
    kinds = [m.kind for m in mutants]
    if len(set(kinds)) != len(kinds) and not args.mutant:
        print("two mutants share a kind: each defect must be of a distinct kind", file=sys.stderr)
        return 2
    sels = [Selection([] if args.full else m.only, "" if args.full else m.select, "" if args.full else m.kernel)
            for m in mutants]
    clean_sels = [] if args.no_clean else clean_selections(sels)

    t0 = time.time()
    jobs: list[tuple[Mutant | None, Selection]] = [(None, c) for c in clean_sels]
    jobs += list(zip(mutants, sels))
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_one, cfg, m, sel, args.keep, args.timeout) for m, sel in jobs]
        results = [f.result() for f in futures]
    clean = results[:len(clean_sels)]
    outcomes = results[len(clean_sels):]
    if GATE_OVERRIDES:
        print("gate overrides in the copies' spec: " + ", ".join(f"{g}.{k}={v}" for g, k, v in GATE_OVERRIDES))
    print(table(outcomes, clean))
    caught = sum(o.caught for o in outcomes)
    clean_ok = all(c.clean_pass for c in clean)
    ok = caught == len(outcomes) and clean_ok
    print(f"\n{caught}/{len(outcomes)} defects caught by their gate; clean run(s) "
          f"{'skipped' if args.no_clean else ('pass' if clean_ok else 'FAIL')}; "
          f"{time.time() - t0:.0f}s with {args.jobs} parallel runs")
    if args.json:
        args.json.write_text(json.dumps({"set": args.set, "ok": ok, "seconds": time.time() - t0,
                                         "clean": [c.__dict__ | {"passed": c.clean_pass} for c in clean],
                                         "mutants": [o.__dict__ | {"caught": o.caught} for o in outcomes]},
                                        indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
