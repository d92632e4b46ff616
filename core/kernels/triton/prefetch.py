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

import torch

import ninfer.kernels.triton  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before any kernel is decorated)
import triton
import triton.language as tl

LINE = 128  # bytes an L2 line
# trip counts a kernel is specialised for (each a constexpr: a compile each)
STEPS = (0, 1, 2, 4, 8, 16)


def bulk_ok(device) -> bool:
    """Whether l2_bulk may run on this device: the interpreter, or a CUDA device of sm_90 on
    (cp.async.bulk is Hopper's)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True
    return torch.device(device).type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def byte_span(t, parts: int, anchor):
    """(a uint8 view of tensor t, the bytes of one of `parts` equal row blocks of it), for the
    l2_bulk helpers: e.g. one expert's rows of a stack. (anchor's bytes, 0) when t is None, not
    contiguous, not 16-byte aligned, on another device, or its block is not a multiple of 16
    bytes: a span of 0 asks for nothing."""
    span = 0
    if (t is not None and t.is_contiguous() and t.shape[0] % parts == 0 and t.data_ptr() % 16 == 0
            and t.device == anchor.device):
        span = t.shape[0] // parts * t.stride(0) * t.element_size()
        span = span if span % 16 == 0 else 0
    return (t.reshape(-1).view(torch.uint8) if span else anchor.view(torch.uint8)), span


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


@triton.jit
def l2_bulk(P, nbytes, ASM: tl.constexpr, ONE: tl.constexpr = False):
    """Ask the L2 for nbytes (a multiple of 16; <= 0: nothing) from P (a byte pointer, 16-byte
    aligned), per element, with one instruction each: `cp.async.bulk.prefetch.L2.global` (sm_90+;
    the caller gates it on the device). A hint: nothing is loaded into registers. ONE (P and
    nbytes scalars, every thread's): only the CTA's first thread asks. Without ASM (the
    interpreter) the range's first and last bytes are read and dropped: the same index
    arithmetic runs (the interpreter does not catch a read past a tensor; the callers' spans are
    checked on the host)."""
    if ASM:
        if ONE:
            who: tl.constexpr = "mov.u32 t, %tid.x; setp.eq.u32 q, t, 0; setp.gt.and.s32 p, $2, 0, q; "
        else:
            who: tl.constexpr = "setp.gt.s32 p, $2, 0; "
        tl.inline_asm_elementwise(
            "{ .reg .pred p, q; .reg .u32 t; " + who + "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [P, nbytes], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.load(P, mask=nbytes > 0)
        tl.load(P + nbytes - 1, mask=nbytes > 0)


@triton.jit
def _piece(span, pieces, i):
    """Piece i (a scalar or a block) of `pieces` of span bytes, each a multiple of 16 bytes but
    the last: (byte offset int64, bytes int32; 0 for a piece past the end)."""
    size = ((span + pieces - 1) // pieces + 15) // 16 * 16
    off = i.to(tl.int64) * size
    return off, tl.maximum(tl.minimum(span - off, size), 0).to(tl.int32)


@triton.jit
def l2_bulk_rows(idx, ok, P, SPAN, NCH: tl.constexpr, ASM: tl.constexpr):
    """l2_bulk of SPAN bytes at P + idx * SPAN for every element of idx where ok (a block of rows
    per index, e.g. one expert's weights in a stack), in NCH pieces of a multiple of 16 bytes.
    SPAN: a multiple of 16 (0: nothing)."""
    off, n = _piece(SPAN, NCH, tl.arange(0, NCH)[None, :])
    l2_bulk(P + idx[:, None].to(tl.int64) * SPAN + off, tl.where(ok[:, None], n, 0), ASM)


@triton.jit
def l2_bulk_share(P, span, share, shares, ASM: tl.constexpr):
    """Share `share` of `shares` of the span bytes at P (a multiple of 16 each but the last),
    asked of the L2 by this CTA's first thread: the CTAs of a grid split one range between them."""
    off, n = _piece(span, shares, share)
    l2_bulk(P + off, n, ASM, True)
