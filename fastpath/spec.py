"""Load and strictly validate a fast-path spec (``fastpath.toml``, DESIGN §3.1).

The schema is data (``SCHEMA`` below), so every rule is visible in one place and every error
can name the file, the key path (``scope.batch_sizes[2]``), the bad value, what is allowed and
the line where the key is written. All errors of a file are reported at once.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpath.errors import SpecError

SUITES = ("coverage", "kernels", "parity", "features", "evals", "perf")
TIERS = ("smoke", "full")
DTYPES = ("float32", "float16", "bfloat16")
STRUCTURED_KINDS = ("json_schema", "regex")
# Reasons the trace may record when the fast path declines a step (docs/architecture.md).
FALLBACK_REASONS = ("prefill", "mixed_batch", "batch_out_of_scope", "context_out_of_scope", "fast_path_unavailable",
                    "draft_out_of_scope", "verify_rows_out_of_scope")
ENGINE_RE = re.compile(r"^[A-Za-z_][\w.-]*$|^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
ARCH_RE = re.compile(r"^sm_\d{2,3}a?$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
VARIANT_RE = re.compile(r"[a-z][a-z0-9_]*")  # a coverage variant: the tail of its case ids


@dataclass(frozen=True)
class Field:
    """One node of the schema. ``kind``: str|int|number|bool|list|table|map|data."""

    kind: str
    required: bool = False
    allowed: tuple | None = None  # exact allowed values
    pattern: re.Pattern | None = None  # for str: must match
    pattern_doc: str = ""
    minimum: int | float | None = None
    nonempty: bool = False  # lists: at least one item
    unique: bool = False  # lists: no duplicates
    items: "Field | None" = None  # list item schema
    fields: dict[str, "Field"] | None = None  # table: known keys
    rest: "Field | None" = None  # table: schema of keys not in fields (None = reject them)
    keys: tuple | None = None  # map: allowed keys (None = any)
    values: "Field | None" = None  # map: value schema


def _ints(minimum: int, required: bool = False) -> Field:
    return Field("list", required=required, nonempty=True, unique=True, items=Field("int", minimum=minimum))


# One tier of an eval task: documents (per bucket for MRCR), generated tokens, repeats, MRCR's
# power-of-two prompt buckets (tokens), AIME-format operations per generated problem.
_EVAL_TIER = Field("table", fields={
    "docs": Field("int", minimum=1),
    "max_gen_toks": Field("int", minimum=1),
    "repeats": Field("int", minimum=1),
    "buckets": Field("list", nonempty=True, unique=True, items=Field("int", minimum=2)),
    "steps": Field("int", minimum=1),
})

# Keys a tier may override in the scope (the slice of the scope it runs).
SCOPE_OVERRIDES = {
    "tensor_parallel": _ints(1),
    "batch_sizes": _ints(1),
    "context_lengths": _ints(1),
    "draft_lengths": _ints(0),
    "dcp_sizes": _ints(1),
}

SCHEMA = Field("table", fields={
    "fastpath": Field("table", required=True, fields={
        "schema": Field("int", required=True, allowed=(1,)),
        "name": Field("str", required=True, pattern=NAME_RE, pattern_doc="lowercase letters, digits, '.', '_', '-'"),
        "engine": Field("str", required=True, pattern=ENGINE_RE,
                        pattern_doc="a registered engine name or 'module:factory'"),
        "description": Field("str"),
    }),
    "switch": Field("table", required=True, fields={
        "key": Field("str", required=True),
        "value": Field("str", required=True),
    }),
    # What a bundle attests (fastpath/digest.py attested_parts): globs relative to the repo root.
    "sources": Field("table", required=True, fields={
        "globs": Field("list", required=True, nonempty=True, unique=True, items=Field("str")),  # the fast path
        "validation": Field("list", nonempty=True, unique=True, items=Field("str")),  # suites, harness
        "subject": Field("list", nonempty=True, unique=True, items=Field("str")),  # model code, weights
    }),
    "scope": Field("table", required=True, fields={
        "hardware": Field("list", required=True, nonempty=True, unique=True,
                          items=Field("str", pattern=ARCH_RE, pattern_doc="a CUDA arch such as 'sm_90'")),
        "tensor_parallel": _ints(1),
        "batch_sizes": _ints(1, required=True),
        "context_lengths": _ints(1, required=True),
        "draft_lengths": _ints(0),
        # the most rows (batch x (draft + 1)) a speculative verify step may have on the fast path;
        # larger verify steps fall back (verify_rows_out_of_scope) and the plan waives them
        "max_verify_rows": Field("int", minimum=1),
        "dcp_sizes": _ints(1),
        "fallbacks": Field("map", values=Field("str", allowed=FALLBACK_REASONS)),
    }),
    "features": Field("table", required=True, fields={
        "max_context": Field("int", required=True, minimum=1),
        "temperature_sampling": Field("bool"),
        "top_k": Field("bool"),
        "top_p": Field("bool"),
        "structured_output": Field("list", unique=True, items=Field("str", allowed=STRUCTURED_KINDS)),
        "speculative_decoding": Field("bool"),
    }),
    # Optional: the fast kernels to test; without it the kernels suite expands the registry.
    "kernels": Field("table", fields={
        "names": Field("list", required=True, nonempty=True, unique=True, items=Field("str")),
    }),
    # Optional: how the perf suite measures (fastpath.stats / fastpath.perf_timing).
    "perf": Field("table", fields={
        # >= 10: the percentile bootstrap of a median over fewer rounds under-covers (a true
        # 1.00x then passes more often than the nominal 2.5 %; tests/test_perf_stats.py)
        "rounds": Field("int", minimum=10),
        "replays": Field("int", minimum=1),  # CUDA-graph replays per timed segment
        "warmup": Field("int", minimum=0),  # untimed calls per path before the rounds
        "min_speedup": Field("number", minimum=0),
        "max_extra_batches": Field("int", minimum=0),  # more batches of rounds for a straddling case
        "confidence": Field("number", minimum=0.5),
        "control_confidence": Field("number", minimum=0.5),
        "control_tolerance": Field("number", minimum=0),
        "n_resamples": Field("int", minimum=100),
        "eager_rounds": Field("int", minimum=0),  # segments of standard_eager, reported beside
        "smoke_rounds": Field("int", minimum=1),  # CPU smoke tier: machinery only, not gated
        "smoke_replays": Field("int", minimum=1),
        # seconds from the suite's first case after which it stops before its next speedup case
        # (0: no limit): the run is incomplete, and `verify --resume` keeps the finished cases
        "budget_s": Field("number", minimum=0),
        # tokens a verify step emits per sequence (accepted + 1), per draft length > 0, declared
        # before measuring: perf's tokens/s and time per output token at that draft length are
        # computed from it and labelled synthetic (the step's time does not depend on acceptance)
        "synthetic_acceptance_length": Field("map", values=Field("number", minimum=1)),
        # decode on the evals suite's own prompts (perf/prompts cases: reported, not gated), on the
        # engine the tier runs suite `engine` with (e.g. "evals": a trained model routes for real)
        "prompt_decode": Field("table", fields={
            "engine": Field("str", required=True, allowed=SUITES),
            "batch_sizes": _ints(1, required=True),
        }),
    }),
    # Optional: what the evals suite evaluates (fastpath/evals; per task and tier, EVALS_DEFAULTS).
    "evals": Field("table", fields={
        "seed": Field("int", minimum=0),  # the generated documents and the per-request seeds
        "max_batch": Field("int", minimum=1),  # requests per engine call
        "max_prefill_tokens": Field("int", minimum=1),  # tokens one call prefills at most (runs, oracle rescoring)
        "budget_s": Field("number", minimum=0),  # after this, the re-batched floor is skipped (0: no limit)
        "mrcr": Field("table", fields={
            "needles": Field("list", nonempty=True, unique=True, items=Field("int", allowed=(2, 4, 8))),
            "data": Field("str"),  # openai/mrcr parquet (or JSONL) files instead of generated documents
            **{t: _EVAL_TIER for t in TIERS}}),
        "aime25": Field("table", fields={
            "data": Field("str"),  # JSONL or parquet rows with problem, answer instead of generated ones
            **{t: _EVAL_TIER for t in TIERS}}),
    }),
    # Optional: named engine options, pulled into a tier's options map by `use = "NAME"` (the map's
    # other keys laid over them), so e.g. a checkpoint's path and digest are written once
    "engine_option_sets": Field("map", values=Field("map", values=Field("data"))),
    "tiers": Field("map", required=True, keys=TIERS, values=Field("table", fields={
        "description": Field("str"),
        "engine_options": Field("map", values=Field("data")),
        # per suite, options laid over engine_options (e.g. parity on a trained checkpoint while
        # perf and kernels stay on the large random model)
        "suite_engine_options": Field("map", keys=SUITES, values=Field("map", values=Field("data"))),
        # coverage again on other engines (e.g. a second model config), each over its own slice of
        # the scope: cases coverage/...@NAME (plan.py)
        "coverage_variants": Field("map", values=Field("table", fields={
            "engine_options": Field("map", required=True, values=Field("data")),
            **SCOPE_OVERRIDES,
        })),
        "dtypes": Field("list", nonempty=True, unique=True, items=Field("str", allowed=DTYPES)),
        "max_context": Field("int", minimum=1),
        **SCOPE_OVERRIDES,
    })),
    "gates": Field("table", required=True, fields={
        "version": Field("str", required=True),
    }, rest=Field("table", fields={
        "suite": Field("str", required=True, allowed=SUITES),
        "description": Field("str"),
    }, rest=Field("data"))),
})

USE = "use"  # the key of an engine options map that names an [engine_option_sets] set

SCOPE_DEFAULTS = {"tensor_parallel": [1], "draft_lengths": [0], "max_verify_rows": None, "dcp_sizes": [1],
                  "fallbacks": {}}
PERF_DEFAULTS = {"rounds": 10, "replays": 30, "warmup": 5, "min_speedup": 1.0, "max_extra_batches": 1,
                 "confidence": 0.95, "control_confidence": 0.999, "control_tolerance": 0.01,
                 "n_resamples": 4000, "eager_rounds": 3, "smoke_rounds": 2, "smoke_replays": 1,
                 "budget_s": 0, "synthetic_acceptance_length": {}, "prompt_decode": None}
EVALS_DEFAULTS = {
    "seed": 0, "max_batch": 16, "max_prefill_tokens": 32768, "budget_s": 0,
    "mrcr": {"needles": [2, 4, 8],
             "smoke": {"buckets": [512, 2048], "docs": 3, "max_gen_toks": 3, "repeats": 1},
             "full": {"buckets": [1024, 2048, 4096, 8192, 16384, 32768], "docs": 4, "max_gen_toks": 320,
                      "repeats": 1}},
    "aime25": {"smoke": {"docs": 2, "max_gen_toks": 3, "repeats": 1, "steps": 3},
               "full": {"docs": 8, "max_gen_toks": 1600, "repeats": 1, "steps": 9}},
}
FEATURE_DEFAULTS = {"temperature_sampling": False, "top_k": False, "top_p": False,
                    "structured_output": [], "speculative_decoding": False}


@dataclass(frozen=True)
class Tier:
    name: str
    engine_options: dict[str, Any]
    scope: dict[str, Any]  # the spec's scope with this tier's overrides applied
    dtypes: list[str]
    max_context: int
    suite_engine_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    # coverage variant name -> {"engine_options": {...}, and scope overrides}
    coverage_variants: dict[str, dict[str, Any]] = field(default_factory=dict)

    def engine_options_for(self, suite: str | None, variant: str | None = None) -> dict[str, Any]:
        """The engine options ``suite`` runs with: engine_options, then its suite_engine_options,
        then (coverage) the variant's engine_options."""
        options = {**self.engine_options, **self.suite_engine_options.get(suite or "", {})}
        if variant is not None:
            options.update(self.coverage_variants[variant]["engine_options"])
        return options

    def coverage_variant(self, name: str) -> "Tier":
        """This tier as coverage runs variant ``name``: the variant's scope overrides laid over it."""
        v = self.coverage_variants[name]
        return dataclasses.replace(self, scope={**self.scope, **{k: v[k] for k in SCOPE_OVERRIDES if k in v}})


