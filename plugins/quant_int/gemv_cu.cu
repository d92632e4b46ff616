// GEMV of 1-4 x rows over q4_g64 / q5_g64 / q6_g64 / q8_g32 weights (layout kb128-v1, formats.py) and NVFP4
// (quant_nvfp4's "g16-split8-f16" layout), in CUDA C++.
//
// Why a CUDA kernel beside the Triton K-walk (gemv_kw.py): on the H200 the K-walk moves q4
// gate+up at 69% of the copy rate and the q5 matrices at 55-60% while issuing only ~40% of the
// instructions the SMs could (BENCHMARKS.md, thirty-fourth run): it waits on memory, with too few
// bytes in flight. Here each warp owns R rows and each lane streams whole 16-byte vectors of them,
// U vectors a row ahead, with no split-K across CTAs: one cross-lane sum a row at the end (with KS
// warps sharing a row group, one shared-memory sum and one barrier too). The occupancy (registers
// only) sets the bytes in flight.
//
// x comes as the K-walk's prepared f16x2 pairs (gemv_kw.xpairs: per word column the pairs A, B,
// C, D scaled by a power of two a K block, 1/scale in INVM), read through L1: a lane's four pair
// vectors cover its weight vector's 32 elements.
//
// Decode (per 32-bit word w of codes: byte b holds element 4i+b of the word's low group in its low
// nibble and of the high group in its high nibble): magic-number fp16, one LOP3 a pair of codes.
//   q4: A = (w & 0x000F000F) ^ 0x64086408 = 1032 + code (nibble ^ 8 is code + 8), so A - 1032;
//       B = (w & 0x00F000F0) ^ 0x64806480 = 1152 + 16 code; C, D the same from w >> 8.
//   q5: bit 4 of each code (qhigh) inverted into the pair (code + 16 is the offset-binary u5):
//       A = 1024 + u5, B = 1024 + 16 u5 (from w), C = 1024 + 2 u5, D = 1024 + 32 u5 (from w >> 7);
//       that C, D leave 2x and 32x the code is why the pairs carry 0.5 and 1/32 (gemv_h2.X_FACTORS).
// A lane's 32 q5 high bits (two 16-bit runs of qhigh) are permuted once a vector into Q so that
// one rotation a word puts that word's eight bits where its four pairs need them.
// q6: a vector's two bits a code come as two 32-bit words of qhigh (HL: its 16 low-group elements,
// HH: its 16 high-group ones, 2 bits an element in order); word i's byte of each goes under its
// pairs by one multiply (two shifted copies that cannot overlap), a mask, and the sign bit flipped:
//   A = ((w & 0x000F000F) | 0x64206420) ^ ((ul * (2^4 + 2^16)) & 0x00300030) = 1056 + code, and
//   B, C, D likewise (gemv_h2's q6 decode, here with the constants in registers).
// The products are summed in fp16 over a vector's 16 codes a group (x's scaling keeps them in
// range, as in gemv_h2), then scaled in fp32.
//
// NVFP4 (BITS 16): a 16-byte vector is two 16-element blocks (8 bytes each: byte j holds element j
// as "A", sign bit 7 and magnitude bits 1-3, and element 8 + j as "B", magnitude bits 4-6 and sign
// bit 0); words 0, 1 are block 2v's, words 2, 3 block 2v + 1's. Each code goes under an f16's sign,
// exponent and top mantissa bits by shifts and masks (gemv_h2._word_asm_nvfp4): its E2M1 value
// times 2^-14, exactly. The two E4M3 block scales (a 16-bit load) go under f16s the same way (value
// times 2^-8); the 2^22 and the row's fp32 global scale are applied once, at the store.

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ half2 h2(uint32_t u) {
  union { uint32_t u; half2 h; } c;
  c.u = u;
  return c.h;
}

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t rotl(uint32_t x, int r) { return __funnelshift_l(x, x, r); }

// Programmatic dependent launch (sm_90+; before that a launch never overlaps the previous one).
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// The wait, then (a late launch: launch.late_dependents, PDL = 2) the trigger: the next kernel is
// scheduled only once this one has waited, i.e. once every kernel before it has completed, so
// that it may read before its own wait what those wrote (the GDN decode step's state).
__device__ __forceinline__ void pdl_wait_then(bool late) {
  pdl_wait();
  if (late) pdl_trigger();
}

// x's pairs and scalings: written by the previous launch, possibly while this grid was already
// resident (PDL), so plain coherent loads (L1-cached), not the read-only path
__device__ __forceinline__ uint4 ld_x(const uint4* p) { return __ldca(p); }
__device__ __forceinline__ float ld_x(const float* p) { return __ldca(p); }

// One LOP3 with both constants in registers: nvcc splits (a & K1) ^ K2 into two (one immediate
// an instruction), which was 8 of a q4 word's ~17 instructions (sm_90 SASS).
template <int LUT>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
  return d;
}
// truth tables over (a, b, c) = (0xF0, 0xCC, 0xAA)
constexpr int AND_XOR = 0x6A;     // (a & b) ^ c
constexpr int AND_OR = 0xEA;      // (a & b) | c
constexpr int ANDNOT_OR = 0xAE;   // (~a & b) | c

// the decode's constants as register operands (see lop3)
struct Masks {
  uint32_t lo, hi, lo_x, hi_x, c5, d5, b4lo, b4hi, b4c, b4d, magic, sign, m6ac, m6bd, g6ac, g6bd;
};

__device__ __forceinline__ Masks masks() {
  Masks k;
  // volatile reads keep them in registers: folded back into immediates, each LOP3 splits again
  asm volatile("mov.b32 %0, 0x000F000F;" : "=r"(k.lo));
  asm volatile("mov.b32 %0, 0x00F000F0;" : "=r"(k.hi));
  asm volatile("mov.b32 %0, 0x64086408;" : "=r"(k.lo_x));
  asm volatile("mov.b32 %0, 0x64806480;" : "=r"(k.hi_x));
  asm volatile("mov.b32 %0, 0x001E001E;" : "=r"(k.c5));
  asm volatile("mov.b32 %0, 0x01E001E0;" : "=r"(k.d5));
  asm volatile("mov.b32 %0, 0x00100010;" : "=r"(k.b4lo));
  asm volatile("mov.b32 %0, 0x01000100;" : "=r"(k.b4hi));
  asm volatile("mov.b32 %0, 0x00200020;" : "=r"(k.b4c));
  asm volatile("mov.b32 %0, 0x02000200;" : "=r"(k.b4d));
  asm volatile("mov.b32 %0, 0x64006400;" : "=r"(k.magic));
  asm volatile("mov.b32 %0, 0x80008000;" : "=r"(k.sign));
  asm volatile("mov.b32 %0, 0x00300030;" : "=r"(k.m6ac));
  asm volatile("mov.b32 %0, 0x03000300;" : "=r"(k.m6bd));
  asm volatile("mov.b32 %0, 0x64206420;" : "=r"(k.g6ac));
  asm volatile("mov.b32 %0, 0x66006600;" : "=r"(k.g6bd));
  return k;
}

