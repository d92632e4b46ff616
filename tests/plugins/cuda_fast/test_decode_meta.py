"""decode_meta (one launch) against its torch form: slots and positions of real rows and padding
rows (slot -1, position -1), int32 or int64 inputs, a strided positions view, an empty batch."""

from __future__ import annotations

import pytest
import torch

from ninfer_plugins.cuda_fast.attention import decode_meta, decode_meta_torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_decode_meta_matches_the_torch_form(dtype):
    slots = torch.tensor([3, -1, 0, 7, 2], dtype=dtype, device=DEV)
    grid = torch.tensor([[5, 6], [-1, -1], [0, 1], [4095, 4096], [17, 18]], dtype=dtype, device=DEV)
    positions = grid[:, 1]  # stride 2
    got = decode_meta(8192, slots, positions)
    want = decode_meta_torch(8192, slots.long(), positions.long())
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def test_decode_meta_empty_and_bad_shapes():
    e = torch.zeros(0, dtype=torch.long, device=DEV)
    assert all(t.shape[0] == 0 for t in decode_meta(64, e, e))
    with pytest.raises(ValueError, match="must be"):
        decode_meta(64, torch.zeros(2, dtype=torch.long, device=DEV), torch.zeros(3, dtype=torch.long, device=DEV))
