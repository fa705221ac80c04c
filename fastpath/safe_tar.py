"""Safe opening of an untrusted bundle archive or directory (DESIGN §3.8, §5).

Every member header is inspected before a single byte is extracted: absolute paths, `..`,
links, device/fifo/sparse members, duplicate names, NUL or backslash in names, too many members,
members or totals over the size limits are all rejected with a specific reason. The size limit
is checked on the header, so a member claiming 10 GB is refused without reading its data.
Extraction then writes regular files only, created exclusively inside a fresh temp dir.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator


@dataclass(frozen=True)
class Limits:
    max_member_bytes: int = 1 << 30  # 1 GiB
    max_total_bytes: int = 4 << 30  # 4 GiB
    max_members: int = 10_000
    max_name_len: int = 1024


class UnsafeBundle(Exception):
    """The archive or directory is refused; ``reason`` says why, ``member`` which entry."""

    def __init__(self, reason: str, member: str | None = None):
        self.reason = reason
        self.member = member
        super().__init__(f"{reason}: {member!r}" if member is not None else reason)


def check_name(name: str, limits: Limits) -> str:
    """The normalised relative name, or UnsafeBundle."""
    if "\0" in name:
        raise UnsafeBundle("NUL byte in member name", name)
    if "\\" in name:
        raise UnsafeBundle("backslash in member name", name)
    if len(name) > limits.max_name_len:
        raise UnsafeBundle(f"member name longer than {limits.max_name_len} characters", name[:80])
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeBundle("absolute path", name)
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if ".." in parts:
        raise UnsafeBundle("parent directory ('..') component", name)
    if not parts:
        raise UnsafeBundle("empty member name", name)
    return "/".join(parts)


class _Budget:
    """Counts members and bytes; catches duplicates and file/directory clashes."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.count = 0
        self.total = 0
        self.files: set[str] = set()
        self.dirs: set[str] = set()
        self.folded: dict[str, str] = {}

    def add(self, name: str, *, is_dir: bool, size: int) -> None:
        self.count += 1
        if self.count > self.limits.max_members:
            raise UnsafeBundle(f"more than {self.limits.max_members} members")
        if size > self.limits.max_member_bytes:
            raise UnsafeBundle(f"member of {size} bytes exceeds the {self.limits.max_member_bytes}-byte limit", name)
        self.total += size
        if self.total > self.limits.max_total_bytes:
            raise UnsafeBundle(f"total size exceeds the {self.limits.max_total_bytes}-byte limit", name)
        # Case-folded duplicates would overwrite each other on case-insensitive file systems.
        if name in self.files or name in self.dirs or self.folded.get(name.casefold(), name) != name:
            raise UnsafeBundle("duplicate member name", name)
        self.folded[name.casefold()] = name
        (self.dirs if is_dir else self.files).add(name)
        parents = PurePosixPath(name).parents
        for parent in list(parents)[:-1]:
            if str(parent) in self.files:
                raise UnsafeBundle("member nested under a file of the same name", name)

    def finish(self) -> None:
        for f in self.files:
            prefix = f + "/"
            if any(o.startswith(prefix) for o in self.files | self.dirs):
                raise UnsafeBundle("member nested under a file of the same name", f)


def _member_kind(m: tarfile.TarInfo) -> str | None:
    """None when allowed, else the reason."""
    if m.issym():
        return "symbolic link"
    if m.islnk():
        return "hard link"
    if m.ischr() or m.isblk():
        return "device file"
    if m.isfifo():
        return "FIFO"
    if m.issparse():
        return "sparse member"
    if m.isreg() or m.isdir():
        return None
    return f"unsupported member type {m.type!r}"


class _Capped(io.RawIOBase):
    """The decompressed stream, refusing to yield more than ``cap`` bytes: a gzip bomb (even one
    hidden in a pax header, which tarfile reads into memory) stops at the cap."""

    def __init__(self, gz: gzip.GzipFile, cap: int):
        self.gz, self.cap = gz, cap

    def _guard(self, end: int) -> None:
        if end > self.cap:
            raise UnsafeBundle(f"archive decompresses to more than {self.cap} bytes")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.cap + 1 - self.gz.tell()
        data = self.gz.read(n)
        self._guard(self.gz.tell())
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def seek(self, pos: int, whence: int = 0) -> int:
        target = {0: pos, 1: self.gz.tell() + pos}.get(whence)
        if target is None:
            raise OSError("seek from the end is not supported")
        self._guard(target)
        return self.gz.seek(target)

    def tell(self) -> int:
        return self.gz.tell()


@contextmanager
def _open_tar(path: Path, limits: Limits) -> Iterator[tarfile.TarFile]:
    # Headers, pax records and padding may add to the data: allow 3 blocks per member on top.
    cap = limits.max_total_bytes + 3 * 512 * (limits.max_members + 2) + (1 << 20) * 2
    with gzip.open(path, "rb") as gz, tarfile.open(fileobj=_Capped(gz, cap), mode="r:") as tar:
        yield tar


