"""The fused sampler (`ninfer.kernels.triton.sample`) against the reference pipeline
(`ninfer.kernels.sampling.sample_rows`) on fresh random inputs: the candidates' ids exactly, the
probabilities to float rounding, the drawn token, and the uniform bit for bit.

Without CUDA the kernels run under TRITON_INTERPRET=1 at small vocabularies with small chunks (so
rows span several chunks and a tail); `-m gpu` runs the real vocabulary on the device."""

from __future__ import annotations

import pytest
import torch

import ninfer.kernels.triton  # noqa: F401  (TRITON_INTERPRET=1 without CUDA, before any kernel is decorated)
from ninfer.kernels.sampling import counter_uniform, sample_rows
from ninfer.kernels.triton.sample import fused_sample, uniform

CUDA = torch.cuda.is_available()
# the kernels on CPU tensors: interpreted, so only where there is no GPU (the -m gpu tests run them there)
INTERPRETED = pytest.mark.skipif(CUDA, reason="interpreted on the CPU; the -m gpu tests cover the device")


def _case(g, rows, vocab, dtype, device, *, penalties=True, extra=True):
    logits = torch.randn(rows, vocab, generator=g) * 3
    # ties (one value repeated over a run of ids), -inf entries, a row that is mostly -inf
    logits[0, 3 : 3 + vocab // 4] = logits[0, 1]
    logits[-1, : vocab // 2] = float("-inf")
    if rows > 2:
        logits[1, vocab // 3 :] = float("-inf")
    logits = logits.to(dtype)
    t = [0.3, 1.0, 2.0, 0.7, 1.3]
    k = [20, 1, 7, 20, 13]
    p = [0.5, 1.0, 0.0, 0.9, 0.95]
    mp = [0.0, 0.1, 0.0, 0.05, 0.0]
    params = {
        "temperature": torch.tensor([t[r % 5] for r in range(rows)]),
        "top_k": torch.tensor([min(k[r % 5], vocab) for r in range(rows)]),
        "top_p": torch.tensor([p[r % 5] for r in range(rows)]),
        "min_p": torch.tensor([mp[r % 5] for r in range(rows)]),
        "presence": torch.rand(rows, generator=g) if penalties else torch.zeros(rows),
        "frequency": torch.rand(rows, generator=g) * 0.5 if penalties else torch.zeros(rows),
        "seeds": torch.randint(-(2**63), 2**63 - 1, (rows,), generator=g),
        "positions": torch.randint(0, 1 << 40, (rows,), generator=g),
    }
    kw = {}
    if penalties:
        kw["counts"] = torch.randint(0, 3, (rows + 2, vocab), generator=g).float().to(device)
        kw["count_rows"] = torch.randperm(rows + 2, generator=g)[:rows].to(device)
        if extra:
            kw["extra_ids"] = torch.randint(0, vocab, (rows, 3), generator=g).to(device)
            kw["extra_len"] = torch.randint(0, 4, (rows,), generator=g).to(device)
    params = {n: v.to(device) for n, v in params.items()}
    return logits.to(device), params, kw


def _args(logits, params, purpose):
    p = params
    return (logits, p["temperature"], p["top_k"], p["top_p"], p["min_p"], p["presence"], p["frequency"],
            p["seeds"], p["positions"], purpose)  # fmt: skip


def _check(got, want):
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=2e-6, atol=1e-7)
    assert torch.equal(got[2], want[2])


@INTERPRETED
@pytest.mark.parametrize("vocab", [7, 300, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_sample_matches_the_reference(vocab, dtype):
    g = torch.Generator().manual_seed(vocab + (dtype == torch.bfloat16))
    for penalties, extra in ((False, False), (True, False), (True, True)):
        logits, params, kw = _case(g, 5, vocab, dtype, "cpu", penalties=penalties, extra=extra)
        purpose = torch.randint(0, 6, (5,), generator=g)
        got = fused_sample(*_args(logits, params, purpose), chunk=64, **kw)
        _check(got, sample_rows(*_args(logits, params, purpose), **kw))
        # without seeds: the distributions only
        ids, probs, token = fused_sample(*_args(logits, params, 1)[:7], None, None, 0, chunk=128, **kw)
        assert token is None and torch.equal(ids, got[0]) and torch.equal(probs, got[1])


@INTERPRETED
def test_fused_sample_draws_like_the_reference_over_many_uniforms():
    """One row, many seeds: the token follows the reference's inverse CDF everywhere, and a
    different purpose changes some draws (so the uniform is really used)."""
    g = torch.Generator().manual_seed(5)
    rows, vocab = 64, 200
    logits = (torch.randn(1, vocab, generator=g) * 1.5).expand(rows, vocab).contiguous()
    ones = torch.ones(rows)
    params = {"temperature": ones, "top_k": torch.full((rows,), 20), "top_p": torch.full((rows,), 0.95),
              "min_p": torch.zeros(rows), "presence": torch.zeros(rows), "frequency": torch.zeros(rows),
              "seeds": torch.randint(-(2**62), 2**62, (rows,), generator=g), "positions": torch.arange(rows)}  # fmt: skip
    got = fused_sample(*_args(logits, params, 1), chunk=64)
    _check(got, sample_rows(*_args(logits, params, 1)))
    assert len(set(got[2].tolist())) > 3
    other = fused_sample(*_args(logits, params, 2), chunk=64)[2]
    assert not torch.equal(other, got[2])


def _grouped_case(g, seqs, m, vocab, device):
    """A speculative round's sampling inputs: seqs sequences of m columns each, the processing
    parameters, counts row and drafts given per sequence, extra_len per column."""
    logits, params, kw = _case(g, seqs * m, vocab, torch.float32, device)
    per_seq = {n: params[n][::m].clone() for n in ("temperature", "top_k", "top_p", "min_p", "presence", "frequency")}
    gkw = {"counts": kw["counts"], "count_rows": kw["count_rows"][::m].clone(),
           "extra_ids": kw["extra_ids"][::m].clone(), "extra_len": torch.arange(seqs * m, device=device) % m}  # fmt: skip
    rows = {n: v.repeat_interleave(m, 0) for n, v in per_seq.items()}
    rkw = dict(gkw, count_rows=gkw["count_rows"].repeat_interleave(m, 0), extra_ids=gkw["extra_ids"].repeat_interleave(m, 0))
    grouped = dict(params, **per_seq)
    expanded = dict(params, **rows)
    return logits, grouped, gkw, expanded, rkw


@INTERPRETED
@pytest.mark.parametrize("seqs,m", [(1, 4), (3, 2), (2, 6)])
def test_grouped_parameters_equal_the_expanded_rows(seqs, m):
    """group = m (a round's columns share their sequence's parameters, counts row and drafts):
    the same candidates, probabilities and tokens as the same parameters repeated per row, in the
    fused kernels and in the reference; a group that does not divide the rows is refused."""
    g = torch.Generator().manual_seed(10 * seqs + m)
    logits, grouped, gkw, expanded, rkw = _grouped_case(g, seqs, m, 300, "cpu")
    want = sample_rows(*_args(logits, expanded, 1), **rkw)
    _check(fused_sample(*_args(logits, grouped, 1), chunk=64, group=m, **gkw), want)
    _check(sample_rows(*_args(logits, grouped, 1), group=m, **gkw), want)
    with pytest.raises(ValueError, match="group"):
        fused_sample(*_args(logits, grouped, 1), group=m + 1 if (seqs * m) % (m + 1) else m + 2, **gkw)


def test_rows_sampler_expands_groups_for_a_sampler_without_the_keyword():
    from ninfer.sampling import rows_sampler

    seen = {}

    class Old:
        def sample_rows(self, logits, temperature, top_k, top_p, min_p, presence, frequency, seeds, positions,
                        purpose, *, counts=None, count_rows=None, extra_ids=None, extra_len=None):  # fmt: skip
            seen["rows"] = (temperature.shape[0], count_rows.shape[0], extra_ids.shape[0])
            return sample_rows(logits, temperature, top_k, top_p, min_p, presence, frequency, seeds, positions,
                               purpose, counts=counts, count_rows=count_rows, extra_ids=extra_ids, extra_len=extra_len)  # fmt: skip

    g = torch.Generator().manual_seed(4)
    logits, grouped, gkw, expanded, rkw = _grouped_case(g, 2, 3, 100, "cpu")
    got = rows_sampler(Old())(*_args(logits, grouped, 1), group=3, **gkw)
    assert seen["rows"] == (6, 6, 6)
    _check(got, sample_rows(*_args(logits, expanded, 1), **rkw))


def _record_case(g, device):
    """A decode step's sampling: 5 rows, the last two padding rows (count row -1) sharing the pad
    row, bf16 logits, penalties read from the counts the step then adds its tokens to."""
    logits, params, kw = _case(g, 5, 300, torch.bfloat16, device, extra=False)
    rows = kw["count_rows"].clone()
    rows[3:] = -1
    pad = kw["counts"].shape[0] - 1
    return logits, params, kw["counts"], rows, pad


def _old_step(logits, params, counts, rows, pad):
    """What the decode step did before the sampler recorded: the pad row mapped, the sampler's
    fp32 logits, then a scatter_add of ones and a copy."""
    crow = torch.where(rows >= 0, rows, pad)
    got = sample_rows(*_args(logits.float(), params, 1), counts=counts, count_rows=crow)
    vocab = logits.shape[-1]
    counts.view(-1).scatter_add_(0, crow * vocab + got[2], torch.ones_like(got[2], dtype=torch.float32))
    return got


@INTERPRETED
def test_recording_the_draw_equals_the_old_step():
    """pad_row + record + token_out (the captured decode step's whole tail in the sampler): the
    same tokens and the same counts afterwards as mapping the pad rows, sampling the fp32 copy
    of the logits, then scatter-adding the tokens, in the fused kernels and in the reference."""
    g = torch.Generator().manual_seed(21)
    logits, params, counts, rows, pad = _record_case(g, "cpu")
    want_counts = counts.clone()
    want = _old_step(logits, params, want_counts, rows, pad)
    for fn in (fused_sample, sample_rows):
        c = counts.clone()
        out = torch.full((5,), -1, dtype=torch.int64)
        extra = {"chunk": 64} if fn is fused_sample else {}
        got = fn(*_args(logits, params, 1), counts=c, count_rows=rows, pad_row=pad, record=True, token_out=out, **extra)
        _check(got, want)
        assert got[2] is out and torch.equal(out, want[2])
        assert torch.equal(c, want_counts), fn.__name__
    with pytest.raises(ValueError, match="record needs"):
        fused_sample(*_args(logits, params, 1)[:7], None, None, 0, counts=counts, count_rows=rows, record=True)
    with pytest.raises(ValueError, match="token_out"):
        fused_sample(*_args(logits, params, 1), token_out=torch.zeros(4, dtype=torch.int64))


def test_rows_sampler_records_for_a_sampler_without_the_keywords():
    from ninfer.sampling import rows_sampler

    class Old:
        def sample_rows(self, logits, temperature, top_k, top_p, min_p, presence, frequency, seeds, positions,
                        purpose, *, counts=None, count_rows=None, extra_ids=None, extra_len=None):  # fmt: skip
            return sample_rows(logits, temperature, top_k, top_p, min_p, presence, frequency, seeds, positions,
                               purpose, counts=counts, count_rows=count_rows, extra_ids=extra_ids, extra_len=extra_len)  # fmt: skip

    g = torch.Generator().manual_seed(22)
    logits, params, counts, rows, pad = _record_case(g, "cpu")
    want_counts = counts.clone()
    want = _old_step(logits, params, want_counts, rows, pad)
    out = torch.zeros(5, dtype=torch.int64)
    got = rows_sampler(Old())(*_args(logits, params, 1), counts=counts, count_rows=rows, pad_row=pad, record=True,
                              token_out=out)  # fmt: skip
    _check(got, want)
    assert torch.equal(out, want[2]) and torch.equal(counts, want_counts)
    wrapped = rows_sampler(Old())
    with pytest.raises(ValueError, match="group"):
        wrapped(*_args(logits, params, 1), group=2)
    with pytest.raises(ValueError, match="record needs"):
        wrapped(*_args(logits, params, 1), record=True)
    with pytest.raises(ValueError, match="token_out"):
        wrapped(*_args(logits, params, 1)[:7], None, None, 0, token_out=out)


def test_uniform_is_counter_uniform_bit_for_bit():
    g = torch.Generator().manual_seed(3)
    seeds = torch.randint(-(2**63), 2**63 - 1, (7, 1), generator=g)
    pos = torch.randint(0, 1 << 59, (1, 9), generator=g)
    for purpose in (0, 5, torch.randint(0, 8, (7, 9), generator=g)):
        assert torch.equal(uniform(seeds, pos, purpose), counter_uniform(seeds, pos, purpose))


def test_fused_sample_refuses_bad_inputs():
    logits = torch.randn(2, 50)
    z = torch.zeros(2)
    k = torch.full((2,), 20)
    s = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="temperature"):
        fused_sample(logits, torch.zeros(3), k, z, z, z, z, s, s, 1)
    with pytest.raises(ValueError, match="top_k"):
        fused_sample(logits, z, k.float(), z, z, z, z, s, s, 1)
    with pytest.raises(ValueError, match="logits"):
        fused_sample(logits.t(), z, k, z, z, z, z, s, s, 1)
    with pytest.raises(ValueError, match="count_rows"):
        fused_sample(logits, z, k, z, z, z, z, s, s, 1, counts=torch.zeros(2, 50))
    with pytest.raises(ValueError, match="counts must be float32"):
        fused_sample(logits, z, k, z, z, z, z, s, s, 1, counts=torch.zeros(2, 49), count_rows=s)
    with pytest.raises(ValueError, match="chunk"):
        fused_sample(logits, z, k, z, z, z, z, s, s, 1, chunk=100)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 4, 8])
def test_fused_sample_matches_the_reference_on_the_gpu(rows):
    g = torch.Generator().manual_seed(rows)
    vocab = 248320
    for penalties in (False, True):
        logits, params, kw = _case(g, rows, vocab, torch.bfloat16, "cuda", penalties=penalties)
        got = fused_sample(*_args(logits, params, 1), **kw)
        want = sample_rows(*_args(logits, params, 1), **kw)
        _check(got, want)
    if rows == 8:  # the decode step's tail: padding rows, the draw recorded, tokens out
        logits, params, counts, crow, pad = _record_case(g, "cuda")
        want_counts = counts.clone()
        want = _old_step(logits, params, want_counts, crow, pad)
        out = torch.zeros(5, dtype=torch.int64, device="cuda")
        _check(fused_sample(*_args(logits, params, 1), counts=counts, count_rows=crow, pad_row=pad, record=True,
                            token_out=out), want)  # fmt: skip
        assert torch.equal(counts, want_counts)
    if rows in (4, 8):  # a round's columns: parameters per sequence of 4
        logits, grouped, gkw, expanded, rkw = _grouped_case(g, rows // 4, 4, vocab, "cuda")
        _check(fused_sample(*_args(logits, grouped, 1), group=4, **gkw), sample_rows(*_args(logits, expanded, 1), **rkw))
    seeds = torch.randint(-(2**63), 2**63 - 1, (64, 1), generator=g).cuda()
    pos = torch.randint(0, 1 << 40, (1, 33), generator=g).cuda()
    assert torch.equal(uniform(seeds, pos, 3), counter_uniform(seeds, pos, 3))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_fused_sample_in_a_cuda_graph():
    g = torch.Generator().manual_seed(9)
    logits, params, kw = _case(g, 4, 248320, torch.bfloat16, "cuda")
    args = _args(logits, params, 1)
    want = fused_sample(*args, **kw)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fused_sample(*args, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_sample(*args, **kw)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(out, want):
        assert torch.equal(a, b)


@INTERPRETED
def test_top_p_one_keeps_weights_below_the_sum_s_rounding():
    """top_p = 1 keeps every top_k candidate even where the running sum no longer moves (weights
    of e^-20 after a weight of 1): the filter's `top_p >= 1` clause, not the comparison."""
    vocab = 100
    logits = torch.full((2, vocab), -40.0)
    logits[:, 0] = 0.0
    logits[:, 1:6] = torch.tensor([-20.0, -20.5, -21.0, -21.5, -22.0])
    one = torch.ones(2)
    z = torch.zeros(2)
    k = torch.full((2,), 20)
    top_p = torch.tensor([1.0, 0.999999])
    seeds = torch.zeros(2, dtype=torch.int64)
    ids, probs, _ = fused_sample(logits, one, k, top_p, z, z, z, seeds, seeds, 1, chunk=32)
    want = sample_rows(logits, one, k, top_p, z, z, z, seeds, seeds, 1)
    assert torch.equal(ids, want[0]) and torch.equal(probs > 0, want[1] > 0)
    assert int((probs[0] > 0).sum()) == 20 and int((probs[1] > 0).sum()) == 1


def _rounds(g, b, k, vocab, device):
    from ninfer.kernels.sampling import process

    m = k + 1
    logits = torch.randn(b * m, vocab, generator=g) * 3
    top = logits.view(b, m, vocab)[:, :k].argmax(-1)
    drafts = torch.where(torch.rand(b, k, generator=g) < 0.6, top, torch.randint(0, vocab, (b, k), generator=g))
    temp = torch.rand(b * m, generator=g) * 1.5 + 0.2
    top_k = torch.randint(1, 21, (b * m,), generator=g)
    zeros = torch.zeros(b * m)
    cand, p = process(logits, temp, top_k, torch.rand(b * m, generator=g), torch.rand(b * m, generator=g) * 0.2,
                      zeros, zeros, None)  # fmt: skip
    seeds = torch.randint(-(2**63), 2**63 - 1, (b,), generator=g)
    starts = torch.randint(0, 1 << 30, (b,), generator=g)
    slots = torch.randperm(b + 5, generator=g)[:b]
    out = (cand.view(b, m, -1), p.view(b, m, -1), drafts, seeds, starts)
    return tuple(t.to(device) for t in out), slots.to(device)


@INTERPRETED
@pytest.mark.parametrize("k", [1, 3, 5])
def test_fused_judge_matches_the_reference(k):
    from ninfer.speculative import judge

    from ninfer.kernels.triton.sample import fused_judge

    g = torch.Generator().manual_seed(k)
    b, vocab = 48, 40
    args, slots = _rounds(g, b, k, vocab, "cpu")
    c_ref, c_got = torch.ones(b + 5, vocab), torch.ones(b + 5, vocab)
    want = judge(*args, vocab, c_ref, slots)
    got = fused_judge(*args, vocab, c_got, slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(c_got, c_ref)
    assert set(want[0].tolist()) == set(range(k + 1))  # every outcome occurs
    got2 = fused_judge(*args, vocab)  # no history
    assert torch.equal(got2[1], want[1])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_fused_judge_matches_the_reference_on_the_gpu():
    from ninfer.speculative import judge

    from ninfer.kernels.triton.sample import fused_judge

    g = torch.Generator().manual_seed(11)
    b, k, vocab = 64, 3, 248320
    args, slots = _rounds(g, b, k, 300, "cuda")
    c_ref = torch.zeros(b + 5, vocab, device="cuda")
    c_got = c_ref.clone()
    want = judge(*args, vocab, c_ref, slots)
    got = fused_judge(*args, vocab, c_got, slots)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(c_got, c_ref)
