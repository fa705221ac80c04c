"""Carry Triton's autotuning results from one H200 training run to the next, on a fresh machine.

fla's chunked KDA kernels (forward and backward) are autotuned: every config of every kernel is
compiled and timed at each new key (head sizes, the row length's chunking), which is part of the
minutes a fresh run spends before its first step (run 2: ~140 s). With
``TRITON_CACHE_AUTOTUNING=1`` Triton writes each result to its cache directory as
``<key>/<kernel>.autotune.json`` and, finding it there, compiles only the chosen config. A run
packs those files (a few kB) into ``autotune.tar.gz`` beside its state; the next run, resumed
from that state, unpacks them first. The key covers Triton's version, the GPU target, the
kernel's source and the configs, so a mismatched file is never read, only ignored.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

ARCHIVE = "autotune.tar.gz"
SUFFIX = ".autotune.json"
# Session 35's results on an H100 (triton 3.6.0, fla-core 0.6.0; sm_90, so the H200 reads them
# too): a fresh run starts from them, since no machine keeps a cache from one session to the next
# (set-up 126 s there without them, ~25 s with them in session 25).
SEED = Path(__file__).with_name("autotune-sm90.tar.gz")


def archive_to_restore(autotune: str | None, resume: str | None) -> Path:
    """The archive a run restores first: the one named, else the resumed state's, else the seed."""
    if autotune:
        return Path(autotune)
    return Path(resume) / ARCHIVE if resume else SEED


def enable() -> None:
    """Before the first autotuned launch: Triton reads this knob from the environment."""
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")


def cache_dir() -> Path:
    from triton import knobs

    return Path(knobs.cache.dir)


def pack(cache: Path, out_file: Path) -> int:
    """Write every autotuning result under ``cache`` into ``out_file``; the number of files."""
    found = sorted(p for p in cache.rglob(f"*{SUFFIX}") if p.is_file()) if cache.is_dir() else []
    if not found:
        return 0
    tmp = out_file.with_name(out_file.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for p in found:
            tar.add(p, arcname=p.relative_to(cache).as_posix())
    tmp.replace(out_file)  # a run cut mid-write leaves the previous archive, never half of one
    return len(found)


def unpack(archive: Path, cache: Path) -> int:
    """Restore ``archive``'s autotuning results under ``cache`` (only ``*.autotune.json`` files,
    only inside it); the number restored."""
    if not archive.is_file():
        return 0
    cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(SUFFIX)]
        tar.extractall(cache, members=members, filter="data")  # "data": no absolute paths, no ../
    return len(members)
