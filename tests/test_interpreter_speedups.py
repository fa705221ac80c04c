"""Triton interpreter speed-ups (optimized_model/k3/fast/kernels/interpreter.py): the cached builtin
scan wraps exactly what the original scan wraps, before a launch and inside one; the integer
overflow check is off only where its assert could never fire; kernels compute the same."""

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
