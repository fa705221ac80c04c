"""lab/train/autotune_cache.py: Triton's autotuning results go from one training run to the next."""

import io
import tarfile

import pytest

from lab.train import autotune_cache as ac


def _cache(root):
    (root / "abc123").mkdir(parents=True)
    (root / "abc123" / "chunk_kda_bwd.autotune.json").write_text('{"configs_timings": []}')
    (root / "def456").mkdir()
    (root / "def456" / "chunk_kda_bwd.cubin").write_bytes(b"\0" * 64)  # compiled code: not carried
    return root


def test_pack_then_unpack_restores_only_the_autotuning_results(tmp_path):
    archive = tmp_path / "state" / ac.ARCHIVE
    archive.parent.mkdir()
    assert ac.pack(_cache(tmp_path / "old"), archive) == 1
    fresh = tmp_path / "new"
    assert ac.unpack(archive, fresh) == 1
    assert (fresh / "abc123" / "chunk_kda_bwd.autotune.json").read_text() == '{"configs_timings": []}'
    assert not (fresh / "def456").exists()
    assert not list(archive.parent.glob("*.tmp"))


def test_nothing_to_carry_writes_nothing_and_a_missing_archive_restores_nothing(tmp_path):
    assert ac.pack(tmp_path / "no-cache", tmp_path / ac.ARCHIVE) == 0
    assert not (tmp_path / ac.ARCHIVE).exists()
    assert ac.unpack(tmp_path / ac.ARCHIVE, tmp_path / "cache") == 0


def test_an_archive_cannot_write_outside_the_cache(tmp_path):
    archive = tmp_path / ac.ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        data = b"{}"
        info = tarfile.TarInfo("../escaped.autotune.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.TarError):
        ac.unpack(archive, tmp_path / "cache")
    assert not (tmp_path / "escaped.autotune.json").exists()


def test_a_failure_to_carry_never_stops_training(capsys):
    from lab.train import run

    def broken():
        raise tarfile.ReadError("truncated")

    run._carry_autotuning(broken, "restored")
    run._carry_autotuning(lambda: 3, "packed")
    out = capsys.readouterr().out
    assert "not restored (ReadError: truncated); Triton autotunes afresh" in out
    assert "packed 3 results" in out


def test_a_run_restores_the_named_archive_else_its_states_else_the_committed_seed():
    assert ac.archive_to_restore("x/a.tar.gz", "state").as_posix() == "x/a.tar.gz"
    assert ac.archive_to_restore(None, "state").as_posix() == "state/" + ac.ARCHIVE
    assert ac.archive_to_restore(None, None) == ac.SEED


def test_the_committed_seed_holds_only_autotuning_results_of_fla_kernels(tmp_path):
    """A fresh machine's run restores it: every member an autotune result, none outside the cache."""
    assert ac.SEED.is_file()
    restored = ac.unpack(ac.SEED, tmp_path / "cache")
    assert restored >= 10
    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert len(files) == restored and all(p.name.endswith(ac.SUFFIX) for p in files)
    assert any("chunk_kda" in p.name for p in files)
