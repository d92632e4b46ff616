"""Full (softmax) attention over the KV cache, torch reference: the `full` attention backend.

The cache holds, per full-attention layer, K (post-norm, post-RoPE) and V as [slots, max_context,
kv_heads, head_dim] in the model dtype, or as INT8-G64 codes with fp16 scales [slots, max_context,
kv_heads, head_dim / 64] (`k_scale`, `v_scale`; spec section 5): this reference quantizes on write
and attends over the decoded values. A tuned backend offers the same three methods.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.device import ANYWHERE
from ninfer.kernels.reference import dequantize_kv_int8, quantize_kv_int8


def read_kv(cache: torch.Tensor, scale: torch.Tensor | None, index, dtype: torch.dtype) -> torch.Tensor:
    """cache[index] in `dtype`: INT8 codes decoded with their scales, 16-bit values as stored."""
    if scale is None:
        return cache[index].to(dtype)
    return dequantize_kv_int8(cache[index], scale[index]).to(dtype)


class ReferenceFullAttention:
    name = "torch.sdpa"
    requirements = ANYWHERE

    def write(self, k_cache, v_cache, slots, positions, k, v, k_scale=None, v_scale=None) -> None:
        """Store k, v [N, Hkv, D] at (slots[i], positions[i]); INT8 caches get codes and scales."""
        if k_scale is None:
            k_cache[slots, positions] = k.to(k_cache.dtype)
            v_cache[slots, positions] = v.to(v_cache.dtype)
            return
        for cache, scales, x in ((k_cache, k_scale, k), (v_cache, v_scale, v)):
            codes, s = quantize_kv_int8(x)
            cache[slots, positions] = codes
            scales[slots, positions] = s

    def prefill(self, q, k_cache, v_cache, slot: int, start_pos: int, scale: float, k_scale=None, v_scale=None) -> torch.Tensor:
        """q [T, Hq, D] at positions start_pos.. of `slot`, whose K/V are already written:
        causal attention over positions 0..start_pos+T-1 -> [T, Hq, D]."""
        t_len = q.shape[0]
        end = start_pos + t_len
        k = read_kv(k_cache, k_scale, (slot, slice(0, end)), q.dtype).transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
        v = read_kv(v_cache, v_scale, (slot, slice(0, end)), q.dtype).transpose(0, 1).unsqueeze(0)
        qh = q.transpose(0, 1).unsqueeze(0).to(k.dtype)  # [1, Hq, T, D]
        rows = torch.arange(start_pos, end, device=q.device).unsqueeze(1)
        mask = torch.arange(end, device=q.device).unsqueeze(0) <= rows  # [T, L]
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        return out[0].transpose(0, 1)

    def decode(
        self, q, k_cache, v_cache, slots, positions, scale: float, max_len: int | None = None, k_scale=None, v_scale=None
    ) -> torch.Tensor:
        """q [B, Hq, D], one token per sequence at positions[b] (its K/V already written):
        attention over 0..positions[b] of slot slots[b] -> [B, Hq, D].

        `max_len` (> every position) bounds the columns read; without it the bound is read from
        `positions`, a host sync that a captured CUDA graph cannot contain.
        """
        length = max_len if max_len is not None else int(positions.max()) + 1
        cols = (slots[:, None], torch.arange(length, device=q.device)[None, :])
        k = read_kv(k_cache, k_scale, cols, q.dtype).transpose(1, 2)  # [B, Hkv, L, D]
        v = read_kv(v_cache, v_scale, cols, q.dtype).transpose(1, 2)
        mask = torch.arange(length, device=q.device).unsqueeze(0) <= positions.unsqueeze(1)  # [B, L]
        qh = q.unsqueeze(2).to(k.dtype)  # [B, Hq, 1, D]
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True)
        return out[:, :, 0]