// src = lo16 | hi16 << 16 (bit i: bit 4 of element i of the vector's low / high 16-element run)
// -> Q, where rotr(Q, {0, 2, 8, 10}[w]) holds word w's bits at 4, 20 (A), 5, 21 (C), 8, 24 (B),
// 9, 25 (D). Seven masked rotations (the tests emulate this and check every bit).
__device__ __forceinline__ uint32_t q5_bits(uint32_t src) {
  uint32_t q = rotl(src & 0xC0C00303u, 4);
  q |= rotl(src & 0x00003030u, 2);
  q |= rotl(src & 0x00000C0Cu, 18);
  q |= rotl(src & 0x0000C0C0u, 16);
  q |= rotl(src & 0x03030000u, 24);
  q |= rotl(src & 0x30300000u, 22);
  q |= rotl(src & 0x0C0C0000u, 6);
  return q;
}

// q5: a vector's 32 high bits, lo16 | hi16 << 16, from its two 16-bit runs of qhigh (p: the low
// group's run; the high group's is 4 runs on)
__device__ __forceinline__ uint32_t q5_high(const uint16_t* p) {
  return (uint32_t)__ldg(p) | ((uint32_t)__ldg(p + 4) << 16);
}

// q5: word i's rotation of the permuted bits Q (q5_bits)
__device__ __forceinline__ uint32_t q5_word_bits(uint32_t Q, int i) {
  return i == 0 ? Q : __funnelshift_r(Q, Q, i == 1 ? 2 : i == 2 ? 8 : 10);
}

// BITS 21: q5 whose high bits come as prepared words (gemv_cu.q5_words: one 32-bit word a vector,
// q5_bits already applied at load), so a vector's high bits are one 32-bit load and no permutation
__host__ __device__ constexpr bool is_q5(int bits) { return bits == 5 || bits == 21; }

// The magic-number offsets the decode subtracts, pair by pair (A, B, C, D): q4 1024 + 8 and
// 1024 + 16 x 8; q5 1024 + 16, 1024 + 16 x 16, 1024 + 2 x 16, 1024 + 32 x 16.
template <int BITS>
__device__ __forceinline__ float pair_offset(int pair) {
  return BITS == 4 ? (pair & 1 ? 1152.f : 1032.f) : (pair == 0 ? 1040.f : pair == 1 ? 1280.f : pair == 2 ? 1056.f : 1536.f);
}

// A word's four pairs of codes as the magic-number decode leaves them, each offset + code x its
// factor (see the top: A and C the low group's, B and D the high's), exact in f16.
template <int BITS>
__device__ __forceinline__ void decode_word_raw(uint32_t w, uint32_t s, const Masks& k, half2& a, half2& b, half2& c,
                                                half2& d) {
  if (BITS == 4) {
    const uint32_t w8 = w >> 8;
    a = h2(lop3<AND_XOR>(w, k.lo, k.lo_x));
    b = h2(lop3<AND_XOR>(w, k.hi, k.hi_x));
    c = h2(lop3<AND_XOR>(w8, k.lo, k.lo_x));
    d = h2(lop3<AND_XOR>(w8, k.hi, k.hi_x));
  } else {
    const uint32_t w7 = w >> 7;
    a = h2(lop3<AND_OR>(w, k.lo, lop3<ANDNOT_OR>(s, k.b4lo, k.magic)));
    b = h2(lop3<AND_OR>(w, k.hi, lop3<ANDNOT_OR>(s, k.b4hi, k.magic)));
    c = h2(lop3<AND_OR>(w7, k.c5, lop3<ANDNOT_OR>(s, k.b4c, k.magic)));
    d = h2(lop3<AND_OR>(w7, k.d5, lop3<ANDNOT_OR>(s, k.b4d, k.magic)));
  }
}

// A word's four pairs of decoded codes (the raw pairs less their offsets).
template <int BITS>
__device__ __forceinline__ void decode_word(uint32_t w, uint32_t s, const Masks& k, half2& a, half2& b, half2& c,
                                            half2& d) {
  decode_word_raw<BITS>(w, s, k, a, b, c, d);
  a = __hsub2(a, __float2half2_rn(pair_offset<BITS>(0)));
  b = __hsub2(b, __float2half2_rn(pair_offset<BITS>(1)));
  c = __hsub2(c, __float2half2_rn(pair_offset<BITS>(2)));
  d = __hsub2(d, __float2half2_rn(pair_offset<BITS>(3)));
}

// q6: word i's pairs from its codes' low nibbles (w) and the bytes i of HL and HH (two bits a code)
__device__ __forceinline__ void decode_word_q6(uint32_t w, uint32_t hl, uint32_t hh, int i, const Masks& k, half2& a,
                                               half2& b, half2& c, half2& d) {
  const uint32_t ul = __byte_perm(hl, 0u, 0x4440u | (uint32_t)i), uh = __byte_perm(hh, 0u, 0x4440u | (uint32_t)i);
  const uint32_t w8 = w >> 8;
  const half2 c_ac = __float2half2_rn(1056.f), c_bd = __float2half2_rn(1536.f);
  a = __hsub2(h2(lop3<AND_XOR>(ul * 0x00010010u, k.m6ac, lop3<AND_OR>(w, k.lo, k.g6ac))), c_ac);
  b = __hsub2(h2(lop3<AND_XOR>(uh * 0x00100100u, k.m6bd, lop3<AND_OR>(w, k.hi, k.g6bd))), c_bd);
  c = __hsub2(h2(lop3<AND_XOR>(ul * 0x00004004u, k.m6ac, lop3<AND_OR>(w8, k.lo, k.g6ac))), c_ac);
  d = __hsub2(h2(lop3<AND_XOR>(uh * 0x00040040u, k.m6bd, lop3<AND_OR>(w8, k.hi, k.g6bd))), c_bd);
}

// q8: a word's four codes (bytes, natural order) as the pairs A = (byte 0, byte 2) and C = (1, 3):
// PRMT puts 0x64 above each offset-binary byte, 1024 + code + 128.
__device__ __forceinline__ void decode_word_q8(uint32_t w, half2& a, half2& c) {
  const uint32_t t = w ^ 0x80808080u;
  const half2 off = __float2half2_rn(1152.f);
  a = __hsub2(h2(__byte_perm(t, 0x64646464u, 0x4240)), off);
  c = __hsub2(h2(__byte_perm(t, 0x64646464u, 0x4341)), off);
}

// NVFP4: a word's eight codes as the f16 pairs A (bytes 0, 2: element j), B (their element 8 + j),
// C (bytes 1, 3: element j), D (their element 8 + j), each the E2M1 value times 2^-14. B of bytes
// 0 and 2 takes one multiply by 2^5 + 2^15 (magnitude up 5, sign up 15); its cross terms land on
// bits the mask drops (bit 21's overlap carries only into bit 22).
__device__ __forceinline__ void decode_word_fp4(uint32_t w, uint32_t sign_mask, half2& a, half2& b, half2& c,
                                                half2& d) {
  a = h2((w << 8) & 0x8E008E00u);
  c = h2(w & 0x8E008E00u);
  b = h2(((w & 0x00710071u) * 0x00008020u) & 0x8E008E00u);
  d = h2(lop3<AND_OR>(w << 7, sign_mask, (w >> 3) & 0x0E000E00u));
}

