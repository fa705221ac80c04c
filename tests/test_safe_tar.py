import gzip
import io
import os
import tarfile
import time

import pytest

from fastpath.safe_tar import Limits, UnsafeBundle, check_name, extract_archive, inspect_archive, open_bundle


def _info(name, *, data=b"", type_=tarfile.REGTYPE, size=None, linkname=""):
    info = tarfile.TarInfo(name)
    info.type = type_
    info.size = len(data) if size is None else size
    info.linkname = linkname
    return info


def _archive(path, members):
    """members: [(TarInfo, bytes or None)]; written with tarfile so headers are genuine."""
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _reason(path, limits=Limits()):
    with pytest.raises(UnsafeBundle) as e:
        with open_bundle(path, limits):
            pass
    return e.value.reason


def test_good_archive_extracts_into_a_fresh_dir_and_is_removed(tmp_path):
    a = _archive(tmp_path / "ok.tar.gz", [(_info("b.fastpath", type_=tarfile.DIRTYPE), None),
                                         (_info("b.fastpath/manifest.json", data=b"{}"), b"{}"),
                                         (_info("b.fastpath/logs/x.log", data=b"hi"), b"hi")])
    with open_bundle(a) as d:
        assert d.name == "b.fastpath" and (d / "logs/x.log").read_bytes() == b"hi"
        root = d.parent
    assert not root.exists()


def test_dotdot_is_rejected_and_nothing_escapes(tmp_path):
    a = _archive(tmp_path / "a.tar.gz", [(_info("b/ok.txt", data=b"1"), b"1"), (_info("b/../../x", data=b"p"), b"p")])
    assert "'..'" in _reason(a)
    assert not (tmp_path / "x").exists()


def test_absolute_path_is_rejected(tmp_path):
    a = _archive(tmp_path / "a.tar.gz", [(_info("/tmp/fastpath-evil", data=b"p"), b"p")])
    assert _reason(a) == "absolute path"
    assert not os.path.exists("/tmp/fastpath-evil")


@pytest.mark.parametrize("type_,reason", [(tarfile.SYMTYPE, "symbolic link"), (tarfile.LNKTYPE, "hard link"),
                                          (tarfile.CHRTYPE, "device file"), (tarfile.BLKTYPE, "device file"),
                                          (tarfile.FIFOTYPE, "FIFO")])
def test_links_and_special_files_are_rejected(tmp_path, type_, reason):
    a = _archive(tmp_path / "a.tar.gz", [(_info("b/link", type_=type_, linkname="/etc/passwd"), None)])
    assert _reason(a) == reason


def test_huge_sparse_member_rejected_from_its_header_without_reading(tmp_path):
    # A header claiming 10 GB with no data behind it: the archive is tiny, the claim is refused
    # on the header (not as a truncated read), quickly.
    info = _info("b/huge.bin", size=10 * 2**30)
    path = tmp_path / "huge.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.fileobj.write(info.tobuf(tarfile.PAX_FORMAT, tar.encoding, tar.errors))
    assert path.stat().st_size < 4096
    t0 = time.perf_counter()
    reason = _reason(path)
    assert "exceeds" in reason and str(10 * 2**30) in reason
    assert time.perf_counter() - t0 < 5


def test_duplicate_and_case_folded_names_are_rejected(tmp_path):
    a = _archive(tmp_path / "a.tar.gz", [(_info("b/x", data=b"1"), b"1"), (_info("b/x", data=b"2"), b"2")])
    assert _reason(a) == "duplicate member name"
    a = _archive(tmp_path / "c.tar.gz", [(_info("b/X", data=b"1"), b"1"), (_info("b/x", data=b"2"), b"2")])
    assert _reason(a) == "duplicate member name"


def test_file_used_as_directory_is_rejected(tmp_path):
    a = _archive(tmp_path / "a.tar.gz", [(_info("b/x", data=b"1"), b"1"), (_info("b/x/y", data=b"2"), b"2")])
    assert "nested under a file" in _reason(a)


def test_member_count_and_total_size_limits(tmp_path):
    members = [(_info(f"b/{i}", data=b"12345"), b"12345") for i in range(5)]
    a = _archive(tmp_path / "a.tar.gz", members)
    assert "more than 4 members" in _reason(a, Limits(max_members=4))
    assert "total size" in _reason(a, Limits(max_total_bytes=20))
    assert "exceeds the 4-byte limit" in _reason(a, Limits(max_member_bytes=4))


def test_backslash_nul_and_empty_names():
    for name, reason in (("b\\..\\x", "backslash"), ("b/x\0y", "NUL"), ("C:/x", "absolute"), ("./", "empty")):
        with pytest.raises(UnsafeBundle, match=reason):
            check_name(name, Limits())
    assert check_name("./b//c", Limits()) == "b/c"


def test_not_an_archive_and_truncated_data(tmp_path):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not gzip at all")
    assert "not a readable" in _reason(junk)
    info = _info("b/x", size=100)
    path = tmp_path / "trunc.tar.gz"
    # Raw gzip: no end-of-archive blocks that would pad the member's missing data.
    path.write_bytes(gzip.compress(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape") + b"short"))
    with pytest.raises(UnsafeBundle):
        extract_archive(path, tmp_path / "dest")


def test_directory_input_gets_the_same_rules(tmp_path):
    d = tmp_path / "b.fastpath"
    (d / "logs").mkdir(parents=True)
    (d / "manifest.json").write_text("{}")
    with open_bundle(d) as root:
        assert root == d
    (d / "logs" / "l").symlink_to("/etc/passwd")
    assert _reason(d) == "symbolic link"
    (d / "logs" / "l").unlink()
    os.link(d / "manifest.json", d / "logs" / "hard")
    assert _reason(d) == "hard link"
    (d / "logs" / "hard").unlink()
    (d / "big").write_bytes(b"x" * 100)
    assert "exceeds" in _reason(d, Limits(max_member_bytes=10))


def test_every_header_is_inspected_before_extraction(tmp_path):
    # A bad member at the end must stop the extraction of the good ones before it.
    a = _archive(tmp_path / "a.tar.gz", [(_info("b/ok", data=b"1"), b"1"),
                                         (_info("b/evil", type_=tarfile.SYMTYPE, linkname="/"), None)])
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UnsafeBundle):
        extract_archive(a, dest)
    assert list(dest.iterdir()) == []
    assert [n for n, _ in inspect_archive(_archive(tmp_path / "g.tar.gz", [(_info("b/ok", data=b"1"), b"1")]))] == ["b/ok"]


def test_data_after_the_archive_end_is_rejected(tmp_path):
    a = _archive(tmp_path / "a.tar.gz", [(_info("b/ok", data=b"1"), b"1")])
    a.write_bytes(a.read_bytes() + gzip.compress(b"\0" * (2 << 20)))  # a second gzip member
    assert "bytes after the gzip trailer" in _reason(a)


def test_decompression_bomb_in_a_pax_header_is_refused_on_its_header(tmp_path):
    # tarfile reads pax records into memory; the header's declared size is capped first.
    info = _info("b/x", data=b"1")
    info.pax_headers = {"comment": "z" * (8 << 20)}
    a = _archive(tmp_path / "bomb.tar.gz", [(info, b"1")])
    assert a.stat().st_size < (64 << 10)
    assert "pax header of 8388625 bytes exceeds the 65536-byte cap" in _reason(a, Limits(max_total_bytes=1000, max_members=2))
