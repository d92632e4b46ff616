"""Fused small ops against the torch oracle: residual add + RMSNorm (offset and plain), the GDN
gated RMSNorm, SwiGLU and the attention output gate, at odd widths (tails) and real widths."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import reference as R
from ninfer.kernels.triton import gated_rmsnorm, rmsnorm, sigmoid_gate, swiglu
from ninfer.kernels.triton.launch import interpreting

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _randn(*shape, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).bfloat16().to(DEV)


def _check_add_rmsnorm(N, H, offset, seed):
    x, res, w = _randn(N, H, seed=seed), _randn(N, H, seed=seed + 1), _randn(H, scale=0.1, seed=seed + 2)
    res0 = res.clone()
    y = rmsnorm(x, w, offset=offset, residual=res)
    new_res, ref = R.add_rmsnorm(x, res0, w, offset=offset)
    if interpreting():
        # the interpreter rounds fp32 -> bf16 by truncation: allow one bf16 ulp there
        assert bool(((res.float() - new_res.float()).abs() <= new_res.float().abs() * 2**-7).all())
    else:
        assert torch.equal(res, new_res)
    R.assert_close(y, ref, "bf16_reduction")
    R.assert_close(rmsnorm(x, w, offset=offset), R.rmsnorm(x, w, offset=offset), "bf16_reduction")


@pytest.mark.parametrize("offset", [True, False])
@pytest.mark.parametrize("H", [300, 512])
def test_add_rmsnorm(offset, H):
    _check_add_rmsnorm(3, H, offset, seed=H)


def test_gated_rmsnorm_tail_rows():
    # 5 x 3 = 15 rows with 16 rows per program: one partial tile; z a strided view
    x, zz, w = _randn(5, 3, 64, seed=1), _randn(5, 3, 128, seed=2), _randn(64, scale=0.1, seed=3)
    z = zz[..., :64]
    R.assert_close(gated_rmsnorm(x, z, w), R.gated_rmsnorm(x, z, w), "bf16_reduction")


def test_swiglu_tail():
    gu = _randn(4, 2 * 2100, seed=4)  # 2100 columns: one full 2048 block and a tail
    R.assert_close(swiglu(gu), R.swiglu(gu), "bf16_elementwise")


def test_sigmoid_gate_strided():
    qg = _randn(4, 3, 128, seed=5)  # per head [x | gate]
    x, g = qg[..., :64], qg[..., 64:]
    R.assert_close(sigmoid_gate(x, g), R.sigmoid_gate(x, g), "bf16_elementwise")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("N", [1, 7])
@pytest.mark.parametrize("offset", [True, False])
@pytest.mark.parametrize("H", [5120, 2048])
def test_rmsnorm_real_widths_gpu(N, offset, H):
    _check_add_rmsnorm(N, H, offset, seed=N + H)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("N", [1, 300])
def test_real_shapes_gpu(N):
    o, z, w = _randn(N, 48, 128, seed=6), _randn(N, 48 * 128, seed=7).view(N, 48, 128), _randn(128, scale=0.1, seed=8)
    R.assert_close(gated_rmsnorm(o, z, w), R.gated_rmsnorm(o, z, w), "bf16_reduction")
    gu = _randn(N, 2 * 17408, seed=9)
    R.assert_close(swiglu(gu), R.swiglu(gu), "bf16_elementwise")
    qg = _randn(N, 24, 512, seed=10)
    R.assert_close(sigmoid_gate(qg[..., :256], qg[..., 256:]), R.sigmoid_gate(qg[..., :256], qg[..., 256:]),
                   "bf16_elementwise")