@dataclass(frozen=True)
class Gates:
    version: str
    settings: dict[str, dict[str, Any]]  # gate name -> its table (always has "suite")

    def names(self) -> list[str]:
        return list(self.settings)

    def suite_of(self, gate: str) -> str | None:
        return self.settings.get(gate, {}).get("suite")

    def for_suite(self, suite: str) -> list[str]:
        return [g for g, s in self.settings.items() if s["suite"] == suite]


@dataclass(frozen=True)
class Spec:
    path: Path
    name: str
    engine: str
    description: str
    switch: dict[str, str]
    source_globs: list[str]
    validation_globs: list[str] | None  # None: the defaults of fastpath.digest
    subject_globs: list[str] | None
    scope: dict[str, Any]
    features: dict[str, Any]
    kernel_names: list[str] | None
    tiers: dict[str, Tier]
    gates: Gates
    raw_text: str = field(repr=False)
    digest: str = ""  # sha256 hex of the file's bytes
    perf: dict[str, Any] = field(default_factory=lambda: _perf({}))  # [perf] over PERF_DEFAULTS
    evals: dict[str, Any] = field(default_factory=lambda: merge_evals({}))  # [evals] over EVALS_DEFAULTS

    @property
    def declared_sources(self) -> frozenset[str]:
        """[sources] keys written in the spec (their globs must match files)."""
        return frozenset(k for k, v in (("validation", self.validation_globs), ("subject", self.subject_globs)) if v)

    def tier(self, name: str) -> Tier:
        if name not in self.tiers:
            raise SpecError(
                f"{self.path}: tier {name!r} is not defined (defined: {', '.join(self.tiers) or 'none'})",
                f"add a [tiers.{name}] table to the spec or pick one of the defined tiers",
            )
        return self.tiers[name]

    def suites(self) -> list[str]:
        """Suites that own at least one gate, in the canonical order."""
        used = {s["suite"] for s in self.gates.settings.values()}
        return [s for s in SUITES if s in used]


