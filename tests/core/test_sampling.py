"""The reference sampler against an independent oracle written from spec section 7, plus the
counter RNG, statistics of the draws, and the speculative point-mass acceptance of spec §3.1.

The oracle is slow plain Python/numpy on purpose: per-row loops, a full sort with an explicit
(value desc, id asc) key, float64 weights. It shares only the float32 penalty arithmetic with the
sampler (so both sort the same adjusted values); filter boundaries are compared on random
logits, away from exact ties of the thresholds.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from ninfer.config import SamplingParams
from ninfer.errors import UserError
from ninfer.kernels.sampling import (
    ReferenceSampler,
    accept_point_mass,
    counter_uniform,
    draw,
    greedy,
    point_mass_accepts,
    residual_without,
    uniforms,
)
from ninfer.sampling import Purpose

SAMPLER = ReferenceSampler()
U64 = (1 << 64) - 1


# ---------------------------------------------------------------------------- oracles


def oracle_probs(logits: np.ndarray, p: SamplingParams, history: list[int]) -> np.ndarray:
    """Spec §7, one row, written independently of the sampler."""
    v = len(logits)
    out = np.zeros(v)
    if p.temperature <= 0:
        best = max(logits)
        out[min(i for i in range(v) if logits[i] == best)] = 1.0
        return out
    adj = logits.astype(np.float32).copy()
    for tok, c in Counter(history).items():
        after_presence = np.float32(adj[tok] - np.float32(p.presence_penalty))
        adj[tok] = after_presence - np.float32(p.frequency_penalty) * np.float32(c)
    order = sorted(range(v), key=lambda i: (-float(adj[i]), i))
    cand = order[: min(p.effective_top_k, v)]
    top = float(adj[cand[0]])
    w = [math.exp((float(adj[i]) - top) / p.temperature) if adj[i] != -np.inf else 0.0 for i in cand]
    n_min = sum(1 for x in w if x >= p.min_p * w[0])
    total = sum(w)
    n_top = len(w)
    if p.top_p < 1:
        run = 0.0
        for n, x in enumerate(w, 1):
            run += x
            if run >= p.top_p * total:
                n_top = n
                break
    n = max(1, min(n_min, n_top))
    kept = sum(w[:n])
    for i, x in zip(cand[:n], w[:n]):
        out[i] = x / kept
    return out


def splitmix_uniform(seed: int, position: int, purpose: int) -> float:
    """The documented construction in exact unsigned Python arithmetic."""

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
        return z ^ (z >> 31)

    z = mix((mix(seed & U64) + (position * 8 + purpose + 1) * 0x9E3779B97F4A7C15) & U64)
    return (z >> 40) / 2**24


def random_logits(rows: int, vocab: int, seed: int, ties: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g) * 2.5
    if ties:  # copy some values onto other ids so the order needs its tie rule
        src = torch.randint(0, vocab, (rows, vocab // 5), generator=g)
        dst = torch.randint(0, vocab, (rows, vocab // 5), generator=g)
        x.scatter_(1, dst, x.gather(1, src))
        top = x.argmax(-1, keepdim=True)
        x.scatter_(1, (top + 3) % vocab, x.gather(1, top))  # a tie at the very top
    return x


def check_against_oracle(logits: torch.Tensor, params: list[SamplingParams], history: list[list[int]]) -> None:
    got = SAMPLER.probs(logits, params, history)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    for r in range(logits.shape[0]):
        want = oracle_probs(logits[r].numpy(), params[r], history[r])
        assert set(np.flatnonzero(want)) == set(torch.nonzero(got[r]).flatten().tolist()), f"row {r} support"
        np.testing.assert_allclose(got[r].numpy(), want, atol=2e-6, rtol=1e-5, err_msg=f"row {r}")


def binomial_bounds_ok(counts: np.ndarray, probs: np.ndarray, n: int) -> None:
    """Per-bin 5-sigma bounds and a chi-square bound near the 1e-6 tail (deterministic seeds)."""
    assert counts[probs == 0].sum() == 0, "drew a token the processed distribution excludes"
    live = probs > 0
    exp = n * probs[live]
    sigma = np.sqrt(exp * (1 - probs[live]))
    assert np.all(np.abs(counts[live] - exp) <= 5 * sigma + 2), (counts[live], exp)
    df = max(int(live.sum()) - 1, 1)
    chi2 = float(((counts[live] - exp) ** 2 / exp).sum())
    assert chi2 < df + 8 * math.sqrt(2 * df), (chi2, df)


# ---------------------------------------------------------------------------- counter RNG


def test_counter_uniform_matches_exact_splitmix():
    cases = [(0, 0, 0), (0, 1, 1), (1, 0, 1), (-1, 5, 2), (2**64 - 1, 7, 3), (2**63, 123456789, 4), (12345, 2**40, 5)]
    for seed, pos, purpose in cases:
        params = [SamplingParams(seed=seed)]
        got = uniforms(params, [pos], purpose, "cpu").item()
        assert got == splitmix_uniform(seed, pos, purpose), (seed, pos, purpose)
    # the int64 seed view and the unsigned seed are the same key
    a = uniforms([SamplingParams(seed=-1)], [3], Purpose.DECODE, "cpu")
    b = uniforms([SamplingParams(seed=2**64 - 1)], [3], Purpose.DECODE, "cpu")
    assert torch.equal(a, b)


def test_counter_uniform_is_uniform_and_keys_are_independent():
    n = 1 << 16
    pos = torch.arange(n)
    u = counter_uniform(torch.zeros(n, dtype=torch.int64), pos, int(Purpose.DECODE))
    assert u.min() >= 0 and u.max() < 1
    hist = torch.histc(u, bins=16, min=0, max=1).numpy()
    binomial_bounds_ok(hist, np.full(16, 1 / 16), n)
    # other seed, other purpose, next position: uncorrelated streams
    for other in (
        counter_uniform(torch.ones(n, dtype=torch.int64), pos, int(Purpose.DECODE)),
        counter_uniform(torch.zeros(n, dtype=torch.int64), pos, int(Purpose.SPEC_ACCEPT)),
        counter_uniform(torch.zeros(n, dtype=torch.int64), pos + 1, int(Purpose.DECODE)),
    ):
        assert not torch.equal(u, other)
        corr = torch.corrcoef(torch.stack([u, other]))[0, 1].item()
        assert abs(corr) < 5 / math.sqrt(n)


def test_uniforms_rejects_bad_keys():
    with pytest.raises(ValueError):
        uniforms([SamplingParams()], [-1], Purpose.DECODE, "cpu")
    with pytest.raises(ValueError):
        uniforms([SamplingParams()], [0], 8, "cpu")
    with pytest.raises(ValueError):
        uniforms([SamplingParams()], [0, 1], Purpose.DECODE, "cpu")


# ---------------------------------------------------------------------------- greedy


def test_greedy_ties_pick_lowest_id():
    x = torch.full((3, 40), -1.0)
    x[0, [31, 7, 12]] = 5.0
    x[1, [39, 38]] = 2.0
    x[2, :] = 0.0
    x[2, [0, 1]] = -0.0  # -0.0 == +0.0: still a tie, still the lowest id
    x[2, 0] = -0.0
    assert greedy(x).tolist() == [7, 38, 0]
    params = [SamplingParams(temperature=0.0)] * 3
    got = SAMPLER.sample(x, params, [[], [], []], [0, 1, 2])
    assert got.tolist() == [7, 38, 0]
    probs = SAMPLER.probs(x, params, [[], [], []])
    assert torch.equal(probs, torch.nn.functional.one_hot(got, 40).float())


def test_greedy_ignores_penalties_seed_and_position():
    x = random_logits(4, 300, seed=1)
    want = greedy(x)
    for seed in (0, 1, 99):
        params = [SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=2.0, seed=seed)] * 4
        hist = [[int(t)] * 5 for t in want]  # penalties would dethrone the argmax if applied
        for pos in ([0, 0, 0, 0], [5, 17, 1000, 3]):
            assert torch.equal(SAMPLER.sample(x, params, hist, pos), want)


# ---------------------------------------------------------------------------- filters vs oracle

FILTERS = {
    "temperature": dict(temperature=0.7, top_k=0, top_p=1.0),
    "temperature_high": dict(temperature=2.0, top_k=-3, top_p=1.0),
    "top_k": dict(temperature=1.0, top_k=5, top_p=1.0),
    "top_k_over_cap": dict(temperature=1.0, top_k=50, top_p=1.0),
    "top_p": dict(temperature=1.0, top_p=0.6),
    "min_p": dict(temperature=1.0, top_p=1.0, min_p=0.05),
    "combined": dict(temperature=0.8, top_k=12, top_p=0.85, min_p=0.02),
    "combined_cold": dict(temperature=0.3, top_k=20, top_p=0.9, min_p=0.1),
}


@pytest.mark.parametrize("name", list(FILTERS))
@pytest.mark.parametrize("vocab", [7, 64, 500])
def test_filter_matches_oracle(name, vocab):
    rows = 6
    x = random_logits(rows, vocab, seed=vocab * 31 + len(name))
    params = [SamplingParams(**FILTERS[name], seed=r) for r in range(rows)]
    check_against_oracle(x, params, [[] for _ in range(rows)])


@pytest.mark.parametrize("presence,frequency", [(1.0, 0.0), (0.0, 0.5), (1.5, 0.3), (-1.5, -0.5), (2.0, 2.0)])
def test_penalties_with_history_match_oracle(presence, frequency):
    rows, vocab = 5, 120
    x = random_logits(rows, vocab, seed=7)
    g = torch.Generator().manual_seed(3)
    top = x.topk(10, dim=-1).indices
    # histories heavy in the current favourites, with repeats, so penalties reorder the top
    history = [top[r, torch.randint(0, 10, (3 * r + 1,), generator=g)].tolist() for r in range(rows)]
    history[0] = []
    filters = dict(temperature=0.9, top_k=15, top_p=0.95, min_p=0.01)
    params = [SamplingParams(**filters, presence_penalty=presence, frequency_penalty=frequency)] * rows
    check_against_oracle(x, params, history)
    # and the penalties do something
    plain = SAMPLER.probs(x, params, [[] for _ in range(rows)])
    assert not torch.equal(plain[1:], SAMPLER.probs(x, params, history)[1:])


def test_mixed_batch_of_greedy_and_sampled_rows_matches_oracle():
    x = random_logits(6, 80, seed=11)
    params = [SamplingParams(**f) for f in FILTERS.values()][:4] + [SamplingParams(temperature=0.0)] * 2
    history = [[1, 2, 2], [], [5], [], [3, 3], []]
    check_against_oracle(x, params, history)


# ---------------------------------------------------------------------------- statistics


def test_draw_frequencies_match_processed_distribution():
    n = 20000
    x = random_logits(1, 50, seed=5, ties=False) * 0.6
    p = SamplingParams(temperature=0.9, top_k=15, top_p=0.9, min_p=0.01, presence_penalty=0.5, seed=42)
    hist = [3, 3, 8]
    probs = SAMPLER.probs(x, [p], [hist])[0].double().numpy()
    assert 5 <= (probs > 0).sum() <= 15  # a distribution worth testing
    toks = SAMPLER.sample(x.expand(n, -1), [p] * n, [hist] * n, list(range(n)))
    counts = np.bincount(toks.numpy(), minlength=50)
    binomial_bounds_ok(counts, probs, n)


def test_sample_is_draw_of_probs():
    rows = 400
    x = random_logits(rows, 200, seed=9)
    params = [SamplingParams(**list(FILTERS.values())[r % len(FILTERS)], seed=r // 3) for r in range(rows)]
    hist = [[r % 200, (r * 7) % 200] for r in range(rows)]
    pos = [r * 13 for r in range(rows)]
    got = SAMPLER.sample(x, params, hist, pos)
    u = uniforms(params, pos, Purpose.DECODE, "cpu")
    assert torch.equal(got, draw(SAMPLER.probs(x, params, hist), u))


def test_sample_is_draw_of_probs_when_weights_round_equal():
    """Distinct adjusted logits whose weights round to one float32: both paths order them by
    probability with the lower id first, so sample still equals draw(probs)."""
    x = torch.full((1, 10), -math.inf)
    x[0, 5], x[0, 2] = 0.0, -1e-30
    p = SamplingParams(temperature=1.0, top_p=1.0)
    probs = SAMPLER.probs(x, [p], [[]])
    assert probs[0, 2] == probs[0, 5] == 0.5
    n = 64
    pos = list(range(n))
    got = SAMPLER.sample(x.expand(n, -1), [p] * n, [[]] * n, pos)
    u = uniforms([p] * n, pos, Purpose.DECODE, "cpu")
    assert torch.equal(got, torch.where(u < 0.5, 2, 5))


def test_inverse_cdf_intervals_are_closed_below():
    """Token i owns [cdf_(i-1), cdf_i): a port (Triton, CUDA) must pick the same id at boundaries."""
    p = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]])
    assert [draw(p, torch.tensor([u])).item() for u in (0.0, 0.4999, 0.5, 1 - 2**-24)] == [1, 1, 3, 3]
    # a uniform rounded up onto the total still lands on a token with mass, never past it
    assert draw(p, torch.tensor([1.0])).item() == 3


def test_determinism_and_row_independence():
    x = random_logits(8, 300, seed=13)
    params = [SamplingParams(temperature=1.0, top_p=0.95, seed=s) for s in range(8)]
    hist = [[r] for r in range(8)]
    pos = list(range(100, 108))
    first = SAMPLER.sample(x, params, hist, pos)
    assert torch.equal(first, SAMPLER.sample(x, params, hist, pos))
    for r in range(8):  # alone, or batched with anything else, a row draws the same token
        alone = SAMPLER.sample(x[r : r + 1], params[r : r + 1], hist[r : r + 1], pos[r : r + 1])
        assert alone.item() == first[r].item()
    perm = [5, 2, 7, 0, 1, 6, 3, 4]
    shuffled = SAMPLER.sample(x[perm], [params[i] for i in perm], [hist[i] for i in perm], [pos[i] for i in perm])
    assert shuffled.tolist() == first[perm].tolist()
    # the purpose is part of the key: some token differs across 8 rows x 2 purposes
    other = SAMPLER.sample(x, params, hist, pos, Purpose.PREFILL)
    bonus = SAMPLER.sample(x, params, hist, pos, Purpose.SPEC_BONUS)
    assert not (torch.equal(first, other) and torch.equal(first, bonus))


def test_bf16_logits_are_processed_in_float32():
    x = random_logits(3, 64, seed=17)
    params = [SamplingParams(temperature=0.8, seed=1)] * 3
    got = SAMPLER.probs(x.bfloat16(), params, [[], [], []])
    want = SAMPLER.probs(x.bfloat16().float(), params, [[], [], []])
    assert got.dtype == torch.float32 and torch.equal(got, want)


# ---------------------------------------------------------------------------- edge cases


def test_all_minus_inf_but_one():
    x = torch.full((2, 30), -math.inf)
    x[:, 17] = -3.0
    params = [SamplingParams(temperature=1.5, min_p=0.0, top_p=1.0), SamplingParams(temperature=0.0)]
    probs = SAMPLER.probs(x, params, [[17, 17], []])
    assert torch.equal(probs, torch.nn.functional.one_hot(torch.tensor([17, 17]), 30).float())
    for pos in range(20):
        assert SAMPLER.sample(x, params, [[17], []], [pos, pos]).tolist() == [17, 17]


def test_top_p_zero_keeps_the_top_candidate():
    x = random_logits(4, 100, seed=19, ties=False)
    params = [SamplingParams(temperature=1.0, top_p=0.0)] * 4
    probs = SAMPLER.probs(x, params, [[]] * 4)
    assert torch.equal(probs, torch.nn.functional.one_hot(x.argmax(-1), 100).float())


def test_min_p_one_keeps_the_ties_of_the_maximum():
    x = torch.tensor([[0.0, 3.0, 1.0, 3.0, 2.9], [1.0, 0.5, 0.2, 0.1, 0.0]])
    probs = SAMPLER.probs(x, [SamplingParams(temperature=1.0, min_p=1.0, top_p=1.0)] * 2, [[], []])
    assert probs.tolist() == [[0.0, 0.5, 0.0, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]]


def test_vocab_smaller_than_top_k():
    x = random_logits(2, 5, seed=23, ties=False)
    params = [SamplingParams(temperature=1.0, top_k=20, top_p=1.0)] * 2
    probs = SAMPLER.probs(x, params, [[], []])
    torch.testing.assert_close(probs, torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
    assert SAMPLER.sample(x, params, [[], []], [0, 1]).shape == (2,)
    assert SAMPLER.probs(x[:, :1], params, [[], []]).tolist() == [[1.0], [1.0]]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nan_or_posinf_logits_raise(bad):
    x = random_logits(3, 40, seed=29)
    x[1, 5] = bad
    with pytest.raises(ValueError, match="row 1 holds NaN or \\+inf"):
        SAMPLER.sample(x, [SamplingParams()] * 3, [[]] * 3, [0, 1, 2])
    with pytest.raises(ValueError, match="row 1"):  # greedy rows too: argmax of NaN is meaningless
        SAMPLER.probs(x, [SamplingParams(temperature=0.0)] * 3, [[]] * 3)


def test_all_minus_inf_row_raises():
    x = random_logits(2, 40, seed=31)
    x[0] = -math.inf
    with pytest.raises(ValueError, match="row 0 is -inf everywhere"):
        SAMPLER.probs(x, [SamplingParams()] * 2, [[], []])


def test_bad_shapes_and_history_raise():
    x = random_logits(2, 40, seed=37)
    with pytest.raises(ValueError):
        SAMPLER.probs(x, [SamplingParams()], [[], []])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        SAMPLER.probs(x, [SamplingParams()] * 2, [[40], []])
    with pytest.raises(ValueError):
        SAMPLER.probs(x[0], [SamplingParams()], [[]])


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", 2.5), ("temperature", -0.1), ("temperature", math.nan), ("top_p", 1.01), ("top_p", -0.5),
        ("min_p", 1.5), ("min_p", -0.1), ("presence_penalty", 2.5), ("frequency_penalty", -2.1), ("top_k", 2.0),
        ("seed", 1.5),
    ],  # fmt: skip
)
def test_params_out_of_spec_range_are_user_errors(field, value):
    with pytest.raises(UserError):
        SamplingParams(**{field: value})


def test_effective_top_k_caps_at_twenty():
    asked = (-1, 0, 1, 5, 19, 20, 21, 1000)
    assert [SamplingParams(top_k=k).effective_top_k for k in asked] == [20, 20, 1, 5, 19, 20, 20, 20]


# ---------------------------------------------------------------------------- speculative acceptance


def test_point_mass_accept_and_residual_edges():
    p = torch.tensor([0.0, 0.25, 0.75, 0.0])
    assert accept_point_mass(p, 2, 0.7499) and not accept_point_mass(p, 2, 0.75)
    assert not accept_point_mass(p, 0, 0.0)  # a token the target excludes is never accepted
    torch.testing.assert_close(residual_without(p, 2), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual_without(p, 0), p)
    one = torch.tensor([0.0, 1.0, 0.0])
    assert accept_point_mass(one, 1, 1 - 2**-24)
    assert torch.equal(residual_without(one, 1), one)  # never rejected; no 0/0
    batch = torch.stack([p, p])
    assert point_mass_accepts(batch, torch.tensor([1, 2]), torch.tensor([0.3, 0.3])).tolist() == [False, True]
    torch.testing.assert_close(residual_without(batch, torch.tensor([1, 2]))[1], torch.tensor([0.0, 1.0, 0.0, 0.0]))


@pytest.mark.parametrize("draft_rank", [0, 3, None])
def test_point_mass_verification_is_lossless(draft_rank):
    """Accept d with p(d), else draw from p without d (spec §3.1): the emitted token is
    distributed as p whatever the draft (a likely one, an unlikely one, one p excludes)."""
    n = 20000
    x = random_logits(1, 60, seed=41, ties=False)
    params = SamplingParams(temperature=1.0, top_k=10, top_p=0.95, seed=7)
    p = SAMPLER.probs(x, [params], [[]])[0]
    order = torch.argsort(p, descending=True)
    draft = int(order[draft_rank]) if draft_rank is not None else int(order[-1])
    pos = list(range(n))
    u_acc = uniforms([params] * n, pos, Purpose.SPEC_ACCEPT, "cpu")
    u_fix = uniforms([params] * n, pos, Purpose.SPEC_CORRECTION, "cpu")
    accepted = point_mass_accepts(p.expand(n, -1), torch.full((n,), draft), u_acc)
    fixed = draw(residual_without(p, draft).expand(n, -1), u_fix)
    toks = torch.where(accepted, draft, fixed)
    binomial_bounds_ok(np.bincount(toks.numpy(), minlength=60), p.double().numpy(), n)


# ---------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_and_cuda_pick_the_same_tokens():
    rows, vocab = 64, 248320
    x = random_logits(rows, vocab, seed=43, ties=False) * 0.5
    x[:, :10] = x[:, 10:20]  # ties inside the candidates
    params = [SamplingParams(**list(FILTERS.values())[r % len(FILTERS)], seed=r * 977) for r in range(rows - 4)]
    params += [SamplingParams(temperature=0.0)] * 4
    hist = [[(r * 31 + j * 7) % vocab for j in range(r % 9)] for r in range(rows)]
    n_same = n_all = 0
    for step in range(8):
        pos = [1000 * step + r for r in range(rows)]
        cpu = SAMPLER.sample(x, params, hist, pos)
        gpu = SAMPLER.sample(x.cuda(), params, hist, pos).cpu()
        n_same += int((cpu == gpu).sum())
        n_all += rows
        u_cpu = uniforms(params, pos, Purpose.DECODE, "cpu")
        assert torch.equal(u_cpu, uniforms(params, pos, Purpose.DECODE, "cuda").cpu())
    # exp and cumsum may differ in the last ulp between devices, which can move a draw whose
    # uniform falls within ~1e-7 of a boundary: allow at most one such row out of 512
    assert n_same >= n_all - 1, (n_same, n_all)
    on_gpu = SAMPLER.probs(x.cuda(), params, hist).cpu()
    torch.testing.assert_close(on_gpu, SAMPLER.probs(x, params, hist), atol=1e-6, rtol=1e-5)
