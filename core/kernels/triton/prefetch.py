"""Weights pulled into the L2 while the kernel before is still running.

A decode step is one chain of dependent launches. Under programmatic dependent launch a GEMV's
CTAs start while the kernel before them runs, and their weights depend on nothing before, so
the decode GEMVs already load their first tile into registers before `griddepcontrol.wait`. That
covers one tile a CTA. The kernels before the biggest waits move few bytes (the GDN decode step,
the attention split-K, the x-pairs launch), so the DRAM is mostly idle during them.
`l2_prefetch` asks the L2 for the lines a CTA will read next (`prefetch.global.L2::evict_normal`,
sm_80+): a hint that costs one instruction a 128-byte line and moves no data into registers.
(Not evict_last: the GEMV's own loads would not lower that priority again, and lines already
read would stay protected against every later prefetch and the state the step reads.)
The GEMV's loads then hit the L2 for what the prefetch brought.

How much: `l2_trips` turns a byte budget (`NINFER_L2PF`, MB over the whole grid; 0, the default,
is off) into trips a CTA prefetches, so the grid's prefetches stay a share of the L2 (50 MB on
H100 and H200) and the lines are still there when read. Without ASM (the interpreter) the lines
are read and discarded instead, so tests walk the same addresses.
"""

from __future__ import annotations

import os

import ninfer.kernels.triton  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before any kernel is decorated)
import triton
import triton.language as tl

LINE = 128  # bytes an L2 line
# trip counts a kernel is specialised for (each a constexpr: a compile each)
STEPS = (0, 1, 2, 4, 8, 16)


def budget_bytes() -> int:
    """NINFER_L2PF: MB of weights the whole grid may prefetch ahead (0 or unset: off). Read at each
    launch, so an A/B in one process may switch it between runs (graphs are captured per run)."""
    v = os.environ.get("NINFER_L2PF", "").strip()
    try:
        return max(0, int(float(v) * 2**20)) if v else 0
    except (ValueError, OverflowError):
        return 0


def resident(grid: int, sm_count: int, num_warps: int) -> int:
    """CTAs of a grid resident at once, about: the decode GEMVs hold ~128 registers a thread, so
    an SM's 64K registers take 16 warps of them. Only these prefetch before the kernel before ends;
    the rest start after it and prefetch ahead of their own walk."""
    return max(1, min(grid, sm_count * max(1, 16 // max(1, num_warps))))


def l2_trips(budget: int, ctas: int, trip_bytes: int, trips: int) -> int:
    """Trips past the first that each of `ctas` resident CTAs prefetches: what the budget gives a
    CTA, no more than it walks after its first trip, rounded down to one of STEPS."""
    if budget <= 0 or ctas <= 0 or trip_bytes <= 0 or trips <= 1:
        return 0
    want = min(budget // (ctas * trip_bytes), trips - 1)
    return max(s for s in STEPS if s <= want)


@triton.constexpr_function
def pow2_lines(nbytes):
    """128-byte lines covering nbytes, rounded up to a power of two (an arange's length)."""
    n = max(1, -(-int(nbytes) // LINE))
    return 1 << (n - 1).bit_length()


@triton.jit
def l2_prefetch(P, ASM: tl.constexpr):
    """Ask the L2 for the lines holding P's addresses (normal eviction priority). Without ASM: read them
    (the interpreter; the value is discarded)."""
    if ASM:
        tl.inline_asm_elementwise("prefetch.global.L2::evict_normal [$1]; mov.u32 $0, 0;", "=r,l", [P],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.load(P)
