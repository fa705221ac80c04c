"""A bundle's perf figures as the Markdown tables of docs/perf-notes.md, read from its rows:

    python3 -m lab.perf_table bundles/k3-mini-latency-specialized.full.fastpath.tar.gz

One row per speedup case (the faster standard step, the eager one, the fast one, tokens/s, the
speedup with its CI's low end, the acceptance length, the fast path's MBU), waived cases left out,
then one row per prompt case and the control's figure.
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from pathlib import Path

import pandas as pd

ROWS = "results/rows.parquet"


def read_rows(bundle: Path) -> pd.DataFrame:
    """The rows of a bundle directory or of its .tar.gz (the archive holds one top folder)."""
    if bundle.is_dir():
        return pd.read_parquet(bundle / ROWS)
    with tarfile.open(bundle, "r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/" + ROWS))
        return pd.read_parquet(io.BytesIO(tar.extractfile(member).read()))


def _metric(case: pd.DataFrame, metric: str, path: str | None = None):
    rows = case[(case.metric == metric) & (case.path.isna() if path is None else case.path == path)]
    return None if rows.empty else rows.iloc[0]


def speedup_table(rows: pd.DataFrame) -> list[str]:
    out = ["| batch | ctx | draft | std ms (which) | eager std ms | fast ms | fast tok/s | speedup [CI low] "
           "| AL | fast MBU |", "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    cases = rows[rows.case_id.str.startswith("perf/speedup/") & (rows.status != "waived")]
    order = cases[["case_id", "draft", "batch", "context"]].drop_duplicates().sort_values(["draft", "batch", "context"])
    for case_id, draft, batch, context in order.itertuples(index=False):
        case = cases[cases.case_id == case_id]
        speedup = _metric(case, "speedup", "fast")
        if speedup is None:  # an error row: the case ran out of budget or failed
            out.append(f"| {batch} | {context} | {draft} | {case.iloc[0].status}: {case.iloc[0].message} |")
            continue
        detail = json.loads(speedup.detail)
        which = detail["against"].removeprefix("standard (").rstrip(")").removeprefix("standard_")
        out.append(
            f"| {batch} | {context} | {draft} | {_metric(case, 'step_ms', 'standard').value:.3f} ({which}) "
            f"| {_metric(case, 'step_ms', 'standard_eager').value:.3f} | {_metric(case, 'step_ms', 'fast').value:.3f} "
            f"| {_metric(case, 'tokens_per_s', 'fast').value:.0f} | {speedup.value:.3f} [{detail['ci_low']:.3f}] "
            f"| {detail['acceptance_length']:.2f} | {100 * _metric(case, 'mbu', 'fast').value:.1f} % |")
    return out


def prompt_table(rows: pd.DataFrame) -> list[str]:
    out = ["| case | prompt tokens | std tok/s | fast tok/s | speedup [CI] | MBU | experts/layer real (random) "
           "| tokens shared |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows[rows.metric == "prompt_speedup"].itertuples(index=False):
        d = json.loads(row.detail)
        out.append(
            f"| {row.case_id.removeprefix('perf/prompts/')} | {max(d['prompt_tokens'])} | {d['std_tok_s']:.0f} "
            f"| {d['fast_tok_s']:.0f} | {row.value:.2f} [{d['ci_low']:.2f}, {d['ci_high']:.2f}] "
            f"| {100 * d['mbu']:.2f} % | {d['experts_per_layer']:.1f} ({d['random_experts_per_layer']:.1f}) "
            f"| {d['token_agreement']:.2f} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path, help="a bundle directory or its .tar.gz")
    args = ap.parse_args(argv)
    rows = read_rows(args.bundle)
    perf = rows[rows.suite == "perf"]
    print("\n".join(speedup_table(perf)), end="\n\n")
    print("\n".join(prompt_table(perf)), end="\n\n")
    for row in perf[perf.metric == "control_speedup"].itertuples(index=False):
        d = json.loads(row.detail)
        print(f"control (standard vs standard): {row.value:.4f}, alarm {d['alarm']}")
    bandwidth = perf[perf.metric == "copy_bandwidth"]
    if not bandwidth.empty:
        print(f"copy bandwidth: {bandwidth.iloc[0].value / 1e12:.3f} TB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
