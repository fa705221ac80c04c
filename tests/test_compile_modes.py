"""lab/compile_modes.py's table: the fastest capturable candidate is marked per shape; eager-only
references and failed shapes never are."""

from lab import compile_modes as cm


def test_table_marks_the_fastest_capturable_candidate():
    results = [
        {"candidate": "eager", "graphs": True, "shapes": {"b1-c1": {"step_ms": 3.0, "tok_s": 333.0, "setup_s": 1.0},
                                                          "b8-c1": {"step_ms": 4.0, "tok_s": 2000.0, "setup_s": 1.0}}},
        {"candidate": "compile:default", "graphs": True,
         "shapes": {"b1-c1": {"step_ms": 2.0, "tok_s": 500.0, "setup_s": 60.0}, "b8-c1": {"error": "boom"}}},
        {"candidate": "loop-moe", "graphs": False, "shapes": {"b1-c1": {"step_ms": 1.0, "tok_s": 1000.0, "setup_s": 0.1},
                                                              "b8-c1": {"step_ms": 1.0, "tok_s": 8000.0, "setup_s": 0.1}}},
    ]
    lines = cm.table(results, ["b1-c1", "b8-c1"]).splitlines()
    eager, compiled, loop = lines[2], lines[3], lines[4]
    assert "2.000 (500) *" in compiled and "error" in compiled and "| 60.0 |" in compiled
    assert "4.000 (2,000) *" in eager and "3.000 (333) |" in eager
    assert "*" not in loop and "(eager, no graph)" in loop
