"""Shared test set-up: the test doubles importable (spec engines "stub.engine:..." and
"tiny_lm.engine:...", tests/doubles/README.md), and a one-CPU-thread fixture for the model tests."""

import sys
from pathlib import Path

import pytest

DOUBLES = Path(__file__).parent / "doubles"
if str(DOUBLES) not in sys.path:
    sys.path.insert(0, str(DOUBLES))

# Suites inside the doubles are run by the verify tests through pytest.main, never collected here.
collect_ignore_glob = ["doubles/*"]


@pytest.fixture(scope="module")
def one_torch_thread():
    """The CI / dev box has 2 shared cores: torch's CPU thread pool only adds contention in the
    model tests (a tiny forward runs 30-50x slower with the default pool)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
