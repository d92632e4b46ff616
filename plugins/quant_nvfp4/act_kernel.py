"""The W4A4 activation quantizer's Triton kernel (native.py's `quantize_activations` launches it).

One program quantizes BR rows x NB blocks of 16: E2M1 codes packed two to a byte and an E4M3 scale
per block written at its place in cuBLAS's tiled scale layout (native.swizzle_offsets); rows past M,
up to the 128-row tile, get zero scales. The rounding is formats.py's (formats.encode_blocks is the
oracle): E4M3 is rounded with integer arithmetic rather than a float8 cast, which Triton's
interpreter does not round to nearest even, so the interpreted kernel and the compiled one agree.
"""

import triton
import triton.language as tl


@triton.jit
def _e4m3(s):
    # s: fp32 in [0, 448]. Round to E4M3, ties to even; return (value, byte).
    # Normal range (s >= 2^-6): the fp32 mantissa rounded to 3 bits with integer arithmetic.
    b = s.to(tl.int32, bitcast=True)
    rb = (b + 0x7FFFF + ((b >> 20) & 1)) & -1048576  # -1048576 = ~0xFFFFF
    vn = rb.to(tl.float32, bitcast=True)
    # Subnormals: multiples of 2^-9, rounded by an add whose ulp is 2^-9 (1.5 * 2^14)
    vs = (s + 24576.0) - 24576.0
    sub = s < 0.015625
    v = tl.where(sub, vs, vn)
    vb = v.to(tl.int32, bitcast=True)
    byte_n = (((vb >> 23) - 120) << 3) | ((vb >> 20) & 7)
    byte_s = (v * 512.0).to(tl.int32)
    byte = tl.where(v < 0.015625, byte_s, byte_n)
    return v, byte

@triton.jit
def quantize_kernel(X, stride_xm, Q, stride_qm, S, G, AMAX, M, K, KB_P4,
                    DYNAMIC: tl.constexpr, BR: tl.constexpr, NB: tl.constexpr):
    pr = tl.program_id(0)
    pk = tl.program_id(1)
    rows = pr * BR + tl.arange(0, BR)
    blocks = pk * NB + tl.arange(0, NB)
    if DYNAMIC:
        # a scale per row (amax of the row / 2688): each token's codes independent of the others
        # in the call (batch size, speculative columns, padding rows)
        amax = tl.load(AMAX + rows, mask=rows < M, other=0.0)
        g = tl.where(amax > 0, tl.div_rn(amax, 2688.0), 1.0)
        if pk == 0:
            tl.store(G + rows, g, mask=rows < M)
        g = g[:, None]
    else:
        g = tl.load(G)
    # [BR, NB, 16] elements
    cols = blocks[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]
    r3 = rows[:, None, None]
    x = tl.load(X + r3 * stride_xm + cols, mask=(r3 < M) & (cols < K), other=0.0).to(tl.float32)
    bamax = tl.max(tl.abs(x), axis=2)
    s32 = tl.minimum(tl.div_rn(bamax, g * 6.0), 448.0)
    v, byte = _e4m3(s32)
    tiny = (v == 0.0) & (bamax > 0.0)
    v = tl.where(tiny, 0.001953125, v)
    byte = tl.where(tiny, 1, byte)
    denom = v * g
    safe = tl.where(denom > 0.0, denom, 1.0)
    q = tl.where(denom[:, :, None] > 0.0, tl.div_rn(x, safe[:, :, None]), 0.0)
    a = tl.abs(q)
    # nearest E2M1 magnitude, ties to the even code (strict > where the lower code is even)
    idx = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
           + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
           + (a > 5.0).to(tl.int32))
    code = idx | tl.where((q < 0.0) & (idx > 0), 8, 0)
    # pack: element 2j low nibble, 2j + 1 high
    pair = tl.reshape(code, [BR, NB * 8, 2])
    lo, hi = tl.split(pair)
    packed = (lo | (hi << 4)).to(tl.uint8)
    pcols = pk * NB * 8 + tl.arange(0, NB * 8)
    r2 = rows[:, None]
    tl.store(Q + r2 * stride_qm + pcols[None, :], packed, mask=(r2 < M) & (pcols[None, :] < KB_P4 * 8))
    # scales, into the tiled layout; rows past M (up to the 128-row tile) get zeros
    b2 = blocks[None, :]
    tile = (r2 // 128) * (KB_P4 // 4) + b2 // 4
    rr = r2 % 128
    off = tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + b2 % 4
    byte = tl.where(r2 < M, byte, 0)
    tl.store(S + off, byte.to(tl.uint8), mask=b2 < KB_P4)