def inspect_archive(path: Path, limits: Limits = Limits()) -> list[tuple[str, tarfile.TarInfo]]:
    """All (normalised name, header) pairs, or UnsafeBundle at the first offending header."""
    budget = _Budget(limits)
    out = []
    try:
        with _open_tar(path, limits) as tar:
            # Iterating reads one header at a time; checking before the next step means a huge
            # member's data is never skipped over (let alone read).
            for m in tar:
                if m.isdir() and m.name.strip("/") in ("", "."):
                    continue  # the archive's own "./" entry carries nothing
                name = check_name(m.name, limits)
                kind = _member_kind(m)
                if kind:
                    raise UnsafeBundle(kind, m.name)
                if m.size < 0:
                    raise UnsafeBundle("negative member size", m.name)
                budget.add(name, is_dir=m.isdir(), size=m.size)
                out.append((name, m))
            _drain(tar.fileobj)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise UnsafeBundle(f"not a readable .tar.gz archive ({e})") from e
    budget.finish()
    if not out:
        raise UnsafeBundle("empty archive")
    return out


def _drain(gz, limit: int = 1 << 20) -> None:
    """Read to the end of the gzip stream so its CRC and length are verified; only a little
    padding may follow the tar end-of-archive blocks."""
    extra = 0
    while chunk := gz.read(1 << 16):
        extra += len(chunk)
        if extra > limit:
            raise UnsafeBundle(f"more than {limit} bytes after the end of the tar archive")


def _write_member(tar: tarfile.TarFile, m: tarfile.TarInfo, target: Path, limit: int) -> None:
    src = tar.extractfile(m)
    if src is None:
        raise UnsafeBundle("member has no data", m.name)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    written = 0
    with os.fdopen(fd, "wb") as out:
        while chunk := src.read(1 << 20):
            written += len(chunk)
            if written > limit:  # never trust the header alone
                raise UnsafeBundle("member data longer than its header", m.name)
            out.write(chunk)
    if written != m.size:
        raise UnsafeBundle("member data shorter than its header (truncated archive)", m.name)


def extract_archive(path: Path, dest: Path, limits: Limits = Limits()) -> None:
    """Inspect every header, then extract regular files and directories into empty ``dest``."""
    members = inspect_archive(path, limits)
    root = Path(dest).resolve()
    try:
        with _open_tar(path, limits) as tar:
            by_name = {m.name: name for name, m in members}
            for m in tar:
                if m.isdir() and m.name.strip("/") in ("", "."):
                    continue
                name = by_name.get(m.name)
                if name is None:
                    raise UnsafeBundle("archive changed between inspection and extraction", m.name)
                target = root.joinpath(*name.split("/"))
                if not target.resolve().is_relative_to(root):
                    raise UnsafeBundle("member escapes the extraction directory", m.name)
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    _write_member(tar, m, target, m.size)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise UnsafeBundle(f"archive unreadable during extraction ({e})") from e


def inspect_directory(path: Path, limits: Limits = Limits()) -> list[str]:
    """Apply the same rules to an already-extracted directory: no links, no special files, sizes."""
    root = Path(path)
    budget = _Budget(limits)
    names = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for entry in sorted(dirnames) + sorted(filenames):
            p = Path(dirpath, entry)
            rel = p.relative_to(root).as_posix()
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                raise UnsafeBundle("symbolic link", rel)
            if stat.S_ISDIR(st.st_mode):
                budget.add(check_name(rel, limits), is_dir=True, size=0)
                continue
            if not stat.S_ISREG(st.st_mode):
                raise UnsafeBundle("device file, FIFO or socket", rel)
            if st.st_nlink > 1:
                raise UnsafeBundle("hard link", rel)
            budget.add(check_name(rel, limits), is_dir=False, size=st.st_size)
            names.append(rel)
    return names


def _bundle_root(extracted: Path) -> Path:
    """The bundle inside an extraction: the single top-level directory, or the root itself."""
    entries = list(extracted.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and not (extracted / "manifest.json").exists():
        return entries[0]
    return extracted


@contextmanager
def open_bundle(path: Path, limits: Limits = Limits()) -> Iterator[Path]:
    """Yield the bundle directory of an archive (extracted into a fresh temp dir, removed after)
    or of a directory (checked in place)."""
    path = Path(path)
    if path.is_symlink():
        raise UnsafeBundle("bundle path is a symbolic link", str(path))
    if path.is_dir():
        inspect_directory(path, limits)
        yield _bundle_root(path)
        return
    if not path.is_file():
        raise UnsafeBundle("no such bundle file or directory", str(path))
    tmp = Path(tempfile.mkdtemp(prefix="fastpath-check-"))
    try:
        extract_archive(path, tmp, limits)
        yield _bundle_root(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
