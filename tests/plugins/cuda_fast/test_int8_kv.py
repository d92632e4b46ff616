"""INT8-G64 KV in HybridCache (spec section 5): layout, the reference path's quantize-on-write,
and the random fill benchmarks use. The fused path's int8 runs in test_fused_path.py."""

from __future__ import annotations

import pytest
import torch

from ninfer.errors import UserError
from ninfer.kernels.reference import dequantize_kv_int8, quantize_kv_int8
from ninfer.testing import load_model, make_tiny

VOCAB = 256


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(make_tiny("qwen3.6-27b", tmp_path_factory.mktemp("tiny27"), vocab=VOCAB, layers=4))


def test_int8_cache_layout(model):
    cache = model.allocate_cache(2, 32, "int8")
    s = model.shape
    k, v = cache.kv(0)
    ks, vs = cache.kv_scales(0)
    assert k.dtype == v.dtype == torch.int8 and k.shape == (2, 32, s.num_key_value_heads, s.head_dim)
    assert ks.dtype == torch.float16 and ks.shape == (2, 32, s.num_key_value_heads, s.head_dim // 64)
    assert model.allocate_cache(2, 32, "bf16").kv_scales(0) is None
    # 1 byte per element plus a 2-byte scale per 64: what the memory plan counts
    kv_bytes = sum(t.numel() * t.element_size() for t in cache.k + cache.v + cache.k_scale + cache.v_scale)
    assert kv_bytes == 32 * 2 * s.kv_bytes_per_token("int8")
    with pytest.raises(UserError, match="--kv-dtype"):
        model.allocate_cache(1, 8, "fp8")


def test_reference_path_reads_what_it_quantized(model):
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(0))
    outs = {}
    for kv in ("bf16", "int8"):
        cache = model.allocate_cache(1, 32, kv)
        h = model.forward(ids[:14], cache, 0, 0)
        h2 = model.forward(ids[14:], cache, 0, 14)
        d = model.decode(torch.tensor([3]), cache, torch.tensor([0]), torch.tensor([20]))
        outs[kv] = torch.cat([model.compute_logits(x) for x in (h, h2, d)])
        if kv == "int8":
            k, _ = cache.kv(0)
            ks, _ = cache.kv_scales(0)
            stored = dequantize_kv_int8(k[0, :21], ks[0, :21])
            codes, scales = quantize_kv_int8(stored)  # decoded codes re-encode to themselves
            assert torch.equal(codes, k[0, :21]) and torch.equal(scales, ks[0, :21])
    rel = float((outs["int8"] - outs["bf16"]).abs().max() / outs["bf16"].abs().max())
    assert 0 < rel < 0.05  # 8-bit K/V: close to the fp32 cache, not equal


def test_fill_random_touches_only_the_prefix(model):
    for kv in ("bf16", "int8"):
        cache = model.allocate_cache(2, 16, kv)
        cache.fill_random(1, 10, seed=3)
        k, _ = cache.kv(0)
        assert k[1, :10].abs().sum() > 0 and k[1, 10:].abs().sum() == 0 and k[0].abs().sum() == 0
        if kv == "int8":
            assert cache.kv_scales(0)[0][1, :10].float().abs().sum() > 0
