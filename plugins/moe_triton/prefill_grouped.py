"""MoE prefill as dequantize-then-grouped-GEMM: every expert's weights decoded to bf16 once a call,
then one cuBLAS-class grouped GEMM for gate_up and one for down over the tokens sorted by expert
(`torch._grouped_mm`), silu * up in one pass and the weighted combine (with the shared expert) in
one kernel.

Why: the fused W4A16 tile kernels (grouped_gemm.py) read each expert's packed weights once, which
is what decode and short chunks want, but their MMA runs at ~108 TFLOP/s at T = 8,192 (BENCHMARKS.md
"35B-A3B MoE", the first run: 4.3 ms a layer, where cuBLAS would do the same FLOPs in 0.67 ms).
From a few thousand tokens on, the FLOPs dominate and the decode pass pays for itself: 35B-A3B
int4 decodes 0.46 GB of packed experts a layer into 1.5 GB of bf16 (~0.5 ms at the copy rate),
then 0.41 TFLOP of grouped GEMM (~0.7 ms): ~1.2 ms a layer against 4.3, if that figure still
holds (not re-measured since). The dense projections' prefill does the same (quant_int/dequant.py).

On by default for calls of >= GROUPED_MIN_T tokens (`NINFER_MOE_PREFILL=tiles` keeps the tile
kernels everywhere; NINFER_MOE_PREFILL_MIN_T moves the threshold). Timed on an H100 (BENCHMARKS.md,
twenty-ninth run): the 35B-A3B's 8,192-token prefill in one chunk 45,400 tok/s against the tiles'
39,500 (+15%), but 18,600 against 23,300 in chunks of 2,048. Int formats only (q4/q5/q6/q8); the
scratch is one bf16 copy of a layer's experts (1.5 GB for the 35B-A3B) and a chunk's sorted
activations, made on first use and kept; the memory plan counts it (plugin.ninfer_workspace_bytes)
when a chunk reaches the threshold.
"""

from __future__ import annotations

import os
from typing import Any

import torch

import ninfer.kernels.triton  # noqa: F401  (sets TRITON_INTERPRET=1 without CUDA, before any kernel is decorated)
import triton
import triton.language as tl
from ninfer.errors import UserError
from ninfer.kernels.triton.launch import lasting
from ninfer.kernels.triton.norms import swiglu
from ninfer_plugins.moe_triton.grouped_gemv import Matrix
from ninfer_plugins.quant_int.formats import FORMATS

# below this many tokens a call keeps the tile kernels (the decode pass would not pay for itself).
# H100, the 35B's 8K prefill by chunk size: a chunk costs the tiles ~48 ms + 19.4 us a token and
# this path ~87 ms + 11.4 us a token (lines through the 2,048 and 8,192 points), equal near 4,800.
GROUPED_MIN_T = 5120
MODES = ("grouped", "tiles")
# quant_int's groupwise formats, by scheme name and by format id (bits)
INT_SCHEMES = tuple(FORMATS)
INT_FORMATS = tuple(f.bits for f in FORMATS.values())


def enabled() -> bool:
    """NINFER_MOE_PREFILL: grouped (the default; empty means it too) or tiles."""
    mode = os.environ.get("NINFER_MOE_PREFILL", "").strip() or "grouped"
    if mode not in MODES:
        raise UserError(f"NINFER_MOE_PREFILL={mode!r}: use grouped or tiles.")
    return mode == "grouped"


def supports(routed_gu: Matrix, routed_dn: Matrix, shared: tuple[Matrix, Matrix, Matrix] | None) -> bool:
    mats = [routed_gu, routed_dn, *(shared or ())]
    return hasattr(torch, "_grouped_mm") and all(m.fmt in INT_FORMATS for m in mats)


def min_tokens() -> int:
    """The fewest tokens a call runs here: GROUPED_MIN_T, or NINFER_MOE_PREFILL_MIN_T (a positive
    integer, read at each call; to time the CLI's default 1,024-token chunks on this path)."""
    v = os.environ.get("NINFER_MOE_PREFILL_MIN_T", "").strip()
    if not v:
        return GROUPED_MIN_T
    if not v.isdigit() or int(v) < 1:
        raise UserError(f"NINFER_MOE_PREFILL_MIN_T={v!r}: give a positive number of tokens.")
    return int(v)


def takes(tokens: int, routed_gu: Matrix, routed_dn: Matrix, shared: tuple[Matrix, Matrix, Matrix] | None) -> bool:
    """Whether a call of `tokens` tokens runs here (switched on, long enough, formats it decodes)."""
    return enabled() and tokens >= min_tokens() and supports(routed_gu, routed_dn, shared)


def _decoded(m: Matrix, out: torch.Tensor) -> torch.Tensor:
    """m's rows decoded to bf16 into out ([rows, k], or [E, rows an expert, k]; quant_int's
    dequant kernel: a stacked Matrix holds quant_int's stored layout)."""
    from ninfer_plugins.quant_int import dequant as D
    from ninfer_plugins.quant_int import kernels as K

    p = K.Prepared(fmt=m.fmt, n=m.q.shape[0], k=m.k, qweight=m.q, scales=m.s, qhigh=m.h)
    D.dequantize_into(p, out.view(-1, m.k))
    return out