// NVFP4: the 16-bit load of a vector's two E4M3 block scales -> their values times 2^-8 (each
// scale's bits under an f16's: sign on 15, exponent and mantissa on 7-13), block 2v first.
__device__ __forceinline__ uint32_t fp4_scale_bits(uint32_t sb) {
  const uint32_t lo = ((sb & 0x7Fu) << 7) | ((sb & 0x80u) << 8);
  const uint32_t hi = ((sb & 0x7F00u) << 15) | ((sb & 0x8000u) << 16);
  return lo | hi;
}
__device__ __forceinline__ float2 fp4_scales(uint32_t sb) { return __half22float2(h2(fp4_scale_bits(sb))); }

__device__ __forceinline__ uint32_t part(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// One row's vector: its 32 codes decoded once, against each of M x rows' pairs (x[m * 4 + part]),
// scaled per group, added to acc[m].
template <int BITS, int M>
__device__ __forceinline__ void dot_vector(uint4 q, uint32_t hbits, uint32_t hbits2, uint32_t scales, const uint4 (&x)[M * 4],
                                           const float (&inv)[M], const Masks& k, float (&acc)[M]) {
  half2 lo[M], hi[M];
#pragma unroll
  for (int m = 0; m < M; ++m) lo[m] = hi[m] = __float2half2_rn(0.f);
  if (BITS == 8) {
    // 16 codes of one group of 32 (scales: its fp16 in the low half of `scales`)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      half2 a, c;
      decode_word_q8(part(q, i), a, c);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        lo[m] = __hfma2(a, h2(part(x[m * 4 + 0], i)), lo[m]);
        lo[m] = __hfma2(c, h2(part(x[m * 4 + 2], i)), lo[m]);
      }
    }
    const float s8 = __half2float(__low2half(h2(scales)));
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float2 sl = __half22float2(lo[m]);
      acc[m] = fmaf((sl.x + sl.y) * s8, inv[m], acc[m]);
    }
    return;
  }
  if (BITS == 16) {
    // words 0, 1: block 2v (lo); words 2, 3: block 2v + 1 (hi)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      half2 a, b, c, d;
      decode_word_fp4(part(q, i), k.sign, a, b, c, d);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        half2& t = i < 2 ? lo[m] : hi[m];
        t = __hfma2(a, h2(part(x[m * 4 + 0], i)), t);
        t = __hfma2(b, h2(part(x[m * 4 + 1], i)), t);
        t = __hfma2(c, h2(part(x[m * 4 + 2], i)), t);
        t = __hfma2(d, h2(part(x[m * 4 + 3], i)), t);
      }
    }
    const float2 sc = fp4_scales(scales);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float2 sl = __half22float2(lo[m]), sh = __half22float2(hi[m]);
      acc[m] = fmaf(fmaf(sl.x + sl.y, sc.x, (sh.x + sh.y) * sc.y), inv[m], acc[m]);
    }
    return;
  }
  const uint32_t Q = BITS == 5 ? q5_bits(hbits) : BITS == 21 ? hbits : 0u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t S = is_q5(BITS) ? q5_word_bits(Q, i) : 0u;
    half2 a, b, c, d;
    if (BITS == 6)
      decode_word_q6(part(q, i), hbits, hbits2, i, k, a, b, c, d);
    else
      decode_word<BITS>(part(q, i), S, k, a, b, c, d);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      lo[m] = __hfma2(a, h2(part(x[m * 4 + 0], i)), lo[m]);
      hi[m] = __hfma2(b, h2(part(x[m * 4 + 1], i)), hi[m]);
      lo[m] = __hfma2(c, h2(part(x[m * 4 + 2], i)), lo[m]);
      hi[m] = __hfma2(d, h2(part(x[m * 4 + 3], i)), hi[m]);
    }
  }
  const float2 sc = __half22float2(h2(scales));
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float2 sl = __half22float2(lo[m]), sh = __half22float2(hi[m]);
    acc[m] = fmaf(fmaf(sl.x + sl.y, sc.x, (sh.x + sh.y) * sc.y), inv[m], acc[m]);
  }
}

// Grid: one warp per R rows (rows padded to a multiple of R * warps a CTA: prepare_int pads to 256).
// qw: [rows, V] 16-byte vectors (V = Kp / 32; q8 Kp / 16); sc: [rows, V / 4] fp16 pairs (groups 2kb, 2kb + 1);
// qh (q5): [rows, 2 V] 16-bit runs (8 a K block: the low group's four, then the high group's);
// qh (q5 words, BITS 21): [rows, V] 32-bit words, one a vector (gemv_cu.q5_words);
// xp: per x row m the four pair parts, [4 rows][4 parts][V] vectors (gemv_kw.x_scratch);
// invm: [4 rows][V / 4] fp32; y: [M, n] bf16.
// KS > 1: KS warps share a row group, each walking every KS-th trip of 32 vectors; their sums
// meet in shared memory (more loads in flight for matrices of few rows and long K: down, o_proj).
// PF = 1: the next trip's loads are issued before this trip's decode (two register sets in turn),
// so a warp keeps a trip's bytes in flight while it computes, not only while it waits.
// NVFP4: sc: [rows, V] 16-bit pairs of E4M3 block scales; g: [rows] fp32 global scales (else unused).

// One trip's loads: U vectors of each of R rows, their scales and (q5/q6) high bits.
template <int R, int U>
struct Trip {
  uint4 q[U][R];
  uint32_t s[U][R], hb[U][R], hb2[U][R];
};

// Where a lane's next trip comes from (advanced a trip at a time: per-load 64-bit index math
// was a fifth of the unrolled loops' instructions).
struct TripPtrs {
  const uint4* qp;
  const uint32_t* sp;
  const uint16_t* sp8;
  const uint16_t* spf;
  const uint16_t* hp;
  const uint32_t* hp6;
  const uint32_t* hw;
};

template <int BITS, int R, int U, int KS>
__device__ __forceinline__ void load_trip(Trip<R, U>& T, TripPtrs& P, int v0, int V, int s_per_row) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u == 0 || v0 + 32 * u < V) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        T.q[u][r] = ld_stream(P.qp + r * V + 32 * u);
        T.s[u][r] = BITS == 16  ? (uint32_t)__ldg(P.spf + r * s_per_row + 32 * u)
                    : BITS == 8 ? (uint32_t)__ldg(P.sp8 + r * s_per_row + 16 * u)
                                : __ldg(P.sp + r * s_per_row + 8 * u);
        T.hb[u][r] = BITS == 5    ? q5_high(P.hp + r * 2 * V + 64 * u)
                     : BITS == 6  ? __ldg(P.hp6 + r * 2 * V + 64 * u)
                     : BITS == 21 ? __ldg(P.hw + r * V + 32 * u)
                                  : 0u;
        T.hb2[u][r] = BITS == 6 ? __ldg(P.hp6 + r * 2 * V + 64 * u + 4) : 0u;
      }
    }
  }
  P.qp += 32 * U * KS;
  P.sp += 8 * U * KS;
  P.sp8 += 16 * U * KS;
  P.spf += 32 * U * KS;
  P.hp += 64 * U * KS;
  P.hp6 += 64 * U * KS;
  P.hw += 32 * U * KS;
}

