"""Diagnosis of two features failures of the full tier with drafts on (perf notes, run V): the
sampling-distribution case after speculative cases in one process, and the standard path's
greedy rows with drafts. Runs the features suite's own case functions in this order, on the
trained model, printing each case's verdict rows:

  1. sampling/temperature on a fresh process;
  2. speculative sampled-d7 (synthetic drafts, verify steps of 8 x 8 rows on the fast path);
  3. sampling/temperature again;
  4. speculative greedy-d3 on both paths (the standard path's fla KDA inputs made contiguous).

    python3 -m lab.gpu_spec_diag
"""

from __future__ import annotations

from fastpath.engine import create_engine
from fastpath.pytest_plugin import LazyModels
from fastpath.spec import load_spec
from fastpath.suites import test_features as F
from lab.gpu_draft_diag import run

SPEC = "optimized_model/k3/fastpath.toml"


def main() -> None:
    spec = load_spec(SPEC)
    tier = spec.tier("full")
    opts = tier.engine_options_for("features")
    engine = create_engine("embedded", **opts)
    models = LazyModels(lambda: engine, spec.switch)

    def gate(name: str) -> dict:
        return dict(spec.gates.settings[name])

    sampling = {"case_id": "features/sampling/temperature", "config": {}}
    sizes = F.SPEC_SIZES["full"]

    def sampling_case(record):
        F.test_sampling_distribution(sampling, engine, spec, tier, models, gate, record)

    run("1 sampling fresh", sampling_case)
    run("2 speculative sampled-d7", lambda record: F._spec_sampled(
        7, sizes, engine, models, gate, record, F.H.verify_batch(spec, tier, 7, sizes["draws"])))
    run("3 sampling after speculation", sampling_case)
    run("4 speculative greedy-d3", lambda record: F._spec_greedy(
        3, sizes, models, tier, record, engine.components(), F.H.verify_batch(spec, tier, 3, sizes["batch"])))


if __name__ == "__main__":
    main()
