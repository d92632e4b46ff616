"""q4 g64 decode kernel (M = 1..16): packed words decoded straight into the MMA operand registers.

Why a second kernel: kernels.py's `_qmm_kernel` decodes a uint8 tile, and Triton hoists the
conversion to the MMA operand layout above that decode, so the packed bytes are read back from
shared memory two bytes at a time (static SASS, Triton 3.6, sm_90, BN 64 / 4 warps / 3 stages: 264
instructions a trip for 64 weights a thread, 4.1 a weight). Here (bench/skinny_sass.py): 2.8-2.9
instructions a weight at BLOCK_N 128-256 and no layout conversion of the weights at all.

How (layout "kb128-v1" of formats.py, read as it is):
* A row's 64 bytes of a K block are 32 int16 halfwords; the pipeliner copies them to shared memory
  (cp.async, 16 bytes) and each thread reads back its 16 contiguous bytes of a row (LDS.128).
* One inline-asm call per 32-bit word (two halfwords, bytes b0..b3) gives four bf16x2 registers of
  exact codes: (b0, b1) and (b2, b3), low nibbles (group 2 kb) and high nibbles (group 2 kb + 1).
  2 prmt + 2 shr + 4 lop3 + 4 fma per 8 weights.
* The K order inside each 64-wide group is permuted (`_sigma`) so that those registers are exactly
  the k pairs the MMA's A operand holds in each thread (pairs 2t, 2t + 1 and 2t + 8, 2t + 9 of
  every 16): Triton lays the decoded tile out as the wgmma register operand with no conversion
  (checked in the TTGIR: the reshape lands directly in #dot_op). x is read in the same permuted
  order, in 4-byte pairs, which the pipeliner also turns into cp.async into the B operand's
  shared-memory tile.
* fp16 group scales multiply the fp32 dot result (exact codes in bf16, one dot per group), loaded
  one K block ahead (the pipeliner does not pipeline loads that feed no dot).
* Swap AB: weights are the MMA's M side (BLOCK_N rows), activations its N (BLOCK_M = 16).
* Split-K: the workspace and arrival-counter protocol of kernels.py (one launch, the last split
  sums all partials in a fixed order, bit-reproducible, CUDA-graph safe).

Under TRITON_INTERPRET=1 the decode is plain Triton integer arithmetic giving the same values in
the same places (tests/plugins/quant_int/test_skinny.py runs the PTX over every byte in an
emulator).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton import sync as SY
from ninfer_plugins.quant_int import kernels as QK

# Two halfwords (one 32-bit word, bytes b0..b3 from its low end) -> four bf16x2 registers of
# codes: $0 = (b0 lo, b1 lo), $1 = (b0 hi, b1 hi), $2 = (b2 lo, b3 lo), $3 = (b2 hi, b3 hi).
# prmt puts b0 and b1 (b2 and b3) under the byte 0x43, the bf16 exponent of 128 (selector nibble
# i names the source byte of output byte i: 0-3 the word, 4-7 `mag`); lop3 with LUT 0x6a is
# (a & b) ^ c: it keeps one nibble per 16-bit half and flips its bit 3 (u ^ 8 = code + 8 for a
# two's-complement nibble u), so a half reads 128 + code + 8, exact in the 7 mantissa bits; the
# fma subtracts 136 (0xC308), exactly. Same bit tricks as kernels.py's ASM_Q4, a word at a time.
ASM_Q4_WORD = tl.constexpr("""
{
.reg .b32 d0, d1, t0, t1, mag, one, bias;
mov.b32 mag, 0x43434343;
mov.b32 one, 0x3F803F80;
mov.b32 bias, 0xC308C308;
prmt.b32 d0, $4, mag, 0x5140;
prmt.b32 d1, $4, mag, 0x7362;
shr.u32 t0, d0, 4;
shr.u32 t1, d1, 4;
lop3.b32 $0, d0, 0xFF0FFF0F, 0x00080008, 0x6a;
lop3.b32 $1, t0, 0x000F000F, 0x43084308, 0x6a;
lop3.b32 $2, d1, 0xFF0FFF0F, 0x00080008, 0x6a;
lop3.b32 $3, t1, 0x000F000F, 0x43084308, 0x6a;
fma.rn.bf16x2 $0, $0, one, bias;
fma.rn.bf16x2 $1, $1, one, bias;
fma.rn.bf16x2 $2, $2, one, bias;
fma.rn.bf16x2 $3, $3, one, bias;
}
""")

@triton.jit
def _codes(hw, FAST: tl.constexpr):
    """int16 halfwords [R, C] -> four bf16 code tiles [R, C]; in each halfword pair (2u, 2u + 1):
    n0 = low nibbles of bytes (4u, 4u + 1), n1 = their high nibbles, n2 / n3 the same for bytes
    (4u + 2, 4u + 3)."""
    if FAST:
        n0, n1, n2, n3 = tl.inline_asm_elementwise(
            ASM_Q4_WORD, "=r,=r,=r,=r,r", [hw],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=2,
        )
    else:
        # the same values in the same places as the asm (which pairs bytes within a word)
        R: tl.constexpr = hw.shape[0]
        C: tl.constexpr = hw.shape[1]
        a, b = tl.split(tl.reshape(hw.to(tl.int32), (R, C // 2, 2)))
        n0 = _pair(a & 0xF, (a >> 8) & 0xF, R, C)
        n1 = _pair((a >> 4) & 0xF, (a >> 12) & 0xF, R, C)
        n2 = _pair(b & 0xF, (b >> 8) & 0xF, R, C)
        n3 = _pair((b >> 4) & 0xF, (b >> 12) & 0xF, R, C)
    return n0, n1, n2, n3


@triton.jit
def _pair(u, v, R: tl.constexpr, C: tl.constexpr):
    """Nibbles u, v [R, C / 2] -> bf16 codes [R, C], u at even columns, v at odd ones. Through
    fp32: the interpreter's direct int -> bf16 conversion is wrong."""
    c = tl.reshape(tl.join((u ^ 8) - 8, (v ^ 8) - 8), (R, C))
    return c.to(tl.float32).to(tl.bfloat16)


