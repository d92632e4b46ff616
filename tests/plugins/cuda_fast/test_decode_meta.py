"""decode_meta (one launch) against its torch form: slots and positions of real rows and padding
rows (slot -1, position -1), int32 or int64 inputs, a strided positions view, an empty batch; the
verify's grouped form (grouped_meta)."""

from __future__ import annotations

import pytest
import torch

from ninfer_plugins.cuda_fast.attention import decode_meta, decode_meta_torch, grouped_meta

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_decode_meta_matches_the_torch_form(dtype):
    slots = torch.tensor([3, -1, 0, 7, 2], dtype=dtype, device=DEV)
    grid = torch.tensor([[5, 6], [-1, -1], [0, 1], [4095, 4096], [17, 18]], dtype=dtype, device=DEV)
    positions = grid[:, 1]  # stride 2
    got = decode_meta(8192, slots, positions)
    want = decode_meta_torch(8192, slots.long(), positions.long())
    assert got.group is None and want.group is None
    for g, w in zip(got[:3], want[:3]):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)


def test_decode_meta_empty_and_bad_shapes():
    e = torch.zeros(0, dtype=torch.long, device=DEV)
    assert all(t.shape[0] == 0 for t in decode_meta(64, e, e)[:3])
    with pytest.raises(ValueError, match="must be"):
        decode_meta(64, torch.zeros(2, dtype=torch.long, device=DEV), torch.zeros(3, dtype=torch.long, device=DEV))


def test_grouped_meta_takes_each_sequences_slot_and_last_length():
    """Rows b * M + t at start_b + t: a group's block-table row is its slot, its length its last
    row's (position + 1); a padded sequence (slot -1, position -1) has length 0."""
    m = 3
    slots = torch.tensor([4, 4, 4, -1, -1, -1, 0, 0, 0], device=DEV)
    positions = torch.tensor([7, 8, 9, -1, -1, -1, 0, 1, 2], device=DEV)
    meta = grouped_meta(decode_meta(64, slots, positions), m)
    gm, table, lens = meta.group
    assert gm == m and table.shape == (3, 1) and table.stride(0) == m
    assert table[:, 0].tolist() == [4, -1, 0] and lens.tolist() == [10, 0, 3] and lens.is_contiguous()
    assert torch.equal(meta.seq_lens, decode_meta(64, slots, positions).seq_lens)  # the rows' own, kept
