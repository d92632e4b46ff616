"""The gated-attention layer's step between the projections and attention, in one launch:
per-head offset RMSNorm of q and k, partial rotate-half RoPE (spec §2.3), and the append of K
and V to the cache (quantized to INT8-G64 when the cache is int8, spec §5).

Tokens are addressed by `slot_mapping` [N] int64: token n goes to flat cache row
slot_mapping[n] = block * block_size + offset (with the block table of its sequence), so the
same kernel serves decode, verify and prefill chunks, paged or per-slot caches; a negative
entry (a padded batch row) writes nothing. Positions are [N] (text) or [3, N] (interleaved
MRoPE); angles are position * inv_freq in fp32, the product transformers forms, so they match
its tables bit for bit before cos/sin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton.attention import KV_GROUP
from ninfer.kernels.triton.launch import pdl_kwargs, pdl_prologue

@triton.jit
def _norm_rope(src, W, INV_FREQ, pos_t, pos_h, pos_w, eps,
               D: tl.constexpr, ROT: tl.constexpr, MROPE: tl.constexpr, SEC_H: tl.constexpr, SEC_W: tl.constexpr):
    HALF: tl.constexpr = ROT // 2
    d = tl.arange(0, D)
    x = tl.load(src + d).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, 0) / D + eps)
    y = x * r * (1.0 + tl.load(W + d).to(tl.float32))
    # rotate-half pairs (i, i + HALF): read each element's partner straight from memory
    partner = tl.where(d < HALF, d + HALF, tl.where(d < ROT, d - HALF, d))
    yp = tl.load(src + partner).to(tl.float32) * r * (1.0 + tl.load(W + partner).to(tl.float32))
    i = tl.where(d < HALF, d, d - HALF)
    freq = tl.load(INV_FREQ + i, mask=d < ROT, other=0.0)
    if MROPE:
        pos = tl.where((i % 3 == 1) & (i < 3 * SEC_H), pos_h, tl.where((i % 3 == 2) & (i < 3 * SEC_W), pos_w, pos_t))
    else:
        pos = pos_t
    ang = pos.to(tl.float32) * freq
    c = tl.cos(ang)
    s = tl.sin(ang)
    rot = tl.where(d < HALF, y * c - yp * s, y * c + yp * s)
    return tl.where(d < ROT, rot, y)


@triton.jit
def _store_row(y, dst, dst_scale, QUANT: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr):
    d = tl.arange(0, D)
    if QUANT:
        NG: tl.constexpr = D // GROUP
        yg = tl.reshape(y, (NG, GROUP))
        amax = tl.max(tl.abs(yg), 1)
        sc = tl.math.div_rn(amax, tl.full([NG], 127.0, tl.float32)).to(tl.float16)
        s32 = sc.to(tl.float32)
        inv = tl.where(s32 > 0, tl.math.div_rn(tl.full([NG], 1.0, tl.float32), tl.where(s32 > 0, s32, 1.0)), 0.0)
        c = tl.minimum(tl.maximum(yg * inv[:, None], -127.0), 127.0)
        # round half to even: adding 1.5 * 2^23 leaves no fraction bits for |c| <= 2^22 (the
        # clamp between the multiply and this add keeps the compiler from fusing them)
        c = (c + 12582912.0) - 12582912.0
        tl.store(dst + d, tl.reshape(c, (D,)).to(tl.int8))
        tl.store(dst_scale + tl.arange(0, NG), sc)
    else:
        tl.store(dst + d, y.to(dst.dtype.element_ty))


@triton.jit
def _qk_norm_rope_append_kernel(
    Q, K, V, POS, QW, KW, INV_FREQ, QO, KO, KC, VC, KSC, VSC, SLOT,
    sq_n, sq_h, sk_n, sk_h, sv_n, sv_h, sp_a,
    sqo_n, sqo_h, sko_n, sko_h,
    skc_p, skc_t, skc_h, svc_p, svc_t, svc_h,
    sks_p, sks_t, sks_h, svs_p, svs_t, svs_h,
    eps,
    HQ: tl.constexpr, D: tl.constexpr, ROT: tl.constexpr,
    MROPE: tl.constexpr, SEC_H: tl.constexpr, SEC_W: tl.constexpr,
    NORM_ROPE: tl.constexpr, TO_CACHE: tl.constexpr, QUANT: tl.constexpr,
    PAGE: tl.constexpr, GROUP: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_prologue(PDL)
    n = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, D)
    kh = h - HQ
    if NORM_ROPE:
        pos_t = tl.load(POS + n)
        pos_h = pos_t
        pos_w = pos_t
        if MROPE:
            pos_h = tl.load(POS + sp_a + n)
            pos_w = tl.load(POS + 2 * sp_a + n)
        if h < HQ:
            y = _norm_rope(Q + n * sq_n + h * sq_h, QW, INV_FREQ, pos_t, pos_h, pos_w, eps, D, ROT, MROPE, SEC_H, SEC_W)
            tl.store(QO + n * sqo_n + h * sqo_h + d, y.to(QO.dtype.element_ty))
        else:
            k = _norm_rope(K + n * sk_n + kh * sk_h, KW, INV_FREQ, pos_t, pos_h, pos_w, eps, D, ROT, MROPE, SEC_H, SEC_W)
            _put_k_v(k, V, KO, KC, VC, KSC, VSC, SLOT, n, kh, sv_n, sv_h, sko_n, sko_h, skc_p, skc_t, skc_h,
                     svc_p, svc_t, svc_h, sks_p, sks_t, sks_h, svs_p, svs_t, svs_h, TO_CACHE, QUANT, PAGE, D, GROUP)
    else:
        k = tl.load(K + n * sk_n + kh * sk_h + d).to(tl.float32)
        _put_k_v(k, V, KO, KC, VC, KSC, VSC, SLOT, n, kh, sv_n, sv_h, sko_n, sko_h, skc_p, skc_t, skc_h,
                 svc_p, svc_t, svc_h, sks_p, sks_t, sks_h, svs_p, svs_t, svs_h, TO_CACHE, QUANT, PAGE, D, GROUP)


@triton.jit
def _put_k_v(k, V, KO, KC, VC, KSC, VSC, SLOT, n, kh, sv_n, sv_h, sko_n, sko_h, skc_p, skc_t, skc_h,
             svc_p, svc_t, svc_h, sks_p, sks_t, sks_h, svs_p, svs_t, svs_h,
             TO_CACHE: tl.constexpr, QUANT: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr):
    d = tl.arange(0, D)
    if TO_CACHE:
        slot = tl.load(SLOT + n)
        if slot >= 0:
            page = slot // PAGE
            tok = slot % PAGE
            v = tl.load(V + n * sv_n + kh * sv_h + d).to(tl.float32)
            _store_row(k, KC + page * skc_p + tok * skc_t + kh * skc_h, KSC + page * sks_p + tok * sks_t + kh * sks_h,
                       QUANT, D, GROUP)
            _store_row(v, VC + page * svc_p + tok * svc_t + kh * svc_h, VSC + page * svs_p + tok * svs_t + kh * svs_h,
                       QUANT, D, GROUP)
    else:
        tl.store(KO + n * sko_n + kh * sko_h + d, k.to(KO.dtype.element_ty))


def _launch(q, k, v, q_weight, k_weight, positions, inv_freq, q_out, k_out, k_cache, v_cache, k_scale, v_scale,
            slot_mapping, eps, mrope_section, norm_rope):
    N, HKV, D = k.shape
    if N == 0:
        return
    HQ = q.shape[1] if q is not None else 0
    for name, t in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"{name} needs a unit stride on its last dim")
    to_cache = k_cache is not None
    quant = to_cache and k_cache.dtype == torch.int8
    if quant and (k_scale is None or v_scale is None):
        raise ValueError("an int8 cache needs k_scale and v_scale")
    mrope = positions is not None and positions.dim() == 2
    if mrope and mrope_section is None:
        raise ValueError("3-axis positions need mrope_section")
    sec = mrope_section or (0, 0, 0)
    rot = 2 * inv_freq.numel() if inv_freq is not None else 0
    dummy = k
    qq, qo = (q, q_out) if q is not None else (dummy, dummy)
    kc, vc = (k_cache, v_cache) if to_cache else (dummy, dummy)
    ksc, vsc = (k_scale, v_scale) if quant else (kc, vc)
    vv = v if v is not None else dummy
    ko = k_out if k_out is not None else dummy
    page = k_cache.shape[1] if to_cache else 1
    ks4 = lambda t: (t.stride(0), t.stride(1), t.stride(2)) if t.dim() == 4 else (0, 0, 0)  # noqa: E731
    _qk_norm_rope_append_kernel[(N, HQ + HKV)](
        qq, k, vv, positions if positions is not None else dummy,
        q_weight if q_weight is not None else dummy, k_weight if k_weight is not None else dummy,
        inv_freq if inv_freq is not None else dummy,
        qo, ko, kc, vc, ksc, vsc, slot_mapping if slot_mapping is not None else dummy,
        qq.stride(0), qq.stride(1), k.stride(0), k.stride(1), vv.stride(0), vv.stride(1),
        positions.stride(0) if mrope else 0,
        qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1),
        *ks4(kc), *ks4(vc), *ks4(ksc), *ks4(vsc),
        eps,
        HQ=HQ, D=D, ROT=rot, MROPE=mrope, SEC_H=sec[1], SEC_W=sec[2],
        NORM_ROPE=norm_rope, TO_CACHE=to_cache, QUANT=quant, PAGE=page, GROUP=KV_GROUP,
        num_warps=2 if D <= 256 else 4, **pdl_kwargs(k.device),
    )


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    eps: float = 1e-6,
    mrope_section: tuple[int, int, int] | None = None,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, Hq, D], k [N, Hkv, D] (any token/head strides, e.g. views into q_proj's per-head
    [q | gate] output) -> normed and rotated (q_out, k_out), contiguous, in q's dtype."""
    q_out = q_out if q_out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = k_out if k_out is not None else torch.empty(k.shape, dtype=k.dtype, device=k.device)
    _launch(q, k, None, q_weight, k_weight, positions, inv_freq, q_out, k_out, None, None, None, None, None,
            eps, mrope_section, True)
    return q_out, k_out


def qk_norm_rope_append(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    eps: float = 1e-6,
    mrope_section: tuple[int, int, int] | None = None,
    q_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode/verify prep: returns normed, rotated q [N, Hq, D]; writes normed, rotated k and
    raw v [N, Hkv, D] into the cache rows slot_mapping[n] (quantized if the cache is int8)."""
    q_out = q_out if q_out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _launch(q, k, v, q_weight, k_weight, positions, inv_freq, q_out, None, k_cache, v_cache, k_scale, v_scale,
            slot_mapping, eps, mrope_section, True)
    return q_out


def append_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write k, v [N, Hkv, D] as they are into the cache rows slot_mapping[n] (int8: quantized)."""
    _launch(None, k, v, None, None, None, None, None, None, k_cache, v_cache, k_scale, v_scale, slot_mapping,
            0.0, None, False)
