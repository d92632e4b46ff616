"""The bf16 projections at one token as a Triton GEMV, for the shapes where cuBLAS pays extra.

Why (BENCHMARKS.md, thirty-fourth run, H200): the 27B bf16 step is 84.8% of its roofline. cuBLAS
reads gate+up and the head at 95-97% of copy, but its M = 1 down projection (5120 x 17408) takes
split-K: a memset, the GEMM (44 µs) and a reduce kernel (2.2 µs), three launches a layer; SwiGLU
before it is one more launch (1.7 µs) that only makes down's input. Here down is one launch that
computes silu(gate) * up while it loads x (`apply_gated`), and each program walks its rows' whole
K, so there are no partials to reduce. The weights' first tile is requested before the PDL wait
(nothing writes weights while the engine runs), so it streams during the launch before.

`NINFER_DENSE_GEMV` (read at each launch, so `dense_27b.py --variants` can switch it):
  "all" (the default): every dense projection at one token here, the head included. On an H100
      (thirty-fifth run) the kernel beat cuBLAS on each of the 27B's five layer shapes (by 2-9 µs)
      and on the 248320 x 5120 head (787 against 841 µs), and the 27B bf16 step with every layer
      projection here went from 19.23 / 19.47 ms to 18.24 / 18.25 ms (alternated in one process);
  "body": every dense projection at one token but the head (n > 65,536);
  "gated": the gated down projection here, the rest F.linear (no gain in the step: 19.31 ms);
  "0": torch's F.linear everywhere, SwiGLU apart.
`NINFER_DENSE_GEMV_CFG="BN:BK:WARPS"` overrides the config (bench/dense_gemv_bench.py ranks them).
Prefill (M > 1) always goes to F.linear.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

# first: without CUDA it sets TRITON_INTERPRET=1, which must hold before triton is imported
from ninfer.kernels.triton.launch import pdl_early_trigger, pdl_kwargs, pdl_wait  # isort: skip

import triton
import triton.language as tl
from ninfer.device import Requirements

GPU = Requirements(devices=("cuda",), min_capability=(8, 0), features=("triton",))
DEFAULT_CFG = (8, 512, 4)  # rows a program, K a trip, warps
HEAD_ROWS = 65536  # more rows than this is a vocabulary head (left to cuBLAS under "body")


@triton.jit
def _dense_gemv_kernel(X, W, Y, N, K, stride_w, GATED: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       PDL: tl.constexpr = False):
    """Y[n] = sum_k W[n, k] x[k] for BN rows a program, fp32 sums, the next trip's weights loaded
    while this trip's multiply-adds run. GATED: x = silu(X[:K]) * X[K:2K], rounded to X's dtype as
    the separate SwiGLU launch would round it."""
    pdl_early_trigger(PDL)
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    rok = rows < N
    wrow = W + rows.to(tl.int64)[:, None] * stride_w
    cols = tl.arange(0, BK)
    w = tl.load(wrow + cols[None, :], mask=rok[:, None] & (cols[None, :] < K), other=0.0)
    pdl_wait(PDL)
    acc = tl.zeros([BN, BK], tl.float32)
    for k0 in range(0, K, BK):
        c = k0 + cols
        cok = c < K
        cn = c + BK
        w_next = tl.load(wrow + cn[None, :], mask=rok[:, None] & (cn[None, :] < K), other=0.0)
        if GATED:
            g = tl.load(X + c, mask=cok, other=0.0).to(tl.float32)
            u = tl.load(X + K + c, mask=cok, other=0.0).to(tl.float32)
            x = (g * tl.sigmoid(g) * u).to(X.dtype.element_ty).to(tl.float32)
        else:
            x = tl.load(X + c, mask=cok, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
        w = w_next
    tl.store(Y + rows, tl.sum(acc, axis=1).to(Y.dtype.element_ty), mask=rok)


def mode() -> str:
    m = os.environ.get("NINFER_DENSE_GEMV", "all")
    if m not in ("0", "gated", "body", "all"):
        raise ValueError(f"NINFER_DENSE_GEMV must be 0, gated, body or all, not {m!r}")
    return m


def config() -> tuple[int, int, int]:
    text = os.environ.get("NINFER_DENSE_GEMV_CFG")
    if not text:
        return DEFAULT_CFG
    bn, bk, warps = (int(v) for v in text.split(":"))
    return bn, bk, warps


def gemv(x: torch.Tensor, w: torch.Tensor, gated: bool = False, cfg: tuple[int, int, int] | None = None) -> torch.Tensor:
    """y [1, n] = x @ w.T for x [1, k] (gated: silu(x[:, :k]) * x[:, k:] for x [1, 2k]); w [n, k]
    with unit column stride (row slices of a merged weight are fine)."""
    n, k = w.shape
    if x.shape[-1] != (2 * k if gated else k) or x.numel() != x.shape[-1] or w.stride(1) != 1:
        raise ValueError(f"dense gemv: x {tuple(x.shape)} does not fit w {tuple(w.shape)} (gated={gated})")
    bn, bk, warps = cfg or config()
    x = x.contiguous()
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _dense_gemv_kernel[(triton.cdiv(n, bn),)](x, w, y, n, k, w.stride(0), GATED=gated, BN=bn, BK=bk, num_warps=warps,
                                              **pdl_kwargs(x.device))
    return y


def _one_token(x: torch.Tensor, w: torch.Tensor) -> bool:
    """One row of x on the GPU, against a weight whose rows are contiguous (anything else: torch)."""
    return x.dim() >= 1 and x.numel() == x.shape[-1] and x.is_cuda and w.stride(1) == 1


class DenseGemvKernel:
    """The `bf16` scheme's kernel on CUDA: F.linear, except at one token where NINFER_DENSE_GEMV
    sends the projection (or the gated down projection) through `gemv`."""

    name = "triton.dense_gemv"
    requirements = GPU

    def prepare(self, weight):
        return weight.tensors["weight"]

    def apply(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        m = mode()
        if _one_token(x, w) and (m == "all" or (m == "body" and w.shape[0] <= HEAD_ROWS)):
            return gemv(x.reshape(1, -1), w).reshape(*x.shape[:-1], w.shape[0])
        return F.linear(x, w)

    def apply_gated(self, gu: torch.Tensor, w: torch.Tensor) -> torch.Tensor | None:
        if not _one_token(gu, w) or mode() == "0":
            return None
        return gemv(gu.reshape(1, -1), w, gated=True).reshape(*gu.shape[:-1], w.shape[0])
