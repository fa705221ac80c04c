"""Evidence bundle: directory layout, manifest, deterministic archive.

    NAME.fastpath/
      manifest.json          every other file (except statement*.json): path, size, sha256
      statement.json  statement.dsse.json     written by fastpath.signing
      spec.toml  plan.json  environment.json  attested.json  summary.json
      results/rows.parquet   logs/...          report.html

attested.json is fastpath.digest.attested_parts of the tree that ran: the four attested digests
(fast_path, validation, subject, spec) with their file lists, the spec's repo-relative path and
the harness version.

A bundle is written, signed and packed in a temp dir beside its destination and only then
renamed into place, so a crash or signal never leaves a half-written or signed-but-unpacked
bundle under the final name. The archive is named NAME.fastpath.tar.gz for NAME.fastpath/;
`fastpath verify` names bundles ``<spec name>.<tier>.fastpath``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

import pandas as pd

from fastpath.digest import canonical_json, sha256_bytes, sha256_file

MANIFEST = "manifest.json"
STATEMENT = "statement.json"
ENVELOPE = "statement.dsse.json"
# Files the manifest does not list: the manifest itself and what signs it.
UNLISTED = frozenset({MANIFEST, STATEMENT, ENVELOPE})
ROWS = "results/rows.parquet"
ATTESTED = "attested.json"
SUFFIX = ".fastpath"


def bundle_name(spec_name: str, tier: str) -> str:
    """The bundle directory's name; its archive is this + ".tar.gz"."""
    return f"{spec_name}.{tier}{SUFFIX}"


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(canonical_json(obj))


def bundle_files(bundle_dir: Path) -> list[str]:
    """Sorted POSIX paths of the regular files under bundle_dir (links are not followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(bundle_dir):
        dirnames.sort()
        for name in filenames:
            p = Path(dirpath, name)
            if p.is_file() and not p.is_symlink():
                out.append(p.relative_to(bundle_dir).as_posix())
    return sorted(out)


def build_manifest(bundle_dir: Path) -> dict:
    files = []
    for rel in bundle_files(bundle_dir):
        if rel in UNLISTED:
            continue
        digest, size = sha256_file(bundle_dir / rel)
        files.append({"path": rel, "size": size, "sha256": digest})
    return {"schema": 1, "algorithm": "sha256", "files": files}


def write_manifest(bundle_dir: Path) -> dict:
    manifest = build_manifest(bundle_dir)
    write_json(bundle_dir / MANIFEST, manifest)
    return manifest


def manifest_sha256(bundle_dir: Path) -> str:
    return sha256_file(Path(bundle_dir) / MANIFEST)[0]


def _find_repo_root(start: Path) -> Path | None:
    for d in [start, *start.parents]:
        if (d / ".git").exists() or (d / "pyproject.toml").is_file():
            return d
    return None


def _spec_relpath(spec_path: Path) -> str | None:
    # Recorded so `check` can find the same spec in the reviewer's checkout.
    spec = spec_path.resolve()
    root = _find_repo_root(spec.parent)
    return spec.relative_to(root).as_posix() if root else None


def _copy_logs(src: Path, dst: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath, name)
            if p.is_symlink() or not p.is_file():  # a bundle never carries links
                continue
            target = dst / p.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, target)


def write_bundle(out_dir: Path, *, spec_path: Path, plan: dict, rows: pd.DataFrame, summary: dict,
                 environment: dict, logs_dir: Path | None, report_html: str | None = None,
                 attested: dict, sign: Callable[[Path], object] | None = None, archive: bool = False,
                 report: Callable[[Path], str] | None = None) -> Path:
    """Write the bundle directory atomically and return its path (manifest included).

    ``report(dir)`` renders report.html from the staged files (fastpath.report.render), so the
    page shows exactly what the bundle holds; it is listed in the manifest like every other file.

    ``sign(dir)`` signs it and ``archive`` packs it while it is still staged under a temp name:
    the final name appears only once everything is done (the archive is replaced first).
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        shutil.copyfile(spec_path, tmp / "spec.toml")
        write_json(tmp / "plan.json", plan)
        env = dict(environment)
        rel = _spec_relpath(Path(spec_path))
        if rel and "spec_path" not in env:
            env["spec_path"] = rel
        write_json(tmp / "environment.json", env)
        write_json(tmp / ATTESTED, attested)
        (tmp / "results").mkdir()
        rows.reset_index(drop=True).to_parquet(tmp / ROWS, index=False)
        write_json(tmp / "summary.json", summary)
        (tmp / "logs").mkdir()
        if logs_dir is not None and Path(logs_dir).is_dir():
            _copy_logs(Path(logs_dir), tmp / "logs")
        if report is not None:
            report_html = report(tmp)
        if report_html is not None:
            (tmp / "report.html").write_text(report_html, encoding="utf-8")
        write_manifest(tmp)
        _seal(tmp, out_dir, sign, archive)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _seal(staged: Path, out_dir: Path, sign: Callable[[Path], object] | None, archive: bool) -> None:
    if sign is not None:
        sign(staged)
    if archive:
        pack(staged, top=out_dir.name, out=archive_path(out_dir))
    _replace_dir(staged, out_dir)


