"""Waits between the CTAs of one launch (device side), for kernels whose later CTAs consume what
earlier ones produce: the K-walk GEMV's inline x pairs (quant_int/gemv_kw.py) and the one-launch
MoE layer (moe_triton/moe_block.py).

A producer writes, `tl.debug_barrier()`, then releases a counter with one atomic (`sem="release"`
or `"acq_rel"`); a consumer calls `wait_at_least(counter, n, ASM)` before reading. With ASM (a
compiled kernel) every thread polls with relaxed loads and a short sleep, then reads the counter
once with acquire semantics: an acquire at every poll would invalidate the SM's whole L1 each
time (the co-resident CTAs' lines with it), and polls without a pause crowd the L2 slice that
holds the counter. A wait past 2^24 polls traps: a CUDA error instead of a silent hang, e.g.
when an aborted launch left a counter set. Without ASM (the interpreter, which runs CTAs one
after another, producers first) the poll is a plain atomic read.
"""

from __future__ import annotations

import os

import ninfer.kernels.triton  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before any kernel is decorated)
import triton
import triton.language as tl

# The split kernels' arrival counters (a CTA stores its partial, then counts itself in; the last
# to arrive sums everyone's). Every CTA's count is a release; only the last CTA then takes an
# acquire fence, and the counter is re-armed relaxed. NINFER_SPLIT_ACQ_REL=1 is the former form:
# each arrival acq_rel (an L1 invalidation in every CTA, evicting the co-resident CTAs' x lines)
# and an acq_rel re-arm (the last CTA waits for its output stores to be acknowledged first).
SPLIT_ACQ_REL = os.environ.get("NINFER_SPLIT_ACQ_REL", "0") == "1"
_ACQ_REL = tl.constexpr(SPLIT_ACQ_REL)
_COMPILED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))
# the last CTA's acquire after a release count: a GPU-scope fence, passing the count through (an
# inline asm needs an operand; gemv_tc's Gluon form issues the same)
FENCE_ACQ_REL = tl.constexpr("fence.acq_rel.gpu;\n\tmov.u32 $0, $1;")


@triton.jit
def acquire(P):
    """Load the int32 at P with acquire semantics at GPU scope (what a producer released before
    it is then visible to this thread)."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [P], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def poll(P):
    """A strong relaxed load at GPU scope: sees other CTAs' releases, without the L1 invalidation
    an acquire load brings."""
    return tl.inline_asm_elementwise("ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l", [P], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def pause(polls):
    """Back off between polls (nanosleep, 64 ns) and count them; trap past 2^24."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $1, 16777216; @p trap; nanosleep.u32 64; add.s32 $0, $1, 1; }",
        "=r,r", [polls], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def wait_at_least(P, target, ASM: tl.constexpr):
    """Spin until the int32 at P is >= target; then what was released before it is visible to
    every thread of this CTA."""
    if ASM:
        v = poll(P)
        polls = v * 0
        while v < target:
            polls = pause(polls)
            v = poll(P)
        acquire(P)
    else:
        v = tl.atomic_add(P, 0, sem="acquire")
        while v < target:
            v = tl.atomic_add(P, 0, sem="acquire")


@triton.jit
def arrive(P):
    """Count this CTA in at the int32 counter P and return the count before it. Call after the
    CTA's stores and a `tl.debug_barrier()`: the count releases them. The CTA that sees the
    last count calls `acquire_all` before it reads the others' stores."""
    if _ACQ_REL:
        n = tl.atomic_add(P, 1, sem="acq_rel")
    else:
        n = tl.atomic_add(P, 1, sem="release")
    return n


@triton.jit
def acquire_all(n):
    """In the CTA that saw the last count `n` of `arrive`: a GPU-scope acq_rel fence after that
    count's read, so every store the other CTAs released before their counts is visible here
    (the PTX memory model's fence-based acquire pattern). Returns n. A no-op under the
    interpreter (its CTAs run one after another) and with NINFER_SPLIT_ACQ_REL=1 (the count
    itself was acq_rel)."""
    if _COMPILED and not _ACQ_REL:
        n = tl.inline_asm_elementwise(FENCE_ACQ_REL, "=r,r", [n], dtype=tl.int32, is_pure=False, pack=1)
    return n


@triton.jit
def rearm(P):
    """Set the counter P back to 0 for the next launch, relaxed: the launch's end (or the next
    kernel's PDL wait, which waits for it) publishes it; nothing in this launch reads it again."""
    if _ACQ_REL:
        tl.atomic_xchg(P, 0)
    else:
        tl.atomic_xchg(P, 0, sem="relaxed")
