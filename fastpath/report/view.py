"""What the report reads from a bundle directory, read defensively.

The bundle is hostile input: any file may be missing, malformed or huge. Every accessor returns
a usable value and records what it could not read in ``problems``, which the page shows: a report
always renders, and says what it could not show. Strings are capped here, before any template or
chart sees them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

MAX_TEXT = 2000          # characters of one cell (messages, names)
MAX_JSON_TEXT = 20_000   # characters of one pretty-printed evidence blob
MAX_JSON_FILE = 16 << 20  # bytes of a JSON file the report parses


def cap(value: Any, limit: int = MAX_TEXT) -> str:
    """A display string of at most ``limit`` characters (plus an ellipsis marker)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


def number(value: Any) -> float | None:
    """A finite float, or None for anything else (NA, strings, booleans, infinities stay None)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def integer(value: Any) -> int | None:
    f = number(value)
    return int(f) if f is not None and f == int(f) else None


def loads_object(text: Any) -> dict:
    """A row's detail/evidence column as a dict ({} when it is not a JSON object)."""
    if isinstance(text, dict):
        return text
    if not isinstance(text, str) or not text:
        return {}
    try:
        value = json.loads(text[:MAX_JSON_FILE])
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def pretty(value: Any) -> str:
    try:
        text = json.dumps(value, indent=1, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        text = str(value)
    return cap(text, MAX_JSON_TEXT)


@dataclass
class BundleView:
    """The files of one bundle directory, as the report uses them."""

    dir: Path
    problems: list[str] = field(default_factory=list)
    _cache: dict = field(default_factory=dict)

    def json(self, name: str) -> dict:
        if name not in self._cache:
            self._cache[name] = self._read_json(name)
        return self._cache[name]

    def _read_json(self, name: str) -> dict:
        path = self.dir / name
        if not path.is_file() or path.is_symlink():
            self.problems.append(f"{name} is missing")
            return {}
        if path.stat().st_size > MAX_JSON_FILE:
            self.problems.append(f"{name} is over {MAX_JSON_FILE >> 20} MiB: not read")
            return {}
        try:
            value = json.loads(path.read_bytes())
        except (ValueError, RecursionError) as e:
            self.problems.append(f"{name} is not valid JSON ({cap(e, 200)})")
            return {}
        if not isinstance(value, dict):
            self.problems.append(f"{name} is not a JSON object")
            return {}
        return value

    def rows(self) -> pd.DataFrame:
        """results/rows.parquet with every documented column (missing ones empty)."""
        if "rows" not in self._cache:
            self._cache["rows"] = self._read_rows()
        return self._cache["rows"]

    def _read_rows(self) -> pd.DataFrame:
        from fastpath.results import COLUMNS

        path = self.dir / "results" / "rows.parquet"
        df = pd.DataFrame(columns=list(COLUMNS))
        if not path.is_file() or path.is_symlink():
            self.problems.append("results/rows.parquet is missing")
            return df
        try:
            df = pd.read_parquet(path)
        except Exception as e:  # hostile bytes: any reader error is a problem to show, not a crash
            self.problems.append(f"results/rows.parquet is not readable ({cap(e, 200)})")
            return pd.DataFrame(columns=list(COLUMNS))
        for col in COLUMNS:
            if col not in df.columns:
                df[col] = None
        # object dtype: every cell is then a plain Python value or None, whatever the file held.
        df = df[list(COLUMNS)].astype(object).where(df[list(COLUMNS)].notna(), None)
        return df.reset_index(drop=True)

    def records(self) -> list[dict]:
        """The rows as dicts, computed once (every section reads them; do not mutate)."""
        if "records" not in self._cache:
            self._cache["records"] = self.rows().to_dict("records")
        return self._cache["records"]

    def text(self, name: str, limit: int = 200_000) -> str | None:
        path = self.dir / name
        if not path.is_file() or path.is_symlink():
            return None
        with open(path, "rb") as f:
            return cap(f.read(limit + 1).decode("utf-8", "replace"), limit)
