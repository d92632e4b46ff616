"""Full attention for the fast path: one fused prep launch, then split-K decode or flash prefill.

A step of a gated-attention layer, from the raw projections (`gated_attention`):

1. `qk_norm_rope_append`: (1+w) RMSNorm of q and k per head, partial RoPE, K and V written to the
   cache row slot * max_context + position (INT8-G64 codes and fp16 scales when the cache is int8).
2. decode (one token per row): the split-K Triton kernel over each row's stripe, with
   sigmoid(gate) applied in its merge; nothing reads a length on the host, so the step can be
   captured in a CUDA graph, and a row with slot -1 / position -1 is padding (length 0, no write).
   Rows that are sequences of M consecutive positions (a speculative verify, the MTP alignment:
   `grouped_meta`) go through the same kernel as one program's T = M queries a sequence, causal
   among themselves, so each sequence's K/V is read once.
   prefill (a chunk of one sequence at start): short chunks (speculative verify, <= 8 tokens) take
   the same split-K kernel; longer ones flash attention (torch SDPA) over the chunk, causal, and,
   past the first chunk, over the cached prefix as a second flash pass whose log-sum-exp merges
   with the first. The prefix pass folds the GQA group into the query axis (q heads of one KV head
   attend as one [group * T] block), so the cached K/V are read as they are, never expanded.

Both caches are the per-slot stripes of `HybridCache`: [slots, max_context, Hkv, D], which the
kernels read as a paged cache of one max_context-token page per slot (block table = slot).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import structlog
import torch
import torch.nn.functional as F

from ninfer_plugins.cuda_fast.ops import TritonOps  # isort: skip  (first: sets TRITON_INTERPRET without CUDA)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ninfer.kernels.triton.launch import pdl_kwargs, pdl_prologue  # noqa: E402
from ninfer_plugins.cuda_fast.plugin import GPU
from ninfer_plugins.qwen_hybrid.attention import ReferenceFullAttention, read_kv

log = structlog.get_logger("ninfer.cuda_fast")

# Up to this many query tokens a prefill chunk goes through the split-K decode kernel, whose
# rows are T x GQA (6): 8 tokens fill 48 of its 64-row tiles.
VERIFY_TOKENS = 8


class DecodeMeta(NamedTuple):
    """What every attention layer of one decode step derives from (slots, positions)."""

    slot_mapping: torch.Tensor  # [B] int64: cache row slot * max_context + position (< 0: padding)
    block_table: torch.Tensor  # [B, 1] int32: the slot's stripe is its one page
    seq_lens: torch.Tensor  # [B] int32: position + 1 (0 for padding rows)
    # (M, block table [B / M, 1], lengths [B / M]) when the rows are B / M sequences of M
    # consecutive positions each, sequence-major (a speculative verify: `grouped_meta`); None:
    # every row its own query
    group: tuple | None = None


def grouped_meta(meta: DecodeMeta, m: int) -> DecodeMeta:
    """`meta` for rows that are sequences of m consecutive positions (row b * m + t at the
    sequence's start + t): each sequence's m queries then go through the split-K kernel as one
    program's T = m rows over its K/V read once, not as m rows each reading the whole stripe.
    The group's length is its last row's (a padded sequence's rows are all length 0)."""
    return meta._replace(group=(m, meta.block_table[m - 1 :: m], meta.seq_lens[m - 1 :: m].contiguous()))


def group_queries() -> bool:
    """NINFER_ATTN_GROUPED=0 (an A/B switch, read at each verify): the verify's rows each their own
    query, as before (T = 1 at B = b * M)."""
    return os.environ.get("NINFER_ATTN_GROUPED", "1") != "0"


def decode_meta_torch(max_context: int, slots: torch.Tensor, positions: torch.Tensor) -> DecodeMeta:
    # padding rows carry slot -1 and position -1: row -max_context-1 (no write), length 0
    return DecodeMeta(slots * max_context + positions, slots.to(torch.int32)[:, None], (positions + 1).to(torch.int32))


@triton.jit
def _decode_meta_kernel(S, P, SM, BT, SL, n, max_context, ss, sp, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl_prologue(PDL)
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = r < n
    slot = tl.load(S + r * ss, mask=ok, other=0).to(tl.int64)
    pos = tl.load(P + r * sp, mask=ok, other=0).to(tl.int64)
    tl.store(SM + r, slot * max_context + pos, mask=ok)
    tl.store(BT + r, slot.to(tl.int32), mask=ok)
    tl.store(SL + r, (pos + 1).to(tl.int32), mask=ok)


def decode_meta(max_context: int, slots: torch.Tensor, positions: torch.Tensor) -> DecodeMeta:
    """`decode_meta_torch` in one launch (the torch form is five: a multiply, two adds, two
    casts). Every MTP pass computes its own, and a round makes three."""
    n = slots.shape[0]
    if slots.dim() != 1 or positions.shape != (n,):
        raise ValueError(f"decode_meta: slots {tuple(slots.shape)} and positions {tuple(positions.shape)} must be [B]")
    dev = slots.device
    sm = torch.empty(n, dtype=torch.int64, device=dev)
    bt = torch.empty(n, 1, dtype=torch.int32, device=dev)
    sl = torch.empty(n, dtype=torch.int32, device=dev)
    if n:
        block = 128
        _decode_meta_kernel[(triton.cdiv(n, block),)](slots, positions, sm, bt, sl, n, max_context, slots.stride(0),
                                                      positions.stride(0), BLOCK=block, num_warps=1, **pdl_kwargs(dev))
    return DecodeMeta(sm, bt, sl)


def _attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):
    """Flash attention [1, H, Lq, D] x [1, H, Lk, D] -> (out [1, H, Lq, D], natural log-sum-exp
    [1, H, Lq] fp32), through the aten op SDPA itself dispatches to."""
    if q.is_cuda:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            q.contiguous(), k.contiguous(), v.contiguous(), 0.0, causal, False, scale=scale
        )[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)[:2]
    return out, lse


def _masked_prefill(q, k, v, start: int, scale: float) -> torch.Tensor:
    """The plain form (a boolean mask over [T, start + T]): the fallback and the tests' oracle."""
    t_len, hq, _ = q.shape
    end = start + t_len
    g = hq // k.shape[1]
    kh = k.repeat_interleave(g, dim=1).transpose(0, 1)[None]
    vh = v.repeat_interleave(g, dim=1).transpose(0, 1)[None]
    mask = torch.arange(end, device=q.device)[None, :] <= torch.arange(start, end, device=q.device)[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kh, vh, attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float, merge: bool = True):
    """q [T, Hq, D] at positions start..start+T-1 over k, v [start + T, Hkv, D] (the cache, these
    tokens included): causal attention -> [T, Hq, D]. `merge=False` takes the masked fallback."""
    t_len, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    if start > 0 and not merge:
        return _masked_prefill(q, k, v, start, scale)
    qh = q.transpose(0, 1)[None]  # [1, Hq, T, D]
    kc = k[start:].repeat_interleave(g, dim=1).transpose(0, 1)[None]  # the chunk's own keys, per q head
    vc = v[start:].repeat_interleave(g, dim=1).transpose(0, 1)[None]
    if start == 0:
        return F.scaled_dot_product_attention(qh, kc, vc, is_causal=True, scale=scale)[0].transpose(0, 1)
    o_c, l_c = _attention_lse(qh, kc, vc, True, scale)
    # prefix: every cached key is visible to every query; q rows of KV head j stacked as (r, t)
    qf = q.reshape(t_len, hkv, g, d).permute(1, 2, 0, 3).reshape(1, hkv, g * t_len, d)
    o_p, l_p = _attention_lse(qf, k[:start].transpose(0, 1)[None], v[:start].transpose(0, 1)[None], False, scale)
    o_p = o_p.reshape(hq, t_len, d)
    l_p = l_p.reshape(hq, t_len).float()
    o_c, l_c = o_c[0], l_c[0].float()
    m = torch.maximum(l_p, l_c)
    w_p, w_c = torch.exp(l_p - m)[..., None], torch.exp(l_c - m)[..., None]
    out = (o_p.float() * w_p + o_c.float() * w_c) / (w_p + w_c)
    return out.to(q.dtype).transpose(0, 1)


class FlashFullAttention(ReferenceFullAttention):
    """The reference methods (write/prefill/decode, for the fp32 path and the MTP layer) plus the
    fused `gated_attention` the layers call for 16-bit activations."""

    name = "cuda_fast.flash+splitk"
    requirements = GPU
    fused_dtypes = (torch.bfloat16, torch.float16)
    graph_decode = True

    def __init__(self) -> None:
        self.ops = TritonOps()
        # whether the flash op with log-sum-exp works here (checked once, on first use)
        self._merge_ok: bool | None = None

    def decode_meta(self, cache, slots: torch.Tensor, positions: torch.Tensor, columns: int = 1) -> DecodeMeta:
        """columns > 1: the rows are sequences of that many consecutive positions, sequence-major
        (a speculative verify, the MTP alignment), and attention takes each sequence's queries
        together (`grouped_meta`), unless NINFER_ATTN_GROUPED=0."""
        meta = decode_meta(cache.max_context, slots, positions)
        return grouped_meta(meta, columns) if columns > 1 and group_queries() else meta

    def gated_attention(self, qg, k, v, layer, kv, slots, positions, *, prefill=None, meta=None) -> torch.Tensor:
        """qg [N, Hq, 2D] (per head [q | gate]), k, v [N, Hkv, D] raw projections; kv the layer's
        (K, V, K scales, V scales); `layer` gives q_norm, k_norm, rotary, eps, scale, head_dim.
        prefill (slot, start) for a chunk of one sequence, None for decode. -> [N, Hq * D]."""
        from ninfer.kernels.triton import decode_attention, qk_norm_rope_append, sigmoid_gate

        n, d = qg.shape[0], layer.head_dim
        k_cache, v_cache, k_scale, v_scale = kv
        if meta is None:
            meta = decode_meta(k_cache.shape[1], slots, positions)
        q, gate = qg[..., :d], qg[..., d:]
        qn = qk_norm_rope_append(
            q, k, v, layer.q_norm.weight, layer.k_norm.weight, positions, layer.rotary.inv_freq,
            k_cache, v_cache, meta.slot_mapping, k_scale=k_scale, v_scale=v_scale, eps=layer.eps,
        )  # fmt: skip
        scales = dict(k_scale=k_scale, v_scale=v_scale, scale=layer.scale)
        if prefill is None and meta.group is not None:
            m, table, lens = meta.group
            b = n // m
            out = decode_attention(qn.view(b, m, *qn.shape[1:]), k_cache, v_cache, table, lens,
                                   gate=gate.view(b, m, *gate.shape[1:]), **scales)
            return out.view(n, -1)
        if prefill is None:
            out = decode_attention(qn[:, None], k_cache, v_cache, meta.block_table, meta.seq_lens, gate=gate[:, None], **scales)
            return out.view(n, -1)
        slot, start = prefill
        end = start + n
        if n <= VERIFY_TOKENS:
            table = torch.full((1, 1), slot, dtype=torch.int32, device=qn.device)
            lens = torch.full((1,), end, dtype=torch.int32, device=qn.device)
            return decode_attention(qn[None], k_cache, v_cache, table, lens, gate=gate[None], **scales).view(n, -1)
        keys = read_kv(k_cache, k_scale, (slot, slice(0, end)), qn.dtype)
        values = read_kv(v_cache, v_scale, (slot, slice(0, end)), qn.dtype)
        out = prefill_attention(qn, keys, values, start, layer.scale, merge=self._merge_works(qn)).contiguous()
        return sigmoid_gate(out, gate, out=out).view(n, -1)

    def _merge_works(self, like: torch.Tensor) -> bool:
        """Check once that the flash op returns what `prefill_attention` merges (its outputs and
        log-sum-exp are a private aten interface); if not, warn and keep the masked form."""
        if self._merge_ok is None:
            gen = torch.Generator(device=like.device).manual_seed(0)
            q, k, v = (torch.randn(s, generator=gen, device=like.device).to(like.dtype) for s in ((24, 12, 64), (64, 2, 64), (64, 2, 64)))
            try:
                got = prefill_attention(q, k, v, 40, 0.125).float()
                want = _masked_prefill(q.float(), k.float(), v.float(), 40, 0.125)
                err = float((got - want).norm() / want.norm())
                self._merge_ok = err < 2e-2
                if not self._merge_ok:
                    log.warning("flash log-sum-exp merge is off here; prefill past the first chunk uses a mask", err=err)
            except Exception as exc:  # noqa: BLE001 - an aten op missing or changed: keep serving
                log.warning("flash attention with log-sum-exp unavailable; prefill past the first chunk uses a mask", error=str(exc))
                self._merge_ok = False
        return self._merge_ok
