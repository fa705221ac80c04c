"""Safe opening of an untrusted bundle archive or directory.

Every member header is inspected before a single byte is extracted: absolute paths, `..`,
links, device/fifo/sparse members, duplicate names, NUL or backslash in names, too many members,
members or totals over the size limits are all rejected with a specific reason. The size limit
is checked on the header, so a member claiming 10 GB is refused without reading its data.

The archive's framing is strict too, so no other tool can read more out of it than we do:
- exactly one gzip member, nothing after its trailer (a second member, appended bytes);
- metadata headers (pax extended/global, GNU long name/link) are size-capped per header and in
  total BEFORE tarfile reads them into memory (a header bomb fails fast, in bounded memory);
- after the tar end-of-archive marker only zero padding may follow (a second archive, members
  that `tar --ignore-zeros` would extract, a header hidden after the end are all refused).
Extraction then writes regular files only, created exclusively inside a fresh temp dir.
"""

from __future__ import annotations

import hashlib
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

# Caps on tar metadata headers, enforced on the header's declared size before its data is read.
# A bundle's names are short (pack writes a pax header only for a name > 100 characters or
# non-ASCII), so 64 KiB per header and 1 MiB per archive are far above anything genuine.
MAX_META_HEADER_BYTES = 64 << 10
MAX_META_TOTAL_BYTES = 1 << 20
# pax/GNU headers may chain (pax + long name + member); more than this in a row is hostile.
MAX_META_CHAIN = 4
# Zero padding allowed after the end-of-archive marker (tarfile pads to 10 KiB records).
MAX_TRAILING_ZERO_BYTES = 1 << 20
_META_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
               tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_CHUNK = 1 << 16


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


class _GzipStream(io.RawIOBase):
    """The decompressed tar stream of a single-member gzip file, read forward only.

    Refuses to yield more than ``cap`` bytes (a gzip bomb stops there), refuses anything after
    the gzip trailer, keeps the last block it returned (to look at the end-of-archive marker)
    and hashes everything it decompresses (the check compares that with `pack`'s stream).
    """

    def __init__(self, raw, cap: int):
        self.raw, self.cap = raw, cap
        self.z = zlib.decompressobj(wbits=31)  # gzip framing only, one member
        self.buf = bytearray()  # decompressed, not yet handed out
        self.pending = b""  # compressed input not yet consumed
        self.pos = 0  # decompressed bytes handed out (or skipped)
        self.produced = 0
        self.tail = b""  # the last <= 512 bytes handed out
        self.sha = hashlib.sha256()
        self.ended = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _fill(self) -> bool:
        """Decompress at most _CHUNK more bytes into buf (bounded read-ahead, so a bomb is
        refused with little memory); False at the end of the gzip member."""
        while not self.ended:
            if self.z.eof:
                self._finish_member()
                return False
            if not self.pending:
                self.pending = self.raw.read(_CHUNK)
                if not self.pending:
                    raise UnsafeBundle("gzip stream is truncated (no gzip trailer)")
            out = self.z.decompress(self.pending, _CHUNK)
            self.pending = self.z.unconsumed_tail
            if out:
                self.produced += len(out)
                if self.produced > self.cap:
                    raise UnsafeBundle(f"archive decompresses to more than {self.cap} bytes")
                self.sha.update(out)
                self.buf += out
                return True
        return False

    def _finish_member(self) -> None:
        self.ended = True
        if self.z.unused_data or self.raw.read(1):
            raise UnsafeBundle("bytes after the gzip trailer (a second gzip member or appended data)")

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.cap + 1
        while len(self.buf) < n and self._fill():
            pass
        data = bytes(self.buf[:n])
        del self.buf[:n]
        self.pos += len(data)
        self.tail = (self.tail + data)[-tarfile.BLOCKSIZE:]
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def seek(self, pos: int, whence: int = 0) -> int:
        target = {0: pos, 1: self.pos + pos}.get(whence)
        if target is None or target < self.pos:
            raise OSError("the archive stream is read forward only")
        while self.pos < target:  # skipping data still decompresses (and counts) it
            if not self.read(min(_CHUNK, target - self.pos)):
                break
        return self.pos

    def tell(self) -> int:
        return self.pos

    def drain(self) -> int:
        """Read to the end; the number of bytes read."""
        n = 0
        while chunk := self.read(_CHUNK):
            n += len(chunk)
        return n