// One trip's products: x's pairs for its vectors (read here: the previous launch wrote them),
// each row's vectors decoded against them into acc.
template <int BITS, int M, int R, int U, int KS>
__device__ __forceinline__ void compute_trip(const Trip<R, U>& T, const uint4*& xq, const float*& ip, int v0, int V,
                                             int nkb, const Masks& k, float (&acc)[R][M]) {
  constexpr int VPB = BITS == 8 ? 8 : 4;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u == 0 || v0 + 32 * u < V) {
      uint4 x[M * 4];
      float inv[M];
#pragma unroll
      for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int p = 0; p < 4; ++p)
          // q8 reads the pairs A and C only
          x[m * 4 + p] = (BITS == 8 && (p & 1)) ? make_uint4(0, 0, 0, 0) : ld_x(xq + (m * 4 + p) * V + 32 * u);
        inv[m] = ld_x(ip + m * nkb + (32 / VPB) * u);
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
        dot_vector<BITS, M>(T.q[u][r], T.hb[u][r], T.hb2[u][r], T.s[u][r], x, inv, k, acc[r]);
    }
  }
  xq += 32 * U * KS;
  ip += (32 / VPB) * U * KS;
}

template <int BITS, int M, int R, int U, int KS, int PF>
__global__ void __launch_bounds__(256) gemv(const uint4* __restrict__ qw, const uint16_t* __restrict__ qh,
                                            const void* __restrict__ sc, const float* __restrict__ g,
                                            const uint4* __restrict__ xp,
                                            const float* __restrict__ invm, __nv_bfloat16* __restrict__ y, int n,
                                            int V, bool late) {
  // q4/q5: 4 vectors a K block of 128, one fp16 pair of scales (groups 2kb, 2kb + 1) a block;
  // q8: 8 vectors a block, one fp16 scale a group of 32 (2 vectors)
  constexpr int VPB = BITS == 8 ? 8 : 4;
  constexpr int STEP = 32 * U * KS;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int slice = KS > 1 ? warp % KS : 0;
  const int group = KS > 1 ? warp / KS : warp;
  const int row0 = (blockIdx.x * ((blockDim.x >> 5) / KS) + group) * R;
  // under programmatic dependent launch the next kernel may start now (it waits for this one),
  // or after this one's wait when launched late
  if (!late) pdl_trigger();
  if (KS == 1 && row0 >= n) {
    pdl_wait_then(late);
    return;
  }
  // with KS > 1 every warp reaches the barrier below; a group past n walks nothing
  const int v_start = lane + 32 * U * slice;  // slice j walks trips j, j + KS, ... of U x 32 vectors
  const int v_end = row0 < n ? V : 0;
  // q8's scales are read as 16-bit values, NVFP4's as 16-bit pairs of bytes, the others' as pairs
  const int s_per_row = BITS == 16 ? V : BITS == 8 ? (V >> 1) : (V >> 2);
  const uint16_t* s16 = (const uint16_t*)sc + (size_t)row0 * s_per_row;
  const int nkb = V / VPB;
  const Masks k = masks();
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
  // a lane with no vector skips the loop, and its wait in it; it may still store outputs
  if (v_start >= v_end) pdl_wait_then(late);
  // pointers at this lane's first vector
  TripPtrs P;
  P.qp = qw + (size_t)row0 * V + v_start;
  P.sp = (const uint32_t*)sc + (size_t)row0 * s_per_row + (v_start >> 2);
  P.sp8 = s16 + (v_start >> 1);
  P.spf = s16 + v_start;
  P.hp = qh + (size_t)row0 * (V << 1) + ((v_start >> 2) << 3) + (lane & 3);
  // q6: qhigh [rows, 2 V] 32-bit words (8 a K block: the low group's four, then the high group's)
  P.hp6 = (const uint32_t*)qh + (size_t)row0 * (V << 1) + ((v_start >> 2) << 3) + (lane & 3);
  P.hw = (const uint32_t*)qh + (size_t)row0 * V + v_start;
  const uint4* xq = xp + v_start;
  const float* ip = invm + v_start / VPB;
  if (PF == 0) {
    Trip<R, U> A;
    bool first = true;
    for (int v0 = v_start; v0 < v_end; v0 += STEP) {
      load_trip<BITS, R, U, KS>(A, P, v0, V, s_per_row);
      if (first) {
        // x is the previous launch's output: the first trip's weights load before the wait for it
        // (a no-op without programmatic dependent launch)
        pdl_wait_then(late);
        first = false;
      }
      compute_trip<BITS, M, R, U, KS>(A, xq, ip, v0, V, nkb, k, acc);
    }
  } else if (v_start < v_end) {
    // two register sets in turn: the next trip loads while this one is decoded
    Trip<R, U> A, B;
    load_trip<BITS, R, U, KS>(A, P, v_start, V, s_per_row);
    pdl_wait_then(late);
    for (int v0 = v_start;;) {
      if (v0 + STEP < v_end) load_trip<BITS, R, U, KS>(B, P, v0 + STEP, V, s_per_row);
      compute_trip<BITS, M, R, U, KS>(A, xq, ip, v0, V, nkb, k, acc);
      v0 += STEP;
      if (v0 >= v_end) break;
      if (v0 + STEP < v_end) load_trip<BITS, R, U, KS>(A, P, v0 + STEP, V, s_per_row);
      compute_trip<BITS, M, R, U, KS>(B, xq, ip, v0, V, nkb, k, acc);
      v0 += STEP;
      if (v0 >= v_end) break;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
  if (KS > 1) {
    // slices 1.. hand their sums to slice 0 of their group
    __shared__ float part_sums[8][R * M];
    if (slice > 0 && lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) part_sums[warp][r * M + m] = acc[r][m];
    }
    __syncthreads();
    if (slice > 0 || row0 >= n) return;
#pragma unroll
    for (int j = 1; j < KS; ++j)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m) acc[r][m] += part_sums[warp + j][r * M + m];
  }
  // lane r * M + m stores row r's output for x row m
  if (lane < R * M) {
    float out = 0.f;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < M; ++m)
        if (lane == r * M + m) out = acc[r][m];
    const int r = lane / M, m = lane - (lane / M) * M;
    // NVFP4: the codes' 2^-14 and the block scales' 2^-8 undone, times the row's global scale
    if (BITS == 16 && row0 + r < n) out *= __ldg(g + row0 + r) * 4194304.f;
    if (row0 + r < n) y[(size_t)m * n + row0 + r] = __float2bfloat16(out);
  }
}

typedef void (*Kernel)(const uint4*, const uint16_t*, const void*, const float*, const uint4*, const float*,
                       __nv_bfloat16*, int, int, bool);

