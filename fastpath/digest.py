"""Content digests: canonical JSON, file hashes and the attested tree digests.

A tree digest ("sha256-tree-v1") covers files keyed by their repo-relative POSIX path. It depends
only on paths and bytes, never on git, mtimes or permissions, so a reviewer's checkout reproduces it.

    digest = sha256( for each entry, path-sorted:  path NUL size NUL sha256-hex LF )

A bundle attests four parts of the tree (``attested_parts``), each its own digest, so `check`
can say which one is stale:

    fast_path   the spec's [sources] globs: the code under test
    validation  what judges it: [sources] validation globs (default: the fastpath/
                harness package, its suites/ included), plus two entries that are not files: the spec's [gates]
                table ("[gates]", canonical JSON) and the harness version ("fastpath-version")
    subject     the model the fast path belongs to: [sources] subject globs (default: the .py
                files beside the spec); put weight files here when weights are loaded
    spec        the spec file itself

A file belongs to the first part whose globs match it (fast_path, validation, subject), so
subject globs may be broad. Declared globs must each match a file; default ones may match none.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import Any

ALGORITHM = "sha256-tree-v1"
_CHUNK = 1 << 20


def canonical_json(obj: Any) -> bytes:
    """One byte encoding per value (sorted keys, fixed separators, UTF-8, trailing LF)."""
    return (json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                       allow_nan=False) + "\n").encode("utf-8")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> tuple[str, int]:
    """(hex digest, size in bytes) of a file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


class SourceDigestError(ValueError):
    """A glob is unsafe or matches nothing."""


def _check_glob(glob: str) -> None:
    # Globs are relative to the repo root; escaping it would attest files outside the tree.
    p = PurePosixPath(glob)
    if not glob or p.is_absolute() or ".." in p.parts or "\\" in glob:
        raise SourceDigestError(f"source glob {glob!r} must be a relative path inside the repository")


def tree_digest(files: list[dict]) -> str:
    """The sha256-tree-v1 digest of path-sorted [{path, sha256, size}] entries."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f["path"]):
        h.update(f"{f['path']}\0{f['size']}\0{f['sha256']}\n".encode("utf-8"))
    return h.hexdigest()


def source_digest(repo_root: Path, globs: list[str]) -> dict:
    """Digest of the files matched by ``globs`` under ``repo_root``.

    Returns {"algorithm", "digest", "files": [{"path", "sha256", "size"}]} sorted by path.
    A glob matching no file is an error naming the glob (a typo must not shrink what is attested).
    """
    root = Path(repo_root).resolve()
    if not globs:
        raise SourceDigestError("no source globs given: nothing to attest")
    files = _entries(_match(root, list(globs), strict=True))
    return {"algorithm": ALGORITHM, "digest": tree_digest(files), "files": files}


PARTS = ("fast_path", "validation", "subject", "spec")
PART_LABELS = {"fast_path": "fast-path sources", "validation": "validation sources", "subject": "subject",
               "spec": "spec"}
DEFAULT_VALIDATION_GLOBS = ("fastpath/**/*.py",)  # the suites are fastpath/suites/
GATES_ENTRY = "[gates]"
VERSION_ENTRY = "fastpath-version"


def _match(root: Path, globs: list[str], *, strict: bool) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for glob in globs:
        _check_glob(glob)
        matched = [p for p in root.glob(glob) if p.is_file()]
        if not matched and strict:
            raise SourceDigestError(f"source glob {glob!r} matches no file under {root}")
        for p in matched:
            if not p.resolve().is_relative_to(root):  # a symlink pointing out of the tree
                raise SourceDigestError(f"source file {p} resolves outside the repository")
            found[p.relative_to(root).as_posix()] = p
    return found


def _entries(found: dict[str, Path]) -> list[dict]:
    out = []
    for rel in sorted(found):
        digest, size = sha256_file(found[rel])
        out.append({"path": rel, "sha256": digest, "size": size})
    return out


def _value_entry(name: str, data: bytes) -> dict:
    return {"path": name, "sha256": sha256_bytes(data), "size": len(data)}


def harness_version(repo_root: Path) -> str:
    """The tree's own fastpath version when the tree is the harness, else the running one."""
    import tomllib
    from importlib import metadata

    try:
        project = tomllib.loads((Path(repo_root) / "pyproject.toml").read_text(encoding="utf-8")).get("project") or {}
        if project.get("name") == "fastpath" and isinstance(project.get("version"), str):
            return project["version"]
    except (OSError, ValueError):
        pass
    try:
        return metadata.version("fastpath")
    except metadata.PackageNotFoundError:
        return "unknown"


