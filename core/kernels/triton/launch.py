"""What every kernel wrapper asks of the device before it launches."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import triton
import triton.language as tl

T = TypeVar("T")


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (CPU CI). Triton 3.9's interpreter multiplies bf16 tl.dot
    operands as their raw 16-bit integers, so kernels upcast dot operands to fp32 there."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


_LASTING: dict[tuple, Any] = {}


def lasting(kind: str, device: torch.device, key: tuple, make: Callable[[], T]) -> T:
    """Scratch a kernel wrapper keeps for the life of the process, one per (kind, device, key),
    made by `make` on first use. A CUDA graph holds the pointers it captured, so scratch that a
    captured launch used must outlive every graph; counters in it start at zero, and the kernels
    that use them put them back."""
    k = (kind, str(device), *key)
    if k not in _LASTING:
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            # made inside a capture, `make`'s fills would only be recorded, never run: counters
            # would start as garbage for any eager call before the first replay
            raise RuntimeError(f"{kind}: scratch for {key} first asked for inside a CUDA-graph capture; "
                               "run the same shapes once eagerly before capturing")
        _LASTING[k] = make()
    return _LASTING[k]


@functools.lru_cache(maxsize=None)
def sm_count(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    return 4


# --- programmatic dependent launch (on by default on sm_90+; NINFER_PDL=0 turns it off) -----------------------------------
#
# A decode step is ~600 short kernels; each waits for the whole previous grid to drain and then
# pays its own launch and prologue. With programmatic dependent launch (sm_90+) a kernel may be
# scheduled while its predecessor's last CTAs still run: it calls `griddepcontrol.wait` before
# touching memory (which returns once the predecessor has completed and its writes are visible),
# and `griddepcontrol.launch_dependents` so that its own successor may be scheduled early in turn.
# Every kernel launched with `pdl_kwargs` must begin with `pdl_prologue(PDL)`: nothing may be read
# or written before the wait (a CUDA graph's memory pool reuses buffers in stream order, so even a
# write to a "fresh" output could hit a buffer the predecessor still reads). The exceptions are
# reads: weights, which no kernel writes while the engine runs (the f16x2 GEMV's first tile and
# the GDN step's gate rows load before the wait and so stream during the predecessor's tail), and
# what kernels before a `late_dependents` launch wrote (below). Every kernel launched with PDL must
# also wait in every CTA: that is what makes "the kernel before completed" imply "every kernel
# before completed", which those reads rely on. On by default since
# the H200 A/B of 2026-12-03 (BENCHMARKS.md: 27B int4 decode 105.5 -> 109.1 tok/s, 35B-A3B int4
# 331.2 -> 343.2, same call each); NINFER_PDL=0 turns it off.


@functools.lru_cache(maxsize=None)
def _pdl_capable(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def pdl_enabled(device: torch.device) -> bool:
    # called at every launch: the environment is read each time (tests switch it), the device
    # query once per device
    if os.environ.get("NINFER_PDL", "1") == "0" or interpreting() or device.type != "cuda":
        return False
    return _pdl_capable(device)


# Launches inside `late_dependents()` (a depth: nested uses are fine; launches happen on one thread)
_late = 0


@contextlib.contextmanager
def late_dependents():
    """Kernels launched inside let their dependents launch only once they are past their own PDL
    wait (PDL = 2), instead of at their start.

    Why: under PDL each kernel lets the next one launch at its start, so a chain of kernels can
    be resident at once, each waiting on the one before: code before a kernel's wait may then run
    while a kernel several launches back is still writing. A kernel launched after a PDL = 2
    launch (or after a launch without PDL) is scheduled only once that launch has waited, i.e.
    once every kernel before it has completed, and no kernel is scheduled before the one ahead of
    it: so, before its own wait, a kernel may read whatever was written before the most recent
    PDL = 2 (or non-PDL) launch ahead of it, never what that launch or later ones write. The GDN
    decode step loads its recurrent state that way (its projection GEMV launched here), and the
    MoE pair down kernel its expert ids and weights (the gate_up launch). Every kernel given
    `pdl_kwargs` must honour PDL = 2: `pdl_prologue`, or `pdl_early_trigger` + `pdl_wait`, or
    gemv_tc's Gluon `_pdl_wait`; and launches that only prepare the next kernel's input (x pairs)
    ask `pdl_kwargs(..., scoped=False)`: they are never the last launch before such a reader, and
    a late trigger there would only delay their GEMV's start (and its loads before the wait)."""
    global _late
    _late += 1
    try:
        yield
    finally:
        _late -= 1


def pdl_kwargs(device: torch.device, late: bool = False, scoped: bool = True) -> dict:
    """Launch keyword arguments of a kernel that takes `PDL: tl.constexpr` and starts with
    pdl_prologue(PDL): empty when PDL is off; PDL = 2 with `late`, or inside `late_dependents()`
    unless `scoped` is False."""
    if not pdl_enabled(device):
        return {}
    return {"PDL": pdl_value(late, scoped), "launch_pdl": True}


def pdl_value(late: bool = False, scoped: bool = True):
    """The PDL constexpr of a launch with PDL on: 2 (the trigger after the wait) or True."""
    return 2 if late or (scoped and _late) else True


@triton.jit
def pdl_early_trigger(PDL: tl.constexpr):
    """The trigger at a kernel's start (`griddepcontrol.launch_dependents`), unless PDL = 2, where
    `pdl_wait` triggers after the wait."""
    if PDL and PDL != 2:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """`griddepcontrol.wait` (returns once the previous kernel has completed and its writes are
    visible); with PDL = 2 the trigger right after it. For a kernel that reads something before
    its wait: `pdl_early_trigger` at its start, then this."""
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    if PDL == 2:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    pdl_early_trigger(PDL)
    pdl_wait(PDL)