# --------------------------------------------------------------------------- validation

def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)


def _fmt_path(parts: list) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


_KIND_DOC = {"str": "a string", "int": "an integer", "number": "a number", "bool": "true or false",
             "list": "an array", "table": "a table", "map": "a table", "data": "a value"}


class _Validator:
    def __init__(self) -> None:
        self.errors: list[tuple[list, str]] = []

    def err(self, path: list, message: str) -> None:
        self.errors.append((list(path), message))

    def check(self, value: Any, f: Field, path: list) -> None:
        kind = f.kind
        ok_type = {
            "str": isinstance(value, str),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "list": isinstance(value, list),
            "table": isinstance(value, dict),
            "map": isinstance(value, dict),
            "data": True,
        }[kind]
        if not ok_type:
            self.err(path, f"{value!r} is {_type_name(value)}; expected {_KIND_DOC[kind]}")
            return
        if f.allowed is not None and value not in f.allowed:
            self.err(path, f"{value!r} is not allowed; allowed values: {', '.join(map(repr, f.allowed))}")
        if f.pattern is not None and not f.pattern.match(value):
            self.err(path, f"{value!r} is not valid; expected {f.pattern_doc}")
        if f.minimum is not None and value < f.minimum:
            self.err(path, f"{value!r} is too small; expected {_KIND_DOC[kind]} >= {f.minimum}")
        if kind == "list":
            if f.nonempty and not value:
                self.err(path, "is empty; expected at least one item")
            seen: list = []
            for i, item in enumerate(value):
                if f.unique and item in seen:
                    self.err(path + [i], f"{item!r} is a duplicate")
                seen.append(item)
                if f.items is not None:
                    self.check(item, f.items, path + [i])
        elif kind == "table":
            self._table(value, f, path)
        elif kind == "map":
            for key, item in value.items():
                if f.keys is not None and key not in f.keys:
                    self.err(path + [key], f"unknown key {key!r}; allowed keys: {', '.join(map(repr, f.keys))}")
                    continue
                if f.values is not None:
                    self.check(item, f.values, path + [key])
        elif kind == "data":
            self._data(value, path)

    def _table(self, value: dict, f: Field, path: list) -> None:
        known = f.fields or {}
        for key, sub in known.items():
            if sub.required and key not in value:
                self.err(path + [key], f"required key is missing (expected {_KIND_DOC[sub.kind]})")
        for key, item in value.items():
            if key in known:
                self.check(item, known[key], path + [key])
            elif f.rest is not None:
                self.check(item, f.rest, path + [key])
            else:
                allowed = ", ".join(known) or "none"
                self.err(path + [key], f"unknown key {key!r}; allowed keys: {allowed}")

    def _data(self, value: Any, path: list) -> None:
        """Free settings: plain TOML data only (no dates: they would not round-trip to JSON)."""
        if isinstance(value, dict):
            for k, v in value.items():
                self._data(v, path + [k])
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self._data(v, path + [i])
        elif not isinstance(value, (str, int, float, bool)):
            self.err(path, f"{value!r} is {_type_name(value)}; expected a string, number, boolean, array or table")