template <int BITS>
Kernel pick(int m, int r, int u, int ks, int pf) {
#define NINFER_CASE(M_, R_, U_, KS_) \
  if (m == M_ && r == R_ && u == U_ && ks == KS_ && pf == 0) return gemv<BITS, M_, R_, U_, KS_, 0>;
  NINFER_CASE(1, 1, 1, 1) NINFER_CASE(1, 1, 2, 1) NINFER_CASE(1, 1, 4, 1) NINFER_CASE(1, 2, 1, 1) NINFER_CASE(1, 2, 2, 1)
  NINFER_CASE(1, 2, 4, 1) NINFER_CASE(1, 4, 1, 1) NINFER_CASE(1, 4, 2, 1) NINFER_CASE(1, 8, 1, 1)
  NINFER_CASE(1, 1, 2, 2) NINFER_CASE(1, 2, 1, 2) NINFER_CASE(1, 2, 2, 2) NINFER_CASE(1, 4, 1, 2) NINFER_CASE(1, 2, 1, 4)
  NINFER_CASE(2, 1, 1, 1) NINFER_CASE(2, 2, 1, 1) NINFER_CASE(2, 2, 2, 1) NINFER_CASE(2, 4, 1, 1)
  NINFER_CASE(3, 1, 1, 1) NINFER_CASE(3, 2, 1, 1) NINFER_CASE(3, 2, 2, 1) NINFER_CASE(3, 4, 1, 1)
  NINFER_CASE(4, 1, 1, 1) NINFER_CASE(4, 2, 1, 1) NINFER_CASE(4, 2, 2, 1) NINFER_CASE(4, 4, 1, 1)
  NINFER_CASE(4, 2, 1, 2) NINFER_CASE(4, 1, 1, 2)
#undef NINFER_CASE
  // the pipelined walk (PF 1), for the configs that won without it (gemv_cu.BUILT_PF)
#define NINFER_PF(M_, R_, U_, KS_) \
  if (m == M_ && r == R_ && u == U_ && ks == KS_ && pf == 1) return gemv<BITS, M_, R_, U_, KS_, 1>;
  NINFER_PF(1, 1, 1, 1) NINFER_PF(1, 2, 1, 1) NINFER_PF(1, 4, 1, 1) NINFER_PF(1, 2, 2, 1) NINFER_PF(1, 2, 1, 2)
  NINFER_PF(1, 2, 1, 4) NINFER_PF(1, 4, 1, 2) NINFER_PF(4, 1, 1, 1) NINFER_PF(4, 2, 1, 1) NINFER_PF(4, 2, 1, 2)
  NINFER_PF(4, 1, 1, 2)
#undef NINFER_PF
  return nullptr;
}


// --- the tensor-core form, for the verify's 2-4 x rows (q4/q5/NVFP4) --------------------------------
//
// The CUDA-core kernel above pays one HFMA2 a pair of weights and x row, so at four x rows it is
// issue-bound (4.9 SASS instructions a q4 weight against 2.4 at one row). Here the products are
// mma.sync m16n8k16 (weights as A, 16 rows x 16 k; x as B, 16 k x 8 columns of which M are x
// rows), so any M <= 4 costs the same instructions. The K order inside an MMA is free when x uses
// the same relabelling (gemv_tc's trick): lane (g, t) = (lane / 4, lane % 4) of a warp owning 16
// rows loads vector t of K block kb of rows g and g + 8; word j's decoded pairs are its A
// fragments for two k-steps: (pa, pc) of group 2kb and (pb, pd) of group 2kb + 1. Its B fragments
// are then exactly the K-walk's x pairs of x row g, word column 4 (4 kb + t) + j: parts A, C for
// the first k-step, B, D for the second. Each K block's two groups accumulate apart (a fresh fp32
// accumulator each), then are scaled by their row's group scales and x's per-block 1/scale in fp32.
// NVFP4 (BITS 16): one MMA's 16 k come from four lanes' vectors, that is four scale blocks, so each
// decoded pair is multiplied by its row's block scale before the MMA (one HMUL2 a pair). Exact in
// f16: a code decodes to its E2M1 value v times 2^-14 and the scale to its E4M3 value s (the
// fp4_scales bits times 256); v * s is a multiple of 2^-10 of at most 6 significant bits and at most
// 2688, so v * s * 2^-14 is a multiple of 2^-24 (f16's subnormal step) below 0.17. The 2^14 and the
// row's global scale are applied at the store.
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t u32(half2 h) {
  union { half2 h; uint32_t u; } c;
  c.h = h;
  return c.u;
}

// An NVFP4 vector's two block scales as f16 E4M3 values (block 2v low): fp4_scales' bits times 2^8.
__device__ __forceinline__ half2 fp4_scales_h2(uint32_t sb) {
  return __hmul2(h2(fp4_scale_bits(sb)), __float2half2_rn(256.f));
}

// One trip of the tensor-core form: U K blocks of rows g and g + 8 (vector t of each), their scale
// pairs (NVFP4: 16-bit pairs of block scales) and q5 high bits.
template <int U>
struct MmaTrip {
  uint4 q0[U], q1[U];
  uint32_t s0[U], s1[U], hb0[U], hb1[U];
};

struct MmaPtrs {
  const uint4 *qp0, *qp1;
  const uint32_t *sp0, *sp1;
  const uint16_t *fp0, *fp1, *hp0, *hp1;
  const uint32_t *wp0, *wp1;
};

// kend: the walk's end (the K blocks past it belong to another CTA's chunk, or to no one)
template <int BITS, int U, int KS>
__device__ __forceinline__ void load_mma_trip(MmaTrip<U>& T, MmaPtrs& P, int kb0, int kend) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u == 0 || kb0 + u < kend) {
      T.q0[u] = ld_stream(P.qp0 + 4 * u);
      T.q1[u] = ld_stream(P.qp1 + 4 * u);
      T.s0[u] = BITS == 16 ? (uint32_t)__ldg(P.fp0 + 4 * u) : __ldg(P.sp0 + u);
      T.s1[u] = BITS == 16 ? (uint32_t)__ldg(P.fp1 + 4 * u) : __ldg(P.sp1 + u);
      T.hb0[u] = BITS == 5 ? q5_high(P.hp0 + 8 * u) : BITS == 21 ? __ldg(P.wp0 + 4 * u) : 0u;
      T.hb1[u] = BITS == 5 ? q5_high(P.hp1 + 8 * u) : BITS == 21 ? __ldg(P.wp1 + 4 * u) : 0u;
    }
  }
  P.qp0 += 4 * U * KS;
  P.qp1 += 4 * U * KS;
  P.sp0 += U * KS;
  P.sp1 += U * KS;
  P.fp0 += 4 * U * KS;
  P.fp1 += 4 * U * KS;
  P.hp0 += 8 * U * KS;
  P.hp1 += 8 * U * KS;
  P.wp0 += 4 * U * KS;
  P.wp1 += 4 * U * KS;
}

