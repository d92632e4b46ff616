"""The small ops between projections as single Triton launches (the `ops` of the fast backend).

At one request a 27B decode step reads its weights in about 3.5 ms (int4) and each launch in a
CUDA graph costs about 1 µs (device README): torch's RMSNorm is six launches, the residual add
one more, SwiGLU two. Here each is one. Same contract as `qwen_hybrid.layers.TorchOps`.
"""

from __future__ import annotations

import torch

# first: without CUDA it sets TRITON_INTERPRET=1, which must hold before triton is imported
from ninfer.kernels.triton import rmsnorm  # isort: skip
from ninfer.kernels.triton.norms import rmsnorm_pair  # isort: skip
from ninfer.kernels.triton.launch import pdl_kwargs, pdl_prologue  # isort: skip

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _silu_mul_kernel(G, U, Y, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + offs, (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_rows_kernel(G, U, Y, cols, stride_g, stride_u, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < cols
    g = tl.load(G + row * stride_g + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * cols + offs, (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty), mask=ok)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, computed in fp32 and rounded once; same shape. Rows may have any stride
    (the two halves of a merged gate|up GEMV's output), read in place; other layouts are copied."""
    if gate.dim() == 2 and gate.shape == up.shape and gate.stride(-1) == 1 and up.stride(-1) == 1 and not (
        gate.is_contiguous() and up.is_contiguous()
    ):
        rows, cols = gate.shape
        out = torch.empty((rows, cols), dtype=gate.dtype, device=gate.device)
        if rows and cols:
            block = 2048
            _silu_mul_rows_kernel[(rows, triton.cdiv(cols, block))](
                gate, up, out, cols, gate.stride(0), up.stride(0), BLOCK=block, num_warps=4, **pdl_kwargs(gate.device)
            )
        return out
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    n = gate.numel()
    if n:
        block = 2048
        _silu_mul_kernel[(triton.cdiv(n, block),)](gate, up, out, n, BLOCK=block, num_warps=4, **pdl_kwargs(gate.device))
    return out


class TritonOps:
    name = "triton"

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float, into=None) -> torch.Tensor:
        """into: the QLinear that reads the result first, whose kernel may make the norm itself
        (QLinear.norm_input)."""
        h = into.norm_input(x, w, eps) if into is not None else None
        return h if h is not None else rmsnorm(x, w, eps)

    def add_rms_norm(self, delta: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float, into=None):
        """residual += delta in place (rounded to its dtype), then its (1+w) norm: one pass. into:
        as rms_norm's; a norm made by `into` may leave residual unwritten and return the sum as a
        new tensor (quant_int's spread norm), so callers carry on with the returned residual."""
        h = into.norm_input(delta, w, eps, residual=residual) if into is not None else None
        if isinstance(h, tuple):  # the sum went to a new tensor (QLinear.norm_input)
            return h
        return residual, (h if h is not None else rmsnorm(delta, w, eps, residual=residual))

    def rms_norm_pair(self, a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor, eps: float):
        """cat((1+wa) norm(a), (1+wb) norm(b)) [N, 2H]: one launch instead of two norms and a cat."""
        return rmsnorm_pair(a, wa, b.to(a.dtype), wb, eps)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return silu_mul(gate, up)