def find_line(text: str, path: list) -> int | None:
    """Best-effort line number (1-based) where the key ``path`` is written in TOML ``text``.

    Scores each line by how many leading keys of the path it accounts for: a ``[a.b]`` header,
    a ``key =`` line inside the current table, and keys of inline tables on that line.
    """
    keys = [str(p) for p in path if not isinstance(p, int)]
    best, best_score = None, 0
    section: tuple[str, ...] = ()
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.split("#", 1)[0].strip()
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?$", stripped)
        if header:
            section = tuple(p.strip().strip("\"'") for p in header.group(1).split("."))
            n = len(section)
            score = n if tuple(keys[:n]) == section else 0
        else:
            n = len(section)
            score = 0
            m = re.match(r"^[\"']?([\w.-]+?)[\"']?\s*=", stripped)
            if m and tuple(keys[:n]) == section and len(keys) > n and m.group(1) == keys[n]:
                score = n + 1
                rest = stripped[m.end():]
                for deeper in keys[n + 1:]:
                    hit = re.search(rf"(?<![\w-])[\"']?{re.escape(deeper)}[\"']?\s*=", rest)
                    if not hit:
                        break
                    score += 1
                    rest = rest[hit.end():]
        if score > best_score:
            best, best_score = lineno, score
    return best


