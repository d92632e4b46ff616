"""argmax_rows (a draft step's proposal: argmax over the head's logits, mapped through a
shortlist's ids, written into a column of the round's drafts) against torch.argmax: fresh random
rows, ties (the first maximum wins), a row of -inf, several chunks with a tail, strided out."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels.triton.sample import argmax_rows

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("b,v,chunk", [(1, 100, 32), (3, 1000, 128), (2, 4096, 4096), (4, 777, 64)])
@pytest.mark.parametrize("mapped", [False, True])
def test_argmax_rows_matches_torch(b, v, chunk, mapped):
    g = torch.Generator().manual_seed(b * 7 + v)
    logits = torch.randn(b, v, generator=g).to(DEV, torch.bfloat16)
    # ties: the row's maximum placed again later, in another chunk and in the same one
    logits[0, v // 2] = logits[0].max() + 1
    logits[0, v - 1] = logits[0, v // 2]
    logits[0, v // 2 + 1] = logits[0, v // 2]
    id_map = torch.randperm(5 * v, generator=g)[:v].to(DEV) if mapped else None
    want = logits.float().argmax(-1)
    if mapped:
        want = id_map[want]
    assert torch.equal(argmax_rows(logits, id_map, chunk=chunk), want)
    # again: each row's last program left its counter at zero
    assert torch.equal(argmax_rows(logits, id_map, chunk=chunk), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("b,v", [(1, 131072), (4, 248320)])
def test_argmax_rows_real_heads_gpu(b, v):
    """The shortlist head's and the full head's widths, chunks racing for real, twenty draws."""
    for seed in range(20):
        g = torch.Generator(device="cuda").manual_seed(seed)
        logits = torch.randn(b, v, device="cuda", generator=g).bfloat16()
        id_map = torch.randperm(v, device="cuda", generator=g)
        assert torch.equal(argmax_rows(logits, id_map), id_map[logits.float().argmax(-1)])


def test_argmax_rows_edge_rows_and_strided_out():
    logits = torch.full((2, 50), float("-inf"), device=DEV)
    logits[1, 17] = 3.0
    drafts = torch.full((2, 3), -1, dtype=torch.int64, device=DEV)
    argmax_rows(logits, out=drafts[:, 1], chunk=16)
    assert drafts[:, 1].tolist() == [0, 17] and bool((drafts[:, 0] == -1).all()) and bool((drafts[:, 2] == -1).all())


def test_argmax_rows_shapes_with_equal_products():
    """Scratch for (rows, chunks) = (1, 8) then (2, 4): each row has its own counter."""
    for b, v in ((1, 8 * 16), (2, 4 * 16)):
        logits = torch.randn(b, v, device=DEV)
        assert torch.equal(argmax_rows(logits, chunk=16), logits.argmax(-1))


def test_argmax_rows_refuses_bad_inputs():
    x = torch.zeros(2, 8, device=DEV)
    with pytest.raises(ValueError, match="unit last stride"):
        argmax_rows(x.T)
    with pytest.raises(ValueError, match="id_map"):
        argmax_rows(x, torch.zeros(7, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match="int64"):
        argmax_rows(x, out=torch.zeros(2, dtype=torch.int32, device=DEV))


def test_argmax_rows_all_nan_row_stays_in_bounds():
    """A row with no comparable logit finds no maximum; the id stays inside the row (and the id
    map), so the next draft step's embedding lookup cannot read past the table."""
    logits = torch.randn(3, 300, device=DEV)
    logits[1] = float("nan")
    id_map = torch.arange(1000, 1300, device=DEV)
    got = argmax_rows(logits, chunk=128)
    assert 0 <= int(got[1]) < 300
    assert torch.equal(got[[0, 2]], logits[[0, 2]].argmax(-1))
    mapped = argmax_rows(logits, id_map, chunk=128)
    assert 1000 <= int(mapped[1]) < 1300
