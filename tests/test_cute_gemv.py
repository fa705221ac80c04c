"""CuTe DSL small-M GEMV (variant "cute" of dense_gemv).

On CPU: the module imports with or without nvidia-cutlass-dsl and reports itself unavailable with
the reason; where the DSL is installed, the kernel is compiled (no GPU needed) and its PTX is
checked for 16-byte vector loads and warp shuffles. Numerics need a CUDA device (skipped here,
with the reason; the GPU script optimized_model/k3/fast/gpu_attn_check.py measures them)."""

import re
import subprocess
import sys

import pytest
import torch

from optimized_model.k3.fast.kernels import cute_gemv as cg

HAS_CUDA = torch.cuda.is_available()


def test_imports_without_cutlass_and_reports_why():
    code = (
        "import sys; sys.modules['cutlass'] = None\n"  # makes `import cutlass` raise ImportError
        "from optimized_model.k3.fast.kernels import cute_gemv as cg\n"
        "ok, why = cg.available(); e = cg.kernel_entry('cpu')\n"
        "print(ok, e.dtypes, '|', why, '|', e.unavailable)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith("False [] |"), line
    assert "nvidia-cutlass-dsl not importable" in line


@pytest.mark.skipif(HAS_CUDA, reason="CPU-only behaviour")
def test_cpu_reports_unavailable_and_refuses_to_run():
    ok, why = cg.available()
    assert not ok and why
    e = cg.kernel_entry("cpu")
    assert e.dtypes == [] and e.unavailable == why
    assert e.component == "dense_gemv" and e.kernel_patterns == [r"cute_gemv_kernel"]
    x, w = torch.randn(1, 64, dtype=torch.float16), torch.randn(32, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="unavailable"):
        cg.gemv(x, w)


def test_make_inputs_and_references_on_cpu():
    inp = cg.make_inputs(dict(m=2, n=24, k=64), "large", "float32", "cpu", 0)
    assert inp["x"].shape == (2, 64) and inp["weight"].shape == (24, 64)
    torch.testing.assert_close(cg.standard(**inp), cg.oracle(**inp))
    assert cg.make_inputs(dict(m=2, n=24, k=64), "large", "float32", "cpu", 0)["x"].equal(inp["x"])


def test_compiles_to_vectorized_ptx():
    """Compile for a GPU target without a GPU; the PTX must use 128-bit global loads and
    butterfly shuffles (the kernel's design), and one CTA per slab of rows."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl not installed (pip install nvidia-cutlass-dsl==4.8.1)")
    import cuda.bindings.driver as drv
    import cutlass.cute as cute

    N, K, M = 48, 1024, 2
    w = torch.randn(N, K).to(torch.bfloat16)
    x = torch.randn(M, K).to(torch.bfloat16)
    y = torch.empty(M, N, dtype=torch.bfloat16)
    args = (cg._wrap(w), cg._wrap(x), cg._wrap(y), drv.CUstream(0))
    fn = cute.compile(cg._build(4, 2), *args, options="--keep-ptx")
    ptx = fn.__ptx__ or ""
    assert ".entry" in ptx and "cute_gemv_kernel" in ptx
    loads = re.findall(r"ld\.global(?:\.\w+)*\.v4\.(?:b32|u32|f32)", ptx)
    assert loads, "no 128-bit vector loads in the PTX"
    assert not re.search(r"ld\.global(?:\.\w+)*\.(?:b16|u16)\b", ptx), "scalar 16-bit loads"
    assert "shfl.sync.bfly" in ptx
    entry = re.search(r"\.entry\s+(\w+)", ptx).group(1)  # the name a profiler will show
    assert any(re.search(p, entry) for p in cg.kernel_entry("cpu").kernel_patterns), entry


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: CuTe DSL numerics run on the GPU only "
                    "(gpu_attn_check.py measures them there)")
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("n,k", [(4096, 4096), (1000, 4104), (4097, 512)])
def test_gpu_numerics_vs_oracle(m, n, k):
    ok, why = cg.available()
    if not ok:
        pytest.skip(why)
    inp = cg.make_inputs(dict(m=m, n=n, k=k), "normal", "bfloat16", "cuda", 0)
    y = cg.gemv(**inp)
    ref = cg.oracle(**inp)
    noise = (cg.standard(**inp).float() - ref).abs().max().item()
    assert (y.float() - ref).abs().max().item() <= max(8e-3, 2 * noise)
    assert torch.equal(y, cg.gemv(**inp))  # deterministic
