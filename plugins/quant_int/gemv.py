"""Dequantize + GEMV on the CUDA cores, for decode (M = 1..4 activation rows).

The fused MMA kernel (kernels.py) decodes weights into the tensor cores' operand layout; at one
token it measured 35-41% of the copy bandwidth in q4 and less in q5/q6 (BENCHMARKS.md). Here each
thread streams 16-byte runs of packed weights, decodes them to fp32 in registers and keeps fp32
partial sums per scale group, reduced once per K trip.

Measured on the H200 (BENCHMARKS.md, "Decode GEMV", `python bench/gemv_tune.py`), M = 1, against
the MMA kernel on the same shapes in the same run: q5 and q6 about 25-30% faster on the 27B's big
matrices, q8 about 30%, q4 about equal, NVFP4 slower. `tuned.TUNED_GEMV` routes exactly the
measured wins here; everything else stays on the MMA kernel. Two rewrites that removed this
version's shared-memory broadcast of x and its shuffle reductions (fewer instructions by static
count of the SASS), one with software prefetch, both measured slower: see BENCHMARKS.md.

Layouts are the prepared ones of kernels.py, read as they are: int "kb128-v1" (64 bytes per
128-element K block per row: low nibbles = group 2kb, high nibbles = group 2kb+1; q5/q6 bits above
the nibble in `qhigh`; q8 natural order, groups of 32) and NVFP4 "g16-split8-f16".

Split-K (a runtime value, so one compiled kernel serves every split): partial sums go to the
same workspace and arrival counters as kernels.py's (one launch, bit-reproducible fixed-order sum
by the last split, counters reset by it; CUDA-graph safe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer_plugins.quant_int import kernels as QK
from ninfer.kernels.triton.launch import pdl_kwargs, pdl_prologue
from ninfer_plugins.quant_int.kernels import _e4m3_scales, _fp4_weights

# q4, four bytes at a time (pack=4): output 0..3 are the low-nibble codes, 4..7 the high-nibble
# codes times 16, as fp32, exact. prmt puts byte i under 0x4B in the top byte (0x4B0000bb reads as
# 2^23 + bb); lop3 (a & mask) ^ c keeps one nibble and flips its bit 3 (u ^ 8 = code + 8) so the
# subtraction of 2^23 + 8 (2^23 + 128 for the high nibble, left in place: 16 * code) is exact.
ASM_Q4_F32 = tl.constexpr("""
{
.reg .b32 m, t<4>;
mov.b32 m, 0x4B000000;
prmt.b32 t0, $8, m, 0x7650;
prmt.b32 t1, $8, m, 0x7651;
prmt.b32 t2, $8, m, 0x7652;
prmt.b32 t3, $8, m, 0x7653;
""" + "".join(
    f"lop3.b32 $%d, t{i}, 0xFF00000F, 0x8, 0x6a;\nsub.f32 $%d, $%d, 0f4B000008;\n" % (i, i, i)
    + f"lop3.b32 $%d, t{i}, 0xFF0000F0, 0x80, 0x6a;\nsub.f32 $%d, $%d, 0f4B000080;\n" % (4 + i, 4 + i, 4 + i)
    for i in range(4)
) + "}")


@triton.jit
def _magic_f32(u, BIAS: tl.constexpr):
    """Integers u in [0, 2^23) -> fp32(u - BIAS), exactly, without an int-to-float convert."""
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + BIAS)


@triton.jit
def _q4_f32(b, FAST: tl.constexpr):
    """uint8 tile -> (low-nibble codes, 16 x high-nibble codes) as fp32."""
    if FAST:
        lo, hi = tl.inline_asm_elementwise(ASM_Q4_F32, "=r,=r,=r,=r,=r,=r,=r,=r,r", [b],
                                           dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
    else:
        lo = _magic_f32((b & 0xF).to(tl.int32) ^ 8, 8.0)
        hi = _magic_f32((b & 0xF0).to(tl.int32) ^ 0x80, 128.0)
    return lo, hi


@triton.jit
def _xrow(X, m, stride_xm, k, k_ok, M):
    return tl.load(X + m * stride_xm + k, mask=k_ok & ((k * 0 + m) < M), other=0.0).to(tl.float32)


@triton.jit
def _row_terms(X, m, stride_xm, M, k_lo, ok_lo, w_lo, s_lo, k_hi, ok_hi, w_hi, s_hi, FMT: tl.constexpr):
    """Row m of x against one trip's decoded tile -> its contribution to that row's outputs
    [BLOCK_N]: each scale group's sum times its scale (int formats; q8 has one tile, the nibble
    formats a low and a high one), or plain sums (NVFP4: its scales are in the weights)."""
    x_lo = _xrow(X, m, stride_xm, k_lo, ok_lo, M)
    if FMT == 8:
        terms = tl.sum(tl.sum(w_lo * x_lo[None], axis=2) * s_lo, axis=1)
    else:
        x_hi = _xrow(X, m, stride_xm, k_hi, ok_hi, M)
        if FMT == 16:
            terms = tl.sum(tl.sum(w_lo * x_lo[None] + w_hi * x_hi[None], axis=2), axis=1)
        else:
            terms = tl.sum(tl.sum(w_lo * x_lo[None], axis=2) * s_lo + tl.sum(w_hi * x_hi[None], axis=2) * s_hi, axis=1)
    return terms


@triton.jit(do_not_specialize=["M", "N", "KB_PER_SPLIT", "SPLIT_K"])
def _gemv_kernel(
    X, W, H, S, G, Y, WS, CNT,
    M, N, K,
    stride_xm, stride_wn, stride_hn, stride_sn, stride_ym,
    KB_PER_SPLIT,
    SPLIT_K,
    FMT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    KB: tl.constexpr,
    EVEN: tl.constexpr,
    FAST: tl.constexpr,
    TILED: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    pdl_prologue(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn64 = rn.to(tl.int64)
    i = tl.arange(0, KB)
    n_kb = tl.cdiv(K, 128)
    kb_lo = pid_k * KB_PER_SPLIT
    kb_hi = tl.minimum(kb_lo + KB_PER_SPLIT, n_kb)
    acc0 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if FMT == 8:
        # q8 g32: a K block is 4 groups of 32 int8 codes, natural order
        g = tl.arange(0, 4 * KB)
        j = tl.arange(0, 32)
        w_rows = W + rn64[:, None, None] * stride_wn
        s_rows = S + rn64[:, None] * stride_sn
        for kb0 in range(kb_lo, kb_hi, KB):
            gg = kb0 * 4 + g
            g_ok = gg < kb_hi * 4
            kk = gg[:, None] * 32 + j[None, :]
            if EVEN:
                q = tl.load(w_rows + kk[None, :, :])
                s = tl.load(s_rows + gg[None, :]).to(tl.float32)
            else:
                q = tl.load(w_rows + kk[None, :, :], mask=g_ok[None, :, None], other=0)
                s = tl.load(s_rows + gg[None, :], mask=g_ok[None, :], other=0.0).to(tl.float32)
            c = _magic_f32((q.to(tl.int32) & 0xFF) ^ 0x80, 128.0)
            k_ok = (kk < K) & g_ok[:, None]
            acc0 += _row_terms(X, 0, stride_xm, M, kk, k_ok, c, s, kk, k_ok, c, s, FMT)
            if BLOCK_M > 1:
                acc1 += _row_terms(X, 1, stride_xm, M, kk, k_ok, c, s, kk, k_ok, c, s, FMT)
            if BLOCK_M > 2:
                acc2 += _row_terms(X, 2, stride_xm, M, kk, k_ok, c, s, kk, k_ok, c, s, FMT)
            if BLOCK_M > 3:
                acc3 += _row_terms(X, 3, stride_xm, M, kk, k_ok, c, s, kk, k_ok, c, s, FMT)
    else:
        j = tl.arange(0, 64)
        w_rows = W + rn64[:, None, None] * stride_wn
        rt = tl.arange(0, BLOCK_N)
        for kb0 in range(kb_lo, kb_hi, KB):
            kbs = kb0 + i
            kb_ok = kbs < kb_hi
            offs = kbs[:, None] * 64 + j[None, :]
            if TILED:
                # tile-major layout (tile_layout): this trip's [BLOCK_N, KB * 64] bytes are one
                # contiguous run, then its [BLOCK_N, 2 KB] scales
                tile = pid_n.to(tl.int64) * (n_kb // KB) + kb0 // KB
                b = tl.load(W + tile * (BLOCK_N * KB * 64) + rt[:, None, None] * (KB * 64) + (i[:, None] * 64 + j[None, :])[None, :, :])
            elif EVEN:
                b = tl.load(w_rows + offs[None, :, :])
            else:
                b = tl.load(w_rows + offs[None, :, :], mask=kb_ok[None, :, None], other=0)
            if FMT == 16:
                # g16-split8-f16: byte c of the block's 64 holds element 16 (c // 8) + c % 8 ("A")
                # and that + 8 ("B", quant_nvfp4.kernels.pack_byte); one E4M3 scale per 8 bytes
                k_lo = kbs[:, None] * 128 + (j[None, :] // 8) * 16 + j[None, :] % 8
                k_hi = k_lo + 8
                sidx = kbs[:, None] * 8 + j[None, :] // 8
                if EVEN:
                    sraw = tl.load(S + rn64[:, None, None] * stride_sn + sidx[None, :, :])
                else:
                    sraw = tl.load(S + rn64[:, None, None] * stride_sn + sidx[None, :, :], mask=kb_ok[None, :, None], other=0)
                sc = _e4m3_scales(sraw, FAST)
                w_lo, w_hi = _fp4_weights(b, sc, FAST)
                w_lo = w_lo.to(tl.float32)
                w_hi = w_hi.to(tl.float32)
                s_lo = sc  # unused by _row_terms for NVFP4 (the scales are in the weights)
                s_hi = sc
            else:
                k_lo = kbs[:, None] * 128 + j[None, :]
                k_hi = k_lo + 64
                s_rows = S + rn64[:, None] * stride_sn + kbs[None, :] * 2
                if TILED:
                    s_rows = S + tile * (BLOCK_N * KB * 2) + rt[:, None] * (2 * KB) + i[None, :] * 2
                if EVEN or TILED:
                    s_lo = tl.load(s_rows).to(tl.float32)
                    s_hi = tl.load(s_rows + 1).to(tl.float32)
                else:
                    s_lo = tl.load(s_rows, mask=kb_ok[None, :], other=0.0).to(tl.float32)
                    s_hi = tl.load(s_rows + 1, mask=kb_ok[None, :], other=0.0).to(tl.float32)
                if FMT == 4:
                    w_lo, w_hi = _q4_f32(b, FAST)
                    s_hi = s_hi * 0.0625  # the high codes come out times 16
                else:
                    # q5/q6: (FMT - 4) more bits per element from the high plane, PER elements a byte
                    PER: tl.constexpr = 8 // (FMT - 4)
                    NB: tl.constexpr = 64 // PER
                    HB: tl.constexpr = 16 * (FMT - 4)
                    hoffs = kbs[:, None] * HB + tl.arange(0, NB)[None, :]
                    h_rows = H + rn64[:, None, None] * stride_hn
                    if EVEN:
                        h_lo = tl.load(h_rows + hoffs[None, :, :])
                        h_hi = tl.load(h_rows + hoffs[None, :, :] + NB)
                    else:
                        h_lo = tl.load(h_rows + hoffs[None, :, :], mask=kb_ok[None, :, None], other=0)
                        h_hi = tl.load(h_rows + hoffs[None, :, :] + NB, mask=kb_ok[None, :, None], other=0)
                    h_lo = tl.reshape(tl.broadcast_to(h_lo[:, :, :, None], (BLOCK_N, KB, NB, PER)), (BLOCK_N, KB, 64))
                    h_hi = tl.reshape(tl.broadcast_to(h_hi[:, :, :, None], (BLOCK_N, KB, NB, PER)), (BLOCK_N, KB, 64))
                    shift = ((j % PER) * (FMT - 4))[None, None, :]
                    MASK: tl.constexpr = (1 << (FMT - 4)) - 1
                    HALF: tl.constexpr = 1 << (FMT - 1)
                    bi = b.to(tl.int32)
                    v_lo = (bi & 0xF) | (((h_lo.to(tl.int32) >> shift) & MASK) << 4)
                    v_hi = ((bi >> 4) & 0xF) | (((h_hi.to(tl.int32) >> shift) & MASK) << 4)
                    w_lo = _magic_f32(v_lo ^ HALF, HALF * 1.0)
                    w_hi = _magic_f32(v_hi ^ HALF, HALF * 1.0)
            k_ok_lo = (k_lo < K) & kb_ok[:, None]
            k_ok_hi = (k_hi < K) & kb_ok[:, None]
            acc0 += _row_terms(X, 0, stride_xm, M, k_lo, k_ok_lo, w_lo, s_lo, k_hi, k_ok_hi, w_hi, s_hi, FMT)
            if BLOCK_M > 1:
                acc1 += _row_terms(X, 1, stride_xm, M, k_lo, k_ok_lo, w_lo, s_lo, k_hi, k_ok_hi, w_hi, s_hi, FMT)
            if BLOCK_M > 2:
                acc2 += _row_terms(X, 2, stride_xm, M, k_lo, k_ok_lo, w_lo, s_lo, k_hi, k_ok_hi, w_hi, s_hi, FMT)
            if BLOCK_M > 3:
                acc3 += _row_terms(X, 3, stride_xm, M, k_lo, k_ok_lo, w_lo, s_lo, k_hi, k_ok_hi, w_hi, s_hi, FMT)
    if FMT == 16:
        gs = tl.load(G + rn)
        if FAST:
            gs = gs * 128.0  # the fast decode's weights come out times 2^-7
        acc0 = acc0 * gs
        acc1 = acc1 * gs
        acc2 = acc2 * gs
        acc3 = acc3 * gs
    n_ok = rn < N
    if SPLIT_K == 1:
        tl.store(Y + rn, acc0.to(Y.dtype.element_ty), mask=n_ok)
        if BLOCK_M > 1:
            tl.store(Y + stride_ym + rn, acc1.to(Y.dtype.element_ty), mask=n_ok & ((rn * 0 + 1) < M))
        if BLOCK_M > 2:
            tl.store(Y + 2 * stride_ym + rn, acc2.to(Y.dtype.element_ty), mask=n_ok & ((rn * 0 + 2) < M))
        if BLOCK_M > 3:
            tl.store(Y + 3 * stride_ym + rn, acc3.to(Y.dtype.element_ty), mask=n_ok & ((rn * 0 + 3) < M))
    else:
        # partial tile of this split: [BLOCK_M, BLOCK_N] fp32 at WS[(tile * SPLIT_K + pid_k) * tile_elems]
        TILE: tl.constexpr = BLOCK_N * BLOCK_M
        r = tl.arange(0, BLOCK_N)
        part = WS + pid_n.to(tl.int64) * SPLIT_K * TILE
        mine = part + pid_k * TILE
        tl.store(mine + r, acc0)
        if BLOCK_M > 1:
            tl.store(mine + BLOCK_N + r, acc1)
        if BLOCK_M > 2:
            tl.store(mine + 2 * BLOCK_N + r, acc2)
        if BLOCK_M > 3:
            tl.store(mine + 3 * BLOCK_N + r, acc3)
        # every thread's partial is stored before the one release below publishes them
        tl.debug_barrier()
        arrived = tl.atomic_add(CNT + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            mm = tl.arange(0, BLOCK_M)
            offs = mm[:, None] * BLOCK_N + r[None, :]
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for p in range(SPLIT_K):
                total += tl.load(part + p * TILE + offs, cache_modifier=".cg")
            y_ptrs = Y + mm[:, None] * stride_ym + rn[None, :]
            tl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=(mm[:, None] < M) & n_ok[None, :])
            tl.atomic_xchg(CNT + pid_n, 0)


MAX_M = 4


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    kb: int
    split_k: int
    num_warps: int
    num_stages: int = 1

    def describe(self) -> str:
        return f"GEMV BN{self.block_n} KB{self.kb} SK{self.split_k} w{self.num_warps} s{self.num_stages}"

    # the interface kernels.py dispatches through (shared with gemv_h2.H2Config)
    def workspace(self, p: QK.Prepared) -> tuple[int, int]:
        return workspace_need(self, p.n, p.k)

    def run(self, x2: torch.Tensor, p: QK.Prepared, fast: bool | None = None) -> torch.Tensor:
        return launch(x2, p, self, fast)


def default_config(fmt: int, n: int, k: int, sm_count: int) -> GemvConfig:
    """Rules when no measured winner exists: 2 K blocks a trip, splits until every SM holds
    several CTAs, keeping at least two trips a split."""
    # the measured winners: 64 rows for the q5/q6 matrices of 5120 and more rows, 16 below
    block_n = (64 if n >= 5120 else 16) if fmt in (5, 6) else 32
    kb = 2
    n_kb = -(-k // 128)
    tiles = -(-n // block_n)
    split = 1
    while tiles * split < 6 * sm_count and n_kb // (split * 2) >= 2 * kb and split < 32:
        split *= 2
    return GemvConfig(block_n, kb, split, 4)


def resolve(cfg: GemvConfig, k: int) -> tuple[int, int, bool]:
    """(splits, K blocks per split, EVEN) for a K of k."""
    n_kb = -(-k // 128)
    kb = min(cfg.kb, n_kb)
    split = max(1, min(cfg.split_k, -(-n_kb // kb)))
    per = -(-n_kb // split)
    per = -(-per // kb) * kb
    split = -(-n_kb // per)
    even = n_kb % per == 0 and per % kb == 0
    return split, per, even


def workspace_need(cfg: GemvConfig, n: int, k: int) -> tuple[int, int]:
    split, _, _ = resolve(cfg, k)
    if split == 1:
        return 0, 0
    tiles = -(-n // cfg.block_n)
    return tiles * split * cfg.block_n * MAX_M, tiles


def tile_layout(p: QK.Prepared, block_n: int, kb: int) -> QK.Prepared:
    """A q4 weight re-laid tile-major for `launch(..., tiled=True)` with this block_n and kb:
    [rows / block_n, K blocks / kb] tiles, each [block_n, kb * 64] packed bytes followed in its
    own array by [block_n, 2 kb] scales, so one trip of one CTA reads one contiguous run."""
    if p.fmt != QK.Q4:
        raise ValueError("the tile-major layout exists for q4 only")
    rows, n_kb = p.qweight.shape[0], -(-p.k // 128)
    if rows % block_n or n_kb % kb or p.k % 128:
        raise ValueError(f"tile-major layout needs rows % {block_n} == 0 and K blocks % {kb} == 0")
    q = p.qweight.reshape(rows // block_n, block_n, n_kb // kb, kb * 64).transpose(1, 2).contiguous()
    s = p.scales[:, : 2 * n_kb].reshape(rows // block_n, block_n, n_kb // kb, 2 * kb).transpose(1, 2).contiguous()
    return QK.Prepared(fmt=p.fmt, n=p.n, k=p.k, qweight=q.view(rows, -1), scales=s.view(rows, -1),
                       fast=p.fast, sm_count=p.sm_count)


def launch(x2: torch.Tensor, p: QK.Prepared, cfg: GemvConfig, fast: bool | None = None, tiled: bool = False) -> torch.Tensor:
    """y [M, n] = x2 [M, k] @ W.T for M <= 4 rows (tiled: p is tile_layout(.., cfg.block_n, cfg.kb))."""
    m = x2.shape[0]
    if m > MAX_M:
        raise ValueError(f"the GEMV path takes at most {MAX_M} rows, got {m}")
    y = torch.empty((m, p.n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    block_m = QK.block_rows(m)
    kb = min(cfg.kb, -(-p.k // 128))
    split, per, even = resolve(cfg, p.k)
    if tiled and (p.fmt != QK.Q4 or not even or kb != cfg.kb):
        raise ValueError(f"tiled GEMV: q4 with whole trips per split only ({cfg.describe()}, K={p.k})")
    grid_n = -(-p.n // cfg.block_n)
    ws = QK.Workspace.get(x2.device)
    if split > 1:
        ws.ensure(grid_n * split * cfg.block_n * MAX_M, grid_n, QK.capturing(x2))
    # split is a runtime value: the kernel's split-K branch is compiled whatever it is, so the
    # workspace pointers always have their real types (unused when split == 1)
    partials, counters = ws.partials, ws.counters
    qhigh = p.qhigh if p.qhigh is not None else p.qweight
    gscale = p.gscale if p.gscale is not None else p.scales
    _gemv_kernel[(grid_n, split)](
        x2, p.qweight, qhigh, p.scales, gscale, y, partials, counters,
        m, p.n, p.k,
        x2.stride(0), p.qweight.stride(0), qhigh.stride(0), p.scales.stride(0), y.stride(0),
        per,
        split,
        FMT=p.fmt,
        BLOCK_N=cfg.block_n,
        BLOCK_M=block_m,
        KB=kb,
        EVEN=even,
        FAST=(p.fast if fast is None else fast) and not QK.interpreting(),
        TILED=tiled,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **pdl_kwargs(x2.device),
    )
    return y