# --------------------------------------------------------------------------- loading

def load_spec(path: str | Path) -> Spec:
    """Read, validate and normalise a spec. Raises SpecError listing every problem."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"spec file {path} does not exist",
                        "pass the path of a fastpath.toml, or set [tool.fastpath] default_spec in pyproject.toml") from None
    except OSError as exc:
        raise SpecError(f"cannot read spec file {path}: {exc.strerror}", "check the path and its permissions") from None
    text = raw.decode("utf-8", errors="replace")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}", "fix the TOML syntax at the position shown") from None

    v = _Validator()
    v.check(data, SCHEMA, [])
    if not v.errors:
        _semantic_checks(data, v)
    if v.errors:
        lines = []
        for key_path, message in v.errors:
            line = find_line(text, key_path)
            where = f"{path}:{line}" if line else str(path)
            lines.append(f"{where}: {_fmt_path(key_path)}: {message}")
        raise SpecError(
            f"invalid spec ({len(lines)} problem{'s' if len(lines) > 1 else ''}):\n  " + "\n  ".join(lines),
            "edit the keys named above; the schema is fastpath/spec.py SCHEMA",
        )
    return _build(path, data, text, hashlib.sha256(raw).hexdigest())


def _semantic_checks(data: dict, v: _Validator) -> None:
    """Rules that relate several keys."""
    for key in ("globs", "validation", "subject"):
        for i, glob in enumerate(data["sources"].get(key, [])):
            parts = glob.replace("\\", "/").split("/")
            if not glob or glob.startswith("/") or ".." in parts or "\\" in glob:
                v.err(["sources", key, i], f"{glob!r} is not valid; expected a relative glob inside the repository")
    max_context = data["features"]["max_context"]
    for i, c in enumerate(data["scope"]["context_lengths"]):
        if c > max_context:
            v.err(["scope", "context_lengths", i], f"{c} exceeds features.max_context = {max_context}")
    rows = data["scope"].get("max_verify_rows")
    if rows is not None and not any(d > 0 for d in data["scope"].get("draft_lengths", [0])):
        v.err(["scope", "max_verify_rows"], f"{rows} is set but scope.draft_lengths has no draft > 0; "
              "expected it only with speculative decoding (drop it or declare a draft length)")
    if not data["tiers"]:
        v.err(["tiers"], "no tier defined; expected at least one of 'smoke', 'full'")
    for tier_name, tier in data["tiers"].items():
        options = [(["engine_options"], tier.get("engine_options", {}))]
        options += [(["suite_engine_options", s], o) for s, o in tier.get("suite_engine_options", {}).items()]
        for name, variant in tier.get("coverage_variants", {}).items():
            options.append((["coverage_variants", name, "engine_options"], variant.get("engine_options", {})))
            if not VARIANT_RE.fullmatch(name):
                v.err(["tiers", tier_name, "coverage_variants", name], f"{name!r} is not a valid variant name; "
                      "expected lowercase letters, digits and '_' (it ends case ids: coverage/decode/...@NAME)")
            limit = tier.get("max_context", max_context)
            for i, c in enumerate(variant.get("context_lengths", [])):
                if c > limit:
                    v.err(["tiers", tier_name, "coverage_variants", name, "context_lengths", i],
                          f"{c} exceeds the tier's max_context = {limit}")
        sets = data.get("engine_option_sets", {})
        for where, opts in options:
            use = opts.get(USE)
            if use is not None and (not isinstance(use, str) or use not in sets):
                v.err(["tiers", tier_name, *where, USE], f"{use!r} is not a set of [engine_option_sets]; expected one of "
                      f"{', '.join(map(repr, sorted(sets))) or '(none defined)'}")
                continue
            opts = _resolve_options(opts, sets)
            dtype = opts.get("dtype")
            if dtype is not None and dtype not in DTYPES:
                v.err(["tiers", tier_name, *where, "dtype"],
                      f"{dtype!r} is not allowed; allowed values: {', '.join(map(repr, DTYPES))}")
    for key in ("confidence", "control_confidence"):
        value = data.get("perf", {}).get(key)
        if value is not None and not value < 1:
            v.err(["perf", key], f"{value!r} is too large; expected a number < 1")
    _acceptance_checks(data, v)
    for tier in TIERS:
        for i, b in enumerate(data.get("evals", {}).get("mrcr", {}).get(tier, {}).get("buckets", [])):
            if b & (b - 1):
                v.err(["evals", "mrcr", tier, "buckets", i], f"{b} is not a power of two (MRCR buckets are 2^k tokens)")
    gates = [k for k in data["gates"] if k != "version"]
    if not gates:
        v.err(["gates"], "no gate defined; expected at least one [gates.NAME] table with a 'suite'")


def _acceptance_checks(data: dict, v: _Validator) -> None:
    """[perf] synthetic_acceptance_length: keys are draft lengths K >= 1, values 1 <= AL <= K + 1,
    and, with features.speculative_decoding, every draft length > 0 of the scope or a tier has
    one (perf could not count its tokens)."""
    where = ["perf", "synthetic_acceptance_length"]
    declared = data.get("perf", {}).get("synthetic_acceptance_length", {})
    for key, al in declared.items():
        if not (key.isdigit() and int(key) >= 1):
            v.err(where + [key], f"{key!r} is not a draft length; expected an integer >= 1 as the key")
        elif not al <= int(key) + 1:
            v.err(where + [key], f"{al!r} is out of range; expected 1 <= acceptance length <= draft + 1 = {int(key) + 1}")
    if not data["features"].get("speculative_decoding"):
        return  # the plan prunes every draft case
    drafts = set(data["scope"].get("draft_lengths", [0]))
    for t in data["tiers"].values():
        drafts |= set(t.get("draft_lengths", []))
    for k in sorted(d for d in drafts if d > 0 and str(d) not in declared):
        v.err(where, f"draft length {k} is in scope but has no acceptance length; add {k} = AL "
                     f"(1 <= AL <= {k + 1}) to [perf] synthetic_acceptance_length")


def acceptance_length(perf: dict, draft: int) -> float:
    """Tokens a step emits per sequence: 1 at draft 0, else the declared synthetic value."""
    if draft == 0:
        return 1.0
    try:
        return float(perf["synthetic_acceptance_length"][draft])
    except KeyError:
        raise SpecError(f"draft length {draft} has no [perf] synthetic_acceptance_length",
                        f"add {draft} = AL (1 <= AL <= {draft + 1}) to [perf] synthetic_acceptance_length") from None


def _perf(given: dict) -> dict:
    """[perf] over PERF_DEFAULTS, the acceptance lengths keyed by int draft length."""
    perf = {**PERF_DEFAULTS, **given}
    perf["synthetic_acceptance_length"] = {int(k): float(al) for k, al in
                                           perf.get("synthetic_acceptance_length", {}).items()}
    return perf


def _resolve_options(options: dict, sets: dict) -> dict:
    """An options map with its ``use = "NAME"`` replaced by that set's options, its own keys laid over."""
    if USE not in options:
        return dict(options)
    return {**sets[options[USE]], **{k: v for k, v in options.items() if k != USE}}


