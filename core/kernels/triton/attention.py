"""Split-K ("flash-decoding") GQA attention for decode and short verify blocks.

Cache layout (both K and V, one tensor each per attention layer):
    cache  [num_blocks, block_size, num_kv_heads, head_dim]   bf16, or int8 codes
    scales [num_blocks, block_size, num_kv_heads, head_dim/64] fp16 (INT8-G64 only, spec §5)
    block_table [B, max_blocks] int32: block i of sequence b is cache[block_table[b, i]]
A paged pool uses 64-token blocks; the per-slot contiguous cache [slots, max_ctx, Hkv, D] is the
same layout with block_size = max_ctx and block_table = slots[:, None]. Only the head_dim stride
must be 1; the other strides are passed, so [num_blocks, Hkv, block_size, D] views work too.

One program reads one KV head's share of one sequence (a split) and scores all the q heads that
share it (GQA ratio x T query tokens as the rows of one tl.dot), so K and V cross the memory bus
once. Splits are sized on the device from seq_lens, and the grid depends only on shapes, so a
CUDA graph captured once serves every length up to the cache's capacity. A second kernel merges
the splits by their log-sum-exp and can apply the attention output gate, sigmoid(gate).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton.launch import interpreting, pdl_kwargs, pdl_prologue, sm_count

LOG2E = 1.4426950408889634
KV_GROUP = 64


@triton.jit
def _split_setup(LENS, num_splits, min_chunk,
                 HKV: tl.constexpr, T: tl.constexpr, GQA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's (sequence, KV head, split), its token range, and its q rows: row m is
    query token m // GQA of q head kh * GQA + m % GQA."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // HKV
    kh = pid % HKV
    seq_len = tl.load(LENS + b)
    # at least min_chunk tokens per split: a short sequence leaves the high splits empty, and
    # an empty split writes only its -inf log-sum-exp (the merge then skips its output row)
    chunk = tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N, min_chunk)
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    offs_m = tl.arange(0, BLOCK_M)
    t = offs_m // GQA
    h = kh * GQA + offs_m % GQA
    row_ok = offs_m < T * GQA
    qpos = seq_len - T + t  # each query's own position; it sees keys 0..qpos
    return b, kh, split, start, end, t, h, row_ok, qpos, row_ok & (offs_m * 0 + start < end)


@triton.jit
def _store_lse(LP, b, t, h, split, sl_b, sl_t, sl_h, m_i, l_i, row_ok):
    seen = l_i > 0
    tl.store(LP + b * sl_b + t * sl_t + h * sl_h + split,
             tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf")), mask=row_ok)


@triton.jit
def _online_softmax(s, m_i, l_i, keep):
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row can see no key of this block (verify rows, causal): keep exp2 away from inf - inf
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _store_partial(OP, o_rows, offs_c, acc, l_i, keep_rows):
    seen = l_i > 0
    tl.store(OP + o_rows[:, None] + offs_c[None, :], acc / tl.where(seen, l_i, 1.0)[:, None], mask=keep_rows[:, None])


@triton.jit
def _i8_to_f16(c, ASM: tl.constexpr):
    # int8 codes -> exact fp16. The cvt instruction converts 16 values per SM per clock, too
    # few to keep up with HBM (each cached token-head brings 512 codes); the byte-permute
    # form builds 0x64XX = 1024 + XX from the biased byte and subtracts 1152 = 1024 + 128,
    # four codes per three integer and two half2 instructions.
    if ASM:
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 u, lo, hi, k64, bias;
            xor.b32 u, $2, 0x80808080;
            mov.b32 k64, 0x64646464;
            mov.b32 bias, 0x64806480;
            prmt.b32 lo, u, k64, 0x4140;
            prmt.b32 hi, u, k64, 0x4342;
            sub.f16x2 $0, lo, bias;
            sub.f16x2 $1, hi, bias;
            }""",
            constraints="=r,=r,r",
            args=[c],
            dtype=tl.float16,
            is_pure=True,
            pack=4,
        )
    else:
        return c.to(tl.float16)


