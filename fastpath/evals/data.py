"""Documents for the eval tasks: the user's local files, and the loaders lm-eval calls.

The suite writes the documents a run evaluates (generated, or chosen from ``data`` files) to
JSONL files and names them in the TaskManager's metadata (``mrcr_data``, ``aime25_data``); the
tasks' ``custom_dataset`` loaders below read them back, so lm-eval never reaches a hub.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any, Iterable


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a JSONL or parquet file, of every such file in a directory, or of a glob."""
    p = Path(path)
    files = sorted(p.glob("*.parquet")) + sorted(p.glob("*.jsonl")) if p.is_dir() else \
        [Path(f) for f in sorted(glob.glob(str(path)))]
    files = [f for f in files if f.suffix in (".parquet", ".jsonl", ".json")]
    if not files:
        raise FileNotFoundError(f"no .jsonl or .parquet data at {path}")
    rows: list[dict] = []
    for f in files:
        if f.suffix == ".parquet":
            import pandas as pd

            rows += [{k: _plain(v) for k, v in r.items()} for r in pd.read_parquet(f).to_dict(orient="records")]
        else:
            rows += [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows


def _plain(value: Any) -> Any:
    """numpy scalars from parquet as Python values (json and the row checks need them)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict, str)) else value


def write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    return path


def _test_split(path: str) -> dict:
    import datasets

    return {"test": datasets.Dataset.from_list(read_rows(path))}


def mrcr_dataset(mrcr_data: str, **_: Any) -> dict:
    """lm-eval ``custom_dataset`` of fastpath_mrcr (lm-eval passes every metadata key)."""
    return _test_split(mrcr_data)


def aime25_dataset(aime25_data: str, **_: Any) -> dict:
    """lm-eval ``custom_dataset`` of fastpath_aime25."""
    return _test_split(aime25_data)
