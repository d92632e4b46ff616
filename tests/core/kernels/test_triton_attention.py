"""Split-K decode attention against the torch oracle: bf16 and INT8-G64 caches, paged and
per-slot layouts, GQA 6 and 8, T=1 and verify blocks, lengths at block and split boundaries.

Without CUDA the kernels run under TRITON_INTERPRET=1 at tiny shapes; `-m gpu` runs the real
27B / 35B shapes on the device.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import reference as R
from ninfer.kernels.triton import decode_attention

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _cache(num_blocks, page, hkv, d, quant, gen):
    k = torch.randn(num_blocks, page, hkv, d, generator=gen).to(DEV)
    v = torch.randn(num_blocks, page, hkv, d, generator=gen).to(DEV)
    if quant:
        kc, ks = R.quantize_kv_int8(k * 2)
        vc, vs = R.quantize_kv_int8(v)
        return kc, vc, ks, vs
    return k.bfloat16(), v.bfloat16(), None, None


def _check(q, kc, vc, bt, lens, ks, vs, gate=None, **kw):
    out = decode_attention(q, kc, vc, bt, lens, k_scale=ks, v_scale=vs, gate=gate, **kw)
    ref = R.decode_attention(q, kc, vc, bt, lens, ks, vs)
    if gate is not None:
        ref = R.sigmoid_gate(ref, gate)
    R.assert_close(out, ref, "attention_int8" if ks is not None else "attention_bf16")
    return out


def _paged_case(B, T, HQ, HKV, D, page, lens, quant, seed, gate=False, **kw):
    gen = torch.Generator().manual_seed(seed)
    max_blocks = max(1, -(-max(lens) // page))
    nb = B * max_blocks + 3
    kc, vc, ks, vs = _cache(nb, page, HKV, D, quant, gen)
    bt = torch.randperm(nb, generator=gen)[: B * max_blocks].reshape(B, max_blocks).int().to(DEV)
    q = torch.randn(B, T, HQ, D, generator=gen).bfloat16().to(DEV)
    g = torch.randn(B, T, HQ, 2 * D, generator=gen).bfloat16().to(DEV)[..., D:] if gate else None
    return _check(q, kc, vc, bt, torch.tensor(lens, dtype=torch.int32, device=DEV), ks, vs, g, **kw)


@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("T,lens", [(1, (37, 5)), (3, (40, 3)), (2, (0, 7))])
def test_paged_small(quant, T, lens):
    _paged_case(2, T, 6, 1, 64, 16, lens, quant, seed=10 * T + quant, gate=(T == 2), num_splits=3, block_n=16)


@pytest.mark.parametrize("lens", [(15, 16, 17), (31, 32, 33), (47, 48, 49)])
def test_block_and_split_boundaries(lens):
    # block_n 16, 2 splits: lengths b-1, b, b+1 around block and split edges
    _paged_case(3, 1, 6, 1, 64, 16, lens, False, seed=lens[0], num_splits=2, block_n=16)


def test_head_dim_256_gqa8_int8():
    _paged_case(1, 1, 8, 1, 256, 16, (21,), True, seed=7, num_splits=2, block_n=16)


def test_head_dim_128_int8_verify():
    _paged_case(2, 2, 6, 1, 128, 16, (33, 2), True, seed=8, num_splits=2, block_n=16)


def test_per_slot_contiguous_cache():
    # [slots, max_ctx, Hkv, D] is the paged layout with block_size = max_ctx
    gen = torch.Generator().manual_seed(3)
    slots, max_ctx, HKV, D = 4, 48, 2, 64
    kc, vc, ks, vs = _cache(slots, max_ctx, HKV, D, True, gen)
    bt = torch.tensor([[2], [0]], dtype=torch.int32, device=DEV)
    q = torch.randn(2, 1, 12, D, generator=gen).bfloat16().to(DEV)
    _check(q, kc, vc, bt, torch.tensor([48, 9], dtype=torch.int32, device=DEV), ks, vs, num_splits=2, block_n=16)


def test_default_splits():
    _paged_case(2, 1, 6, 1, 64, 16, (50, 20), False, seed=11, block_n=16)


def test_min_chunk_leaves_splits_empty():
    # 4 splits of at least 32 tokens: the 20-token sequence fills one, the 50-token one two
    _paged_case(2, 1, 6, 1, 64, 16, (50, 20), True, seed=12, num_splits=4, min_chunk=32, block_n=16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quant", [False, True])
@pytest.mark.parametrize("HQ,HKV", [(24, 4), (16, 2)])
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("dequant", ["asm", "cvt"])
def test_real_shapes_gpu(quant, HQ, HKV, T, dequant):
    if dequant == "cvt" and not quant:
        pytest.skip("the dequant choice is for int8 caches")
    lens = (T, 8192, 3001)
    _paged_case(3, T, HQ, HKV, 256, 64, lens, quant, seed=HQ + T, gate=True, int8_dequant=dequant)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("block_n,num_warps,num_stages", [(32, 4, 2), (64, 4, 2), (64, 8, 2), (32, 4, 3), (64, 4, 3)])
def test_configs_gpu(block_n, num_warps, num_stages):
    for quant, dequant in ((False, "asm"), (True, "asm"), (True, "cvt")):
        _paged_case(2, 1, 24, 4, 256, 64, (5000, 77), quant, seed=block_n, block_n=block_n,
                    num_warps=num_warps, num_stages=num_stages, int8_dequant=dequant)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_per_slot_and_pool_with_append_gpu():
    # the prep kernel appends into the per-slot [slots, max_ctx, Hkv, D] cache, attention reads it
    from ninfer.kernels.triton import qk_norm_rope_append

    gen = torch.Generator().manual_seed(21)
    slots, max_ctx, HQ, HKV, D, B = 3, 4096, 24, 4, 256, 2
    for quant in (False, True):
        kc, vc, ks, vs = _cache(slots, max_ctx, HKV, D, quant, gen)
        lens = torch.tensor([4096, 1000], dtype=torch.int32, device=DEV)
        bt = torch.tensor([[2], [0]], dtype=torch.int32, device=DEV)
        qg = torch.randn(B, HQ, 2 * D, generator=gen).bfloat16().to(DEV)
        kv = torch.randn(B, 2, HKV, D, generator=gen).bfloat16().to(DEV)
        w = (torch.randn(D, generator=gen) * 0.1).bfloat16().to(DEV)
        pos = (lens - 1).long()
        slot_mapping = bt[:, 0].long() * max_ctx + pos
        inv = R.rope_inv_freq(64, 1e7, DEV)
        q = qk_norm_rope_append(qg[..., :D], kv[:, 0], kv[:, 1], w, w, pos, inv, kc, vc, slot_mapping,
                                k_scale=ks, v_scale=vs)
        _check(q[:, None], kc, vc, bt, lens, ks, vs, gate=qg[:, None, :, D:])


def test_more_splits_than_one_merge_tile():
    # 300 splits > the merge's 256-wide tile: the merge loops; most splits are empty
    _paged_case(1, 1, 6, 1, 64, 16, (40,), False, seed=13, num_splits=300, block_n=16)


class _Compiled:
    """A compiled kernel's occupancy figures, as Triton's CompiledKernel carries them."""

    def __init__(self, regs, shared):
        from types import SimpleNamespace

        self.n_regs, self.metadata = regs, SimpleNamespace(shared=shared)

    def _init_handles(self):
        pass


def test_resident_ctas_from_registers_and_shared(monkeypatch):
    """The split kernel's figures on sm_90 (Triton 3.6): T = 1 115 registers and 74 KB, two programs
    an SM; T = 4 (the MTP verify, BLOCK_M 32) 150 registers, one; the int8 kernel 128, two."""
    from types import SimpleNamespace

    from ninfer.kernels.triton import attention as A

    props = SimpleNamespace(regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
                            max_threads_per_multi_processor=2048)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    assert A.resident_ctas(_Compiled(115, 75776), 8, "cuda") == 2
    assert A.resident_ctas(_Compiled(150, 86016), 8, "cuda") == 1
    assert A.resident_ctas(_Compiled(128, 43008), 8, "cuda") == 2
    assert A.resident_ctas(_Compiled(40, 0), 4, "cuda") == 12  # threads: 2048 / 128 = 16; registers: 12
    assert A.resident_ctas(_Compiled(64, 143360), 4, "cuda") == 1  # shared memory


def test_splits_follow_resident_ctas(monkeypatch):
    from ninfer.kernels.triton import attention as A

    monkeypatch.setattr(A, "sm_count", lambda device: 132)
    assert A.default_num_splits(1, 4, 8256, "cuda") == 66  # two programs an SM: one wave of 264
    assert A.default_num_splits(1, 4, 8256, "cuda", ctas_per_sm=1) == 33

    class Broken:
        def warmup(self, *args, **kwargs):
            raise RuntimeError("no compiler here")

    monkeypatch.setattr(A, "_RESIDENT", {})
    meta = {"num_warps": 8}
    assert A._splits_for(Broken(), lambda: (), meta, ("k",), 1, 4, 8256, "cuda", 64) == 66  # the old rule stands
    assert A._RESIDENT == {("k",): 2}
    monkeypatch.setattr(A, "_RESIDENT", {})
    monkeypatch.setattr(A, "resident_ctas", lambda compiled, warps, device: 1)

    class Fits:
        def warmup(self, *args, **kwargs):
            return object()

    assert A._splits_for(Fits(), lambda: (), meta, ("k",), 1, 4, 8256, "cuda", 64) == 33
    assert A._RESIDENT == {("k",): 1}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("quant", [False, True])
def test_default_splits_fit_one_wave_gpu(quant):
    """The 27B's verify shape (T = 4, GQA 6): the default grid fits the SMs in one wave by the
    compiled kernel's own occupancy, and its output matches the old two-per-SM grid's."""
    from ninfer.kernels.triton import attention as A

    gen = torch.Generator().manual_seed(4)
    kc, vc, ks, vs = _cache(1, 8256, 4, 256, quant, gen)
    bt = torch.zeros(1, 1, dtype=torch.int32, device=DEV)
    lens = torch.tensor([8192], dtype=torch.int32, device=DEV)
    q = torch.randn(1, 4, 24, 256, generator=gen).bfloat16().to(DEV)
    out = decode_attention(q, kc, vc, bt, lens, k_scale=ks, v_scale=vs)
    per_sm = [v for k, v in A._RESIDENT.items() if dict(k[-1])["T"] == 4]  # key: (..., meta-parameters)
    assert per_sm and 1 <= per_sm[-1] <= 4
    old = decode_attention(q, kc, vc, bt, lens, k_scale=ks, v_scale=vs, num_splits=A.default_num_splits(1, 4, 8256, q.device))
    R.assert_close(out, old, "attention_int8" if quant else "attention_bf16")
