"""Result rows (docs/architecture.md "Result rows"): build, append crash-safely, load, write.

While suites run, rows are appended to a JSONL file with flush + fsync per row, so a crash
loses at most the row being written (a torn last line is ignored on load). At the end they
become one pandas DataFrame with fixed dtypes, written as Parquet; JSON goes through
``write_json_atomic`` (temp file + os.replace) so readers never see half a file.
"""

from __future__ import annotations

import json
import math
import operator
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

COMPARATORS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}
# The row statuses, in one place: status -> (the `passed` values it allows, gates on it, meaning).
# `info` rows are reported but never gate (smoke-tier perf rows, comparisons beside the gated one):
# later suites add rows of this status instead of new statuses.
STATUS_TABLE: dict[str, tuple[frozenset[bool], bool, str]] = {
    "pass": (frozenset({True}), True, "the check ran and met its threshold"),
    "fail": (frozenset({False}), True, "the check ran and missed its threshold"),
    "error": (frozenset({False}), True, "the check could not run (crash, missing result): fails its gate"),
    "waived": (frozenset({False}), True, "not run, with the reason in message (plan waiver or run-time)"),
    "info": (frozenset({True, False}), False, "reported, not gated; passed is the comparison's outcome"),
}
STATUSES = tuple(STATUS_TABLE)
GATING_STATUSES = tuple(s for s, (_, gates, _) in STATUS_TABLE.items() if gates)


def row_status_problem(status: Any, passed: Any) -> str | None:
    """Why a row's (status, passed) pair is invalid, or None."""
    if status not in STATUS_TABLE:
        return f"row status {status!r} is not one of {', '.join(STATUSES)}"
    if not isinstance(passed, (bool, np.bool_)):
        return f"row passed {passed!r} is not a boolean"
    if bool(passed) not in STATUS_TABLE[status][0]:
        return f"row passed={bool(passed)} contradicts its status {status!r}"
    return None

# Column -> pandas dtype. Nullable types so missing config values stay missing, not 0/"".
COLUMNS: dict[str, str] = {
    "suite": "string",
    "case_id": "string",
    "gate": "string",
    "metric": "string",
    "value": "float64",
    "threshold": "float64",
    "comparator": "string",
    "status": "string",
    "passed": "bool",
    "tp": "Int64",
    "batch": "Int64",
    "context": "Int64",
    "draft": "Int64",
    "dtype": "string",
    "path": "string",
    "component": "string",
    "kernel": "string",
    "detail": "string",
    "evidence": "string",
    "message": "string",
}
CONFIG_COLUMNS = ("tp", "batch", "context", "draft", "dtype", "path", "component", "kernel")


def _json_text(value: Any) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def compare(value: float, comparator: str, threshold: float) -> bool:
    """``value <comparator> threshold``; NaN never passes."""
    if comparator not in COMPARATORS:
        raise ValueError(f"comparator {comparator!r} is not one of {', '.join(COMPARATORS)}")
    if value is None or threshold is None or math.isnan(value) or math.isnan(threshold):
        return False
    return bool(COMPARATORS[comparator](value, threshold))


def make_row(suite: str, case_id: str, gate: str | None, metric: str, value: Any = None, *,
             threshold: float | None = None, comparator: str | None = None, passed: bool | None = None,
             status: str | None = None, evidence: Any = None, message: str = "", detail: Any = None,
             **config: Any) -> dict:
    """One row as a plain dict with every column.

    ``passed`` is computed from ``comparator``/``threshold`` when not given; config keys that
    are not columns go into ``detail`` (JSON) so nothing recorded is lost.
    """
    value_f = float("nan") if value is None else float(value)
    threshold_f = None if threshold is None else float(threshold)
    if comparator is not None and comparator not in COMPARATORS:
        raise ValueError(f"comparator {comparator!r} is not one of {', '.join(COMPARATORS)}")
    if status is not None and status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    if status in ("error", "waived"):
        passed = False
    elif passed is None and status == "info" and (comparator is None or threshold_f is None):
        passed = False
    elif passed is None:
        if comparator is None or threshold_f is None:
            raise ValueError("a row needs passed=, or comparator= and threshold= to compute it")
        passed = compare(value_f, comparator, threshold_f)
    passed = bool(passed)
    if status is None:
        status = "pass" if passed else "fail"
    else:
        problem = row_status_problem(status, passed)
        if problem:
            raise ValueError(problem)

    extra = {k: v for k, v in config.items() if k not in CONFIG_COLUMNS}
    detail_obj = json.loads(_json_text(detail)) if detail is not None else {}
    if extra:
        detail_obj = {**detail_obj, **extra} if isinstance(detail_obj, dict) else {"detail": detail_obj, **extra}
    row = {
        "suite": suite, "case_id": case_id, "gate": gate or "", "metric": metric, "value": value_f,
        "threshold": threshold_f, "comparator": comparator, "status": status, "passed": passed,
        **{k: config.get(k) for k in CONFIG_COLUMNS},
        "detail": _json_text(detail_obj), "evidence": _json_text(evidence), "message": message or "",
    }
    return row


class RowWriter:
    """Appends rows to a JSONL file; each row is on disk (fsync) before ``write`` returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, row: dict) -> None:
        # NaN is not JSON; store it as null and restore on load.
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        self._file.write(json.dumps(clean, sort_keys=True, default=str) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_rows(path: str | Path) -> list[dict]:
    """Rows of one JSONL file; a torn final line (crash mid-write) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break  # torn by a crash: the row was never complete
            raise
    return rows


def rows_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """A DataFrame with exactly COLUMNS, in order, with their fixed dtypes."""
    df = pd.DataFrame(list(rows), columns=list(COLUMNS))
    for col, dtype in COLUMNS.items():
        if dtype == "bool":
            df[col] = df[col].fillna(False).astype(bool)
        elif dtype == "float64":
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
        else:
            df[col] = df[col].astype(dtype)
    return df.reset_index(drop=True)


def write_json_atomic(obj: Any, path: str | Path) -> None:
    path = Path(path)
    _atomic_write(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def write_parquet(df: pd.DataFrame, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        rows_frame(df.to_dict("records")).to_parquet(tmp, index=False, engine="pyarrow")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_parquet(path: str | Path) -> pd.DataFrame:
    return rows_frame(pd.read_parquet(path, engine="pyarrow").to_dict("records"))


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
