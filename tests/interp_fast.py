"""Triton's interpreter, without its per-helper-call re-patching (tests only).

Under TRITON_INTERPRET=1 every call of a @triton.jit helper from inside a kernel
(`InterpretedFunction.__call__`, tl.sum included) runs `_patch_lang` again: it walks
`inspect.getmembers` over triton.language, its tensor class and its math module and re-installs
the same interpreted wrappers the kernel launch (`GridExecutor.__call__`) has already installed.
That is about 1 ms a helper call, a quarter of the interpreted end-to-end tests' time.

This wrapper skips the repeat only where it changes nothing: inside a kernel launch, for a helper
whose module sees no language module (triton.language, triton.language.core) that this launch has
not already patched. A helper that sees one more (triton's own standard library sees `core`)
patches as before, once a launch. What a launch patches is still restored when it ends, as
before.

It also turns off the interpreter's integer-overflow sanitizer (a checked int64 copy of every int32
add, sub and mul: about a third of what is left). At the tiny shapes the interpreter runs, index
arithmetic is nowhere near 2^31, so the check cannot fire there; the shapes where it could are
the GPU tests', where compiled kernels never check.

Installed by conftest; if triton's interpreter lacks the names it wraps, nothing changes.
"""

from __future__ import annotations

import dataclasses
import threading


class _Unchanged:
    def restore(self) -> None:
        pass


def _memo_np_dtype(original, tl):
    """The interpreter's dtype -> numpy dtype map builds its table at every call (a third of a
    million calls in one end-to-end test); this one answers from a table built once and asks the
    original for anything else."""
    table = {}
    for name in ("int1", "float16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                 "int64", "uint64", "bfloat16", "float8e5", "float8e5b16", "float8e4nv", "float8e4b8",
                 "float8e4b15"):
        dt = getattr(tl, name, None)
        if dt is not None:
            try:
                table[dt] = original(dt)
            except (KeyError, TypeError):
                pass

    def np_dtype(tt_dtype):
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        found = None if isinstance(scalar, tl.pointer_type) else table.get(scalar)
        return found if found is not None else original(tt_dtype)

    return np_dtype


def install() -> bool:
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    names = ("_patch_lang", "GridExecutor", "InterpretedFunction", "tl")
    if not all(hasattr(interp, n) for n in names) or getattr(interp, "_ninfer_fast", False):
        return False
    tl = interp.tl
    langs = (tl, tl.core)
    original = interp._patch_lang
    launch_call = interp.GridExecutor.__call__
    state = threading.local()
    keys: dict[object, frozenset[int]] = {}

    def key(fn) -> frozenset[int]:
        k = keys.get(fn)
        if k is None:
            k = keys[fn] = frozenset(id(v) for v in fn.__globals__.values() if any(v is m for m in langs))
        return k

    def patch_lang(fn):
        patched = getattr(state, "patched", None)
        k = key(fn)
        if patched is not None and k and k <= patched:
            return _Unchanged()
        scope = original(fn)
        if patched is not None:
            patched |= k
        return scope

    def launch(self, *args, **kwargs):
        outer = getattr(state, "patched", None)
        state.patched = set()
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            state.patched = outer

    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is not None and dataclasses.is_dataclass(options) and hasattr(options, "sanitize_overflow"):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
    np_dtype = getattr(interp, "_get_np_dtype", None)
    if np_dtype is not None:
        interp._get_np_dtype = _memo_np_dtype(np_dtype, tl)
    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = launch
    interp._ninfer_fast = True
    return True
