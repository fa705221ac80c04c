"""CuTe DSL small-M GEMV (variant "cute" of dense_gemv).

On CPU: the module imports with or without nvidia-cutlass-dsl and reports itself unavailable with
the reason; where the DSL is installed, the kernel is compiled (no GPU needed) and its PTX is
checked for 16-byte vector loads and warp shuffles. Numerics need a CUDA device (skipped here,
with the reason; the GPU script lab/gpu_attn_check.py measures them)."""

import os
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


def test_importing_it_builds_no_triton_kernel():
    """The module is imported on CPU too (registry, tests): it must not import a @triton.jit
    helper before the engine switches on Triton's interpreter (a helper built outside the
    interpreter cannot be called from an interpreted kernel)."""
    code = ("import sys\nfrom optimized_model.k3.fast.kernels import cute_gemv\n"
            "print(sorted(m for m in sys.modules if m == 'triton' or m.endswith('kernels.pdl')))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # not switched on yet
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]"


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


def _ptx(M=2, N=48, K=1024, norm=False, residual=False, use_pdl=False, warps=4, rpw=2) -> str:
    """The PTX of one build, compiled for a GPU target without a GPU."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl not installed (pip install nvidia-cutlass-dsl==4.8.1)")
    import cuda.bindings.driver as drv
    import cutlass.cute as cute

    w = torch.randn(N, K).to(torch.bfloat16)
    x = torch.randn(M, K).to(torch.bfloat16)
    y = torch.empty(M, N, dtype=torch.bfloat16)
    nw = torch.ones(1, K, dtype=torch.bfloat16) if norm else x[:1]
    r = torch.zeros(M, N, dtype=torch.bfloat16) if residual else y
    args = (cg._wrap(w), cg._wrap(x), cg._wrap(nw), cg._wrap(y), cg._wrap(r), 1e-6, drv.CUstream(0))
    fn = cute.compile(cg._build(warps, rpw, norm, residual, use_pdl), *args, options="--keep-ptx")
    return fn.__ptx__ or ""


def test_compiles_to_vectorized_ptx():
    """The PTX must use 128-bit global loads and butterfly shuffles (the kernel's design), and
    one CTA per slab of rows."""
    ptx = _ptx()
    assert ".entry" in ptx and "cute_gemv_kernel" in ptx
    loads = re.findall(r"ld\.global(?:\.\w+)*\.v4\.(?:b32|u32|f32)", ptx)
    assert loads, "no 128-bit vector loads in the PTX"
    assert not re.search(r"ld\.global(?:\.\w+)*\.(?:b16|u16)\b", ptx), "scalar 16-bit loads"
    assert "shfl.sync.bfly" in ptx
    assert "griddepcontrol" not in ptx and "rsqrt" not in ptx  # no fusion asked, no PDL
    entry = re.search(r"\.entry\s+(\w+)", ptx).group(1)  # the name a profiler will show
    assert any(re.search(p, entry) for p in cg.kernel_entry("cpu").kernel_patterns), entry


@pytest.mark.parametrize("norm,residual", [(True, False), (False, True), (True, True)])
def test_fused_builds_compile_with_their_fusions(norm, residual):
    """The RMSNorm prologue brings the rstd (rsqrt) and only vector loads of x / the norm
    weight; the residual epilogue one scalar load per output; under PDL the W rows' first
    vectors are loaded before griddepcontrol.wait (weights are never written) and nothing is
    stored before it."""
    ptx = _ptx(M=1, norm=norm, residual=residual, use_pdl=True)
    assert ("rsqrt" in ptx) == norm
    scalar_loads = re.findall(r"ld\.global(?:\.\w+)*\.(?:b16|u16)\b", ptx)
    assert bool(scalar_loads) == residual
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("griddepcontrol.launch_dependents") > wait
    before = ptx[:wait]
    assert len(re.findall(r"ld\.global(?:\.\w+)*\.v4", before)) == 2  # rows_per_warp W vectors
    assert "st.global" not in before
    assert "griddepcontrol" not in _ptx(M=1, norm=norm, residual=residual, use_pdl=False)


def test_supports_names_what_is_out_of_scope():
    """Operand checks (no device needed): each refusal says which operand and why."""
    bf = torch.bfloat16
    x, w = torch.zeros(1, 64, dtype=bf), torch.zeros(32, 64, dtype=bf)
    ok = lambda **kw: cg.supports(kw.pop("x", x), kw.pop("w", w), need_device=False, **kw)  # noqa: E731
    assert ok() == (True, "")
    assert ok(out=torch.zeros(1, 32, dtype=bf), norm_weight=torch.zeros(64, dtype=bf),
              residual=torch.zeros(1, 40, dtype=bf)) == (True, "")
    assert "small-M" in ok(x=torch.zeros(5, 64, dtype=bf))[1]
    assert "bf16/fp16" in ok(x=x.float(), w=w.float())[1]
    assert "not a multiple" in ok(x=torch.zeros(1, 60, dtype=bf), w=torch.zeros(32, 60, dtype=bf))[1]
    assert "x rows" in ok(x=torch.zeros(2, 68, dtype=bf)[:, :64])[1]  # 136-byte rows
    assert ok(x=torch.zeros(2, 128, dtype=bf)[:, :64])[0]  # 256-byte rows: aligned views are fine
    assert "out must be" in ok(out=torch.zeros(1, 31, dtype=bf))[1]
    assert "norm_weight" in ok(norm_weight=torch.zeros(64))[1]
    assert "residual" in ok(residual=torch.zeros(2, 32, dtype=bf))[1]


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device: CuTe DSL numerics run on the GPU only "
                    "(lab/gpu_attn_check.py measures them there)")
@pytest.mark.parametrize("shape", cg.kernel_entry("cpu").shapes, ids=str)
def test_gpu_numerics_vs_oracle(shape):
    ok, why = cg.available()
    if not ok:
        pytest.skip(why)
    inp = cg.make_inputs(shape, "normal", "bfloat16", "cuda", 0)
    y = cg.fast(**inp)
    ref = cg.oracle(**inp)
    noise = (cg.standard(**inp).float() - ref).abs().max().item()
    assert (y.float() - ref).abs().max().item() <= max(8e-3, 2 * noise)
    assert torch.equal(y, cg.fast(**inp))  # deterministic