def attested_parts(repo_root: Path, spec) -> dict:
    """The four attested digests of the tree for ``spec`` (a fastpath.spec.Spec).

    Returns {"algorithm", "spec_path", "harness_version",
             "parts": {part: {"digest", "files": [{"path", "sha256", "size"}]}}}.
    """
    root = Path(repo_root).resolve()
    spec_file = Path(spec.path).resolve()
    if not spec_file.is_relative_to(root):
        raise SourceDigestError(f"the spec {spec.path} is outside the repository {root}")
    spec_rel = spec_file.relative_to(root).as_posix()
    if not spec.source_globs:
        raise SourceDigestError("no source globs given: nothing to attest")
    fast = _match(root, list(spec.source_globs), strict=True)
    declared = getattr(spec, "declared_sources", frozenset())
    validation_globs = getattr(spec, "validation_globs", None) or list(DEFAULT_VALIDATION_GLOBS)
    spec_dir = PurePosixPath(spec_rel).parent.as_posix()
    subject_globs = getattr(spec, "subject_globs", None) or [f"{spec_dir}/**/*.py" if spec_dir != "." else "*.py"]
    validation = _match(root, validation_globs, strict="validation" in declared)
    subject = _match(root, subject_globs, strict="subject" in declared)
    # The first part that claims a file owns it; the spec file is its own part.
    for rel in fast:
        validation.pop(rel, None)
    for rel in [*fast, *validation, spec_rel]:
        subject.pop(rel, None)
    validation.pop(spec_rel, None)
    version = harness_version(root)
    validation_entries = _entries(validation) + [
        _value_entry(GATES_ENTRY, canonical_json(_gates_table(spec))),
        _value_entry(VERSION_ENTRY, version.encode("utf-8")),
    ]
    spec_digest, spec_size = sha256_file(spec_file)
    files = {"fast_path": _entries(fast), "validation": validation_entries, "subject": _entries(subject),
             "spec": [{"path": spec_rel, "sha256": spec_digest, "size": spec_size}]}
    return {"algorithm": ALGORITHM, "spec_path": spec_rel, "harness_version": version,
            "parts": {p: {"digest": tree_digest(files[p]), "files": files[p]} for p in PARTS}}


def _gates_table(spec) -> dict:
    return {"version": spec.gates.version, **spec.gates.settings}


def stale_parts(tree: dict, attested: dict[str, str], recorded: dict[str, list]) -> dict[str, list[str]]:
    """part -> what differs ("path changed", "path not in bundle", "path not in tree") for each
    part whose digest in ``tree`` (attested_parts) differs from ``attested`` ({part: digest});
    ``recorded`` ({part: files}) is the bundle's file list, used only to name the files."""
    out: dict[str, list[str]] = {}
    for part in PARTS:
        mine = tree["parts"][part]
        if mine["digest"] == attested.get(part):
            continue
        theirs = recorded.get(part) if isinstance(recorded.get(part), list) else []
        ours = {f["path"]: f["sha256"] for f in mine["files"]}
        them = {f.get("path"): f.get("sha256") for f in theirs if isinstance(f, dict)}
        diffs = sorted([p for p in ours.keys() & them.keys() if ours[p] != them[p]]
                       + [f"{p} (new)" for p in ours.keys() - them.keys()]
                       + [f"{p} (removed)" for p in them.keys() - ours.keys()])
        out[part] = diffs
    return out