@triton.jit
def _mma_order(a, b, BLOCK_N: tl.constexpr):
    """Two [BN, 32] code tiles of one group, a = n0 / n1 and b = n2 / n3 of `_codes`, -> [BN, 64]
    in the permuted K order `_sigma`. Element h = 2u + e of a is byte 4u + e, of b byte 4u + 2 + e;
    with u = 4t + kk (thread t of a quad holds words 4t..4t + 3, 16 contiguous bytes) column
    j = 16 kk + 8 q + 2 t + e holds byte 16 t + 4 kk + 2 q + e. e is the MMA register's half and
    t the lane in the quad, so no data moves: only Triton's view of the registers changes."""
    v = tl.join(a, b)  # [BN, 32, 2]: [r, h, q], h = 8 t + 2 kk + e
    v = tl.reshape(v, (BLOCK_N, 4, 4, 2, 2))  # [r, t, kk, e, q]
    v = tl.permute(v, (0, 2, 4, 1, 3))  # [r, kk, q, t, e]
    return tl.reshape(v, (BLOCK_N, 64))


@triton.jit
def _sigma():
    """k within the group (= byte of the row's 64) of each permuted column j, see `_mma_order`;
    pairs of columns are pairs of consecutive k (4-byte copies of x)."""
    j = tl.arange(0, 64)
    return 16 * ((j // 2) % 4) + 4 * (j // 16) + 2 * ((j // 8) % 2) + j % 2


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
    EVEN_K: tl.constexpr,
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
    sig = _sigma()
    x_cols = X + rm[None, :].to(tl.int64) * stride_xm + sig[:, None]
    x_ok = m_ok[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    n_kb = tl.cdiv(K, 128)
    kb_lo = pid_k * KB_PER_SPLIT
    kb_hi = tl.minimum(kb_lo + KB_PER_SPLIT, n_kb)
    # scales feed the accumulator, not the MMA, so the pipeliner would leave their load in the
    # loop with its whole latency: load each block's pair one block ahead (as kernels.py does)
    s_cur = tl.load(s_rows + tl.minimum(kb_lo, n_kb - 1))
    for kb in range(kb_lo, kb_hi):
        # clamped: the last trip's look-ahead reads a block it does not use, in bounds
        s_nxt = tl.load(s_rows + tl.minimum(kb + 1, n_kb - 1))
        hw = tl.load(w_rows + kb * 32)
        if EVEN_K:
            x_lo = tl.load(x_cols + kb * 128, mask=x_ok, other=0.0)
            x_hi = tl.load(x_cols + kb * 128 + 64, mask=x_ok, other=0.0)
        else:
            k_lo = kb * 128 + sig[:, None]
            x_lo = tl.load(x_cols + kb * 128, mask=x_ok & (k_lo < K), other=0.0)
            x_hi = tl.load(x_cols + kb * 128 + 64, mask=x_ok & (k_lo + 64 < K), other=0.0)
        n0, n1, n2, n3 = _codes(hw, FAST)
        d_lo = _dot(_mma_order(n0, n2, BLOCK_N), x_lo, None, DOT_F32)
        d_hi = _dot(_mma_order(n1, n3, BLOCK_N), x_hi, None, DOT_F32)
        s_lo, s_hi = _scale_pair(s_cur)
        # two FFMAs per accumulator element (a sum of both products first would add an FADD)
        acc += d_lo * s_lo[:, None]
        acc += d_hi * s_hi[:, None]
        s_cur = s_nxt
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
        arrived = SY.arrive(CNT + tile)
        if arrived == SPLIT_K - 1:
            SY.acquire_all(arrived)
            total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for p in range(SPLIT_K):
                total += tl.load(part + p * tile_elems + offs, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(Y.dtype.element_ty), mask=out_mask)
            SY.rearm(CNT + tile)


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    # the MMA's N: 16 is the smallest tl.dot takes
    block_m: int = 16

    def describe(self) -> str:
        return f"SKINNY BN{self.block_n} BM{self.block_m} SK{self.split_k} w{self.num_warps} s{self.num_stages}"


def split_for(n: int, k: int, block_n: int, sm_count: int, per_sm: int = 3) -> int:
    """Splits (a power of two up to 16) until about per_sm tiles an SM are in flight, keeping at
    least 4 K blocks a split."""
    n_kb = -(-k // 128)
    tiles = -(-n // block_n)
    split = 1
    while tiles * split < per_sm * sm_count and n_kb // (split * 2) >= 4 and split < 16:
        split *= 2
    return split


def default_config(n: int, k: int, sm_count: int) -> SkinnyConfig:
    """Not measured yet (bench/skinny_bench.py will): BLOCK_N 128 on 4 warps (the fewest
    instructions a weight at 167 registers, three CTAs an SM), about three tiles an SM."""
    return SkinnyConfig(128, split_for(n, k, 128, sm_count))


def resolve_split(cfg: SkinnyConfig, k: int) -> tuple[int, int]:
    """(splits, K blocks per split) a launch will use: no split is empty."""
    n_kb = -(-k // 128)
    per = -(-n_kb // max(1, min(cfg.split_k, n_kb)))
    return -(-n_kb // per), per


def workspace_need(cfg: SkinnyConfig, n: int, k: int, m: int) -> tuple[int, int]:
    """(partial elements, counters) a launch of m rows needs in kernels.Workspace."""
    split, _ = resolve_split(cfg, k)
    if split == 1:
        return 0, 0
    tiles = -(-n // cfg.block_n) * -(-m // cfg.block_m)
    return tiles * split * cfg.block_n * cfg.block_m, tiles


def reserve_workspace(p: QK.Prepared, cfg: SkinnyConfig, max_m: int = 16) -> None:
    """Size the split-K scratch now (load time), so a CUDA graph never allocates."""
    if p.device.type == "cuda":
        QK.Workspace.get(p.device).reserve(*workspace_need(cfg, p.n, p.k, max_m))


def launch(x2: torch.Tensor, p: QK.Prepared, cfg: SkinnyConfig | None = None) -> torch.Tensor:
    """y [M, n] = x2 [M, k] @ W.T for a prepared q4 weight (kernels.Prepared, rows padded to
    ROW_PAD); x2 bf16, contiguous in its last dim. Meant for M <= 16 (larger M runs, one row
    block of 16 after another)."""
    if p.fmt != QK.Q4:
        raise ValueError(f"the skinny kernel takes q4 weights, got format {p.fmt}")
    if cfg is None:
        cfg = default_config(p.n, p.k, p.sm_count)
    if p.qweight.shape[0] % cfg.block_n:
        raise ValueError(f"weight rows {p.qweight.shape[0]} are not whole blocks of {cfg.block_n}")
    m = x2.shape[0]
    y = torch.empty((m, p.n), dtype=x2.dtype, device=x2.device)
    if m == 0:
        return y
    grid_n = -(-p.n // cfg.block_n)
    grid_m = -(-m // cfg.block_m)
    split, per = resolve_split(cfg, p.k)
    ws = QK.Workspace.get(x2.device)
    if split > 1:
        ws.ensure(*workspace_need(cfg, p.n, p.k, m), QK.capturing(x2))
        partials, counters = ws.partials, ws.counters
    else:
        partials, counters = y, y  # unused
    # the packed bytes as halfwords and each K block's two fp16 scales as one int32 (Kp / 64 is
    # even): both views are free
    w16 = p.qweight.view(torch.int16)
    s32 = p.scales.view(torch.int32)
    _skinny_kernel[(grid_n, grid_m, split)](
        x2, w16, s32, y, partials, counters,
        m, p.n, p.k,
        x2.stride(0), w16.stride(0), s32.stride(0), y.stride(0),
        per,
        BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, SPLIT_K=split,
        FAST=p.fast and not QK.interpreting(), DOT_F32=QK.interpreting(), EVEN_K=p.k % 128 == 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y
