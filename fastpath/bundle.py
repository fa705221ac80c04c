"""Evidence bundle: directory layout, manifest, deterministic archive (DESIGN §3.7).

    NAME.fastpath/
      manifest.json          every other file (except statement*.json): path, size, sha256
      statement.json  statement.dsse.json     written by fastpath.signing
      spec.toml  plan.json  environment.json  source_digest.json  summary.json
      results/rows.parquet   logs/...          report.html

A bundle is written into a temp dir beside its destination and renamed into place, so a crash
never leaves a half-written bundle under the final name.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

from fastpath.digest import canonical_json, sha256_bytes, sha256_file

MANIFEST = "manifest.json"
STATEMENT = "statement.json"
ENVELOPE = "statement.dsse.json"
# Files the manifest does not list: the manifest itself and what signs it.
UNLISTED = frozenset({MANIFEST, STATEMENT, ENVELOPE})
ROWS = "results/rows.parquet"


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
                 source_digest: dict) -> Path:
    """Write the bundle directory atomically and return its path (manifest included, unsigned)."""
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
        write_json(tmp / "source_digest.json", source_digest)
        (tmp / "results").mkdir()
        rows.reset_index(drop=True).to_parquet(tmp / ROWS, index=False)
        write_json(tmp / "summary.json", summary)
        (tmp / "logs").mkdir()
        if logs_dir is not None and Path(logs_dir).is_dir():
            _copy_logs(Path(logs_dir), tmp / "logs")
        if report_html is not None:
            (tmp / "report.html").write_text(report_html, encoding="utf-8")
        write_manifest(tmp)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


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


def pack(bundle_dir: Path) -> Path:
    """Write NAME.fastpath.tar.gz beside the bundle: same content -> same bytes.

    Members are sorted, live under NAME.fastpath/, have mtime 0, owner 0/"" and mode 0644/0755;
    the gzip header carries mtime 0 and no file name.
    """
    bundle_dir = Path(bundle_dir)
    if not (bundle_dir / MANIFEST).is_file():
        raise FileNotFoundError(f"{bundle_dir} is not a bundle (no {MANIFEST})")
    top = bundle_dir.name
    dirs: set[str] = set()
    files = bundle_files(bundle_dir)
    for rel in files:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    entries = [(top, True)] + [(f"{top}/{d}", True) for d in dirs] + [(f"{top}/{f}", False) for f in files]
    entries.sort(key=lambda e: e[0])

    out = archive_path(bundle_dir)
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "wb") as f:
        # Stream tar -> gzip -> file: a large bundle is never held in memory.
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for name, is_dir in entries:
                    if is_dir:
                        tar.addfile(_tarinfo(name, is_dir=True))
                        continue
                    path = bundle_dir / name[len(top) + 1:]
                    with open(path, "rb") as src:
                        tar.addfile(_tarinfo(name, is_dir=False, size=path.stat().st_size), src)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    return out


def archive_sha256(path: Path) -> str:
    return sha256_bytes(Path(path).read_bytes())
