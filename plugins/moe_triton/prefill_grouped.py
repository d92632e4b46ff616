"""MoE prefill as dequantize-then-grouped-GEMM: every expert's weights decoded to bf16 once a call,
then one cuBLAS-class grouped GEMM for gate_up and one for down over the tokens sorted by expert
(`torch._grouped_mm`), the combine in torch.

Why: the fused W4A16 tile kernels (grouped_gemm.py) read each expert's packed weights once, which
is what decode and short chunks want, but their MMA runs at ~108 TFLOP/s at T = 8,192 (BENCHMARKS.md
"35B-A3B MoE", the first run: 4.3 ms a layer, where cuBLAS would do the same FLOPs in 0.67 ms).
From a few thousand tokens on, the FLOPs dominate and the decode pass pays for itself: 35B-A3B
int4 decodes 0.46 GB of packed experts a layer into 1.5 GB of bf16 (~0.5 ms at the copy rate),
then 0.41 TFLOP of grouped GEMM (~0.7 ms): ~1.2 ms a layer against 4.3, if that figure still
holds (not re-measured since). The dense projections' prefill does the same (quant_int/dequant.py).

Off by default (`NINFER_MOE_PREFILL=grouped` turns it on for calls of >= GROUPED_MIN_T tokens)
until an H200 run has timed it against the tiles. Int formats only (q4/q5/q6/q8); the scratch is
one bf16 copy of a layer's experts (1.5 GB for the 35B-A3B), made on first use and kept; the memory
plan counts it (plugin.ninfer_workspace_bytes) when the switch is on.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

from ninfer.kernels.triton.launch import lasting
from ninfer_plugins.moe_triton.grouped_gemv import Matrix
from ninfer_plugins.quant_int.formats import FORMATS

# below this many tokens a call keeps the tile kernels (the decode pass would not pay for itself)
GROUPED_MIN_T = 2048
# quant_int's groupwise formats, by scheme name and by format id (bits)
INT_SCHEMES = tuple(FORMATS)
INT_FORMATS = tuple(f.bits for f in FORMATS.values())


def enabled() -> bool:
    return os.environ.get("NINFER_MOE_PREFILL", "") == "grouped"


def supports(routed_gu: Matrix, routed_dn: Matrix, shared: tuple[Matrix, Matrix, Matrix] | None) -> bool:
    mats = [routed_gu, routed_dn, *(shared or ())]
    return hasattr(torch, "_grouped_mm") and all(m.fmt in INT_FORMATS for m in mats)


def takes(tokens: int, routed_gu: Matrix, routed_dn: Matrix, shared: tuple[Matrix, Matrix, Matrix] | None) -> bool:
    """Whether a call of `tokens` tokens runs here (switched on, long enough, formats it decodes)."""
    return enabled() and tokens >= GROUPED_MIN_T and supports(routed_gu, routed_dn, shared)


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


def run(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, top_k: int, routed_gu: Matrix, routed_dn: Matrix,
        num_experts: int, inner: int, shared: Any = None) -> torch.Tensor:
    """out [T, H] in x's dtype = sum_j weights[t, j] * down_e(silu(G_e x_t) * U_e x_t) over the
    routed slots j < top_k (e = ids[t, j]), plus the shared expert (`shared`: moe.SharedWeights,
    its per-token weight weights[t, top_k]) when there is one. x must be bf16 on the GPU (the
    grouped GEMM's dtype); ids / weights [T, slots] as the router writes them. No host sync."""
    T, hidden = x.shape
    E = num_experts
    xb = x.to(torch.bfloat16)
    wgu, wdn = _scratch(x.device, E, inner, hidden)
    _decoded(routed_gu, wgu)
    _decoded(routed_dn, wdn)
    # the (token, slot) pairs sorted by expert; the groups' ends for the grouped GEMM
    e_flat = ids[:, :top_k].reshape(-1).long()
    order = torch.argsort(e_flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int64, device=x.device).scatter_add_(0, e_flat, torch.ones_like(e_flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    xs = xb.index_select(0, order // top_k)
    gu = torch._grouped_mm(xs, wgu.transpose(1, 2), offs=offs)
    # h rounded to the activations' dtype, as the tile kernels store it
    h = (F.silu(gu[:, :inner].float()) * gu[:, inner:].float()).to(torch.bfloat16)
    ys = torch._grouped_mm(h, wdn.transpose(1, 2), offs=offs)
    y = torch.empty_like(ys)
    y[order] = ys  # back to (token, slot) order
    out = (y.view(T, top_k, hidden).float() * weights[:, :top_k].float()[:, :, None]).sum(1)
    if shared is not None:
        sg, su, sd = (_dense(m) for m in (shared.gate, shared.up, shared.down))
        hs = (F.silu((xb @ sg.T).float()) * (xb @ su.T).float()).to(torch.bfloat16)
        out += weights[:, top_k].float()[:, None] * (hs @ sd.T).float()
    return out.to(x.dtype)


def _dense(m: Matrix) -> torch.Tensor:
    """A small matrix (the shared expert's) decoded to bf16 [rows, k]."""
    return _decoded(m, torch.empty(m.q.shape[0], m.k, dtype=torch.bfloat16, device=m.q.device))