def scratch_bytes(experts: int, inner: int, hidden: int, tokens: int, top_k: int) -> int:
    """Device bytes a call of `tokens` tokens holds: the kept bf16 experts (gate_up and down) and the
    transient sorted-token tensors (gathered x, gate_up out, h, down out, all bf16)."""
    kept = 2 * experts * 3 * inner * hidden
    return kept + 2 * tokens * top_k * (2 * hidden + 3 * inner)


def _scratch(device: torch.device, experts: int, inner: int, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    def make():
        return (torch.empty(experts, 2 * inner, hidden, dtype=torch.bfloat16, device=device),
                torch.empty(experts, hidden, inner, dtype=torch.bfloat16, device=device))

    return lasting("moe_prefill_grouped", device, (experts, inner, hidden), make)


@triton.jit
def _combine_kernel(YS, INV, W, YSH, OUT, H, s_ys, s_w, s_ysh, s_out,
                    TOP_K: tl.constexpr, SHARED: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t, cols] = sum_j W[t, j] * YS[INV[t * TOP_K + j], cols] (+ W[t, TOP_K] * YSH[t, cols]),
    summed in fp32 in slot order, then the shared pair (bit-reproducible: no atomics)."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        row = tl.load(INV + t * TOP_K + j).to(tl.int64)
        w = tl.load(W + t * s_w + j)
        acc += w * tl.load(YS + row * s_ys + cols, mask=ok, other=0.0).to(tl.float32)
    if SHARED:
        acc += tl.load(W + t * s_w + TOP_K) * tl.load(YSH + t * s_ysh + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(OUT + t * s_out + cols, acc.to(OUT.dtype.element_ty), mask=ok)


def run(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, top_k: int, routed_gu: Matrix, routed_dn: Matrix,
        num_experts: int, inner: int, shared: Any = None) -> torch.Tensor:
    """out [T, H] in x's dtype = sum_j weights[t, j] * down_e(silu(G_e x_t) * U_e x_t) over the
    routed slots j < top_k (e = ids[t, j]), plus the shared expert (`shared`: moe.SharedWeights,
    its per-token weight weights[t, top_k]) when there is one. x must be bf16 on the GPU (the
    grouped GEMM's dtype); ids / weights [T, slots] as the router writes them. No host sync.

    Past the two grouped GEMMs, h = silu(gate) * up is one pass (norms.swiglu, rounded to bf16 as
    the tile kernels store it), and the combine one kernel that reads each pair's down row from
    its sorted place and adds the shared expert's (_combine_kernel): no fp32 [T, top_k, H]
    temporaries, no scatter back to (token, slot) order."""
    T, hidden = x.shape
    E = num_experts
    xb = x.to(torch.bfloat16)
    wgu, wdn = _scratch(x.device, E, inner, hidden)
    _decoded(routed_gu, wgu)
    _decoded(routed_dn, wdn)
    # the (token, slot) pairs sorted by expert; the groups' ends for the grouped GEMM; each pair's
    # place in that order (inv) for the combine
    e_flat = ids[:, :top_k].reshape(-1).long()
    order = torch.argsort(e_flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int64, device=x.device).scatter_add_(0, e_flat, torch.ones_like(e_flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    inv = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=x.device)).to(torch.int32)
    xs = xb.index_select(0, order // top_k)
    h = swiglu(torch._grouped_mm(xs, wgu.transpose(1, 2), offs=offs))
    ys = torch._grouped_mm(h, wdn.transpose(1, 2), offs=offs)
    ysh = ys
    if shared is not None:
        # the shared expert's gate and up as one [2I, H] matrix: one GEMM, then the same swiglu
        s_inner = shared.gate.q.shape[0]
        sgu = torch.empty(2 * s_inner, hidden, dtype=torch.bfloat16, device=x.device)
        _decoded(shared.gate, sgu[:s_inner])
        _decoded(shared.up, sgu[s_inner:])
        ysh = swiglu(xb @ sgu.T) @ _dense(shared.down).T
    out = torch.empty(T, hidden, dtype=x.dtype, device=x.device)
    w = weights.float()
    block_h = min(1024, triton.next_power_of_2(hidden))
    _combine_kernel[(T, triton.cdiv(hidden, block_h))](
        ys, inv, w, ysh, out, hidden, ys.stride(0), w.stride(0), ysh.stride(0), out.stride(0),
        TOP_K=top_k, SHARED=shared is not None, BLOCK_H=block_h, num_warps=4)
    return out


def _dense(m: Matrix) -> torch.Tensor:
    """A small matrix (the shared expert's) decoded to bf16 [rows, k]."""
    return _decoded(m, torch.empty(m.q.shape[0], m.k, dtype=torch.bfloat16, device=m.q.device))
