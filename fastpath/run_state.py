"""The run directory's state (DIR/state, laid out in fastpath/verify.py's docstring): what
``--resume`` continues from; a torn or hand-edited file is a usage error naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from fastpath.errors import UsageError
from fastpath.plan import Plan
from fastpath.results import RowWriter, make_row, read_rows, write_json_atomic

# A sharded suite's retry pass: the cases its shards released (out of GPU memory beside the other
# shards), run alone once every shard has ended (suite_workers); its files are <suite>.retry.*
RETRY = (0, 0)
RELEASED = "released"  # claims/<suite>/released/<case>: the cases given back for the retry


class RunState:
    """The files under DIR/state (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.root = run_dir / "state"

    @property
    def exists(self) -> bool:
        return (self.root / "run.json").is_file()

    def _load(self, path: Path) -> Any:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _torn(path, str(exc).splitlines()[0]) from None

    def run_info(self) -> dict:
        path = self.root / "run.json"
        info = self._load(path)
        keys = ("spec_path", "spec_digest", "tier", "suites_dir", "repo_root")
        bad = [k for k in keys if not isinstance(info, dict) or not isinstance(info.get(k), str)]
        if bad:
            raise _torn(path, f"missing or non-string {', '.join(bad)}")
        if not isinstance(info.get("attested", {}), dict):
            raise _torn(path, "attested is not an object")
        if not isinstance(info.get("machine", ""), str):
            raise _torn(path, "machine is not a string")
        return info

    def rows_path(self, suite: str, shard: tuple[int, int] = (0, 1)) -> Path:
        return self.root / "rows" / f"{shard_name(suite, shard)}.jsonl"

    def log_path(self, suite: str, shard: tuple[int, int] = (0, 1)) -> Path:
        return self.root / "logs" / f"{shard_name(suite, shard)}.log"

    def finished_path(self, suite: str, shard: tuple[int, int] = (0, 1)) -> Path:
        """The case ids an attempt finished, one a line, each written once all its rows were
        (``--fastpath-finished``): what a resume keeps of an interrupted attempt."""
        return self.root / "finished" / f"{shard_name(suite, shard)}.txt"

    def kept_path(self, suite: str) -> Path:
        """Rows of the cases earlier, interrupted attempts finished (``keep_finished``): the next
        attempt skips those cases (``--fastpath-kept``) and its rows join them when it is done."""
        return self.root / "kept" / f"{suite}.jsonl"

    def keep_finished(self, suite: str) -> int:
        """Before an unfinished suite runs again: keep the rows of every case its earlier attempts
        finished without an error row (any shard's, its retry's, a crashed attempt's), drop the
        rest (a case cut off mid-way is not evidence; one that hit an error gets another try), and
        clear the attempts' files. Returns how many cases are kept."""
        attempts, notes = self._attempt_files("rows", suite, ".jsonl"), self._attempt_files("finished", suite, ".txt")
        finished = {line.strip() for p in notes if p.is_file()
                    for line in p.read_text(encoding="utf-8").splitlines() if line.strip()}
        kept = self.kept_rows(suite)
        kept_ids = {r["case_id"] for r in kept}
        new = [r for path in attempts if path.is_file() for r in self._rows(path)
               if r["case_id"] in finished and r["case_id"] not in kept_ids]
        errored = {r["case_id"] for r in new if r["status"] == "error"}
        kept += [r for r in new if r["case_id"] not in errored]
        if kept:
            self.kept_path(suite).parent.mkdir(parents=True, exist_ok=True)
            tmp = self.kept_path(suite).with_suffix(".tmp")
            with RowWriter(tmp) as writer:
                for row in kept:
                    writer.write(row)
            tmp.replace(self.kept_path(suite))
        self._keep_logs(suite, len({r["case_id"] for r in kept}))
        for path in [*attempts, *notes]:
            path.unlink(missing_ok=True)
        return len({r["case_id"] for r in kept})

    def _keep_logs(self, suite: str, kept: int) -> None:
        """The cut-off attempt's logs go with its kept cases (the bundle's suite log shows every
        attempt: what the kept cases printed, and that the suite was resumed)."""
        logs = [p for p in self._attempt_files("logs", suite, ".log") if p.is_file()]
        if not logs:
            return
        heading = f"== an earlier attempt, cut off: {kept} finished case(s) kept, the others run again\n"
        text = heading + "".join(f"-- {p.name}\n" + p.read_text(encoding="utf-8", errors="replace") for p in logs)
        path = self.root / "kept" / f"{suite}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as out:
            out.write(text)
        for p in logs:
            p.unlink()

    def kept_rows(self, suite: str) -> list[dict]:
        path = self.kept_path(suite)
        return self._rows(path) if path.is_file() else []

    def join_kept(self, suite: str) -> None:
        """A suite that ended: its kept rows join the new attempt's, in plan order (the bundle
        shows every case). Ended "done", the attempt's notes go; ended "crashed" (it runs again on
        resume), the kept cases are noted as finished again, so that resume keeps them too."""
        kept, status = self.kept_path(suite), (self.marker(suite) or {}).get("status")
        if status is None:
            return
        if kept.is_file():
            if status != "done":
                self.finished_path(suite).parent.mkdir(parents=True, exist_ok=True)
                with open(self.finished_path(suite), "a", encoding="utf-8") as note:
                    note.writelines(f"{c}\n" for c in dict.fromkeys(r["case_id"] for r in self.kept_rows(suite)))
            rows = self.rows_path(suite)
            lines = kept.read_text(encoding="utf-8").splitlines(keepends=True)
            lines += rows.read_text(encoding="utf-8").splitlines(keepends=True) if rows.is_file() else []
            _in_plan_order(lines, self.case_order(suite))
            tmp = rows.with_suffix(".tmp")
            tmp.write_text("".join(lines), encoding="utf-8")
            tmp.replace(rows)
            kept.unlink()
        kept_log, log = self.root / "kept" / f"{suite}.log", self.log_path(suite)
        if kept_log.is_file():
            attempt = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(kept_log.read_text(encoding="utf-8") + "== the attempt that ended the suite\n" + attempt,
                           encoding="utf-8")
            kept_log.unlink()
        for note in self._attempt_files("finished", suite, ".txt") if status == "done" else []:
            note.unlink(missing_ok=True)

    def _attempt_files(self, folder: str, suite: str, suffix: str) -> list[Path]:
        """The suite's files in ``folder``: the whole suite's, its shards', its retry's."""
        where = self.root / folder
        return [where / f"{suite}{suffix}", *sorted(where.glob(f"{suite}.shard-*{suffix}")),
                where / f"{suite}.retry{suffix}"]

    def _rows(self, path: Path) -> list[dict]:
        try:
            rows = read_rows(path)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _torn(path, str(exc).splitlines()[0]) from None
        if not all(isinstance(r, dict) and isinstance(r.get("case_id"), str) and "status" in r for r in rows):
            raise _torn(path, "a line is not a result row")
        return rows

    def claims_dir(self, suite: str) -> Path:
        """Where a sharded suite's shards claim its cases (``--fastpath-claims``)."""
        return self.root / "claims" / suite

    def clear_claims(self, suite: str) -> None:
        """Before a sharded suite's shards start: an earlier attempt's claims name cases whose rows
        were forgotten with it."""
        shutil.rmtree(self.claims_dir(suite), ignore_errors=True)

    def marker(self, suite: str, shard: tuple[int, int] = (0, 1)) -> dict | None:
        path = self.root / "done" / f"{shard_name(suite, shard)}.json"
        if not path.is_file():
            return None
        marker = self._load(path)
        if not isinstance(marker, dict) or not isinstance(marker.get("status"), str):
            raise _torn(path, "not a completion marker")
        return marker

    def mark(self, suite: str, status: str, shard: tuple[int, int] = (0, 1), **info: Any) -> None:
        write_json_atomic({"suite": suite, "status": status, **info},
                          self.root / "done" / f"{shard_name(suite, shard)}.json")

    def forget(self, suite: str, shard: tuple[int, int] = (0, 1)) -> None:
        """Before a suite (or shard) runs again: an interrupted attempt's rows are not evidence,
        and an old marker must not stand for this attempt (a worker that dies leaves none)."""
        self.rows_path(suite, shard).unlink(missing_ok=True)
        self.finished_path(suite, shard).unlink(missing_ok=True)
        (self.root / "done" / f"{shard_name(suite, shard)}.json").unlink(missing_ok=True)

    def crashed(self, suite: str, message: str, shard: tuple[int, int] = (0, 1)) -> None:
        """A suite (or shard) that could not run: one error row says why; its cases end up 'no result'."""
        with RowWriter(self.rows_path(suite, shard)) as writer:
            writer.write(make_row(suite, f"{suite}/suite", "", "suite", status="error", message=message))
        self.mark(suite, "crashed", shard, message=message)

    def released(self, suite: str) -> list[str]:
        """The claims a sharded suite's shards gave back (cases out of GPU memory beside others)."""
        folder = self.claims_dir(suite) / RELEASED
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def merge_shards(self, suite: str, n: int, case_order: list[str] | None = None,
                     retry: bool = False) -> list[dict | None]:
        """The suite's rows, log and marker from its ``n`` shards' and, with ``retry``, its retry's
        (rows in ``case_order``, the plan's, whichever shard ran a case -- else in shard order --,
        logs in shard order, "done" iff every shard was; the shard files and claims removed);
        returns the shards' markers."""
        shards = [(i, n) for i in range(n)] + ([RETRY] if retry else [])
        markers = [self.marker(suite, sh) for sh in shards]
        rows, log = self.rows_path(suite), self.log_path(suite)
        lines = [line for sh in shards if (p := self.rows_path(suite, sh)).is_file()
                 for line in p.read_text(encoding="utf-8").splitlines(keepends=True)]
        if case_order:
            _in_plan_order(lines, case_order)
        rows.write_text("".join(lines), encoding="utf-8")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(_shard_heading(sh) + (p.read_text(encoding="utf-8") if p.is_file() else "")
                               for sh in shards for p in [self.log_path(suite, sh)]), encoding="utf-8")
        for sh in shards:
            for path in (self.rows_path(suite, sh), self.log_path(suite, sh),
                         self.root / "done" / f"{shard_name(suite, sh)}.json"):
                path.unlink(missing_ok=True)
        self.clear_claims(suite)
        crashed = [m for m in markers if (m or {}).get("status") != "done"]
        if crashed:
            self.mark(suite, "crashed", message=(crashed[0] or {}).get("message") or "a shard never finished")
        else:
            self.mark(suite, "done", pytest_exit=max(m["pytest_exit"] for m in markers), shards=n,
                      **({"retried_alone": retry} if retry else {}))
        return markers

    def case_order(self, suite: str) -> list[str]:
        """The suite's case ids in the run's plan order (its cases, then those it waived)."""
        plan_path = self.root / "plan.json"
        plan = Plan.from_json(self._load(plan_path))
        cases, waivers = plan.for_suite(suite)
        return [c.case_id for c in cases] + [w.case.case_id for w in waivers]

    def suite_state(self, plan: Plan) -> dict[str, str]:
        return {s: (self.marker(s) or {}).get("status", "not_run") for s in plan.suites}

    def all_rows(self, plan: Plan) -> list[dict]:
        """Rows of the suites that finished; rows of an interrupted attempt do not count."""
        rows: list[dict] = []
        for suite in plan.suites:
            if self.marker(suite) is not None:
                rows += self._rows(self.rows_path(suite))
            self.kept_rows(suite)  # a torn or edited kept file fails a resume before any suite runs
        return rows


def _in_plan_order(lines: list[str], case_order: list[str]) -> None:
    """Sort row lines by their case's place in the plan, in place (stable: a case's rows keep
    their order; a line of no planned case goes last)."""
    rank = {case_id: i for i, case_id in enumerate(case_order)}
    lines.sort(key=lambda line: rank.get(_case_id(line), len(rank)))


def _case_id(line: str) -> str | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None  # a torn line: all_rows names the file when it reads it
    return row.get("case_id") if isinstance(row, dict) else None


def shard_name(suite: str, shard: tuple[int, int]) -> str:
    """A suite's file stem, or one shard's (``verify --jobs`` splits long suites), or its retry's."""
    i, n = shard
    if shard == RETRY:
        return f"{suite}.retry"
    return suite if n == 1 else f"{suite}.shard-{i + 1}-of-{n}"


def _shard_heading(shard: tuple[int, int]) -> str:
    if shard == RETRY:
        return "== retried alone: the cases that ran out of GPU memory beside the other shards\n"
    return f"== shard {shard[0] + 1} of {shard[1]}\n"


def _torn(path: Path, detail: str) -> UsageError:
    return UsageError(f"run state {path} is unreadable or was edited ({detail})",
                      "this run cannot be resumed: start a new one with a new --out")
