"""q4 g64 decode kernel (M = 1..16) with a short inner loop: packed words decoded straight into
the MMA operand's registers.

Why a second kernel: kernels.py's `_qmm_kernel` decodes a uint8 tile, and Triton hoists the
conversion to the MMA operand layout above that decode, so the packed bytes are read back from
shared memory two bytes at a time (static SASS at its M = 1 config: ~4 instructions per weight).
Streaming q4 at the H200's copy bandwidth leaves an SM about 4 thread-instructions per weight at
perfect issue; this kernel spends about 1.5 (bench/skinny_sass.py prints the counts).

How (layout "kb128-v1" of formats.py, read as it is):
* Each row's 64 bytes of a K block are loaded as 32 int16 halfwords; a thread's 16 contiguous
  bytes become, through one inline-asm call per two halfwords (a 32-bit word), four bf16x2
  registers: (byte0, byte2) and (byte1, byte3) for the low nibbles (group 2 kb) and the same for
  the high nibbles (group 2 kb + 1). Three shifts and four lop3 per 8 weights.
* The K order inside each 64-wide group is permuted (`_sigma`) so that those registers are exactly
  the k pairs the MMA's A operand wants in each thread (k pairs 2t, 2t + 1 and 2t + 8, 2t + 9 of
  every 16): the A tile needs no layout conversion. x is gathered in the same permuted order (x
  is BLOCK_M x 128 per trip, shared by BLOCK_N weight rows).
* The decoded value is 136 + code (the nibble xor 8 under the bf16 exponent of 128), exact. The
  bias is removed after the MMA: 136 * sum(x over the group) per activation row, computed from
  the same bf16 x in fp32, then the fp16 group scale multiplies the fp32 dot result.
* Swap AB: weights are the MMA's M side (BLOCK_N rows), activations its N (BLOCK_M = 16).
* Split-K: the workspace and arrival-counter protocol of kernels.py (one launch, the last split
  sums all partials in a fixed order, bit-reproducible, CUDA-graph safe).

Under TRITON_INTERPRET=1 the decode is plain Triton integer arithmetic (same values).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer_plugins.quant_int import kernels as QK

# Two halfwords (one 32-bit word, bytes b0..b3 from its low end) -> four bf16x2 registers, each
# half holding 136 + code: $0 = (b0 lo, b2 lo), $1 = (b0 hi, b2 hi), $2 = (b1 lo, b3 lo),
# $3 = (b1 hi, b3 hi). lop3 with LUT 0x6a is (a & b) ^ c: it keeps one nibble per 16-bit half,
# flips its bit 3 (u ^ 8 = code + 8 for a two's-complement nibble u) and sets 0x43 above it, the
# bf16 exponent of 128 whose 7 mantissa bits hold the nibble exactly: 128 + code + 8.
ASM_Q4_WORD = tl.constexpr("""
{
.reg .b32 t1, t2, t3, one, bias;
mov.b32 one, 0x3F803F80;
mov.b32 bias, 0xC308C308;
shr.u32 t1, $4, 4;
shr.u32 t2, $4, 8;
shr.u32 t3, $4, 12;
lop3.b32 $0, $4, 0x000F000F, 0x43084308, 0x6a;
lop3.b32 $1, t1, 0x000F000F, 0x43084308, 0x6a;
lop3.b32 $2, t2, 0x000F000F, 0x43084308, 0x6a;
lop3.b32 $3, t3, 0x000F000F, 0x43084308, 0x6a;
fma.rn.bf16x2 $0, $0, one, bias;
fma.rn.bf16x2 $1, $1, one, bias;
fma.rn.bf16x2 $2, $2, one, bias;
fma.rn.bf16x2 $3, $3, one, bias;
}
""")

# what every decoded weight carries on top of its code
BIAS = tl.constexpr(136.0)


@triton.jit
def _codes(hw, FAST: tl.constexpr):
    """int16 halfwords [R, C] -> four bf16 tiles [R, C] of 136 + code: nibble 0..3 of each."""
    if FAST:
        n0, n1, n2, n3 = tl.inline_asm_elementwise(
            ASM_Q4_WORD, "=r,=r,=r,=r,r", [hw],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=2,
        )
    else:
        # through fp32: the interpreter's direct int -> bf16 conversion is wrong
        v = hw.to(tl.int32)
        n0 = (((v & 0xF) ^ 8) - 8).to(tl.float32).to(tl.bfloat16)
        n1 = ((((v >> 4) & 0xF) ^ 8) - 8).to(tl.float32).to(tl.bfloat16)
        n2 = ((((v >> 8) & 0xF) ^ 8) - 8).to(tl.float32).to(tl.bfloat16)
        n3 = ((((v >> 12) & 0xF) ^ 8) - 8).to(tl.float32).to(tl.bfloat16)
    return n0, n1, n2, n3


@triton.jit
def _mma_order(a, b, BLOCK_N: tl.constexpr):
    """Two [BN, 32] tiles (a = bytes 2h, b = bytes 2h + 1 of halfword h) -> [BN, 64] in the
    permuted K order `_sigma`: column j = 16 kk + 8 q + 2 t + e holds byte 16 t + 4 kk + 2 e + q."""
    v = tl.join(a, b)  # [BN, 32, 2]: [r, h, q], h = 8 t + 2 kk + e
    v = tl.reshape(v, (BLOCK_N, 4, 4, 2, 2))  # [r, t, kk, e, q]
    v = tl.permute(v, (0, 2, 4, 1, 3))  # [r, kk, q, t, e]
    return tl.reshape(v, (BLOCK_N, 64))


@triton.jit
def _sigma():
    """Byte (= k within the group) of each permuted column j, see `_mma_order`."""
    j = tl.arange(0, 64)
    return 16 * ((j // 2) % 4) + 4 * (j // 16) + 2 * (j % 2) + (j // 8) % 2


@triton.jit
def _dot(a, b, acc, F32: tl.constexpr):
    # F32 only under TRITON_INTERPRET: its numpy dot multiplies bf16 bit patterns as integers
    if F32:
        d = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        d = tl.dot(a, b, acc)
    return d


@triton.jit
def _scale_pair(v):
    """int32 holding a K block's two fp16 group scales -> (low group, high group) as fp32."""
    lo = (v & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    hi = (v >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return lo.to(tl.float32), hi.to(tl.float32)


@triton.jit
def _x_order(x, BLOCK_M: tl.constexpr):
    """x [BM, 128] (one K block, natural order) -> the two groups' B tiles [64, BM] in `_sigma`
    order: natural k = 64 g + 16 t + 4 kk + 2 e + q goes to row j = 16 kk + 8 q + 2 t + e."""
    v = tl.reshape(x, (BLOCK_M, 2, 4, 4, 2, 2))  # [m, g, t, kk, e, q]
    v = tl.permute(v, (3, 5, 2, 4, 0, 1))  # [kk, q, t, e, m, g]
    v = tl.reshape(v, (64, BLOCK_M, 2))
    return tl.split(v)


@triton.jit(do_not_specialize=["M", "N", "KB_PER_SPLIT"])
def _skinny_kernel(
    X, W, S, Y, WS, CNT,
    M, N, K,
    stride_xm, stride_wn, stride_sn, stride_ym,
    KB_PER_SPLIT,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    FAST: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < M
    # W is the packed weight viewed as int16 (32 halfwords per K block); rows padded: no masks
    w_rows = W + rn[:, None].to(tl.int64) * stride_wn + tl.arange(0, 32)[None, :]
    s_rows = S + rn.to(tl.int64) * stride_sn
    kcol = tl.arange(0, 128)
    x_rows = X + rm[:, None].to(tl.int64) * stride_xm + kcol[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    n_kb = tl.cdiv(K, 128)
    kb_lo = pid_k * KB_PER_SPLIT
    kb_hi = tl.minimum(kb_lo + KB_PER_SPLIT, n_kb)
    # scales feed the accumulator, not the MMA, and x goes through registers (it is permuted):
    # the pipeliner would leave both loads in the loop with their whole latency, so each is
    # loaded one block ahead (scales as kernels.py does)
    s_cur = tl.load(s_rows + tl.minimum(kb_lo, n_kb - 1))
    x_cur = tl.load(x_rows + kb_lo * 128, mask=m_ok[:, None] & (kb_lo * 128 + kcol[None, :] < K), other=0.0)
    for kb in range(kb_lo, kb_hi):
        # clamped: the last trip's look-ahead reads a block it does not use, in bounds
        s_nxt = tl.load(s_rows + tl.minimum(kb + 1, n_kb - 1))
        x_nxt = tl.load(x_rows + (kb + 1) * 128, mask=m_ok[:, None] & ((kb + 1) * 128 + kcol[None, :] < K), other=0.0)
        hw = tl.load(w_rows + kb * 32)
        x_lo, x_hi = _x_order(x_cur.to(tl.bfloat16), BLOCK_M)
        n0, n1, n2, n3 = _codes(hw, FAST)
        d_lo = _dot(_mma_order(n0, n2, BLOCK_N), x_lo, None, DOT_F32)
        d_hi = _dot(_mma_order(n1, n3, BLOCK_N), x_hi, None, DOT_F32)
        s_lo, s_hi = _scale_pair(s_cur.to(tl.float32, bitcast=True).to(tl.int32, bitcast=True))
        # two FFMAs per accumulator element (a sum of both products first would add an FADD)
        acc += d_lo * s_lo[:, None]
        acc += d_hi * s_hi[:, None]
        s_cur = s_nxt
        x_cur = x_nxt
    n_ok = rn < N
    y_ptrs = Y + rm[None, :].to(tl.int64) * stride_ym + rn[:, None]
    out_mask = n_ok[:, None] & m_ok[None, :]
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=out_mask)
    else:
        grid_n = tl.num_programs(0)
        tile = pid_m * grid_n + pid_n
        tile_elems = BLOCK_N * BLOCK_M
        offs = tl.arange(0, BLOCK_N)[:, None] + tl.arange(0, BLOCK_M)[None, :] * BLOCK_N
        part = WS + (tile.to(tl.int64) * SPLIT_K) * tile_elems
        tl.store(part + pid_k * tile_elems + offs, acc)
        # every thread's partial is stored before the one release below publishes them
        tl.debug_barrier()
        arrived = tl.atomic_add(CNT + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for p in range(SPLIT_K):
                total += tl.load(part + p * tile_elems + offs, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(CNT + tile, 0)


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    block_m: int = 16

    def describe(self) -> str:
        return f"SKINNY BN{self.block_n} BM{self.block_m} SK{self.split_k} w{self.num_warps} s{self.num_stages}"


def launch(x2: torch.Tensor, p: QK.Prepared, cfg: SkinnyConfig) -> torch.Tensor:
    m = x2.shape[0]
    y = torch.empty((m, p.n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    grid_n = -(-p.n // cfg.block_n)
    grid_m = -(-m // cfg.block_m)
    n_kb = -(-p.k // 128)
    split = max(1, min(cfg.split_k, n_kb))
    per = -(-n_kb // split)
    split = -(-n_kb // per)
    ws = QK.Workspace.get(x2.device)
    if split > 1:
        need = grid_n * grid_m * split * cfg.block_n * cfg.block_m
        if ws.partials.numel() < need or ws.counters.numel() < grid_n * grid_m:
            if x2.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("split-K workspace too small inside a CUDA graph: call reserve_workspace at load")
            ws.reserve(need, grid_n * grid_m)
        partials, counters = ws.partials, ws.counters
    else:
        partials, counters = y, y
    w16 = p.qweight.view(torch.int16)
    s32 = p.scales.view(torch.int32)
    _skinny_kernel[(grid_n, grid_m, split)](
        x2, w16, s32, y, partials, counters,
        m, p.n, p.k,
        x2.stride(0), w16.stride(0), s32.stride(0), y.stride(0),
        per,
        BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, SPLIT_K=split,
        FAST=p.fast and not QK.interpreting(), DOT_F32=QK.interpreting(),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y
