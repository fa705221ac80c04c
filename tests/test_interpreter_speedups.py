"""Triton interpreter speed-ups (optimized_model/k3/fast/kernels/interpreter.py): the cached builtin
scan wraps exactly what the original scan wraps, before a launch and inside one; the integer
overflow check is off only where its assert could never fire; kernels compute bit for bit what
they compute under the interpreter as shipped."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any fast kernel module is imported

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter as interp  # noqa: E402

from optimized_model.k3.fast.kernels import interpreter  # noqa: E402

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("TRITON_INTERPRET was set to something else", allow_module_level=True)


def _wrapped_names(scan, modules) -> list[tuple[str, str]]:
    scope = interp._LangPatchScope()
    try:
        for m in modules:
            scan(m, interp.interpreter_builder, scope)
        return sorted((getattr(obj, "__name__", type(obj).__name__), name) for obj, name, _ in scope._changes)
    finally:
        scope.restore()


def test_cached_scan_wraps_what_the_original_wraps():
    assert interpreter.enable() == ""
    cached = interp._patch_builtin
    original = cached.__wrapped__
    modules = [tl, tl.core, tl.math, tl.tensor]
    assert _wrapped_names(cached, modules) == _wrapped_names(original, modules)
    # inside a launch: the launch's own wrappers are in place, and nothing more is wrapped
    outer = interp._patch_lang(_wrapped_names)  # as a launch does for a function that sees tl
    try:
        assert _wrapped_names(cached, modules) == _wrapped_names(original, modules)
    finally:
        outer.restore()


@pytest.mark.parametrize("n", [5, 100])
def test_a_kernel_with_device_calls_still_computes_the_same(n):
    from optimized_model.k3.fast.kernels.norm import kernel_entry

    e = kernel_entry("cpu")
    inputs = e.make_inputs({"M": 3, "N": n}, "normal", "float32", "cpu", 0)
    torch.testing.assert_close(e.fast(**inputs), e.oracle(**inputs), atol=1e-5, rtol=1e-5)


def test_the_overflow_check_is_off_only_where_its_assert_could_not_fire():
    from triton.language.semantic import TritonSemantic

    assert interpreter.enable() == ""
    options = interp.interpreter_builder.options
    assert options.debug is False and options.sanitize_overflow is False
    # why that changes nothing: without debug the check's device_assert returns at once
    assert TritonSemantic(interp.interpreter_builder).device_assert(None, "never evaluated", None) is None


def test_kernels_compute_bit_for_bit_what_they_compute_without_the_speedups(monkeypatch):
    """KDA decode (device calls into our helpers and into triton.language's own, whose module
    sees tl.core where the kernel's sees only tl) and the gemv, with the three speed-ups and
    with Triton's interpreter as shipped."""
    import dataclasses

    from optimized_model.k3.fast.kernels import gemv, kda_decode

    assert interpreter.enable() == ""
    cases = [(kda_decode.kernel_entry("cpu")[0], {"batch": 3, "heads": 2, "head_k": 16, "head_v": 32, "block_v": 16}),
             (gemv.kernel_entry("cpu")[0], {"M": 3, "N": 249, "K": 152})]
    inputs = [e.make_inputs(shape, "normal", "float16", "cpu", 5) for e, shape in cases]
    fast = [e.fast(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()})
            for (e, _), inp in zip(cases, inputs)]
    monkeypatch.setattr(interp, "_patch_builtin", interp._patch_builtin.__wrapped__)
    monkeypatch.setattr(interp, "_patch_lang", interp._patch_lang.__wrapped__)
    monkeypatch.setattr(interp.GridExecutor, "__call__", interp.GridExecutor.__call__.__wrapped__)
    builder = interp.interpreter_builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=True))
    shipped = [e.fast(**inp) for (e, _), inp in zip(cases, inputs)]
    for a, b in zip(fast, shipped):
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert torch.equal(x, y)
