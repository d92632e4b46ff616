"""`no_host_reads()`: record every host read of a tensor value inside a block, the things that
break (or silently freeze) a CUDA graph capture: `.item()`, `int/float/bool(t)`, `t.__index__`,
`.tolist()`, `.cpu()`, `.numpy()`, `nonzero`, `unique`, boolean-mask indexing,
`repeat_interleave` without `output_size`, `equal`, `bincount`, `masked_select`, new tensors
built from Python data (`torch.tensor` / `torch.as_tensor` of a list: a host-to-device copy in a
captured step), and factories called here without `device=` (a CPU tensor on a GPU: on this
CPU-only test every tensor is on the CPU, so a forgotten device would otherwise pass).

Two layers watch: a TorchFunctionMode (the Python-level calls, named as written) and a
TorchDispatchMode (the aten ops they become, which catches reads hidden inside torch, e.g. a
boolean index). Calls made while Triton's interpreter is on the stack are it emulating the GPU
(TRITON_INTERPRET=1), not host reads of the real step, so they pass.

Each read is recorded with its call site (the innermost frame in this repository, plus the
repository frames above it); the block raises AssertionError listing them all on exit, so one
run reports every site rather than the first (and an `except Exception` in the code under test
cannot swallow it)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_HERE = os.path.abspath(__file__)
# the interpreter (TRITON_INTERPRET=1) runs kernels as Python and copies their tensors; host
# callbacks of a real launch (heuristics, autotune hooks) stay watched
_INTERPRETER = os.path.join("triton", "runtime", "interpreter.py")

# Python-level calls (TorchFunctionMode `func.__name__`) that read a value on the host
_FUNC_READS = {
    "item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__",
    "nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "equal", "bincount", "allclose",
}  # fmt: skip
# factories that make a CPU tensor when `device=` is left out: inside a GPU step, an error or a
# host-to-device copy (only calls written in this repository are checked)
_FACTORIES = {"arange", "zeros", "ones", "full", "empty", "eye", "linspace", "rand", "randn", "randint", "randperm"}
# aten overload packets that read a value on the host (or size their output by one)
_ATEN_READS = {
    "item", "_local_scalar_dense", "is_nonzero", "nonzero", "argwhere", "unique_dim", "_unique", "_unique2",
    "unique_consecutive", "masked_select", "equal", "bincount", "allclose",
}  # fmt: skip


def _site() -> tuple[str, ...] | None:
    """The repository frames of the current call, innermost first; None when a Triton frame is on
    the stack (the interpreter's own tensor traffic and the kernel bodies it runs)."""
    chain = []
    f = sys._getframe(2)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if path.endswith(_INTERPRETER):
            return None
        if path.startswith(_REPO) and path != _HERE and ".venv" not in path:
            chain.append(f"{os.path.relpath(path, _REPO)}:{f.f_lineno} ({f.f_code.co_name})")
        f = f.f_back
    return tuple(chain)


def _called_from_repo() -> bool:
    """Whether the torch call being handled was written in this repository (not inside torch)."""
    path = os.path.abspath(sys._getframe(2).f_code.co_filename)
    return path.startswith(_REPO) and path != _HERE and ".venv" not in path


def _bool_index(indices) -> bool:
    return any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in indices or ())


class _Watch:
    def __init__(self) -> None:
        self.reads: dict[tuple[str, str], str] = {}  # (op, the call chain) -> the innermost site
        # > 0 while a Python-level read already recorded runs: its aten op is the same read
        self.inside = 0
        # the files whose torch calls the watch saw (so a test can show the path it meant ran)
        self.callers: set[str] = set()

    def add(self, op: str) -> bool:
        chain = _site()
        if chain is None:
            return False
        site = chain[0] if chain else "<outside the repository>"
        self.reads.setdefault((op, " <- ".join(chain[:8])), site)
        return True

    def caller_files(self) -> set[str]:
        """The repository files (relative paths) that made torch calls inside the block."""
        paths = map(os.path.abspath, self.callers)
        return {os.path.relpath(p, _REPO) for p in paths if p.startswith(_REPO) and ".venv" not in p}


class _Functions(TorchFunctionMode):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        self.watch.callers.add(sys._getframe(1).f_code.co_filename)
        if name in _FUNC_READS:
            if self.watch.add(name):
                self.watch.inside += 1
                try:
                    return func(*args, **kwargs)
                finally:
                    self.watch.inside -= 1
        elif name in ("tensor", "as_tensor") and args and not isinstance(args[0], torch.Tensor):
            self.watch.add(f"torch.{name}(<python data>)")
        elif name in _FACTORIES and kwargs.get("device") is None and _called_from_repo():
            self.watch.add(f"torch.{name} without device=")
        elif name == "where" and len(args) == 1 and not kwargs:
            self.watch.add("where(condition) (a nonzero)")
        elif name == "__getitem__" and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            if _bool_index(index):
                self.watch.add("boolean-mask index")
        elif name == "repeat_interleave" and kwargs.get("output_size") is None:
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            if isinstance(repeats, torch.Tensor) or (repeats is None and isinstance(args[0], torch.Tensor)):
                self.watch.add("repeat_interleave(tensor repeats) without output_size")
        return func(*args, **kwargs)


class _Aten(TorchDispatchMode):
    def __init__(self, watch: _Watch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if self.watch.inside:
            pass
        elif name in _ATEN_READS:
            self.watch.add(f"aten.{name}")
        elif name in ("index", "index_put", "index_put_", "_index_put_impl_") and len(args) > 1 and _bool_index(args[1]):
            self.watch.add(f"aten.{name} with a boolean mask")
        elif name == "repeat_interleave" and func._overloadname != "self_int" and kwargs.get("output_size") is None:
            self.watch.add("aten.repeat_interleave without output_size")
        return func(*args, **kwargs)


@contextlib.contextmanager
def no_host_reads(check: bool = True) -> Iterator[_Watch]:
    """Watch the block; yields the watch: `reads` ((op, call chain) -> innermost site) and
    `caller_files()`. With `check`, raise AssertionError on exit if there is any read."""
    watch = _Watch()
    with _Functions(watch), _Aten(watch):
        yield watch
    if check and watch.reads:
        lines = [f"  {op} at {chain}" for op, chain in sorted(watch.reads)]
        raise AssertionError("host reads inside a step meant for CUDA-graph capture:\n" + "\n".join(lines))