def reseal(bundle_dir: Path, sign: Callable[[Path], object]) -> Path:
    """Sign an existing bundle directory and re-pack it, staged in a copy: an interrupt leaves
    the old directory and archive as they were. Returns the archive."""
    bundle_dir = Path(bundle_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{bundle_dir.name}.", suffix=".tmp", dir=bundle_dir.parent))
    try:
        os.rmdir(tmp)
        shutil.copytree(bundle_dir, tmp, symlinks=True)
        _seal(tmp, bundle_dir, sign, True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return archive_path(bundle_dir)


def _replace_dir(new: Path, dest: Path) -> None:
    """Move ``new`` to ``dest``; an existing ``dest`` is swapped out first, then removed."""
    old = None
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".old", dir=dest.parent))
        os.rmdir(old)
        os.rename(dest, old)
    os.rename(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --- deterministic archive -------------------------------------------------------------------

def archive_path(bundle_dir: Path) -> Path:
    bundle_dir = Path(bundle_dir)
    return bundle_dir.with_name(bundle_dir.name + ".tar.gz")


def _tarinfo(name: str, *, is_dir: bool, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.size = 0 if is_dir else size
    info.mode = 0o755 if is_dir else 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _write_tar(fileobj, bundle_dir: Path, top: str) -> None:
    """The canonical tar stream of a bundle: `check` compares an archive's stream with this."""
    dirs: set[str] = set()
    files = bundle_files(bundle_dir)
    for rel in files:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    entries = [(top, True)] + [(f"{top}/{d}", True) for d in dirs] + [(f"{top}/{f}", False) for f in files]
    entries.sort(key=lambda e: e[0])
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, is_dir in entries:
            if is_dir:
                tar.addfile(_tarinfo(name, is_dir=True))
                continue
            path = bundle_dir / name[len(top) + 1:]
            with open(path, "rb") as src:
                tar.addfile(_tarinfo(name, is_dir=False, size=path.stat().st_size), src)


class _HashSink:
    def __init__(self):
        self.sha, self.size = hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size


def canonical_tar_digest(bundle_dir: Path, top: str | None = None) -> tuple[str, int]:
    """(sha256 hex, size) of the tar stream `pack` writes for this directory."""
    sink = _HashSink()
    _write_tar(sink, Path(bundle_dir), top or Path(bundle_dir).name)
    return sink.sha.hexdigest(), sink.size


def pack(bundle_dir: Path, *, top: str | None = None, out: Path | None = None) -> Path:
    """Write NAME.fastpath.tar.gz beside the bundle: same content -> same bytes.

    Members are sorted, live under ``top`` (default NAME.fastpath/), have mtime 0, owner 0/""
    and mode 0644/0755; the gzip header carries mtime 0 and no file name.
    """
    bundle_dir = Path(bundle_dir)
    if not (bundle_dir / MANIFEST).is_file():
        raise FileNotFoundError(f"{bundle_dir} is not a bundle (no {MANIFEST})")
    out = Path(out) if out else archive_path(bundle_dir)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            # Stream tar -> gzip -> file: a large bundle is never held in memory.
            with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz:
                _write_tar(gz, bundle_dir, top or bundle_dir.name)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def archive_sha256(path: Path) -> str:
    return sha256_bytes(Path(path).read_bytes())
