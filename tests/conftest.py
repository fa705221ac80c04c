"""Shared test set-up: make the test doubles importable (spec engine "fastpath_double_engine:...")."""

import sys
from pathlib import Path

DOUBLES = Path(__file__).parent / "doubles"
if str(DOUBLES) not in sys.path:
    sys.path.insert(0, str(DOUBLES))

# Suites inside the doubles are run by the verify tests through pytest.main, never collected here.
collect_ignore_glob = ["doubles/*", "suite_doubles/*"]
