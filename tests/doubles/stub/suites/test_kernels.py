"""Double kernels suite: the fast kernel against its oracle."""

import pytest


@pytest.mark.fastpath(kind="kernel", gate="kernels_noise_floor")
def test_kernel_vs_oracle(case, fp_engine, fp_gate, record):
    atol = fp_gate("kernels_noise_floor")["atol"]
    x = [0.5, -1.25, 3.0]
    for kernel in fp_engine.kernels():
        err = max(abs(a - b) for a, b in zip(kernel.fast(x), kernel.oracle(x)))
        record("kernels_noise_floor", "max_abs_err", err, threshold=atol, comparator="<=", kernel=kernel.name)
