"""Lab tools: GPU experiments, benchmarks, sweeps and profilers (not product, not tests).

Run from the repository root as ``python3 -m lab.NAME`` (lab/README.md says which question
each answers). Not installed, and nothing in fastpath/ or optimized_model/ imports it.
"""
