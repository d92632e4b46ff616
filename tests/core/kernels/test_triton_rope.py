"""q/k offset RMSNorm + partial RoPE (+ K/V append to the cache) against the torch oracle:
text and MRoPE positions, large positions, strided q (the [q | gate] per-head layout), bf16 and
INT8-G64 caches with their codec bits checked exactly, padded rows that must write nothing."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import reference as R
from ninfer.kernels.triton import append_kv, qk_norm_rope, qk_norm_rope_append

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(N, HQ, HKV, D, seed):
    g = torch.Generator().manual_seed(seed)
    qg = torch.randn(N, HQ, 2 * D, generator=g).bfloat16().to(DEV)
    k = torch.randn(N, HKV, D, generator=g).bfloat16().to(DEV)
    v = torch.randn(N, HKV, D, generator=g).bfloat16().to(DEV)
    qw = (torch.randn(D, generator=g) * 0.1).bfloat16().to(DEV)
    kw = (torch.randn(D, generator=g) * 0.1).bfloat16().to(DEV)
    return qg[..., :D], k, v, qw, kw


def _empty_cache(nb, page, hkv, d, quant):
    if quant:
        c = lambda: torch.zeros(nb, page, hkv, d, dtype=torch.int8, device=DEV)  # noqa: E731
        s = lambda: torch.zeros(nb, page, hkv, d // 64, dtype=torch.float16, device=DEV)  # noqa: E731
        return c(), c(), s(), s()
    return (torch.zeros(nb, page, hkv, d, dtype=torch.bfloat16, device=DEV),
            torch.zeros(nb, page, hkv, d, dtype=torch.bfloat16, device=DEV), None, None)


@pytest.mark.parametrize("mrope", [False, True])
def test_qk_norm_rope(mrope):
    N, HQ, HKV, D, rot = 5, 4, 2, 128, 32
    q, k, _, qw, kw = _inputs(N, HQ, HKV, D, seed=int(mrope))
    inv = R.rope_inv_freq(rot, 1e7, DEV)
    if mrope:
        pos, sec = torch.randint(0, 5000, (3, N), device=DEV), (6, 5, 5)
    else:
        pos, sec = torch.randint(0, 262144, (N,), device=DEV), None
    qo, ko = qk_norm_rope(q, k, qw, kw, pos, inv, mrope_section=sec)
    R.assert_close(qo, R.qk_norm_rope(q, qw, pos, inv, mrope_section=sec), "bf16_elementwise")
    R.assert_close(ko, R.qk_norm_rope(k, kw, pos, inv, mrope_section=sec), "bf16_elementwise")


def _check_append(N, HQ, HKV, D, rot, page, quant, seed):
    q, k, v, qw, kw = _inputs(N, HQ, HKV, D, seed)
    inv = R.rope_inv_freq(rot, 1e7, DEV)
    pos = torch.randint(0, 100000, (N,), device=DEV)
    nb = N + 2
    slots = torch.randperm(nb * page)[:N].to(DEV)
    slots[N // 2] = -1  # a padded row writes nothing
    kc, vc, ks, vs = _empty_cache(nb, page, HKV, D, quant)
    qo = qk_norm_rope_append(q, k, v, qw, kw, pos, inv, kc, vc, slots, k_scale=ks, v_scale=vs)
    R.assert_close(qo, R.qk_norm_rope(q, qw, pos, inv), "bf16_elementwise")
    k_ref = R.qk_norm_rope(k, kw, pos, inv)
    written = torch.zeros(nb, page, dtype=torch.bool, device=DEV)
    for n, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        blk, off = divmod(s, page)
        written[blk, off] = True
        if quant:
            codes, scales = R.quantize_kv_int8(v[n])
            assert torch.equal(vc[blk, off], codes) and torch.equal(vs[blk, off], scales)
            # k is quantized from fp32 values the kernel computed: codes within one step
            kcodes, kscales = R.quantize_kv_int8(k_ref[n])
            assert int((kc[blk, off].int() - kcodes.int()).abs().max()) <= 1
            R.assert_close(vs[blk, off].float(), scales.float(), "bf16_elementwise")
            R.assert_close(ks[blk, off].float(), kscales.float(), "bf16_elementwise")
        else:
            assert torch.equal(vc[blk, off], v[n])
            R.assert_close(kc[blk, off], k_ref[n], "bf16_elementwise")
    assert not bool(kc[~written].float().abs().sum()) and not bool(vc[~written].float().abs().sum())


@pytest.mark.parametrize("quant", [False, True])
def test_qk_norm_rope_append(quant):
    _check_append(5, 4, 2, 128, 32, 8, quant, seed=10 + quant)


def test_int8_codec_bits():
    # zeros, a lone spike, a ramp hitting exact quarter steps, random: codes and scales exact
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 2, 256, generator=g) * 5
    x[0, 0, :64] = 0
    x[1, 0, :] = 0
    x[1, 0, 70] = 1000.0
    x[2, 1, :] = (torch.arange(256) - 128) * 0.25
    x = x.bfloat16().to(DEV)
    kc, vc, ks, vs = _empty_cache(1, 6, 2, 256, True)
    append_kv(x, x, kc, vc, torch.arange(6, device=DEV), k_scale=ks, v_scale=vs)
    codes, scales = R.quantize_kv_int8(x)
    assert torch.equal(kc[0], codes) and torch.equal(ks[0], scales)
    assert torch.equal(vc[0], codes) and torch.equal(vs[0], scales)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("HQ,HKV", [(24, 4), (16, 2)])
def test_real_shapes_gpu(quant, HQ, HKV):
    _check_append(64, HQ, HKV, 256, 64, 64, quant, seed=HQ)
