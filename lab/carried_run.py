"""Can a carried full-tier run directory still be resumed from this tree? Asked here, on the CPU,
before a GPU command is spent on `fastpath verify --resume`, which would refuse it there.

    python3 -m lab.carried_run [.carry/full.tar.gz] [--spec optimized_model/k3/fastpath.toml]

Reads the run's ``full/state/run.json`` (the attested digests the run started with, the spec's
among them) and ``full/state/done/`` (finished suites) straight from the archive, computes the tree's
digests as verify does (fastpath.digest.attested_parts) and prints either "resumable" with the
suites done and left, or what changed per part. Exit 0 resumable, 1 not, 2 unreadable archive.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from fastpath.digest import attested_parts, stale_parts
from fastpath.spec import load_spec


def read_run(archive: Path) -> tuple[dict, list[str], dict[str, list], dict[str, int]]:
    """(run.json, finished suites, the files each attested part held, per unfinished suite the
    cases a resume keeps) of the run directory archived under ``full/``; the file lists come from
    the bundle directory's attested.json, written once a suite finished (empty before)."""
    with tarfile.open(archive, "r:gz") as tar:
        member = tar.extractfile("full/state/run.json")
        if member is None:
            raise KeyError("full/state/run.json")
        info = json.load(member)
        members = [m for m in tar.getmembers() if m.isfile()]
        done = sorted(Path(m.name).stem for m in members if Path(m.name).parent.as_posix() == "full/state/done")
        recorded: dict[str, list] = {}
        for m in members:
            path = Path(m.name)
            if path.name == "attested.json" and path.parent.parent.as_posix() == "full":
                parts = json.load(tar.extractfile(m)).get("parts") or {}
                recorded = {part: value.get("files") or [] for part, value in parts.items()}
        kept = kept_cases(tar, members)
    return info, done, recorded, kept


def kept_cases(tar: tarfile.TarFile, members: list[tarfile.TarInfo]) -> dict[str, int]:
    """Per suite, the cases an interrupted attempt finished (``state/finished/<suite>*.txt``)
    or an earlier resume kept (``state/kept/<suite>.jsonl``): what `verify --resume` keeps."""
    cases: dict[str, set[str]] = {}
    for m in members:
        path = Path(m.name)
        folder = path.parent.as_posix()
        if folder not in ("full/state/finished", "full/state/kept") or path.suffix not in (".txt", ".jsonl"):
            continue
        lines = tar.extractfile(m).read().decode("utf-8", "replace").splitlines()
        ids = [json.loads(x).get("case_id", "") for x in lines if x.strip()] if path.suffix == ".jsonl" \
            else [x.strip() for x in lines if x.strip()]
        cases.setdefault(path.name.split(".")[0], set()).update(i for i in ids if i)
    return {suite: len(ids) for suite, ids in cases.items()}


def verdict(info: dict, done: list[str], recorded: dict[str, list], root: Path,
            spec_path: Path, kept: dict[str, int] | None = None) -> tuple[bool, list[str]]:
    spec = load_spec(spec_path)
    lines: list[str] = []
    # the spec is one of the attested parts (its digest is the file's, as run.json's spec_digest)
    for part, files in stale_parts(attested_parts(root, spec), info.get("attested") or {}, recorded).items():
        files = files if part in recorded else []  # without the run's file list, every file looks new
        named = ", ".join(files[:8]) + (f" (+{len(files) - 8} more)" if len(files) > 8 else "")
        lines.append(f"{part}: " + (named or "its digest differs from the run's"))
    if lines:
        return False, lines + ["start afresh (`--out`), or resume from a checkout of the run's commit"]
    left = [s + (f" ({kept[s]} of its cases finished: kept)" if (kept or {}).get(s) else "")
            for s in spec.suites() if s not in done]
    machine = info.get("machine")  # verify resumes a run only on the kind of machine it started on
    return True, [f"resumable: the attested tree is the run's; done: {', '.join(done) or 'none'}; "
                  f"left: {', '.join(left) or 'none'}"
                  + (f"; on {machine} only" if machine else "")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("archive", nargs="?", default=".carry/full.tar.gz")
    ap.add_argument("--spec", default="optimized_model/k3/fastpath.toml")
    a = ap.parse_args(argv)
    try:
        info, done, recorded, kept = read_run(Path(a.archive))
    except (OSError, tarfile.TarError, KeyError, json.JSONDecodeError, AttributeError) as exc:
        print(f"carried_run: cannot read {a.archive}: {exc}; fix: pass the full.tar.gz a "
              "gpu_full_tier.sh call returned", file=sys.stderr)
        return 2
    ok, lines = verdict(info, done, recorded, Path.cwd(), Path(a.spec), kept)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
