"""Small fused ops that would otherwise cost a memory pass (or a launch) each:
RMSNorm with the residual add, the GDN gated RMSNorm, SwiGLU, and the attention output gate.

All read bf16 (or any float), compute in fp32 and write once in the output's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton.launch import pdl_kwargs, pdl_prologue


@triton.jit
def _rmsnorm_kernel(X, RES, W, Y, sx, sr, sy, n_cols, eps,
                    BLOCK: tl.constexpr, OFFSET: tl.constexpr, HAS_RES: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    rmsnorm_row(X, RES, W, Y, tl.program_id(0).to(tl.int64), sx, sr, sy, n_cols, eps, BLOCK, OFFSET, HAS_RES)


@triton.jit
def rmsnorm_row(X, RES, W, Y, row, sx, sr, sy, n_cols, eps,
                BLOCK: tl.constexpr, OFFSET: tl.constexpr, HAS_RES: tl.constexpr,
                RES_OUT=None, so=0, lo=0, SLICE: tl.constexpr = 0):
    """One row of `rmsnorm` (with the residual add when HAS_RES): a kernel that does more after
    the norm (quant_int's K-walk x pairs) calls it as the rmsnorm kernel does. SLICE > 0: the
    whole row is read and reduced alike, but only columns lo .. lo + SLICE - 1 are stored, of the
    norm and of the sum (into RES_OUT, row stride so; RES is left as it was), so that programs
    sharing a row each store their own part (quant_int's gemv_kw.norm_pairs_spread)."""
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    st = ok
    if SLICE:
        st = ok & (cols >= lo) & (cols < lo + SLICE)
    x = tl.load(X + row * sx + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        # the residual stream is stored in its own dtype, and the norm reads what was stored
        s = (x + tl.load(RES + row * sr + cols, mask=ok, other=0.0).to(tl.float32)).to(RES.dtype.element_ty)
        if SLICE:
            tl.store(RES_OUT + row * so + cols, s, mask=st)
        else:
            tl.store(RES + row * sr + cols, s, mask=ok)
        x = s.to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
    w = tl.load(W + cols, mask=st, other=0.0).to(tl.float32)
    if OFFSET:
        w = w + 1.0
    tl.store(Y + row * sy + cols, (x * r * w).to(Y.dtype.element_ty), mask=st)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    offset: bool = True,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """RMSNorm of x [N, H] over H: (1 + w) with offset=True (Qwen), w with offset=False.
    With `residual` [N, H]: residual += x in place (rounded to its dtype), and the norm of the
    new residual is returned — the pre-norm block's `x = x + mixer(h); h = norm(x)` in one pass."""
    N, H = x.shape
    if out is None:
        out = torch.empty(N, H, dtype=x.dtype, device=x.device)
    if N == 0:
        return out
    res = residual if residual is not None else x
    if x.stride(1) != 1 or res.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("rmsnorm needs a unit stride on the last dim")
    block = triton.next_power_of_2(H)
    _rmsnorm_kernel[(N,)](x, res, weight, out, x.stride(0), res.stride(0), out.stride(0), H, eps,
                          BLOCK=block, OFFSET=offset, HAS_RES=residual is not None,
                          num_warps=min(16, max(1, block // 512)), **pdl_kwargs(x.device))
    return out


@triton.jit
def _rmsnorm_pair_kernel(A, B, WA, WB, Y, sa, sb, sy, n_cols, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    half = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    if half == 0:
        x = tl.load(A + row * sa + cols, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(WA + cols, mask=ok, other=0.0).to(tl.float32)
    else:
        x = tl.load(B + row * sb + cols, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(WB + cols, mask=ok, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
    tl.store(Y + row * sy + half * n_cols + cols, (x * r * (w + 1.0)).to(Y.dtype.element_ty), mask=ok)


def rmsnorm_pair(a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """cat((1 + wa) RMSNorm(a), (1 + wb) RMSNorm(b)) over the last dim, a and b [N, H] -> [N, 2H]
    in a's dtype, one launch (the MTP's input: the embedded next token and the target's hidden,
    each with its own norm, then concatenated for fc)."""
    if a.dim() != 2 or a.shape != b.shape or wa.shape != (a.shape[1],) or wb.shape != wa.shape:
        raise ValueError(f"rmsnorm_pair: a {tuple(a.shape)}, b {tuple(b.shape)}, weights {tuple(wa.shape)} "
                         f"{tuple(wb.shape)} must be [N, H], [N, H], [H], [H]")
    if a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError("rmsnorm_pair needs a unit stride on the last dim")
    N, H = a.shape
    out = torch.empty(N, 2 * H, dtype=a.dtype, device=a.device)
    if N:
        block = triton.next_power_of_2(H)
        _rmsnorm_pair_kernel[(N, 2)](a, b, wa, wb, out, a.stride(0), b.stride(0), out.stride(0), H, eps, BLOCK=block,
                                     num_warps=min(16, max(1, block // 512)), **pdl_kwargs(a.device))
    return out


@triton.jit
def _gated_rmsnorm_kernel(X, Z, W, Y, sx_n, sx_h, sz_n, sz_h, sy_n, sy_h, n_rows, H, eps,
                          D: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = rows < n_rows
    n = (rows // H).to(tl.int64)
    h = rows % H
    d = tl.arange(0, D)
    x = tl.load(X + (n * sx_n + h * sx_h)[:, None] + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    z = tl.load(Z + (n * sz_n + h * sz_h)[:, None] + d[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, 1) / D + eps)
    y = x * r[:, None] * tl.load(W + d).to(tl.float32)[None, :] * (z * tl.sigmoid(z))
    tl.store(Y + (n * sy_n + h * sy_h)[:, None] + d[None, :], y.to(Y.dtype.element_ty), mask=ok[:, None])


def gated_rmsnorm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """GDN output norm: x, z [N, H, D] -> plain RMSNorm(x) * w * silu(z) per head (weight [D]).
    out may be x itself."""
    N, H, D = x.shape
    if out is None:
        out = torch.empty(N, H, D, dtype=x.dtype, device=x.device)
    rows = N * H
    if rows == 0:
        return out
    per = max(1, min(16, 2048 // D))
    _gated_rmsnorm_kernel[(triton.cdiv(rows, per),)](
        x, z, weight, out, x.stride(0), x.stride(1), z.stride(0), z.stride(1), out.stride(0), out.stride(1),
        rows, H, eps, D=D, ROWS=per, num_warps=4, **pdl_kwargs(x.device))
    return out


@triton.jit
def _swiglu_kernel(GU, Y, s_gu, s_y, n_cols, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    g = tl.load(GU + row * s_gu + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(GU + row * s_gu + n_cols + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * s_y + cols, (g * tl.sigmoid(g) * u).to(Y.dtype.element_ty), mask=ok)


def swiglu(gate_up: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up for a fused [N, 2I] input laid out [gate | up]; returns [N, I]."""
    N, I2 = gate_up.shape
    inter = I2 // 2
    if out is None:
        out = torch.empty(N, inter, dtype=gate_up.dtype, device=gate_up.device)
    if N == 0:
        return out
    block = 2048
    _swiglu_kernel[(N, triton.cdiv(inter, block))](gate_up, out, gate_up.stride(0), out.stride(0), inter,
                                                  BLOCK=block, num_warps=4, **pdl_kwargs(gate_up.device))
    return out


@triton.jit
def _sigmoid_gate_kernel(X, G, Y, sx_n, sx_h, sg_n, sg_h, sy_n, sy_h, H, D: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    row = tl.program_id(0)
    n = (row // H).to(tl.int64)
    h = row % H
    d = tl.arange(0, D)
    x = tl.load(X + n * sx_n + h * sx_h + d).to(tl.float32)
    g = tl.load(G + n * sg_n + h * sg_h + d).to(tl.float32)
    tl.store(Y + n * sy_n + h * sy_h + d, (x * tl.sigmoid(g)).to(Y.dtype.element_ty))


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x * sigmoid(gate) for x, gate [N, H, D] (gate may be the strided gate half of q_proj's
    per-head [q | gate] output); D a power of two. out may be x itself."""
    N, H, D = x.shape
    if out is None:
        out = torch.empty(N, H, D, dtype=x.dtype, device=x.device)
    if N * H:
        _sigmoid_gate_kernel[(N * H,)](x, gate, out, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
                                       out.stride(0), out.stride(1), H, D=D, num_warps=2, **pdl_kwargs(x.device))
    return out