@triton.jit
def _decode_split_kernel(
    Q, K, V, BT, LENS, OP, LP,
    sq_b, sq_t, sq_h,
    sk_p, sk_t, sk_h,
    sv_p, sv_t, sv_h,
    sbt_b,
    so_b, so_t, so_h, so_s,
    sl_b, sl_t, sl_h,
    qk_scale,
    num_splits, min_chunk,
    HKV: tl.constexpr, T: tl.constexpr, GQA: tl.constexpr, D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_prologue(PDL)
    b, kh, split, start, end, t, h, row_ok, qpos, keep = _split_setup(LENS, num_splits, min_chunk, HKV, T, GQA,
                                                                        BLOCK_M, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * sq_b + t[:, None] * sq_t + h[:, None] * sq_h + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    q = q.to(tl.float32 if DOT_F32 else tl.bfloat16)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        page = tl.load(BT + b * sbt_b + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
        tok = offs_n % PAGE
        k = tl.load(K + (page * sk_p + tok * sk_t + kh * sk_h)[:, None] + offs_d[None, :], mask=n_ok[:, None], other=0)
        v = tl.load(V + (page * sv_p + tok * sv_t + kh * sv_h)[:, None] + offs_d[None, :], mask=n_ok[:, None], other=0)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, n_ok[None, :] & (offs_n[None, :] <= qpos[:, None]))
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)

    _store_partial(OP, b * so_b + t * so_t + h * so_h + split * so_s, offs_d, acc, l_i, keep)
    _store_lse(LP, b, t, h, split, sl_b, sl_t, sl_h, m_i, l_i, row_ok)


@triton.jit
def _decode_split_int8_kernel(
    Q, K, V, KS, VS, BT, LENS, OP, LP,
    sq_b, sq_t, sq_h,
    sk_p, sk_t, sk_h,
    sv_p, sv_t, sv_h,
    sks_p, sks_t, sks_h,
    svs_p, svs_t, svs_h,
    sbt_b,
    so_b, so_t, so_h, so_s,
    sl_b, sl_t, sl_h,
    qk_scale,
    num_splits, min_chunk,
    HKV: tl.constexpr, T: tl.constexpr, GQA: tl.constexpr, D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    GROUP: tl.constexpr, DOT_F32: tl.constexpr, DEQ_ASM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_prologue(PDL)
    # INT8-G64 without dequantizing a tile: per 64-dim group g, scores += (q_g . codes_g) * s_k[n, g]
    # and acc_g += (p * s_v[n, g]) @ codes_g, with the codes exact in fp16. Four groups (D <= 256)
    # are four accumulators, written out because Triton has no arrays of tensors.
    NG: tl.constexpr = D // GROUP
    DT: tl.constexpr = tl.float32 if DOT_F32 else tl.float16
    b, kh, split, start, end, t, h, row_ok, qpos, keep = _split_setup(LENS, num_splits, min_chunk, HKV, T, GQA,
                                                                        BLOCK_M, BLOCK_N)
    offs_g = tl.arange(0, GROUP)
    q_rows = Q + b * sq_b + t * sq_t + h * sq_h
    # fp16 operands: q after the (1+w) norm is far inside fp16's range, and codes are exact
    q0 = tl.load(q_rows[:, None] + offs_g[None, :], mask=row_ok[:, None], other=0.0).to(DT)
    q1 = q0
    q2 = q0
    q3 = q0
    if NG > 1:
        q1 = tl.load(q_rows[:, None] + GROUP + offs_g[None, :], mask=row_ok[:, None], other=0.0).to(DT)
    if NG > 2:
        q2 = tl.load(q_rows[:, None] + 2 * GROUP + offs_g[None, :], mask=row_ok[:, None], other=0.0).to(DT)
        q3 = tl.load(q_rows[:, None] + 3 * GROUP + offs_g[None, :], mask=row_ok[:, None], other=0.0).to(DT)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc0 = tl.zeros([BLOCK_M, GROUP], tl.float32)
    acc1 = tl.zeros([BLOCK_M, GROUP], tl.float32)
    acc2 = tl.zeros([BLOCK_M, GROUP], tl.float32)
    acc3 = tl.zeros([BLOCK_M, GROUP], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        page = tl.load(BT + b * sbt_b + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
        tok = offs_n % PAGE
        k_rows = K + page * sk_p + tok * sk_t + kh * sk_h
        v_rows = V + page * sv_p + tok * sv_t + kh * sv_h
        ks_rows = KS + page * sks_p + tok * sks_t + kh * sks_h
        vs_rows = VS + page * svs_p + tok * svs_t + kh * svs_h
        s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for g in tl.static_range(NG):
            kc = tl.load(k_rows[:, None] + g * GROUP + offs_g[None, :], mask=n_ok[:, None], other=0)
            ksc = tl.load(ks_rows + g, mask=n_ok, other=0.0).to(tl.float32)
            if g == 0:
                qg = q0
            elif g == 1:
                qg = q1
            elif g == 2:
                qg = q2
            else:
                qg = q3
            s += tl.dot(qg, tl.trans(_i8_to_f16(kc, DEQ_ASM).to(DT))) * ksc[None, :]
        p, alpha, m_i, l_i = _online_softmax(s * qk_scale, m_i, l_i, n_ok[None, :] & (offs_n[None, :] <= qpos[:, None]))
        for g in tl.static_range(NG):
            vc = _i8_to_f16(tl.load(v_rows[:, None] + g * GROUP + offs_g[None, :], mask=n_ok[:, None], other=0), DEQ_ASM)
            vsc = tl.load(vs_rows + g, mask=n_ok, other=0.0).to(tl.float32)
            pv = tl.dot((p * vsc[None, :]).to(DT), vc.to(DT))
            if g == 0:
                acc0 = acc0 * alpha[:, None] + pv
            elif g == 1:
                acc1 = acc1 * alpha[:, None] + pv
            elif g == 2:
                acc2 = acc2 * alpha[:, None] + pv
            else:
                acc3 = acc3 * alpha[:, None] + pv

    rows = b * so_b + t * so_t + h * so_h + split * so_s
    _store_partial(OP, rows, offs_g, acc0, l_i, keep)
    if NG > 1:
        _store_partial(OP, rows, GROUP + offs_g, acc1, l_i, keep)
    if NG > 2:
        _store_partial(OP, rows, 2 * GROUP + offs_g, acc2, l_i, keep)
        _store_partial(OP, rows, 3 * GROUP + offs_g, acc3, l_i, keep)
    _store_lse(LP, b, t, h, split, sl_b, sl_t, sl_h, m_i, l_i, row_ok)


@triton.jit
def _decode_merge_kernel(
    OP, LP, OUT, G,
    so_b, so_t, so_h, so_s,
    sl_b, sl_t, sl_h,
    sout_b, sout_t, sout_h,
    sg_b, sg_t, sg_h,
    num_splits,
    HQ: tl.constexpr, T: tl.constexpr, BD: tl.constexpr, BLOCK_S: tl.constexpr, HAS_GATE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_prologue(PDL)
    # one program per (row, head, BD-wide slice of head_dim), all splits in one load: a serial
    # loop over splits in few programs would leave this launch latency-bound
    pid = tl.program_id(0)
    b = pid // (T * HQ)
    t = (pid // HQ) % T
    h = pid % HQ
    offs_d = tl.program_id(1) * BD + tl.arange(0, BD)
    lp = LP + b * sl_b + t * sl_t + h * sl_h
    op = OP + b * so_b + t * so_t + h * so_h
    m_vec = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        m_vec = tl.maximum(m_vec, tl.load(lp + offs_s, mask=offs_s < num_splits, other=float("-inf")))
    m = tl.max(m_vec, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # an empty sequence: every split is empty
    total = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BD], tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        s_ok = offs_s < num_splits
        lse = tl.load(lp + offs_s, mask=s_ok, other=float("-inf"))
        w = tl.exp2(lse - m)
        o = tl.load(op + offs_s[:, None] * so_s + offs_d[None, :], mask=(s_ok & (lse > float("-inf")))[:, None], other=0.0)
        total += w
        acc += tl.sum(w[:, None] * o, 0)
    den = tl.sum(total, 0)
    out = acc / tl.where(den > 0, den, 1.0)
    if HAS_GATE:
        g = tl.load(G + b * sg_b + t * sg_t + h * sg_h + offs_d).to(tl.float32)
        out = out * tl.sigmoid(g)
    tl.store(OUT + b * sout_b + t * sout_t + h * sout_h + offs_d, out.to(OUT.dtype.element_ty))


def default_num_splits(batch: int, num_kv_heads: int, capacity: int, device: torch.device, block_n: int = 64,
                       ctas_per_sm: int = 2) -> int:
    """Splits per (sequence, KV head): enough programs for `ctas_per_sm` per SM (what the split
    kernel's registers and shared memory let one SM hold, `resident_ctas`), never more than the
    cache's capacity holds blocks. Depends on shapes only, so CUDA graphs can capture it."""
    want = triton.cdiv(ctas_per_sm * sm_count(str(device)), batch * num_kv_heads)
    return max(1, min(want, triton.cdiv(capacity, block_n), 256))


_RESIDENT: dict = {}


def resident_ctas(compiled: Any, num_warps: int, device: torch.device) -> int:
    """How many programs of a compiled kernel one SM holds at once, from its registers (allocated
    per warp in units of 256), shared memory and threads. Why: the split kernel at T = 3..8 query
    rows a KV head (the MTP verify: BLOCK_M 32) takes 150 registers a thread against 115 at T = 1
    (sm_90, Triton 3.6), so an SM holds one program, not two; the old two-per-SM grid then ran in
    two waves: 32.2 against 16.7 us a layer for the same KV bytes (H100, bench/graph_kernels.py,
    BENCHMARKS.md nineteenth run)."""
    compiled._init_handles()
    props = torch.cuda.get_device_properties(device)
    regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    threads_sm = getattr(props, "max_threads_per_multi_processor", 2048)
    per_warp = -(-compiled.n_regs * 32 // 256) * 256
    by_regs = regs_sm // max(1, per_warp * num_warps)
    by_smem = (smem_sm // (compiled.metadata.shared + 1024)) if compiled.metadata.shared else 32
    return max(1, min(by_regs, by_smem, threads_sm // (32 * num_warps), 32))


def _splits_for(kernel: Any, warm_args: Callable[[], tuple], meta: dict, key: tuple, batch: int, hkv: int,
                capacity: int, device: torch.device, block_n: int) -> int:
    """default_num_splits for as many programs an SM as the compiled split kernel fits: compiled
    (not launched) the first time a key is seen, on `warm_args()` (partials for two splits, so a
    one-split specialization is never the one measured); the two-per-SM rule if anything about it
    fails. Inside a CUDA graph capture nothing is compiled or loaded: a key not seen before gets
    the old rule, not remembered (the graph's warm-up runs come first and normally fill it)."""
    per_sm = _RESIDENT.get(key)
    if per_sm is None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return default_num_splits(batch, hkv, capacity, device, block_n)
    if per_sm is None:
        try:
            with torch.cuda.device(device) if torch.cuda.is_available() else contextlib.nullcontext():
                compiled = kernel.warmup(*warm_args(), grid=(1, 1), **meta)
                per_sm = resident_ctas(compiled, meta["num_warps"], device)
        except Exception:  # noqa: BLE001 - a tuning hint only: the old rule stands
            per_sm = 2
        _RESIDENT[key] = per_sm
    return default_num_splits(batch, hkv, capacity, device, block_n, per_sm * attn_waves())


def attn_waves() -> int:
    """NINFER_ATTN_WAVES (an experiment, read at each launch; default 1): the occupancy-sized grid
    times this many waves. At T = 1, 8K context, two waves of one-block splits (S132) beat one
    (S66): 20.9 against 22.7 us (H100, bench/attn_sweep.py, BENCHMARKS.md twentieth run); at T = 4
    one wave won (24.6-25.2 against 27.5). In the 27B step two waves did not win (119.5 against
    118.8 / 119.4 tok/s, same run), so the default stays one."""
    try:
        return max(1, int(os.environ.get("NINFER_ATTN_WAVES", "1")))
    except ValueError:
        return 1


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    scale: float | None = None,
    gate: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    min_chunk: int = 0,
    block_n: int = 64,
    num_warps: int = 8,
    num_stages: int = 2,
    int8_dequant: str = "asm",
) -> torch.Tensor:
    """Attention of q [B, T, Hq, D] over the paged cache; returns [B, T, Hq, D] in q's dtype.

    seq_lens [B] int32 counts each sequence's cached tokens, the T new ones included (append
    them first): query t sits at position seq_lens[b] - T + t and sees keys up to it. A length
    of 0 (a padded batch row) gives zeros. gate [B, T, Hq, D] (any strides, e.g. the gate half
    of q_proj's per-head [q | gate] output) multiplies the result by sigmoid(gate).

    num_splits (default: `default_num_splits`, from shapes only) fixes the grid; each split
    takes cdiv(len, num_splits) tokens rounded up to block_n, and at least min_chunk, so short
    sequences in a graph captured for long ones use fewer splits. Both are CUDA-graph safe:
    nothing here reads seq_lens on the host. int8_dequant "asm" turns codes into fp16 with
    byte permutes (fast), "cvt" with the conversion instruction (kept as the plain reference).
    Defaults (block_n 64, 8 warps, 2 stages, asm) were the fastest measured on the H200 for
    bf16 and int8 at 8K and 128K context (BENCHMARKS.md, "Decode kernels").
    """
    B, T, HQ, D = q.shape
    _, page, HKV, Dk = k_cache.shape
    if Dk != D or HQ % HKV or D % KV_GROUP or q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError(f"decode_attention: q {tuple(q.shape)} does not fit cache {tuple(k_cache.shape)} (or a non-unit last stride)")
    quant = k_cache.dtype == torch.int8
    if quant and (k_scale is None or v_scale is None or D > 4 * KV_GROUP or k_scale.stride(-1) != 1 or v_scale.stride(-1) != 1):
        raise ValueError("decode_attention: an int8 cache needs k_scale and v_scale (unit last stride), head_dim <= 256")
    gqa = HQ // HKV
    capacity = block_table.shape[1] * page
    block_m = max(16, triton.next_power_of_2(T * gqa))
    scale = D**-0.5 if scale is None else scale
    splits = num_splits or default_num_splits(B, HKV, capacity, q.device, block_n)

    meta = dict(HKV=HKV, T=T, GQA=gqa, D=D, PAGE=page, BLOCK_M=block_m, BLOCK_N=block_n, DOT_F32=interpreting(),
                num_warps=num_warps, num_stages=num_stages, **pdl_kwargs(q.device))
    qkv_strides = (q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                   v_cache.stride(0), v_cache.stride(1), v_cache.stride(2))
    if quant:
        kernel = _decode_split_int8_kernel
        meta.update(GROUP=KV_GROUP, DEQ_ASM=int8_dequant == "asm" and not interpreting())
        head = (q, k_cache, v_cache, k_scale, v_scale, block_table, seq_lens)
        mid = (*qkv_strides, k_scale.stride(0), k_scale.stride(1), k_scale.stride(2),
               v_scale.stride(0), v_scale.stride(1), v_scale.stride(2))
    else:
        kernel = _decode_split_kernel
        head = (q, k_cache, v_cache, block_table, seq_lens)
        mid = qkv_strides

    def arguments(n_splits: int) -> tuple:
        """The split kernel's arguments with partials for n_splits (part_o, part_l last)."""
        po = torch.empty(B, T, HQ, n_splits, D, dtype=torch.float32, device=q.device)
        pl = torch.empty(B, T, HQ, n_splits, dtype=torch.float32, device=q.device)
        common = (block_table.stride(0), po.stride(0), po.stride(1), po.stride(2), po.stride(3),
                  pl.stride(0), pl.stride(1), pl.stride(2), scale * LOG2E, n_splits, min_chunk)
        return (*head, po, pl, *mid, *common), po, pl

    if num_splits is None and q.is_cuda and not interpreting() and os.environ.get("NINFER_ATTN_OCCUPANCY", "1") != "0":
        # as many splits as the compiled kernel has room for in one wave (`resident_ctas`), per
        # kernel, device, batch, capacity, dtypes and meta-parameters (T, GQA, D, page, blocks, warps...)
        key = (kernel, q.device.index, B, capacity, q.dtype, k_cache.dtype, tuple(sorted(meta.items())))
        splits = _splits_for(kernel, lambda: arguments(max(2, splits))[0], meta, key, B, HKV, capacity, q.device, block_n)
    args, part_o, part_l = arguments(splits)
    kernel[(B * HKV, splits)](*args, **meta)
    if out is None:
        out = torch.empty(B, T, HQ, D, dtype=q.dtype, device=q.device)
    g = gate if gate is not None else out
    bd = min(D, 64)
    block_s = min(256, triton.next_power_of_2(splits))
    _decode_merge_kernel[(B * T * HQ, D // bd)](
        part_o, part_l, out, g,
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_o.stride(3),
        part_l.stride(0), part_l.stride(1), part_l.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        g.stride(0), g.stride(1), g.stride(2),
        splits,
        HQ=HQ, T=T, BD=bd, BLOCK_S=block_s, HAS_GATE=gate is not None,
        num_warps=8 if block_s * bd >= 8192 else 4, **pdl_kwargs(q.device),
    )
    return out
