"""`python tests/fastpath_shim.py ARGS...`: the `fastpath` executable the gate and action tests run.

- `digest SPEC --source DIR --json`: a stand-in for the real command (which this test must not
  depend on: its parts are another module's business). It prints the contract's shape,
  {"spec", "name", "parts": {fast_path, validation, subject, spec}}: fast_path is the spec's
  source digest, spec the spec file's sha256; validation and subject are constants (the toy
  repositories have no suites or subject model).
- everything else: the real CLI. While `fastpath check` lacks the contract's --freshness and
  --spec options (they come with the checker's rewrite), the shim drops them: the check is then
  enforce-only and reads the spec from [tool.fastpath] default_spec, which the test trees set.
"""

from __future__ import annotations

import inspect
import json
import sys
import tomllib
from pathlib import Path


def fake_digest(argv: list[str]) -> int:
    from fastpath.digest import sha256_file, source_digest

    spec = Path(argv[0])
    source = Path(argv[argv.index("--source") + 1]) if "--source" in argv else Path(".")
    data = tomllib.loads(spec.read_text(encoding="utf-8"))
    parts = {"fast_path": source_digest(source, data["sources"]["globs"])["digest"],
             "validation": "toy-validation", "subject": "toy-subject", "spec": sha256_file(spec)[0]}
    print(json.dumps({"spec": str(spec), "name": data["fastpath"]["name"], "parts": parts}))
    return 0


def without_unsupported_check_options(argv: list[str]) -> list[str]:
    from fastpath import cli

    supported = inspect.signature(cli.check).parameters
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--freshness", "--spec") and argv[i].lstrip("-") not in supported:
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["digest"]:
        return fake_digest(argv[1:])
    if argv[:1] == ["check"]:
        argv = ["check", *without_unsupported_check_options(argv[1:])]
    from fastpath.cli import app

    return app(argv, standalone_mode=True) or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