def _build(path: Path, data: dict, text: str, digest: str) -> Spec:
    scope = {**SCOPE_DEFAULTS, **data["scope"]}
    features = {**FEATURE_DEFAULTS, **data["features"]}
    sets = data.get("engine_option_sets", {})
    tiers = {}
    for name, t in data["tiers"].items():
        options = _resolve_options(t.get("engine_options", {}), sets)
        tier_scope = {**scope, **{k: t[k] for k in SCOPE_OVERRIDES if k in t}}
        dtypes = list(t.get("dtypes") or [options.get("dtype", "float32")])
        variants = {k: {**copy.deepcopy(v), "engine_options": _resolve_options(v["engine_options"], sets)}
                    for k, v in t.get("coverage_variants", {}).items()}
        tiers[name] = Tier(name, options, tier_scope, dtypes, t.get("max_context", features["max_context"]),
                           {k: _resolve_options(v, sets) for k, v in t.get("suite_engine_options", {}).items()},
                           variants)
    gates_data = data["gates"]
    gates = Gates(gates_data["version"], {k: dict(v) for k, v in gates_data.items() if k != "version"})
    fp = data["fastpath"]
    return Spec(
        path=path, name=fp["name"], engine=fp["engine"], description=fp.get("description", ""),
        switch=dict(data["switch"]), source_globs=list(data["sources"]["globs"]),
        validation_globs=data["sources"].get("validation"), subject_globs=data["sources"].get("subject"), scope=scope,
        features=features, kernel_names=(data.get("kernels") or {}).get("names"), tiers=tiers,
        gates=gates, raw_text=text, digest=digest, perf=_perf(data.get("perf", {})),
        evals=merge_evals(data.get("evals", {})),
    )


def merge_evals(given: dict) -> dict:
    """[evals] over EVALS_DEFAULTS, table by table (a tier table's keys over the default tier's)."""
    out = copy.deepcopy({k: v for k, v in EVALS_DEFAULTS.items() if not isinstance(v, dict)})
    out.update({k: v for k, v in given.items() if not isinstance(v, dict)})
    for task in ("mrcr", "aime25"):
        base, mine = copy.deepcopy(EVALS_DEFAULTS[task]), given.get(task, {})
        out[task] = {k: v for k, v in {**base, **mine}.items() if k not in TIERS}
        for tier in TIERS:
            out[task][tier] = {**base[tier], **mine.get(tier, {})}
    return out