template <int BITS, int U, int KS, int OFS>
__device__ __forceinline__ void compute_mma_trip(const MmaTrip<U>& T, const uint4*& xq0, const float*& ip0,
                                                 const float*& ip1, int kb0, int kend, int V, int m, bool x_row, int n0,
                                                 int n1, const Masks& k, float (&acc)[4]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (u == 0 || kb0 + u < kend) {
      uint4 xv[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) xv[p] = x_row ? ld_x(xq0 + p * V + 4 * u) : make_uint4(0, 0, 0, 0);
      const float i0 = n0 < m ? ld_x(ip0 + u) : 0.f;
      const float i1 = n1 < m ? ld_x(ip1 + u) : 0.f;
      const uint32_t Q0 = BITS == 5 ? q5_bits(T.hb0[u]) : BITS == 21 ? T.hb0[u] : 0u;
      const uint32_t Q1 = BITS == 5 ? q5_bits(T.hb1[u]) : BITS == 21 ? T.hb1[u] : 0u;
      float dlo[4] = {0.f, 0.f, 0.f, 0.f}, dhi[4] = {0.f, 0.f, 0.f, 0.f};
      // NVFP4: rows g and g + 8's block scales (words 0, 1: block 2v; 2, 3: block 2v + 1)
      const half2 f0 = BITS == 16 ? fp4_scales_h2(T.s0[u]) : __float2half2_rn(0.f);
      const half2 f1 = BITS == 16 ? fp4_scales_h2(T.s1[u]) : __float2half2_rn(0.f);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        half2 a0, b0, c0, d0, a1, b1, c1, d1;
        if constexpr (BITS == 16) {
          decode_word_fp4(part(T.q0[u], j), k.sign, a0, b0, c0, d0);
          decode_word_fp4(part(T.q1[u], j), k.sign, a1, b1, c1, d1);
          const half2 e0 = j < 2 ? __low2half2(f0) : __high2half2(f0);
          const half2 e1 = j < 2 ? __low2half2(f1) : __high2half2(f1);
          a0 = __hmul2(a0, e0), b0 = __hmul2(b0, e0), c0 = __hmul2(c0, e0), d0 = __hmul2(d0, e0);
          a1 = __hmul2(a1, e1), b1 = __hmul2(b1, e1), c1 = __hmul2(c1, e1), d1 = __hmul2(d1, e1);
        } else if constexpr (OFS == 1) {
          decode_word_raw<BITS>(part(T.q0[u], j), is_q5(BITS) ? q5_word_bits(Q0, j) : 0u, k, a0, b0, c0, d0);
          decode_word_raw<BITS>(part(T.q1[u], j), is_q5(BITS) ? q5_word_bits(Q1, j) : 0u, k, a1, b1, c1, d1);
          // the pairs keep their offsets: an MMA of the negated offsets against the same x takes
          // them out of the fp32 sums (the 16 rows' terms are alike)
          const uint32_t na = u32(__float2half2_rn(-pair_offset<BITS>(0))), nb = u32(__float2half2_rn(-pair_offset<BITS>(1)));
          const uint32_t nc = u32(__float2half2_rn(-pair_offset<BITS>(2))), nd = u32(__float2half2_rn(-pair_offset<BITS>(3)));
          mma16816(dlo, na, na, nc, nc, part(xv[0], j), part(xv[2], j));
          mma16816(dhi, nb, nb, nd, nd, part(xv[1], j), part(xv[3], j));
        } else {
          decode_word<BITS>(part(T.q0[u], j), is_q5(BITS) ? q5_word_bits(Q0, j) : 0u, k, a0, b0, c0, d0);
          decode_word<BITS>(part(T.q1[u], j), is_q5(BITS) ? q5_word_bits(Q1, j) : 0u, k, a1, b1, c1, d1);
        }
        mma16816(dlo, u32(a0), u32(a1), u32(c0), u32(c1), part(xv[0], j), part(xv[2], j));
        mma16816(dhi, u32(b0), u32(b1), u32(d0), u32(d1), part(xv[1], j), part(xv[3], j));
      }
      if constexpr (BITS == 16) {
        // the scales are in the products: the two halves' sums, by x's 1/scale
        acc[0] = fmaf(dlo[0] + dhi[0], i0, acc[0]);
        acc[1] = fmaf(dlo[1] + dhi[1], i1, acc[1]);
        acc[2] = fmaf(dlo[2] + dhi[2], i0, acc[2]);
        acc[3] = fmaf(dlo[3] + dhi[3], i1, acc[3]);
      } else {
        const float2 sg = __half22float2(h2(T.s0[u])), sg8 = __half22float2(h2(T.s1[u]));
        acc[0] = fmaf(fmaf(dlo[0], sg.x, dhi[0] * sg.y), i0, acc[0]);
        acc[1] = fmaf(fmaf(dlo[1], sg.x, dhi[1] * sg.y), i1, acc[1]);
        acc[2] = fmaf(fmaf(dlo[2], sg8.x, dhi[2] * sg8.y), i0, acc[2]);
        acc[3] = fmaf(fmaf(dlo[3], sg8.x, dhi[3] * sg8.y), i1, acc[3]);
      }
    }
  }
  xq0 += 4 * U * KS;
  ip0 += U * KS;
  ip1 += U * KS;
}