class _GuardedTarInfo(tarfile.TarInfo):
    """Caps metadata headers on their declared size before tarfile reads them into memory."""

    def _proc_member(self, tar):
        if self.type in _META_TYPES:
            tar._meta_chain = getattr(tar, "_meta_chain", 0) + 1
            tar._meta_total = getattr(tar, "_meta_total", 0) + max(self.size, 0)
            kind = "GNU long-name" if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK) else "pax"
            if self.size > MAX_META_HEADER_BYTES:
                raise UnsafeBundle(f"{kind} header of {self.size} bytes exceeds the "
                                   f"{MAX_META_HEADER_BYTES}-byte cap per metadata header")
            if tar._meta_total > MAX_META_TOTAL_BYTES:
                raise UnsafeBundle(f"metadata headers exceed the {MAX_META_TOTAL_BYTES}-byte cap per archive")
            if tar._meta_chain > MAX_META_CHAIN:
                raise UnsafeBundle(f"more than {MAX_META_CHAIN} metadata headers in a row")
        else:
            tar._meta_chain = 0
            if self.type == tarfile.GNUTYPE_SPARSE:  # its extension headers are never read
                raise UnsafeBundle("sparse member", self.name)
        return super()._proc_member(tar)


def _stream_cap(limits: Limits) -> int:
    # Headers, pax records and padding add to the data: 3 blocks per member plus the caps.
    return (limits.max_total_bytes + 3 * 512 * (limits.max_members + 2) + MAX_META_TOTAL_BYTES
            + MAX_TRAILING_ZERO_BYTES + (1 << 20))


@contextmanager
def _open_tar(path: Path, limits: Limits) -> Iterator[tuple[tarfile.TarFile, _GzipStream]]:
    with open(path, "rb") as raw:
        stream = _GzipStream(raw, _stream_cap(limits))
        with tarfile.open(fileobj=stream, mode="r:", tarinfo=_GuardedTarInfo) as tar:
            yield tar, stream


def _check_end(tar: tarfile.TarFile, stream: _GzipStream) -> None:
    """After the last member: the end-of-archive marker (two zero blocks), then only zeros, then
    the end of the one gzip member. tarfile stops at the first zero *or unreadable* block, so
    anything hidden after it (a second archive, members for --ignore-zeros) is caught here."""
    end = tar.offset  # where tarfile stopped looking for headers
    seen = stream.tell() - end  # bytes of the stopping block tarfile already read
    if seen < 0 or seen > len(stream.tail):
        raise UnsafeBundle("tar stream ends inside a member (truncated archive)")
    if seen and stream.tail[-seen:].count(0) != seen:
        raise UnsafeBundle(f"non-zero bytes after the tar end-of-archive marker at offset {end} "
                           "(a header hidden after the end: another tool would extract more)")
    zeros = seen
    while chunk := stream.read(_CHUNK):
        if chunk.count(0) != len(chunk):
            raise UnsafeBundle(f"non-zero bytes after the tar end-of-archive marker at offset {end} "
                               "(a second archive or members another tool's --ignore-zeros would extract)")
        zeros += len(chunk)
        if zeros > MAX_TRAILING_ZERO_BYTES:
            raise UnsafeBundle(f"more than {MAX_TRAILING_ZERO_BYTES} bytes of padding after the tar end-of-archive marker")
    if zeros < 2 * tarfile.BLOCKSIZE:
        raise UnsafeBundle("no tar end-of-archive marker (two zero blocks): truncated archive")


_READ_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error)


def inspect_archive(path: Path, limits: Limits = Limits()) -> list[tuple[str, tarfile.TarInfo]]:
    """All (normalised name, header) pairs, or UnsafeBundle at the first offending header."""
    budget = _Budget(limits)
    out = []
    try:
        with _open_tar(path, limits) as (tar, stream):
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
            _check_end(tar, stream)
    except _READ_ERRORS as e:
        raise UnsafeBundle(f"not a readable .tar.gz archive ({e})") from e
    budget.finish()
    if not out:
        raise UnsafeBundle("empty archive")
    return out


def tar_stream_digest(path: Path, limits: Limits = Limits()) -> tuple[str, int]:
    """(sha256 hex, size) of the archive's decompressed tar stream, read with the same guards."""
    try:
        with open(path, "rb") as raw:
            stream = _GzipStream(raw, _stream_cap(limits))
            stream.drain()
            return stream.sha.hexdigest(), stream.produced
    except _READ_ERRORS as e:
        raise UnsafeBundle(f"not a readable .tar.gz archive ({e})") from e


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
        with _open_tar(path, limits) as (tar, stream):
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
            _check_end(tar, stream)
    except _READ_ERRORS as e:
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
