"""Hostile archive framing, built here byte by byte: whatever another tool could read out of an
archive beyond what `check` reads is refused, and header bombs fail fast in bounded memory."""

import gzip
import io
import tarfile
import time
import tracemalloc
import zlib

import pytest

from fastpath.safe_tar import (MAX_META_CHAIN, MAX_META_HEADER_BYTES, MAX_META_TOTAL_BYTES, UnsafeBundle,
                               inspect_archive, open_bundle)

BLOCK = tarfile.BLOCKSIZE


def _tar(members, end=True) -> bytes:
    """A plain tar stream of (name, data); with its end-of-archive marker unless ``end`` is false."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return raw if end else raw[:_members_end(raw)]


def _members_end(raw: bytes) -> int:
    """Offset just past the last member (where the end-of-archive marker starts)."""
    i = len(raw)
    while i >= BLOCK and raw[i - BLOCK:i] == b"\0" * BLOCK:
        i -= BLOCK
    return i


def _header(name, size, type_=tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, type_
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def _reason(path) -> str:
    with pytest.raises(UnsafeBundle) as e:
        with open_bundle(path):
            pass
    return e.value.reason


GOOD = [("b.fastpath/manifest.json", b"{}"), ("b.fastpath/x.log", b"hello")]


def test_the_plain_archive_is_accepted(tmp_path):
    path = tmp_path / "ok.tar.gz"
    path.write_bytes(gzip.compress(_tar(GOOD)))
    assert [n for n, _ in inspect_archive(path)] == ["b.fastpath/manifest.json", "b.fastpath/x.log"]


@pytest.mark.parametrize("what,after", [
    ("a second archive", lambda: _tar([("b.fastpath/evil.py", b"import os")])),
    ("a member only --ignore-zeros reaches", lambda: b"\0" * BLOCK + _tar([("b.fastpath/evil", b"x")], end=False)),
    ("a header declaring a huge member", lambda: _header("b.fastpath/huge", 10 * 2**30)),
    ("a block with a bad checksum", lambda: b"garbage".ljust(BLOCK, b"\1")),
])
def test_anything_but_zeros_after_the_end_marker_is_refused(tmp_path, what, after):
    path = tmp_path / "a.tar.gz"
    path.write_bytes(gzip.compress(_tar(GOOD) + after()))
    assert "after the tar end-of-archive marker" in _reason(path), what


def test_a_hidden_member_right_after_one_zero_block_is_refused(tmp_path):
    # tarfile stops at the first zero block; GNU tar --ignore-zeros would go on and extract.
    raw = _tar(GOOD, end=False) + b"\0" * BLOCK + _tar([("b.fastpath/evil", b"x")])
    path = tmp_path / "a.tar.gz"
    path.write_bytes(gzip.compress(raw))
    assert "non-zero bytes after the tar end-of-archive marker" in _reason(path)


@pytest.mark.parametrize("tail", [gzip.compress(b""), gzip.compress(b"\0" * 1024), b"junk", b"\0"])
def test_a_second_gzip_member_or_bytes_after_the_trailer_are_refused(tmp_path, tail):
    path = tmp_path / "a.tar.gz"
    path.write_bytes(gzip.compress(_tar(GOOD)) + tail)
    assert _reason(path) == "bytes after the gzip trailer (a second gzip member or appended data)"


def test_a_missing_end_marker_is_refused(tmp_path):
    path = tmp_path / "a.tar.gz"
    path.write_bytes(gzip.compress(_tar(GOOD, end=False)))
    assert "no tar end-of-archive marker" in _reason(path)


def test_zero_padding_after_the_end_marker_is_accepted(tmp_path):
    path = tmp_path / "a.tar.gz"
    path.write_bytes(gzip.compress(_tar(GOOD) + b"\0" * 20 * BLOCK))
    with open_bundle(path) as d:
        assert (d / "x.log").read_bytes() == b"hello"


def _bomb(path, type_, size):
    """A metadata header declaring ``size`` bytes, followed by that much data, streamed to gzip
    (the test itself never holds the bomb in memory)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(z.compress(_header("././@LongLink" if type_ == tarfile.GNUTYPE_LONGNAME else "pax", size, type_)))
        chunk = b"9 path=zzzzzzzz\n" * 4096
        for _ in range(size // len(chunk)):
            f.write(z.compress(chunk))
        f.write(z.compress(_tar(GOOD)))
        f.write(z.flush())
    return path


@pytest.mark.parametrize("type_,kind", [(tarfile.XHDTYPE, "pax"), (tarfile.XGLTYPE, "pax"),
                                        (tarfile.GNUTYPE_LONGNAME, "GNU long-name")])
def test_a_header_bomb_fails_fast_in_bounded_memory(tmp_path, type_, kind):
    size = 64 << 20
    path = _bomb(tmp_path / "bomb.tar.gz", type_, size)
    assert path.stat().st_size < (1 << 20)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        reason = _reason(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reason == f"{kind} header of {size} bytes exceeds the {MAX_META_HEADER_BYTES}-byte cap per metadata header"
    assert peak < 8 << 20, f"peak {peak} bytes while refusing a {size}-byte header"
    assert time.perf_counter() - t0 < 5


def test_metadata_headers_are_capped_in_total_and_in_a_row(tmp_path):
    # Many headers, each under the per-header cap, add up past the archive's cap.
    each = MAX_META_HEADER_BYTES - BLOCK
    raw = b""
    for i in range(MAX_META_TOTAL_BYTES // each + 1):
        raw += _header(f"pax{i}", each, tarfile.XGLTYPE) + b"\n" * each + _header(f"b.fastpath/f{i}", 0)
    path = tmp_path / "many.tar.gz"
    path.write_bytes(gzip.compress(raw + b"\0" * 2 * BLOCK))
    assert _reason(path) == f"metadata headers exceed the {MAX_META_TOTAL_BYTES}-byte cap per archive"
    # Empty pax headers chained without end would recurse inside tarfile.
    chain = b"".join(_header(f"pax{i}", 0, tarfile.XHDTYPE) for i in range(MAX_META_CHAIN + 1))
    path.write_bytes(gzip.compress(chain + _tar(GOOD)))
    assert _reason(path) == f"more than {MAX_META_CHAIN} metadata headers in a row"


def test_a_zero_padding_bomb_stops_at_the_padding_cap(tmp_path):
    from fastpath.safe_tar import MAX_TRAILING_ZERO_BYTES

    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    path = tmp_path / "zeros.tar.gz"
    with open(path, "wb") as f:
        f.write(z.compress(_tar(GOOD)))
        for _ in range(64):
            f.write(z.compress(b"\0" * (1 << 20)))
        f.write(z.flush())
    assert _reason(path) == f"more than {MAX_TRAILING_ZERO_BYTES} bytes of padding after the tar end-of-archive marker"
