"""What every kernel wrapper asks of the device before it launches."""

from __future__ import annotations

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
# write to a "fresh" output could hit a buffer the predecessor still reads). The one exception is
# reading weights, which no kernel writes while the engine runs: the f16x2 GEMV's first tile and
# the GDN step's gate rows load before the wait and so stream during the predecessor's tail. On by default since
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


def pdl_kwargs(device: torch.device) -> dict:
    """Launch keyword arguments of a kernel that takes `PDL: tl.constexpr` and starts with
    pdl_prologue(PDL): empty when PDL is off."""
    return {"PDL": True, "launch_pdl": True} if pdl_enabled(device) else {}


@triton.jit
def pdl_prologue(PDL: tl.constexpr):
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
        tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
