"""The batched round's acceptance on candidates (speculative.judge) against the dense functions it
replaced (scatter_probs, point_mass_accepts, residual_without, draw), and sample_rows' counts."""

from __future__ import annotations

import torch

from ninfer.kernels.sampling import (
    counter_uniform,
    draw,
    point_mass_accepts,
    process,
    residual_without,
    sample_rows,
    scatter_probs,
)
from ninfer.sampling import Purpose
from ninfer.speculative import judge


def _dense(cand, p, drafts, seeds, starts, vocab):
    b, k = drafts.shape
    m = k + 1
    probs = scatter_probs(cand.reshape(b * m, -1), p.reshape(b * m, -1), vocab).view(b, m, vocab)
    pos = starts[:, None] + torch.arange(m)
    u = counter_uniform(seeds[:, None], pos[:, 1:], int(Purpose.SPEC_ACCEPT))
    ok = point_mass_accepts(probs[:, :k].reshape(b * k, vocab), drafts.reshape(-1), u.reshape(-1)).view(b, k)
    accepted = torch.cumprod(ok.to(torch.int64), 1).sum(1)
    at = accepted[:, None]
    dist = probs.gather(1, at[:, :, None].expand(b, 1, vocab))[:, 0]
    rejected = torch.cat((drafts, drafts[:, :1]), 1).gather(1, at)[:, 0]
    corrected = accepted < k
    dist = torch.where(corrected[:, None], residual_without(dist, rejected), dist)
    purpose = torch.where(corrected, int(Purpose.SPEC_CORRECTION), int(Purpose.SPEC_BONUS))
    last = draw(dist, counter_uniform(seeds, starts + 1 + accepted, purpose))
    return accepted, torch.cat((drafts, last[:, None]), 1).scatter(1, at, last[:, None])


def test_judge_on_candidates_keeps_the_dense_tokens():
    g = torch.Generator().manual_seed(0)
    b, k, vocab = 64, 3, 40
    m = k + 1
    logits = torch.randn(b * m, vocab, generator=g) * 3
    drafts = torch.randint(0, vocab, (b, k), generator=g)
    # half the drafts are their column's argmax, so every count of accepted drafts occurs
    top = logits.view(b, m, vocab)[:, :k].argmax(-1)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.6, top, drafts)
    temp = torch.rand(b * m, generator=g) * 1.5 + 0.2
    top_k = torch.randint(1, 21, (b * m,), generator=g)
    top_p = torch.rand(b * m, generator=g)
    min_p = torch.rand(b * m, generator=g) * 0.2
    zeros = torch.zeros(b * m)
    cand, p = process(logits, temp, top_k, top_p, min_p, zeros, zeros, None)
    seeds = torch.randint(-(2**62), 2**62, (b,), generator=g)
    starts = torch.randint(0, 1000, (b,), generator=g)
    got = judge(cand.view(b, m, -1), p.view(b, m, -1), drafts, seeds, starts, vocab)
    want = _dense(cand.view(b, m, -1), p.view(b, m, -1), drafts, seeds, starts, vocab)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    seen = set(got[0].tolist())
    assert seen == {0, 1, 2, 3}, seen  # rejections at every column and full acceptance
    # a wrong uniform position changes some outcome: the check can fail
    shifted = judge(cand.view(b, m, -1), p.view(b, m, -1), drafts, seeds, starts + 1, vocab)
    assert not torch.equal(shifted[1], want[1])


def test_sample_rows_reads_counts_by_row_and_adds_the_drafts_before():
    g = torch.Generator().manual_seed(1)
    rows, vocab, e = 5, 30, 3
    logits = torch.randn(rows, vocab, generator=g)
    table = torch.randint(0, 3, (4, vocab), generator=g).float()
    count_rows = torch.tensor([3, 0, 3, 1, 2])
    extra = torch.randint(0, vocab, (rows, e), generator=g)
    extra_len = torch.tensor([0, 1, 2, 3, 3])
    temp = torch.full((rows,), 0.7)
    top_k = torch.full((rows,), 20)
    top_p = torch.full((rows,), 0.9)
    min_p = torch.zeros(rows)
    pres, freq = torch.full((rows,), 0.5), torch.full((rows,), 0.25)
    ids, p, tok = sample_rows(logits, temp, top_k, top_p, min_p, pres, freq, torch.arange(rows), torch.arange(rows), 1,
                              counts=table, count_rows=count_rows, extra_ids=extra, extra_len=extra_len)
    counts = table[count_rows].clone()
    for r in range(rows):
        for j in range(int(extra_len[r])):
            counts[r, extra[r, j]] += 1
    want_ids, want_p = process(logits, temp, top_k, top_p, min_p, pres, freq, counts)
    assert torch.equal(ids, want_ids) and torch.equal(p, want_p)
    assert tok.shape == (rows,) and all(int(t) in ids[r].tolist() for r, t in enumerate(tok))
