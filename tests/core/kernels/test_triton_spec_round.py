"""A batched round's bookkeeping kernels (`ninfer.kernels.triton.spec_round`) against the torch
ops they replace (`SpeculativeRound._verify`'s first lines and `_round_step`'s last), on fresh
random inputs: batch sizes 1..5 over a table with more slots than sequences, K = 1..5, every
accepted count, strided views as the round passes them. Interpreted without CUDA; `-m gpu` runs
the same on the device."""

from __future__ import annotations

import pytest
import torch

import ninfer.kernels.triton  # noqa: F401  (TRITON_INTERPRET=1 without CUDA)
from ninfer.kernels.triton.spec_round import round_inputs, round_outputs

CUDA = torch.cuda.is_available()


def _case(g, b, k, n, device):
    table = torch.randint(0, 1000, (n, k), generator=g)
    slots = torch.randperm(n, generator=g)[:b]
    # the round's inputs are rows of one [5, n] buffer: views with a unit stride
    ints = torch.randint(0, 1 << 20, (5, n), generator=g)
    ints[2, :b] = slots
    return table.to(device), ints.to(device)


def _torch_inputs(table, slots, anchor, starts):
    b, m = slots.shape[0], table.shape[1] + 1
    drafts = table.index_select(0, slots)
    return (drafts, torch.cat((anchor[:, None], drafts), 1), starts[:, None] + torch.arange(m, device=table.device),
            slots[:, None].expand(b, m).reshape(-1))  # fmt: skip


def _check_both(device):
    g = torch.Generator().manual_seed(11)
    for k in (1, 3, 5):
        for b in (1, 2, 5):
            table, ints = _case(g, b, k, 7, "cpu")
            table, ints = table.to(device), ints.to(device)
            anchor, starts, slots = ints[0, :b], ints[1, :b], ints[2, :b]
            got = round_inputs(table, slots, anchor, starts)
            for x, y in zip(got, _torch_inputs(table, slots, anchor, starts)):
                assert torch.equal(x, y)
            m = k + 1
            accepted = torch.randint(0, m, (b,), generator=g).to(device)
            kept = torch.randint(0, 1000, (b, m), generator=g).to(device)
            new = torch.randint(0, 1000, (b, k), generator=g).to(device)
            want_table, got_table = table.clone(), table.clone()
            want_out = torch.zeros(7, k + 2, dtype=torch.int64, device=device)
            got_out = torch.full((7, k + 2), -5, dtype=torch.int64, device=device)
            got_out[b:] = 0
            want_next = torch.zeros(2, 7, dtype=torch.int64, device=device)
            got_next = want_next.clone()
            want_table.index_copy_(0, slots, new)
            want_out[:b, :m].copy_(kept)
            want_out[:b, m].copy_(accepted)
            want_next[0, :b].copy_(kept.gather(1, accepted[:, None])[:, 0])
            want_next[1, :b].copy_(starts + accepted + 1)
            round_outputs(kept, accepted, new, slots, starts, got_table, got_out, got_next)
            assert torch.equal(got_table, want_table)
            assert torch.equal(got_out, want_out)
            assert torch.equal(got_next, want_next)


@pytest.mark.skipif(CUDA, reason="interpreted on the CPU; the -m gpu test runs it on the device")
def test_round_io_matches_the_torch_ops():
    _check_both("cpu")


def test_round_io_refuses_bad_inputs():
    table = torch.zeros(4, 3, dtype=torch.int64)
    one = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="slots"):
        round_inputs(table, one.int(), one, one)
    with pytest.raises(ValueError, match="starts"):
        round_inputs(table, one, one, torch.zeros(3, dtype=torch.int64))
    kept = torch.zeros(2, 4, dtype=torch.int64)
    new = torch.zeros(2, 3, dtype=torch.int64)
    out = torch.zeros(4, 5, dtype=torch.int64)
    nxt = torch.zeros(2, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="kept"):
        round_outputs(kept[:, :3], one, new, one, one, table, out, nxt)
    with pytest.raises(ValueError, match="out"):
        round_outputs(kept, one, new, one, one, table, out[:, :4], nxt)
    with pytest.raises(ValueError, match="next_in"):
        round_outputs(kept, one, new, one, one, table, out, nxt[:1])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_round_io_matches_the_torch_ops_on_the_gpu():
    _check_both("cuda")
