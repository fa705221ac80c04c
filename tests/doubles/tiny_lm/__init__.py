"""A small test-double engine (Engine protocol) whose fast path can be made defective.

Used by tests/test_suites_double.py and the double version of the mutation self-test, so the
suites can be tested without the K3-mini subject. ``fast_path.py`` is the double's "fast path"
(the file the double's mutation patches edit); ``engine.py`` the model, paths and engine;
``spec.toml`` its spec.
"""
