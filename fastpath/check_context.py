"""What `fastpath check` knows while it judges one bundle: the tree's spec, the bundle's files
read lazily (each at most once, each malformed one a rule failure), and the tiers."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from fastpath.bundle import ROWS

TIERS = ("smoke", "full")  # ascending strength
FRESHNESS = ("enforce", "warn")


class Fail(Exception):
    """Raised inside a rule: the rule fails with this reason."""


class BadInput(Exception):
    """The check cannot start (missing file, not a bundle, unreadable trust policy or spec): exit 2."""


# --- the tree's spec -------------------------------------------------------------------------

def declared_spec(source_root: Path, spec: Path | None = None) -> Path:
    """The spec the tree declares: ``spec`` (relative to the source root, else to the current
    directory; inside the source tree either way) or the
    ``[tool.fastpath] default_spec`` of its pyproject.toml; BadInput if there is none."""
    root = Path(source_root).resolve()
    if spec is None:
        pyproject = root / "pyproject.toml"
        try:
            rel = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["fastpath"]["default_spec"]
        except (OSError, UnicodeDecodeError, KeyError, TypeError, tomllib.TOMLDecodeError):
            raise BadInput(f"{pyproject} has no [tool.fastpath] default_spec; pass --spec PATH") from None
        if not isinstance(rel, str):
            raise BadInput(f"{pyproject}: [tool.fastpath] default_spec is not a string")
        spec = Path(rel)
    path = (root / spec).resolve()
    if not path.is_file() and Path(spec).resolve().is_file():
        path = Path(spec).resolve()  # given relative to the current directory instead
    if not path.is_relative_to(root):
        raise BadInput(f"spec {spec} is outside the source tree {root}")
    if not path.is_file():
        raise BadInput(f"no spec file {path}; pass --spec PATH (relative to --source)")
    return path


# --- context ---------------------------------------------------------------------------------

def default_plan_cases(spec_path: Path, tier: str) -> dict:
    """Plan JSON recomputed from a spec file (part A's spec + plan modules)."""
    from fastpath.plan import build_plan
    from fastpath.spec import load_spec

    return build_plan(load_spec(spec_path), tier).to_json()


@dataclass
class Context:
    bundle_path: Path
    trust_path: Path
    source_root: Path
    require_tier: str | None
    plan_builder: Callable[[Path, str], dict]
    spec_path: Path  # the tree's declared spec (absolute)
    freshness: str = "enforce"
    dir: Path | None = None
    statement: dict | None = None
    signer_keyids: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    _cache: dict = field(default_factory=dict)

    def json(self, name: str) -> dict:
        if name not in self._cache:
            p = self.dir / name
            if not p.is_file():
                raise Fail(f"{name} is missing from the bundle")
            try:
                value = json.loads(p.read_bytes())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise Fail(f"{name} is not valid JSON: {e}") from e
            if not isinstance(value, dict):
                raise Fail(f"{name} is not a JSON object")
            self._cache[name] = value
        return self._cache[name]

    @property
    def tier(self) -> str:
        tier = self.json("summary.json").get("tier")
        if tier not in TIERS:
            raise Fail(f"summary.json tier {tier!r} is not one of {list(TIERS)}")
        return tier

    def tree_spec_rel(self) -> str:
        return self.spec_path.relative_to(self.source_root).as_posix()

    def judging_spec(self) -> Path:
        """The spec plan, hardware and gates are judged by: the tree's (enforce) or, with
        --freshness warn, the bundle's own spec.toml (integrity still fully checked)."""
        if self.freshness == "warn":
            bundled = self.dir / "spec.toml"
            if not bundled.is_file():
                raise Fail("spec.toml is missing from the bundle")
            return bundled
        return self.spec_path

    def judging_spec_data(self) -> dict:
        if "spec_data" not in self._cache:
            try:
                self._cache["spec_data"] = tomllib.loads(self.judging_spec().read_text(encoding="utf-8"))
            except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
                raise Fail(f"cannot read the spec {self.judging_spec().name}: {e}") from e
        return self._cache["spec_data"]

    def judging_spec_obj(self):
        if "spec_obj" not in self._cache:
            from fastpath.spec import load_spec

            try:
                self._cache["spec_obj"] = load_spec(self.judging_spec())
            except Exception as e:
                raise Fail(f"invalid spec: {e}") from e
        return self._cache["spec_obj"]

    def plan(self) -> dict:
        if "plan" not in self._cache:
            try:
                self._cache["plan"] = self.plan_builder(self.judging_spec(), self.tier)
            except Fail:
                raise
            except Exception as e:  # a bad tree spec is the reviewer's problem, but say so
                raise Fail(f"cannot build the plan from the spec: {e}") from e
        return self._cache["plan"]

    def rows(self) -> pd.DataFrame:
        if "rows" not in self._cache:
            p = self.dir / ROWS
            if not p.is_file():
                raise Fail(f"{ROWS} is missing from the bundle")
            try:
                df = pd.read_parquet(p)
            except Exception as e:
                raise Fail(f"{ROWS} is not readable Parquet: {e}") from e
            missing = {"case_id", "gate", "status", "passed"} - set(df.columns)
            if missing:
                raise Fail(f"{ROWS} lacks columns {sorted(missing)}")
            self._cache["rows"] = df
        return self._cache["rows"]
