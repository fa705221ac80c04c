"""A scripted test-double engine for the harness's own tests (see tests/doubles/README.md)."""
