"""The speculative round's GDN commit kernel (`commit_columns`) against the torch gather +
index_copy it replaces: every layer, unordered slots, every column, bf16 conv and fp32 state,
sizes that leave a partial block, and slots that are not touched stay as they were."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels.triton import commit_columns

DEV = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _check(L, S, M, tail, dtype, slots, cols, block=4096):
    g = torch.Generator().manual_seed(L * 100 + S * 10 + M)
    src = torch.randn(L, S, M, *tail, generator=g).to(DEV, dtype)
    dst = torch.randn(L, S, *tail, generator=g).to(DEV, dtype)
    s = torch.tensor(slots, dtype=torch.long, device=DEV)
    c = torch.tensor(cols, dtype=torch.long, device=DEV)
    want = dst.clone()
    want.index_copy_(1, s, src[:, s, c])
    commit_columns(dst, src, s, c, block=block)
    assert torch.equal(dst, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slots,cols", [([0], [0]), ([2], [3]), ([3, 1], [1, 0]), ([1, 0, 2], [3, 3, 2])])
def test_commit_matches_the_torch_form(dtype, slots, cols):
    _check(3, 4, 4, (2, 5, 7), dtype, slots, cols, block=64)  # 70 elements a column: a partial block


def test_commit_int32_column_counts_and_one_block():
    L, S, M = 2, 3, 2
    src = torch.arange(L * S * M * 6, dtype=torch.float32, device=DEV).view(L, S, M, 6)
    dst = torch.zeros(L, S, 6, device=DEV)
    commit_columns(dst, src, torch.tensor([2], dtype=torch.int32, device=DEV), torch.tensor([1], dtype=torch.int32, device=DEV))
    assert torch.equal(dst[:, 2], src[:, 2, 1]) and bool((dst[:, :2] == 0).all())


def test_commit_refuses_bad_inputs():
    src = torch.zeros(2, 3, 4, 5, device=DEV)
    s = torch.zeros(1, dtype=torch.long, device=DEV)
    with pytest.raises(ValueError, match="need"):
        commit_columns(torch.zeros(2, 3, 6, device=DEV), src, s, s)
    with pytest.raises(ValueError, match="one dtype"):
        commit_columns(torch.zeros(2, 3, 5, device=DEV, dtype=torch.bfloat16), src, s, s)
    with pytest.raises(ValueError, match="contiguous"):
        commit_columns(torch.zeros(2, 5, 3, device=DEV).transpose(1, 2), src, s, s)
    with pytest.raises(ValueError, match=r"must be \[B\]"):
        commit_columns(torch.zeros(2, 3, 5, device=DEV), src, s, torch.zeros(2, dtype=torch.long, device=DEV))


@gpu
@needs_gpu
def test_commit_real_shapes_gpu():
    """The 27B's 48 GDN layers: recurrent state [48, slots, 48, 128, 128] fp32 with 4 columns, the
    conv state [48, slots, 10240, 3] bf16, two sequences."""
    _check(48, 3, 4, (48, 128, 128), torch.float32, [2, 0], [3, 1])
    _check(48, 3, 4, (10240, 3), torch.bfloat16, [2, 0], [0, 2])
