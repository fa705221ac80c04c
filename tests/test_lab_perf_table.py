"""lab/perf_table.py on the committed full bundle: one table row per speedup case that ran, with
that case's own figures, and one per prompt case."""

from pathlib import Path

import pytest

from lab import perf_table

BUNDLE = Path(__file__).resolve().parents[1] / "bundles" / "k3-mini-latency-specialized.full.fastpath.tar.gz"


@pytest.fixture(scope="module")
def perf_rows():
    rows = perf_table.read_rows(BUNDLE)
    return rows[rows.suite == "perf"]


def test_one_row_per_speedup_case_that_ran_with_its_own_speedup(perf_rows):
    table = perf_table.speedup_table(perf_rows)[2:]
    ran = perf_rows[perf_rows.case_id.str.startswith("perf/speedup/") & (perf_rows.metric == "speedup")]
    assert len(table) == len(ran) > 0
    for line in table:
        batch, ctx, draft = (int(c) for c in line.strip("|").split("|")[:3])
        case = ran[(ran.batch == batch) & (ran.context == ctx) & (ran.draft == draft)]
        assert f"| {case.iloc[0].value:.3f} [" in line


def test_one_row_per_prompt_case_and_the_cli_prints_the_control(perf_rows, capsys):
    assert len(perf_table.prompt_table(perf_rows)) - 2 == int((perf_rows.metric == "prompt_speedup").sum())
    assert perf_table.main([str(BUNDLE)]) == 0
    assert "control (standard vs standard):" in capsys.readouterr().out
