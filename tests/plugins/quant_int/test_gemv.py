"""The CUDA-core GEMV (quant_int/gemv.py) against dequantize-then-matmul in fp32, every format.

CPU (CI): interpreted at tiny sizes with K and row tails, M = 1..4, split-K with uneven splits.
GPU (`-m gpu`): every registered linear shape at M = 1..4, the PTX decode and the plain one, the
dispatch of kernels.launch, split-K bit-reproducibility.
"""

from __future__ import annotations

import os
import types

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

from ninfer_plugins.quant_int import formats as F  # noqa: E402
from ninfer_plugins.quant_int import gemv as G  # noqa: E402
from ninfer_plugins.quant_int import kernels as K  # noqa: E402
from ninfer_plugins.quant_int.linear import prepare_int  # noqa: E402
from ninfer_plugins.quant_nvfp4 import formats as NF  # noqa: E402
from ninfer_plugins.quant_nvfp4.kernels import prepare_nvfp4  # noqa: E402

SCHEMES = ["q4_g64", "q5_g64", "q6_g64", "q8_g32", "nvfp4"]


def packed_and_ref(w: torch.Tensor, scheme: str):
    if scheme == "nvfp4":
        pk = NF.quantize(w)
        return prepare_nvfp4(pk), NF.dequantize(pk)
    pk = F.quantize(w, scheme)
    return prepare_int(pk), F.dequantize(pk)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))


interp = pytest.mark.skipif(not INTERPRET, reason="interpreter tests run where there is no GPU (CI), or with TRITON_INTERPRET=1")


@interp
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(
    "m,n,k,cfg",
    [
        (1, 70, 200, G.GemvConfig(16, 2, 1, 4)),  # K tail inside a block, row tail
        (3, 64, 256, G.GemvConfig(32, 1, 2, 4)),
        (4, 40, 640, G.GemvConfig(16, 2, 3, 4)),  # 5 K blocks over 3 splits of 2: uneven
        (2, 33, 96, G.GemvConfig(16, 4, 1, 4)),  # one K block, KB clipped
    ],
)
def test_interpreted_gemv_matches_reference(scheme, m, n, k, cfg):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), scheme)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    y = G.launch(x, p, cfg)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert rel_err(y, x.float() @ deq.T) < 6e-3


@interp
def test_interpreted_split_k_reproducible_and_counters_reset():
    g = torch.Generator().manual_seed(3)
    p, deq = packed_and_ref(torch.randn(48, 1024, generator=g), "q4_g64")
    x = torch.randn(4, 1024, generator=g).to(torch.bfloat16)
    a = G.launch(x, p, G.GemvConfig(16, 1, 8, 4))
    b = G.launch(x, p, G.GemvConfig(16, 1, 8, 4))
    assert torch.equal(a, b)
    assert int(K.Workspace.get(torch.device("cpu")).counters.abs().sum()) == 0
    assert rel_err(a, x.float() @ deq.T) < 6e-3


def test_resolve_splits_cover_k_exactly():
    for k in (128, 200, 640, 5120, 17408, 6144):
        n_kb = -(-k // 128)
        for kb in (1, 2, 4):
            for want in (1, 2, 3, 8, 64):
                split, per, even = G.resolve(G.GemvConfig(32, kb, want, 4), k)
                assert (split - 1) * per < n_kb <= split * per
                assert even == (n_kb % per == 0 and per % min(kb, n_kb) == 0)


def test_more_than_four_rows_refused():
    p, _ = packed_and_ref(torch.randn(16, 128), "q4_g64")
    with pytest.raises(ValueError, match="at most 4 rows"):
        G.launch(torch.zeros(5, 128, dtype=torch.bfloat16), p, G.GemvConfig(16, 1, 1, 4))


# --- GPU -------------------------------------------------------------------------------------------

SHAPES = [(12288, 5120), (1024, 5120), (5120, 6144), (10240, 5120), (6144, 5120), (17408, 5120), (5120, 17408),
          (8192, 2048), (512, 2048), (2048, 4096), (4096, 2048), (1024, 2048), (2048, 512)]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")
@pytest.mark.parametrize("scheme", SCHEMES)
def test_gpu_gemv_registered_shapes(scheme):
    g = torch.Generator(device="cuda").manual_seed(11)
    for n, k in SHAPES:
        p, deq = packed_and_ref(torch.randn(n, k, device="cuda", generator=g), scheme)
        cfgs = [G.default_config(p.fmt, n, k, p.sm_count), G.GemvConfig(64, 4, 1, 8), G.GemvConfig(16, 1, 3, 2)]
        for m in (1, 2, 3, 4):
            x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
            ref = x.float() @ deq.T
            for cfg in cfgs:
                for fast in (True, False):
                    y = G.launch(x, p, cfg, fast)
                    assert bool(torch.isfinite(y).all())
                    assert rel_err(y, ref) < 6e-3, (n, k, m, cfg, fast, rel_err(y, ref))
            # the engine's entry point, whichever kernel it picks
            assert rel_err(K.launch(x, p), ref) < 6e-3
        # split-K sums in a fixed order: the same bits every time
        x = torch.randn(1, k, device="cuda", generator=g, dtype=torch.bfloat16)
        cfg = G.GemvConfig(32, 1, 8, 4)
        assert torch.equal(G.launch(x, p, cfg), G.launch(x, p, cfg))
        del p, deq
    torch.cuda.empty_cache()


@interp
@pytest.mark.parametrize("m,n,k,cfg", [(1, 70, 512, G.GemvConfig(16, 2, 2, 4)), (4, 40, 768, G.GemvConfig(32, 1, 2, 4)), (2, 64, 1024, G.GemvConfig(16, 4, 2, 4))])
def test_interpreted_tiled_q4_equals_row_major(m, n, k, cfg):
    """The tile-major q4 layout computes exactly what the row-major one does (same trips, same
    order of sums), rows padded to whole tiles."""
    g = torch.Generator().manual_seed(n + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g), "q4_g64")
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    t = G.tile_layout(p, cfg.block_n, cfg.kb)
    assert t.qweight.numel() == p.qweight.numel()
    torch.testing.assert_close(G.launch(x, t, cfg, tiled=True), G.launch(x, p, cfg), rtol=0, atol=0)
    assert rel_err(G.launch(x, t, cfg, tiled=True), x.float() @ deq.T) < 1e-2
    with pytest.raises(ValueError, match="q4"):
        G.tile_layout(packed_and_ref(torch.randn(n, k, generator=g), "q8_g32")[0], cfg.block_n, cfg.kb)