// rows padded to a multiple of 16 x warps a CTA / KS; m (1-4) x rows at run time. g: NVFP4's
// per-row global scales (BITS 16 only). PF = 1: the pipelined walk, as gemv's. OFS = 1 (q4/q5): the
// decode leaves each code's magic-number offset in its pair (no sub.f16x2: 32 of a K block's ~170
// instructions a lane) and one more MMA a word and half takes the offsets out in the fp32 sums
// (rounded against offset x sum(x), about 2^10 x: some 2e-5 of the output in a numpy model, far
// below bf16's half ulp; the subtracting form is exact).
// KC > 1: K is also split over KC CTAs a row group (blockIdx.y: chunk c of K blocks [c nkb / KC,
// (c + 1) nkb / KC)), for shapes with few row groups and a long K (q5 down, 5120 x 17408: 320 row
// groups, 2.4 CTAs an SM, so a third of the SMs carry a third more than the rest). Each chunk's
// slice-0 warps store their fp32 sums in ws [KC][groups][32 lanes][4] and count in on cnt[group];
// the last to arrive adds the KC sums in chunk order (the same bits whichever arrives last), stores
// y and sets the counter back to 0 for the next launch. ws and cnt are written only after the PDL
// wait, so a launch never meets the one before it there.
template <int BITS, int U, int KS, int PF, int OFS, int KC>
__global__ void __launch_bounds__(256) gemv_mma(const uint4* __restrict__ qw, const uint16_t* __restrict__ qh,
                                                const uint32_t* __restrict__ sc, const float* __restrict__ gsc,
                                                const uint4* __restrict__ xp, const float* __restrict__ invm,
                                                __nv_bfloat16* __restrict__ y, float* __restrict__ ws,
                                                int* __restrict__ cnt, int n, int V, int m, bool late) {
  constexpr int STEP = U * KS;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int slice = KS > 1 ? warp % KS : 0;
  const int group = KS > 1 ? warp / KS : warp;
  const int row0 = (blockIdx.x * ((blockDim.x >> 5) / KS) + group) * 16;
  const int g = lane >> 2, t = lane & 3;
  if (!late) pdl_trigger();
  if (KS == 1 && row0 >= n) {
    pdl_wait_then(late);
    return;
  }
  const int nkb = V >> 2;
  const int chunk = KC > 1 ? (int)blockIdx.y : 0;
  const int kend = KC > 1 ? ((chunk + 1) * nkb) / KC : nkb;  // this CTA's K blocks: [kc0, kend)
  const int kb_start = (KC > 1 ? (chunk * nkb) / KC : 0) + U * slice;
  const int kb_end = row0 < n ? kend : 0;
  const bool x_row = g < m;  // this lane's B column is x row g
  const int n0 = 2 * t, n1 = 2 * t + 1;  // this lane's accumulator columns
  const Masks k = masks();
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (kb_start >= kb_end) pdl_wait_then(late);
  // pointers at this lane's first block, advanced a trip at a time (no per-load index math)
  MmaPtrs P;
  P.qp0 = qw + (size_t)(row0 + g) * V + t + 4 * kb_start;
  P.qp1 = P.qp0 + (size_t)8 * V;
  P.sp0 = sc + (size_t)(row0 + g) * (V >> 2) + kb_start;
  P.sp1 = P.sp0 + (size_t)8 * (V >> 2);
  // NVFP4: a 16-bit pair of block scales a vector
  P.fp0 = (const uint16_t*)sc + (size_t)(row0 + g) * V + t + 4 * kb_start;
  P.fp1 = P.fp0 + (size_t)8 * V;
  P.hp0 = qh + (size_t)(row0 + g) * (V << 1) + t + 8 * kb_start;
  P.hp1 = P.hp0 + (size_t)8 * (V << 1);
  // q5 words (BITS 21): one 32-bit word a vector
  P.wp0 = (const uint32_t*)qh + (size_t)(row0 + g) * V + t + 4 * kb_start;
  P.wp1 = P.wp0 + (size_t)8 * V;
  const uint4* xq0 = xp + (size_t)(g * 4) * V + t + 4 * kb_start;
  const float* ip0 = invm + (n0 < m ? n0 : 0) * nkb + kb_start;
  const float* ip1 = invm + (n1 < m ? n1 : 0) * nkb + kb_start;
  if (PF == 0) {
    MmaTrip<U> A;
    bool first = true;
    for (int kb0 = kb_start; kb0 < kb_end; kb0 += STEP) {
      load_mma_trip<BITS, U, KS>(A, P, kb0, kend);
      if (first) {
        pdl_wait_then(late);
        first = false;
      }
      compute_mma_trip<BITS, U, KS, OFS>(A, xq0, ip0, ip1, kb0, kend, V, m, x_row, n0, n1, k, acc);
    }
  } else if (kb_start < kb_end) {
    // two register sets in turn: the next trip loads while this one is decoded
    MmaTrip<U> A, B;
    load_mma_trip<BITS, U, KS>(A, P, kb_start, kend);
    pdl_wait_then(late);
    for (int kb0 = kb_start;;) {
      if (kb0 + STEP < kb_end) load_mma_trip<BITS, U, KS>(B, P, kb0 + STEP, kend);
      compute_mma_trip<BITS, U, KS, OFS>(A, xq0, ip0, ip1, kb0, kend, V, m, x_row, n0, n1, k, acc);
      kb0 += STEP;
      if (kb0 >= kb_end) break;
      if (kb0 + STEP < kb_end) load_mma_trip<BITS, U, KS>(A, P, kb0 + STEP, kend);
      compute_mma_trip<BITS, U, KS, OFS>(B, xq0, ip0, ip1, kb0, kend, V, m, x_row, n0, n1, k, acc);
      kb0 += STEP;
      if (kb0 >= kb_end) break;
    }
  }
  if (KS > 1) {
    // slices 1.. hand their accumulators to slice 0 of their group
    __shared__ float part_sums[8][32][4];
    if (slice > 0) {
#pragma unroll
      for (int c = 0; c < 4; ++c) part_sums[warp][lane][c] = acc[c];
    }
    __syncthreads();
    if (slice > 0 || row0 >= n) return;
#pragma unroll
    for (int j = 1; j < KS; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[c] += part_sums[warp + j][lane][c];
  }
  if constexpr (KC > 1) {
    // this chunk's sums, then count in; the last chunk to arrive stores y (a group past n has
    // returned already: at the start for KS = 1, after the slices' sum otherwise)
    const int groups = gridDim.x * ((blockDim.x >> 5) / KS), gi = row0 >> 4;
    float* const mine = ws + ((size_t)chunk * groups + gi) * 128 + lane * 4;
    *reinterpret_cast<float4*>(mine) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    __threadfence();
    __syncwarp();
    int before = 0;
    if (lane == 0) {
      __threadfence();  // the warp's stores (ordered to lane 0 by the barrier) before the count
      before = atomicAdd(cnt + gi, 1);
    }
    before = __shfl_sync(0xffffffffu, before, 0);
    if (before != KC - 1) return;
    __threadfence();
    float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c2 = 0; c2 < KC; ++c2) {
      const float4 p = c2 == chunk ? make_float4(acc[0], acc[1], acc[2], acc[3])
                                   : __ldcg(reinterpret_cast<const float4*>(ws + ((size_t)c2 * groups + gi) * 128 + lane * 4));
      sum[0] += p.x, sum[1] += p.y, sum[2] += p.z, sum[3] += p.w;
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] = sum[c];
    if (lane == 0) cnt[gi] = 0;  // for the next launch (a graph replays the same counters)
  }
  // D[row g (+8)][column 2t (+1)]: column n is x row n's output
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int row = row0 + g + 8 * (c >> 1), col = 2 * t + (c & 1);
    // NVFP4: the codes' 2^-14 undone, times the row's global scale
    if (col < m && row < n)
      y[(size_t)col * n + row] = __float2bfloat16(BITS == 16 ? acc[c] * __ldg(gsc + row) * 16384.f : acc[c]);
  }
}

typedef void (*MmaKernel)(const uint4*, const uint16_t*, const uint32_t*, const float*, const uint4*, const float*,
                          __nv_bfloat16*, float*, int*, int, int, int, bool);

template <int BITS>
MmaKernel pick_mma(int u, int ks, int pf, int ofs, int kc) {
  // K split over CTAs too (gemv_cu.BUILT_MMA_KC: K blocks ahead, warps a row group, CTAs a row group)
#define NINFER_MMA_KC(U_, KS_, KC_) \
  if (u == U_ && ks == KS_ && kc == KC_ && pf == 0 && ofs == 0) return gemv_mma<BITS, U_, KS_, 0, 0, KC_>;
  NINFER_MMA_KC(1, 4, 2) NINFER_MMA_KC(1, 8, 2) NINFER_MMA_KC(2, 4, 2) NINFER_MMA_KC(2, 8, 2) NINFER_MMA_KC(1, 4, 4)
  NINFER_MMA_KC(1, 8, 4) NINFER_MMA_KC(2, 2, 2)
#undef NINFER_MMA_KC
  if (kc != 1) return nullptr;
#define NINFER_MMA(U_, KS_) \
  if (u == U_ && ks == KS_ && pf == 0 && ofs == 0) return gemv_mma<BITS, U_, KS_, 0, 0, 1>;
  NINFER_MMA(1, 1) NINFER_MMA(2, 1) NINFER_MMA(4, 1) NINFER_MMA(1, 2) NINFER_MMA(2, 2) NINFER_MMA(1, 4)
  NINFER_MMA(2, 4) NINFER_MMA(1, 8) NINFER_MMA(2, 8)
#undef NINFER_MMA
  // the pipelined walk (gemv_cu.BUILT_MMA_PF)
#define NINFER_MMA_PF(U_, KS_) \
  if (u == U_ && ks == KS_ && pf == 1 && ofs == 0) return gemv_mma<BITS, U_, KS_, 1, 0, 1>;
  NINFER_MMA_PF(1, 2) NINFER_MMA_PF(2, 2) NINFER_MMA_PF(1, 4) NINFER_MMA_PF(2, 4) NINFER_MMA_PF(1, 8) NINFER_MMA_PF(2, 8)
#undef NINFER_MMA_PF
  // the offsets taken out by an MMA (q4/q5; gemv_cu.BUILT_MMA_OFS), plain and pipelined
  if constexpr (BITS != 16) {
#define NINFER_MMA_OFS(U_, KS_, PF_) \
  if (u == U_ && ks == KS_ && pf == PF_ && ofs == 1) return gemv_mma<BITS, U_, KS_, PF_, 1, 1>;
    NINFER_MMA_OFS(1, 2, 0) NINFER_MMA_OFS(2, 2, 0) NINFER_MMA_OFS(1, 4, 0) NINFER_MMA_OFS(2, 4, 0) NINFER_MMA_OFS(1, 8, 0)
    NINFER_MMA_OFS(2, 8, 0) NINFER_MMA_OFS(2, 2, 1) NINFER_MMA_OFS(2, 4, 1) NINFER_MMA_OFS(1, 8, 1) NINFER_MMA_OFS(2, 8, 1)
#undef NINFER_MMA_OFS
  }
  return nullptr;
}

}  // namespace

