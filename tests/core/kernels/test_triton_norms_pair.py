"""rmsnorm_pair (the MTP's two input norms and their concatenation in one launch) against the
torch form, fresh random inputs, a width that is not a power of two, fp32 hidden into bf16."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels.triton.norms import rmsnorm_pair
from ninfer_plugins.qwen_hybrid.layers import TORCH_OPS, offset_rms_norm

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n,h", [(1, 64), (3, 80), (4, 200)])
@pytest.mark.parametrize("b_dtype", [torch.bfloat16, torch.float32])
def test_pair_matches_two_norms_and_a_cat(n, h, b_dtype):
    g = torch.Generator().manual_seed(n * 1000 + h)
    a = torch.randn(n, h, generator=g).to(DEV, torch.bfloat16)
    b = (3 * torch.randn(n, h, generator=g)).to(DEV, b_dtype)
    wa, wb = (0.1 * torch.randn(2, h, generator=g)).to(DEV, torch.bfloat16)
    got = rmsnorm_pair(a, wa, b.to(a.dtype), wb, 1e-6)
    want = torch.cat((offset_rms_norm(a, wa, 1e-6), offset_rms_norm(b.to(a.dtype), wb, 1e-6)), dim=-1)
    assert got.shape == (n, 2 * h) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(TORCH_OPS.rms_norm_pair(a, wa, b, wb, 1e-6).float(), want.float(), rtol=0, atol=0)


def test_pair_refuses_mismatched_shapes():
    a = torch.zeros(2, 8, device=DEV)
    with pytest.raises(ValueError, match="must be"):
        rmsnorm_pair(a, torch.zeros(8, device=DEV), torch.zeros(3, 8, device=DEV), torch.zeros(8, device=DEV))
    with pytest.raises(ValueError, match="unit stride"):
        rmsnorm_pair(torch.zeros(8, 2, device=DEV).T, torch.zeros(8, device=DEV), a, torch.zeros(8, device=DEV))