@interp
@pytest.mark.parametrize("scheme", ["q4_g64", "q5_g64", "q8_g32", "nvfp4"])
def test_interpreted_merged_weight_is_the_parts_stacked(scheme, monkeypatch):
    """TritonQuantLinear.merge_prepared: one launch over the stacked rows gives each part's own
    output, and the parts, re-pointed at row views, still give theirs (GEMV and MMA paths).
    NVFP4 merges only under NINFER_NV_MERGE=1."""
    from ninfer_plugins.quant_int.linear import int_kernels
    from ninfer_plugins.quant_nvfp4.kernels import nvfp4_kernels

    monkeypatch.setenv("NINFER_NV_MERGE", "all")

    kernel = nvfp4_kernels()[0] if scheme == "nvfp4" else int_kernels(scheme)[0]
    g = torch.Generator().manual_seed(11)
    parts = [packed_and_ref(torch.randn(n, 256, generator=g), scheme) for n in (256, 512)]
    merged, views = kernel.merge_prepared([p for p, _ in parts])
    assert merged.n == 768 and [v.n for v in views] == [256, 512]
    assert views[1].qweight.data_ptr() == merged.qweight[256:].data_ptr()
    for m in (1, 5):
        x = torch.randn(m, 256, generator=g).to(torch.bfloat16)
        y = K.launch(x, merged)
        want = torch.cat([x.float() @ deq.T for _, deq in parts], dim=1)
        assert rel_err(y, want) < 6e-3
        assert torch.equal(torch.cat([K.launch(x, v) for v in views], dim=1), y) or rel_err(
            torch.cat([K.launch(x, v) for v in views], dim=1), want) < 6e-3
    padded = packed_and_ref(torch.randn(100, 256, generator=g), scheme)[0]  # rows padded to 256
    assert kernel.merge_prepared([parts[0][0], padded]) is None


def test_nvfp4_parts_stay_apart_unless_asked(monkeypatch):
    """Off by default; NINFER_NV_MERGE=1 merges only where the CUDA GEMV has a winner for the merged
    shape (tuned.TUNED_CU), =all every group."""
    from ninfer_plugins.quant_int.linear import _nv_merge
    from ninfer_plugins.quant_nvfp4.kernels import nvfp4_kernels

    gate_up = [types.SimpleNamespace(n=17408, k=5120)] * 2
    odd = [types.SimpleNamespace(n=256, k=256)] * 2
    for env, want in (("0", (False, False)), ("1", (True, False)), ("all", (True, True))):
        monkeypatch.setenv("NINFER_NV_MERGE", env)
        assert (_nv_merge(gate_up), _nv_merge(odd)) == want, env
    monkeypatch.setenv("NINFER_NV_MERGE", "1")
    monkeypatch.delenv("NINFER_CU_TUNED", raising=False)

    g = torch.Generator().manual_seed(12)
    parts = [packed_and_ref(torch.randn(256, 256, generator=g), "nvfp4")[0] for _ in range(2)]
    assert nvfp4_kernels()[0].merge_prepared(parts) is None
