"""A batched speculative round's bookkeeping in two launches (`round_inputs`, `round_outputs`).

In torch the round's first lines (the slots' drafts gathered, the verify ids concatenated, their
positions, each row's slot) are four launches, and its last lines (the new drafts stored in the
slots' table, the kept tokens and the accepted count copied out, the next round's anchor and
start) are eight: gathers, copies and adds of a few int64 each, every one a launch inside the
round's CUDA graph and a break in the programmatic-dependent-launch chain of the Triton kernels
around it. Here each end is one program per sequence. The torch forms stay inline in
`ninfer.speculative` (`SpeculativeRound._verify`'s first lines, `_round_step`'s last) as the CPU
path and NINFER_ROUND_IO=0's; tests/core/kernels/test_triton_spec_round.py checks the kernels
against the same ops. The results are the same integers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton.launch import pdl_kwargs, pdl_prologue


@triton.jit
def _round_inputs_kernel(TABLE, st, SLOTS, ANCHOR, STARTS, DRAFTS, IDS, POS, ROWS,
                         K: tl.constexpr, M: tl.constexpr, MP: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    j = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, MP)
    slot = tl.load(SLOTS + j)
    # column c > 0 holds draft c - 1 of the slot; column 0 the anchor
    d = tl.load(TABLE + slot * st + c - 1, mask=(c >= 1) & (c <= K), other=0)
    tl.store(DRAFTS + j * K + c - 1, d, mask=(c >= 1) & (c <= K))
    ids = tl.where(c == 0, tl.load(ANCHOR + j), d)
    tl.store(IDS + j * M + c, ids, mask=c < M)
    tl.store(POS + j * M + c, tl.load(STARTS + j) + c, mask=c < M)
    tl.store(ROWS + j * M + c, slot + c * 0, mask=c < M)


@triton.jit
def _round_outputs_kernel(KEPT, ACC, NEW, sn, SLOTS, STARTS, TABLE, st, OUT, so, NEXT, snx,
                          K: tl.constexpr, M: tl.constexpr, MP: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    j = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, MP)
    slot = tl.load(SLOTS + j)
    acc = tl.load(ACC + j)
    new = tl.load(NEW + j * sn + c, mask=c < K, other=0)
    tl.store(TABLE + slot * st + c, new, mask=c < K)
    kept = tl.load(KEPT + j * M + c, mask=c < M, other=0)
    tl.store(OUT + j * so + c, tl.where(c == M, acc, kept), mask=c <= M)
    tl.store(NEXT + j, tl.sum(tl.where(c == acc, kept, 0), 0))
    tl.store(NEXT + snx + j, tl.load(STARTS + j) + acc + 1)


def _check(name: str, t: torch.Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    if t.dtype != torch.int64 or t.device != device or tuple(t.shape) != shape:
        raise ValueError(f"{name} must be int64 {list(shape)} on {device}, got {t.dtype} {list(t.shape)} on {t.device}")
    if t.dim() and t.stride(-1) != 1:
        raise ValueError(f"{name} needs a unit last stride")


def round_inputs(table: torch.Tensor, slots: torch.Tensor, anchor: torch.Tensor, starts: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verify's inputs of b sequences, from the slots' draft table [S, K] and each sequence's
    slot, anchor and start [b]: (drafts [b, K] = table[slots], ids [b, K+1] = anchor then drafts,
    positions [b, K+1] = start + column, row slots [b * (K+1)]). One launch, no host sync."""
    b, k = slots.shape[0], table.shape[1]
    dev = table.device
    _check("table", table, tuple(table.shape), dev)
    for name, t in (("slots", slots), ("anchor", anchor), ("starts", starts)):
        _check(name, t, (b,), dev)
    m = k + 1
    drafts = torch.empty(b, k, dtype=torch.int64, device=dev)
    ids = torch.empty(b, m, dtype=torch.int64, device=dev)
    pos = torch.empty(b, m, dtype=torch.int64, device=dev)
    rows = torch.empty(b * m, dtype=torch.int64, device=dev)
    if b:
        _round_inputs_kernel[(b,)](table, table.stride(0), slots, anchor, starts, drafts, ids, pos, rows,
                                   K=k, M=m, MP=triton.next_power_of_2(m + 1), num_warps=1, **pdl_kwargs(dev))
    return drafts, ids, pos, rows


def round_outputs(kept: torch.Tensor, accepted: torch.Tensor, new: torch.Tensor, slots: torch.Tensor,
                  starts: torch.Tensor, table: torch.Tensor, out: torch.Tensor, next_in: torch.Tensor) -> None:
    """What a round leaves, in one launch: the new drafts [b, K] into the slots' rows of `table`,
    kept [b, K+1] and accepted [b] into out[:b, :K+2], the next anchor (kept at accepted) and start
    (start + accepted + 1) into next_in[0, :b] and next_in[1, :b]."""
    b, k = slots.shape[0], table.shape[1]
    m = k + 1
    dev = table.device
    _check("kept", kept, (b, m), dev)
    for name, t in (("accepted", accepted), ("slots", slots), ("starts", starts)):
        _check(name, t, (b,), dev)
    _check("new drafts", new, (b, k), dev)
    _check("table", table, tuple(table.shape), dev)
    if out.dtype != torch.int64 or out.shape[0] < b or out.shape[1] < m + 1 or out.stride(1) != 1:
        raise ValueError(f"out must be int64 [>= {b}, >= {m + 1}] with a unit last stride")
    if next_in.dtype != torch.int64 or next_in.shape[0] != 2 or next_in.shape[1] < b or next_in.stride(1) != 1:
        raise ValueError(f"next_in must be int64 [2, >= {b}] with a unit last stride")
    if not kept.is_contiguous():
        raise ValueError("kept must be contiguous")
    if b:
        _round_outputs_kernel[(b,)](kept, accepted, new, new.stride(0), slots, starts, table, table.stride(0),
                                    out, out.stride(0), next_in, next_in.stride(0),
                                    K=k, M=m, MP=triton.next_power_of_2(m + 1), num_warps=1, **pdl_kwargs(dev))
