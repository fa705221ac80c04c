"""Content digests: canonical JSON, file hashes and the fast-path source digest (DESIGN §3.7).

The source digest ("sha256-tree-v1") is what a bundle attests about the code that ran: the files
matched by the spec's `[sources] globs`, keyed by their repo-relative POSIX path. It depends only
on paths and bytes, never on git, mtimes or permissions, so a reviewer's checkout reproduces it.

    digest = sha256( for each file, path-sorted:  path NUL size NUL sha256-hex LF )
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
    found: dict[str, Path] = {}
    for glob in globs:
        _check_glob(glob)
        matched = [p for p in root.glob(glob) if p.is_file()]
        if not matched:
            raise SourceDigestError(f"source glob {glob!r} matches no file under {root}")
        for p in matched:
            real = p.resolve()
            if not real.is_relative_to(root):  # a symlink pointing out of the tree
                raise SourceDigestError(f"source file {p} resolves outside the repository")
            found[p.relative_to(root).as_posix()] = p
    files = []
    for rel in sorted(found):
        digest, size = sha256_file(found[rel])
        files.append({"path": rel, "sha256": digest, "size": size})
    return {"algorithm": ALGORITHM, "digest": tree_digest(files), "files": files}
