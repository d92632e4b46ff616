"""The fast path's sampler: the reference's eager calls, the fused kernels for captured steps
(interpreted without CUDA), NINFER_FUSED_SAMPLE=0 back to the reference pipeline."""

from __future__ import annotations

import torch

import ninfer.kernels.triton  # noqa: F401  (TRITON_INTERPRET=1 without CUDA)
from ninfer.kernels.sampling import sample_rows
from ninfer.sampling import rows_sampler
from ninfer_plugins.cuda_fast.sampler import TritonSampler


def _inputs(rows=3, vocab=90):
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(rows, vocab, generator=g)
    f = torch.full((rows,), 0.8)
    z = torch.zeros(rows)
    k = torch.full((rows,), 20)
    seeds = torch.randint(-(2**62), 2**62, (rows,), generator=g)
    pos = torch.arange(rows) + 100
    counts = torch.randint(0, 2, (rows + 1, vocab), generator=g).float()
    kw = {"counts": counts, "count_rows": torch.tensor([2, 0, 3])}
    return (logits, f, k, torch.full((rows,), 0.9), z, f * 0.5, z, seeds, pos, 1), kw


def test_the_fused_rows_equal_the_reference(monkeypatch):
    args, kw = _inputs()
    s = TritonSampler()
    assert rows_sampler(s) == s.sample_rows and s.name == "triton"
    got, want = s.sample_rows(*args, **kw), sample_rows(*args, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[1], want[1], rtol=2e-6, atol=1e-7)
    # the distributions only: no token
    assert s.sample_rows(*args[:7], None, None, 0, **kw)[2] is None
    monkeypatch.setenv("NINFER_FUSED_SAMPLE", "0")
    ref = TritonSampler()
    assert not ref.fused
    out = ref.sample_rows(*args, **kw)
    assert all(torch.equal(a, b) for a, b in zip(out, want))


def test_the_plugin_offers_it_on_cuda_only():
    from ninfer_plugins.cuda_fast.plugin import GPU

    assert TritonSampler().requirements is GPU
