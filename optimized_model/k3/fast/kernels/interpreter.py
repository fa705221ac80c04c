"""Three wasted costs of Triton's CPU interpreter (TRITON_INTERPRET=1) removed; kernel semantics
unchanged.

1. Every call of a ``@triton.jit`` device function under the interpreter -- ``tl.sum``, ``tl.zeros``,
``tl.sigmoid`` and our own helpers, dozens per program -- re-patches ``triton.language`` for the
interpreter: ``_patch_builtin(module)`` walks ``inspect.getmembers(module)`` (hundreds of
names, sorted) to find the builtins to wrap. Profiled on the tiny model's decode step that walk
was a third of the interpreter's time. The set of names that can hold a builtin never changes
(a builtin is defined at import; the interpreter only swaps it for its wrapper and back), so
``enable()`` replaces ``_patch_builtin`` with one that walks those names only, found once per
module: it wraps exactly the members the original would wrap, in the same scope.

2. Integer ``+ - *`` on int32 (every offset computation) is re-done in int64 and compared with
the int32 bounds for a ``device_assert`` -- which does nothing unless the interpreter's
``debug`` option is on (``semantic.device_assert`` returns at once), so the check's work is
thrown away: another third of a KDA decode program. With ``debug`` off, ``enable()`` turns the
``sanitize_overflow`` option off too, which skips exactly that unused work.

3. Each such device call re-patches ``triton.language`` although the launch around it (or an
earlier call in it) already did: the wrappers put in place stay until the launch ends. A
device call whose modules were patched earlier in the same launch now skips the re-patch (per
thread, reset at every launch): a third of what remains of a KDA decode program.

Only the interpreter is touched; on a GPU nothing here runs. A Triton whose interpreter lacks
one of the functions replaced keeps its own (``enable()`` returns why).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import threading
from typing import Any

_PATCH_WRAPPER = "_patch_attr.<locals>.<lambda>"  # the interpreter's wrapper of a builtin
_names: dict[int, list[str]] = {}
_enabled = False


def _candidates(module: Any, is_builtin: Any) -> list[str]:
    """Names of ``module`` that hold a builtin or the interpreter's wrapper of one (computed
    once per module: a name that holds neither now never held a builtin)."""
    key = id(module)
    if key not in _names:
        _names[key] = [name for name, member in inspect.getmembers(module)
                       if is_builtin(member) or getattr(member, "__qualname__", "") == _PATCH_WRAPPER]
    return _names[key]


def enable() -> str:
    """Install the three speed-ups (idempotent). Returns "" when installed, else why not."""
    global _enabled
    if _enabled:
        return ""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return "Triton's interpreter is off"
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
    except Exception as exc:  # pragma: no cover - triton is a model dependency
        return f"triton's interpreter is not importable ({type(exc).__name__})"
    original = getattr(interp, "_patch_builtin", None)
    patch_attr = getattr(interp, "_patch_attr", None)
    is_builtin = getattr(getattr(tl, "core", None), "is_builtin", None)
    grid = getattr(interp, "GridExecutor", None)
    if not all(callable(f) for f in (original, patch_attr, is_builtin, getattr(interp, "_patch_lang", None),
                                     getattr(grid, "__call__", None))):
        return "this Triton's interpreter lacks _patch_builtin/_patch_attr/_patch_lang/GridExecutor: left as it is"

    def patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        for name in _candidates(pkg, is_builtin):
            member = getattr(pkg, name)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    patch_builtin.__wrapped__ = original  # type: ignore[attr-defined]
    # the names are found now, outside any launch: inside one, the launch's own replacements (e.g.
    # of associative_scan) are neither builtins nor wrappers, and a first scan there missed them
    for module in (tl, getattr(tl, "core", None), getattr(tl, "math", None), getattr(tl, "tensor", None)):
        if module is not None:
            _candidates(module, is_builtin)
    interp._patch_builtin = patch_builtin
    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is not None and not getattr(options, "debug", True) and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    _skip_repeated_patches(interp, tl)
    _enabled = True
    return ""


class _NothingToRestore:
    def restore(self) -> None:
        pass


def _skip_repeated_patches(interp: Any, tl: Any) -> None:
    """``_patch_lang(fn)`` patches the language modules ``fn`` sees; within one launch a second
    patch of the same modules finds every builtin already wrapped and changes nothing."""
    patch_lang, grid_call = interp._patch_lang, interp.GridExecutor.__call__
    launch = threading.local()  # .patched: ids of the modules patched in this thread's launch
    seen: dict[int, frozenset] = {}

    def modules(fn: Any) -> frozenset:
        key = id(fn.__globals__)
        if key not in seen:
            seen[key] = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        return seen[key]

    def patch_once(fn: Any) -> Any:
        patched = getattr(launch, "patched", None)
        if patched is not None and modules(fn) <= patched:
            return _NothingToRestore()
        scope = patch_lang(fn)
        if patched is not None:
            patched |= modules(fn)
        return scope

    def run_grid(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(launch, "patched", None)
        launch.patched = set()
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            launch.patched = outer

    patch_once.__wrapped__, run_grid.__wrapped__ = patch_lang, grid_call  # type: ignore[attr-defined]
    interp._patch_lang, interp.GridExecutor.__call__ = patch_once, run_grid