// Loads every kernel of the library on `device` now (CUDA loads a kernel lazily at its first
// launch, which may otherwise fall inside a graph capture). Returns a cudaError_t.
extern "C" int ninfer_gemv_preload(int device) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
  const int ms[] = {1, 2, 3, 4}, rs[] = {1, 2, 4, 8}, us[] = {1, 2, 4}, kss[] = {1, 2, 4, 8};
  for (int m : ms)
    for (int r : rs)
      for (int u : us)
        for (int ks : kss) {
          for (int pf = 0; pf < 2; ++pf) {
            const Kernel ks_[] = {pick<4>(m, r, u, ks, pf), pick<5>(m, r, u, ks, pf), pick<6>(m, r, u, ks, pf),
                                  pick<8>(m, r, u, ks, pf), pick<16>(m, r, u, ks, pf), pick<21>(m, r, u, ks, pf)};
            for (Kernel k : ks_) {
              if (k == nullptr) continue;
              cudaFuncAttributes attr;
              e = cudaFuncGetAttributes(&attr, k);
              if (e != cudaSuccess) return (int)e;
            }
          }
        }
  const int kcs[] = {1, 2, 4};
  for (int u : us)
    for (int ks : kss)
      for (int kc : kcs)
        for (int pf = 0; pf < 2; ++pf)
          for (int ofs = 0; ofs < 2; ++ofs) {
            const MmaKernel mk[] = {pick_mma<4>(u, ks, pf, ofs, kc), pick_mma<5>(u, ks, pf, ofs, kc),
                                    pick_mma<16>(u, ks, pf, ofs, kc), pick_mma<21>(u, ks, pf, ofs, kc)};
            for (MmaKernel k : mk) {
              if (k == nullptr) continue;
              cudaFuncAttributes attr;
              e = cudaFuncGetAttributes(&attr, k);
              if (e != cudaSuccess) return (int)e;
            }
          }
  return 0;
}

// The launchers' shared part: this library's own (static) runtime keeps its own current device,
// made the stream's; a grid of one CTA per `per_cta` rows, with programmatic dependent launch
// when pdl (1: trigger at the start, 2: after the wait; the kernels read which).
struct Launch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
};

static cudaError_t prepare_launch(Launch& l, int device, int n, int per_cta, int warps, int pdl, void* stream,
                                  int chunks = 1) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) {
    const cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return e;
  }
  l.cfg.gridDim = dim3((n + per_cta - 1) / per_cta, chunks);
  l.cfg.blockDim = dim3(32 * warps);
  l.cfg.stream = (cudaStream_t)stream;
  l.attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  l.attr[0].val.programmaticStreamSerializationAllowed = 1;
  l.cfg.attrs = l.attr;
  l.cfg.numAttrs = pdl ? 1 : 0;
  return cudaSuccess;
}

// The tensor-core form (q4/q5/NVFP4, 1-4 x rows, 16 rows a warp; g: NVFP4's global scales; kc > 1: K
// split over kc CTAs a row group too, ws fp32 [kc][row groups][128] and cnt int32 [row groups], zeros,
// given back as zeros). Returns a cudaError_t; 1000 for a (bits, unroll, K split, ...) not built.
extern "C" int ninfer_gemv_mma(int bits, int m, int unroll, int ksplit, int pf, int ofs, int kc, int warps,
                               const void* qw, const void* qh, const void* sc, const void* g, const void* xp,
                               const void* invm, void* y, void* ws, void* cnt, int n, int V, int pdl, void* stream,
                               int device) {
  MmaKernel k = bits == 4    ? pick_mma<4>(unroll, ksplit, pf, ofs, kc)
                : bits == 5  ? pick_mma<5>(unroll, ksplit, pf, ofs, kc)
                : bits == 16 ? pick_mma<16>(unroll, ksplit, pf, ofs, kc)
                : bits == 21 ? pick_mma<21>(unroll, ksplit, pf, ofs, kc)
                             : nullptr;
  if (k == nullptr || warps < 1 || warps > 8 || warps % ksplit || m < 1 || m > 4) return 1000;
  if (kc > 1 && (ws == nullptr || cnt == nullptr)) return 1000;
  Launch l;
  const cudaError_t e = prepare_launch(l, device, n, 16 * (warps / ksplit), warps, pdl, stream, kc);
  if (e != cudaSuccess) return (int)e;
  return (int)cudaLaunchKernelEx(&l.cfg, k, (const uint4*)qw, (const uint16_t*)qh, (const uint32_t*)sc,
                                 (const float*)g, (const uint4*)xp, (const float*)invm, (__nv_bfloat16*)y, (float*)ws,
                                 (int*)cnt, n, V, m, pdl == 2);
}

// Returns a cudaError_t (0: launched); 1000 for a (bits, x rows, rows, unroll, K split, pipelined) not
// built. bits 21: q5 with its high bits as prepared words (qh: gemv_cu.q5_words).
extern "C" int ninfer_gemv(int bits, int m, int rows, int unroll, int ksplit, int pf, int warps, const void* qw,
                           const void* qh, const void* sc, const void* g, const void* xp, const void* invm, void* y,
                           int n, int V, int pdl, void* stream, int device) {
  Kernel k = bits == 4    ? pick<4>(m, rows, unroll, ksplit, pf)
             : bits == 5  ? pick<5>(m, rows, unroll, ksplit, pf)
             : bits == 6  ? pick<6>(m, rows, unroll, ksplit, pf)
             : bits == 8  ? pick<8>(m, rows, unroll, ksplit, pf)
             : bits == 16 ? pick<16>(m, rows, unroll, ksplit, pf)
             : bits == 21 ? pick<21>(m, rows, unroll, ksplit, pf)
                          : nullptr;
  if (k == nullptr || warps < 1 || warps > 8 || warps % ksplit || rows * m > 32) return 1000;
  Launch l;
  const cudaError_t e = prepare_launch(l, device, n, rows * (warps / ksplit), warps, pdl, stream);
  if (e != cudaSuccess) return (int)e;
  return (int)cudaLaunchKernelEx(&l.cfg, k, (const uint4*)qw, (const uint16_t*)qh, sc, (const float*)g,
                                 (const uint4*)xp, (const float*)invm, (__nv_bfloat16*)y, n, V, pdl == 2);
}
