"""Prefill path: dequantize a prepared weight to a bf16 scratch, then cuBLAS.

At prefill sizes the fused kernel (kernels.py) measured 18-55% of bf16 cuBLAS at M = 1024
(BENCHMARKS.md): decoding in the MMA's operand path costs it the tensor-core pipeline cuBLAS
keeps. Here a bandwidth-bound Triton kernel writes the weight once as bf16 (about 2.5 bytes moved
per weight in q4: 0.53 read, 2 written) and torch's GEMM does the rest at bf16 speed. At M = 8192
that costs about 3% on top of the GEMM (see `DEQUANT_MIN_M` for where it starts to pay).

Every output element is the reference dequantization (`dequantize_int_prepared`,
`quant_nvfp4.kernels.dequantize_prepared`, fp32) rounded once to bf16, bit for bit:
* int formats: code * fp32(scale16) is exact in fp32 (at most 8 + 11 significant bits), then
  one round to nearest even.
* NVFP4: e2m1 * e4m3 is exact (at most 6 significant bits, within bf16's range) and the decoders
  of kernels.py give it in bf16 (the PTX one times 2^-7, folded into the global scale below); the
  one fp32 multiply by the global scale rounds as the reference's does (the same real product),
  then one round to bf16.
The GPU rounds fp32 -> bf16 in hardware (cvt.rn); Triton's interpreter truncates, so under
TRITON_INTERPRET the kernel rounds with integer arithmetic instead (`_round_bf16`).

Layouts are the prepared ones (kernels.Prepared), read as they are: int "kb128-v1" (64 bytes per
128-element K block per row: low nibbles = elements 0..63 = group 2kb, high = 64..127; q5/q6 bits
above the nibble in `qhigh`; q8 natural order, groups of 32) and NVFP4 "g16-split8-f16" (byte j
of a 16-element group: elements j and 8 + j, quant_nvfp4.kernels.pack_byte; E4M3 scale per 16 in
`scales`; fp32 `gscale` per row).

Scratch: one bf16 buffer per device, shared by every linear (they run one at a time on one
stream, as the split-K workspace of kernels.py assumes), grown at load time by `reserve` to the
largest chunk any prepared weight needs, never inside a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer_plugins.quant_int import kernels as K
from ninfer_plugins.quant_int.kernels import _e4m3_scales, _fp4_weights

# Activation rows from which apply() dequantizes + cuBLAS instead of the fused kernel. Arithmetic
# (H200, 4.2 TB/s, fused kernel's M = 1024 rates from BENCHMARKS.md; not yet measured): on 27B
# gate/up in q4 the fused kernel wins below about 200 rows (its M = 128 tile wave takes ~70 us,
# dequant 56 us + the GEMM's own read of the bf16 weight 45 us); q5/q6/q8/NVFP4, the fused
# kernel's slow formats, cross over near 100 rows, and with the int4 recipe most matrices are q5.
# bench/quant_prefill.py sweeps M = 64..512 on both sides to set it from measurement.
DEQUANT_MIN_M = 128

# Bytes of bf16 scratch one dequantize + GEMM step may use. 192 MiB holds every linear of the
# registered models whole (the largest besides the heads is 27B gate/up, 17408 x 5120 = 170 MiB),
# so their GEMMs run unsplit at cuBLAS's own tile counts (a 3-way split of gate/up at M = 1024
# would leave 1.4 waves of 128 x 256 tiles on 132 SMs); only the vocabulary heads (248320 rows)
# are cut, into balanced row chunks (27B: 13 of 19,200 rows; 35B: 6 of 41,472). 192 MiB is 0.13%
# of an H200; ninfer.memory.DEQUANT_SCRATCH accounts for it.
CHUNK_BYTES = 192 << 20


@dataclass(frozen=True)
class DequantConfig:
    block_r: int  # rows per program; divides kernels.ROW_PAD, so loads need no row mask
    num_warps: int


# One program per BLOCK_R rows x one 128-wide K block (q4: 64 * BLOCK_R bytes in, 256 * BLOCK_R
# out). Not yet tuned: bench/quant_prefill.py times the alternatives.
DEFAULT_CONFIG = DequantConfig(64, 4)


@triton.jit
def _round_bf16(f, EXACT: tl.constexpr):
    """fp32 -> bf16, round to nearest even. EXACT: integer arithmetic (the interpreter truncates)."""
    if EXACT:
        u = f.to(tl.int32, bitcast=True)
        r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
        out = r.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        out = f.to(tl.bfloat16)
    return out


@triton.jit
def _biased_f32(u, BIAS: tl.constexpr):
    """Integers u in [0, 2^23) -> fp32(u - BIAS), exactly: u under the exponent of 2^23, one subtraction."""
    return (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + BIAS)


# R (rows in this chunk) varies per call: one compilation serves all
@triton.jit(do_not_specialize=["R"])
def _dequant_kernel(
    W, H, S, G, OUT,
    R, K,
    stride_wn, stride_hn, stride_sn, stride_on,
    FMT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    FAST: tl.constexpr,
    EXACT_ROUND: tl.constexpr,
):
    kb = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rows < R
    # prepared tensors are padded to whole ROW_PAD blocks and K to whole 128 blocks: loads are
    # unmasked, stores are masked to the R x K output
    w_rows = W + rows.to(tl.int64) * stride_wn
    s_rows = S + rows.to(tl.int64) * stride_sn
    o_rows = OUT + rows.to(tl.int64) * stride_on
    if FMT == 8:
        # q8 g32: 128 codes per block, four groups of 32, each its own scale: a [rows, 4, 32] tile
        g = tl.arange(0, 4)
        i = tl.arange(0, 32)
        col = kb * 128 + g[:, None] * 32 + i[None, :]
        q = tl.load(w_rows[:, None, None] + col[None, :, :])
        s = tl.load(s_rows[:, None] + kb * 4 + g[None, :]).to(tl.float32)
        w = _biased_f32((q.to(tl.int32) & 0xFF) ^ 0x80, 128.0) * s[:, :, None]
        tl.store(o_rows[:, None, None] + col[None, :, :], _round_bf16(w, EXACT_ROUND),
                 mask=r_ok[:, None, None] & (col < K)[None, :, :])
    elif FMT == 16:
        # g16-split8-f16 as a flat [rows, 64] byte tile (the int formats' loads), each byte's block
        # scale gathered per column; the byte's two elements (16g + j and 16g + 8 + j, g = c // 8)
        # interleaved in registers so that the block's 128 columns go out as one contiguous store.
        # 34816x5120 on an H100: 211.8 us (72% of copy) against 824.5 us (19%) for the former
        # [rows, 8 groups, 8] tile with two stores of 16-byte runs 32 bytes apart, and the M = 1024
        # prefill matmul 38% -> 72% of cuBLAS (bench/dq_bench.py, BENCHMARKS.md thirty-first run)
        c64 = tl.arange(0, 64)
        b = tl.load(w_rows[:, None] + kb * 64 + c64[None, :])
        sraw = tl.load(s_rows[:, None] + kb * 8 + c64[None, :] // 8)
        lo, hi = _fp4_weights(b, _e4m3_scales(sraw, FAST), FAST)
        gs = tl.load(G + rows)
        if FAST:
            gs = gs * 128.0  # the PTX decode gives e2m1 * s * 2^-7 (kernels.ASM_FP4)
        wl = _round_bf16(lo.to(tl.float32) * gs[:, None], EXACT_ROUND)
        wh = _round_bf16(hi.to(tl.float32) * gs[:, None], EXACT_ROUND)
        w = tl.reshape(tl.permute(tl.reshape(tl.join(wl, wh), (BLOCK_R, 8, 8, 2)), (0, 1, 3, 2)), (BLOCK_R, 128))
        c = kb * 128 + tl.arange(0, 128)[None, :]
        tl.store(o_rows[:, None] + c, w, mask=r_ok[:, None] & (c < K))
    else:
        # kb128-v1: a [rows, 64] byte tile; low nibbles are elements 0..63 (group 2kb), high 64..127
        j = tl.arange(0, 64)
        b = tl.load(w_rows[:, None] + kb * 64 + j[None, :]).to(tl.int32)
        s2 = tl.load(s_rows[:, None] + kb * 2 + tl.arange(0, 2)[None, :]).to(tl.float32)
        s_lo, s_hi = tl.split(s2)
        HALF: tl.constexpr = 1 << (FMT - 1)
        if FMT == 4:
            v_lo = b & 0xF
            v_hi = b >> 4
        else:
            # high-bit plane: (FMT - 4) bits per element, 16 * (FMT - 4) bytes per block
            PER: tl.constexpr = 8 // (FMT - 4)
            NB: tl.constexpr = 64 // PER
            h_rows = H + rows.to(tl.int64) * stride_hn
            hb = h_rows[:, None] + kb * (16 * (FMT - 4))
            h_lo = tl.load(hb + tl.arange(0, NB)[None, :]).to(tl.int32)
            h_hi = tl.load(hb + NB + tl.arange(0, NB)[None, :]).to(tl.int32)
            h_lo = tl.reshape(tl.broadcast_to(h_lo[:, :, None], (BLOCK_R, NB, PER)), (BLOCK_R, 64))
            h_hi = tl.reshape(tl.broadcast_to(h_hi[:, :, None], (BLOCK_R, NB, PER)), (BLOCK_R, 64))
            shift = ((j % PER) * (FMT - 4))[None, :]
            MASK: tl.constexpr = (1 << (FMT - 4)) - 1
            v_lo = (b & 0xF) | (((h_lo >> shift) & MASK) << 4)
            v_hi = (b >> 4) | (((h_hi >> shift) & MASK) << 4)
        # two's complement code c = (v ^ HALF) - HALF
        w_lo = _biased_f32(v_lo ^ HALF, HALF * 1.0) * s_lo[:, None]
        w_hi = _biased_f32(v_hi ^ HALF, HALF * 1.0) * s_hi[:, None]
        col = kb * 128 + j[None, :]
        tl.store(o_rows[:, None] + col, _round_bf16(w_lo, EXACT_ROUND), mask=r_ok[:, None] & (col < K))
        tl.store(o_rows[:, None] + col + 64, _round_bf16(w_hi, EXACT_ROUND), mask=r_ok[:, None] & (col + 64 < K))


# --- host side --------------------------------------------------------------------------------------


def dequantize_into(
    p: K.Prepared, out: torch.Tensor, row0: int = 0, cfg: DequantConfig | None = None, fast: bool | None = None
) -> torch.Tensor:
    """out [r, k] bf16 (last dim contiguous) = rows row0 .. row0 + r of the weight; returns out.

    row0 must be a multiple of kernels.ROW_PAD (the loads run to the end of the last row block)."""
    cfg = cfg or DEFAULT_CONFIG
    r = out.shape[0]
    if out.dtype != torch.bfloat16 or out.shape[1] != p.k or out.stride(1) != 1:
        raise ValueError(f"dequantize_into needs a bf16 [rows, {p.k}] output with contiguous rows, got {out.dtype} {list(out.shape)}")
    if row0 % K.ROW_PAD or K.ROW_PAD % cfg.block_r or row0 + r > p.n:
        raise ValueError(f"rows {row0}..{row0 + r} of {p.n}: the start must be a multiple of {K.ROW_PAD}")
    if r == 0:
        return out
    q = p.qweight[row0:]
    s = p.scales[row0:]
    h = p.qhigh[row0:] if p.qhigh is not None else q
    g = p.gscale[row0:] if p.gscale is not None else s
    n_kb = -(-p.k // 128)
    _dequant_kernel[(n_kb, -(-r // cfg.block_r))](
        q, h, s, g, out,
        r, p.k,
        q.stride(0), h.stride(0), s.stride(0), out.stride(0),
        FMT=p.fmt,
        BLOCK_R=cfg.block_r,
        FAST=(p.fast if fast is None else fast) and not K.interpreting(),
        EXACT_ROUND=K.interpreting(),
        num_warps=cfg.num_warps,
    )
    return out


def dequantize(p: K.Prepared, cfg: DequantConfig | None = None, fast: bool | None = None) -> torch.Tensor:
    """The whole weight as a new bf16 [n, k] tensor (tests, tools; apply() uses the scratch)."""
    out = torch.empty((p.n, p.k), dtype=torch.bfloat16, device=p.device)
    return dequantize_into(p, out, 0, cfg, fast)


def chunk_rows(n: int, k: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows per dequantize + GEMM step: all n when they fit chunk_bytes, else balanced chunks,
    each a multiple of kernels.ROW_PAD."""
    most = max(K.ROW_PAD, chunk_bytes // (2 * k) // K.ROW_PAD * K.ROW_PAD)
    if n <= most:
        return n
    chunks = -(-n // most)
    return -(-(-(-n // chunks)) // K.ROW_PAD) * K.ROW_PAD


class Scratch:
    """Per-device bf16 buffer the dequantized chunks are written to."""

    _by_device: dict[torch.device, Scratch] = {}

    def __init__(self, device: torch.device) -> None:
        self.buf = torch.empty(0, dtype=torch.bfloat16, device=device)

    @classmethod
    def get(cls, device: torch.device) -> Scratch:
        s = cls._by_device.get(device)
        if s is None:
            s = cls._by_device[device] = cls(device)
        return s

    def reserve(self, elems: int) -> None:
        if self.buf.numel() < elems:
            self.buf = torch.empty(elems, dtype=torch.bfloat16, device=self.buf.device)

    def view(self, rows: int, k: int) -> torch.Tensor:
        if self.buf.numel() < rows * k:
            if self.buf.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("dequantize scratch too small inside a CUDA graph: call dequant.reserve at load")
            self.reserve(rows * k)
        return self.buf[: rows * k].view(rows, k)


def reserve(p: K.Prepared, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Grow the device's scratch (load time) to what `matmul` will need for this weight."""
    if p.device.type != "cuda":
        return
    Scratch.get(p.device).reserve(min(p.n, chunk_rows(p.n, p.k, chunk_bytes)) * p.k)


def matmul(
    x2: torch.Tensor, p: K.Prepared, chunk_bytes: int = CHUNK_BYTES, cfg: DequantConfig | None = None, fast: bool | None = None
) -> torch.Tensor:
    """y [M, n] = x2 [M, k] @ W.T: each row chunk of W dequantized to the scratch, then cuBLAS."""
    rows = chunk_rows(p.n, p.k, chunk_bytes)
    scratch = Scratch.get(x2.device)
    if rows >= p.n:
        return torch.nn.functional.linear(x2, dequantize_into(p, scratch.view(p.n, p.k), 0, cfg, fast))
    y = torch.empty((x2.shape[0], p.n), dtype=x2.dtype, device=x2.device)
    for r0 in range(0, p.n, rows):
        r1 = min(r0 + rows, p.n)
        w = dequantize_into(p, scratch.view(r1 - r0, p.k), r0, cfg, fast)
        # a column slice of y (row stride n) is a valid cuBLAS output as it is: no copy
        torch.mm(x2, w.t(), out=y[:, r0:r1])
    return y
