"""Zeroed int32 counter buffers for the kernels whose last program to arrive (atomic ticket)
finishes the work: KDA decode's per-head counters, the experts' down kernel's per-tile tickets.

One buffer per (purpose, device), grown on demand. The kernels re-arm every counter they take,
so a buffer stays zero between launches and graph replays. An outgrown buffer is replaced but
kept alive, never freed: a graph captured earlier still points at it. (Underscore module: not a
kernel module, the registry skips it.)
"""

from __future__ import annotations

import torch

_CACHE: dict[tuple[str, str], torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []


def zeroed(purpose: str, device, n: int, min_size: int = 256) -> torch.Tensor:
    """The zeroed int32 buffer of ``purpose`` on ``device``, at least ``n`` entries long."""
    key = (purpose, str(device))
    buf = _CACHE.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _RETIRED.append(buf)
        buf = _CACHE[key] = torch.zeros(max(n, min_size), dtype=torch.int32, device=device)
    return buf
