"""Jitter stress: perturb timing around kernel calls to surface races (kernels).

A race such as "read the activations before waiting on the producer" usually goes unseen
because the producer happens to finish first. Under ``stress()`` the timing changes:

- GPU: busy work (large matmuls) is queued on a side stream so it competes for SMs with the
  kernel under test; the current stream is stalled for a random number of cycles
  (``torch.cuda._sleep``) before and between calls, so the host runs ahead of the device; and
  random host sleeps are inserted between launches.
- CPU: random sleeps before and after each call; every thread *started* while the stress is
  active first sleeps a random time (so a worker that the code forgot to join finishes late);
  the interpreter's thread switch interval is shortened and busy background threads compete
  for the GIL and the cores (thread interleaving).

Usage::

    with jitter.stress(seed=1, device="cuda") as j:
        out = j.call(kernel, **inputs)   # or plain calls inside the block

Everything is restored on exit. The randomness is seeded; timing itself is not reproducible,
which is the point: callers run several rounds (spec: ``kernels_jitter.rounds``).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

__all__ = ["Jitter", "stress", "is_active"]

_active = threading.Event()


def is_active() -> bool:
    return _active.is_set()


class Jitter:
    def __init__(self, seed: int = 0, device: str = "cpu", *, max_delay_s: float = 0.003,
                 busy_threads: int = 2, side_stream_work: int = 8):
        self.rng = random.Random(seed)
        self.device = str(device)
        self.max_delay_s = max_delay_s
        self.busy_threads = busy_threads
        self.side_stream_work = side_stream_work
        self.calls = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._saved: dict[str, Any] = {}
        self._side = None
        self._side_buf = None

    # ---- helpers -------------------------------------------------------------------------
    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def _delay(self) -> None:
        time.sleep(self.rng.uniform(0.0, self.max_delay_s))

    def _gpu_perturb(self) -> None:
        import torch

        if self._side is not None and self._side_buf is not None:
            with torch.cuda.stream(self._side):
                a = self._side_buf
                for _ in range(self.rng.randint(1, self.side_stream_work)):
                    a = a @ a
                    a = a / (a.abs().amax() + 1)  # keep it finite; the values don't matter
        # stall the current stream so the host runs ahead and launch order shifts
        torch.cuda._sleep(self.rng.randint(0, 2_000_000))

    def perturb(self) -> None:
        """One perturbation point (call it between launches)."""
        if self.cuda:
            self._gpu_perturb()
        self._delay()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` with perturbations before and after it (device work is synchronised
        only at the end, so the perturbation overlaps the call)."""
        self.calls += 1
        self.perturb()
        out = fn(*args, **kwargs)
        self.perturb()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return out

    # ---- context ---------------------------------------------------------------------------
    def _busy(self) -> None:
        x = 0
        while not self._stop.is_set():
            for i in range(2000):
                x += i * i
            if self.rng.random() < 0.1:
                time.sleep(0)

    def __enter__(self) -> "Jitter":
        jit = self
        self._saved["switch"] = sys.getswitchinterval()
        sys.setswitchinterval(1e-5)
        orig_run = threading.Thread.run
        self._saved["run"] = orig_run
        seed_rng = random.Random(self.rng.random())
        lock = threading.Lock()

        def delayed_run(thread_self: threading.Thread) -> None:
            if _active.is_set() and getattr(thread_self, "_fastpath_jitter_busy", False) is False:
                with lock:
                    d = seed_rng.uniform(jit.max_delay_s, 4 * jit.max_delay_s)
                time.sleep(d)
            orig_run(thread_self)

        threading.Thread.run = delayed_run  # type: ignore[method-assign]
        _active.set()
        for _ in range(self.busy_threads):
            t = threading.Thread(target=self._busy, daemon=True, name="fastpath-jitter-busy")
            t._fastpath_jitter_busy = True  # type: ignore[attr-defined]
            t.start()
            self._threads.append(t)
        if self.cuda:
            import torch

            self._side = torch.cuda.Stream()
            self._side_buf = torch.randn(2048, 2048, device=self.device)
        return self

    def __exit__(self, *exc: Any) -> None:
        _active.clear()
        self._stop.set()
        for t in self._threads:
            t.join()
        self._threads.clear()
        threading.Thread.run = self._saved["run"]  # type: ignore[method-assign]
        sys.setswitchinterval(self._saved["switch"])
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            self._side = None
            self._side_buf = None


@contextmanager
def stress(seed: int = 0, device: str = "cpu", **options: Any) -> Iterator[Jitter]:
    """Open a jitter stress context (see the module docstring)."""
    j = Jitter(seed, device, **options)
    with j:
        yield j
