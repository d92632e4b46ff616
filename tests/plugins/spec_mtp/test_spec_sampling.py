"""Sampled output is distributed exactly as without speculation (spec 3.1), by chi-square tests.

A Markov "model" over 8 tokens (logits depend on the last token only) makes thousands of seeded
requests cheap; a point-mass drafter proposes likely and unlikely successors. The joint law of
the first 4 generated tokens is enumerated exactly from the sampler's processed distributions
(temperature, top-k, top-p, and a presence penalty whose history must count the provisionally
accepted drafts) and compared with the empirical law over seeds. A deliberately broken
acceptance (correction drawn without removing the draft) must fail the same test. Then the same
end to end on a real tiny checkpoint (16-token vocabulary) with its own MTP layer.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from spec_helpers import make_engine

import ninfer.speculative
from ninfer.config import SamplingParams
from ninfer.engine import LLMEngine
from ninfer.kernels.sampling import ReferenceSampler
from ninfer.testing import load_model, make_tiny

V, N, RUNS = 8, 4, 2000
PROMPT = [3, 1]
PARAMS = dict(temperature=0.9, top_k=6, top_p=0.95, presence_penalty=0.7, max_new_tokens=N, ignore_eos=True, stop_token_ids=())


class FakeCache:
    def __init__(self, num_slots: int, max_context: int) -> None:
        self.num_slots, self.max_context = num_slots, max_context

    def reset(self, slot):
        pass

    def snapshot(self, slot):
        return None

    def restore(self, slot, snap):
        pass

    def keep_columns(self, slot, count):
        pass

    def stop_keeping(self, slot):
        pass

    def use_column(self, slot, column):
        pass


class MarkovModel:
    """hidden = one-hot of the token; logits = table[token]."""

    def __init__(self) -> None:
        self.table = torch.randn(V, V, generator=torch.Generator().manual_seed(5)) * 1.5
        self.shape = SimpleNamespace(vocab_size=V)
        self.device = torch.device("cpu")

    def allocate_cache(self, num_slots, max_context, kv_dtype):
        return FakeCache(num_slots, max_context)

    def forward(self, ids, cache, slot, start_pos):
        return torch.nn.functional.one_hot(ids, V).float()

    def decode(self, ids, cache, slots, positions):
        return torch.nn.functional.one_hot(ids, V).float()

    def compute_logits(self, hidden):
        return hidden @ self.table


class SuccessorDrafter:
    """Point-mass drafts: a fixed successor of the previous token (sometimes the likely one)."""

    k = 2

    def __init__(self, table: torch.Tensor) -> None:
        order = table.argsort(-1, descending=True)
        self.succ = torch.where(torch.arange(V) % 3 == 0, order[:, 2], order[:, 0])

    def align(self, slot, next_ids, hidden, start):
        return torch.nn.functional.one_hot(next_ids, V).float()

    def draft(self, slots, seeds, positions, max_len):
        d = [self.succ[seeds.argmax(-1)]]
        for _ in range(self.k - 1):
            d.append(self.succ[d[-1]])
        return torch.stack(d, dim=1)


def exact_law(probs_after, n: int) -> dict[tuple[int, ...], float]:
    """The exact law of the first n outputs: `probs_after(seq)` is the processed distribution [V]
    of the token that follows the outputs `seq`."""
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, mass in law.items():
            probs = probs_after(seq)
            nxt.update({seq + (t,): mass * float(probs[t]) for t in range(len(probs)) if probs[t] > 0})
        law = nxt
    return law


def markov_law(model: MarkovModel, p: SamplingParams) -> dict[tuple[int, ...], float]:
    sampler = ReferenceSampler()
    return exact_law(lambda seq: sampler.probs(model.table[(PROMPT + list(seq))[-1]][None], [p], [list(seq)])[0], N)


def outcome_counts(eng: LLMEngine, prompt: list[int], params: dict, runs: int) -> dict[tuple[int, ...], int]:
    """How often each output occurs over seeds 0..runs-1."""
    out: dict[str, list[int]] = {eng.add_request(prompt, SamplingParams(seed=s, **params)): [] for s in range(runs)}
    while eng.has_unfinished():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
    counts: dict[tuple[int, ...], int] = {}
    for ids in out.values():
        counts[tuple(ids)] = counts.get(tuple(ids), 0) + 1
    return counts


def sample_law(model: MarkovModel, tok, params: dict, speculate: bool) -> dict[tuple[int, ...], int]:
    cache = model.allocate_cache(32, 64, "bf16")
    drafter = SuccessorDrafter(model.table) if speculate else None
    eng = LLMEngine(model, cache, ReferenceSampler(), tok, max_context=64, max_batch=32, speculator=drafter)
    return outcome_counts(eng, PROMPT, params, RUNS)


def chi_square_p(counts: dict, law: dict) -> float:
    """p-value of the observed counts under `law`, cells with expected < 5 pooled."""
    runs = sum(counts.values())
    assert set(counts) <= set(law), "a sequence the target could never produce"
    obs, exp, pool_o, pool_e = [], [], 0, 0.0
    for seq, prob in law.items():
        e = prob * runs
        if e < 5:
            pool_o, pool_e = pool_o + counts.get(seq, 0), pool_e + e
        else:
            obs.append(counts.get(seq, 0))
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    o, e = torch.tensor(obs, dtype=torch.float64), torch.tensor(exp, dtype=torch.float64)
    stat = float(((o - e) ** 2 / e).sum())
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


@pytest.fixture(scope="module")
def model():
    return MarkovModel()


def test_exact_law_sums_to_one(model):
    assert abs(sum(markov_law(model, SamplingParams(**PARAMS)).values()) - 1) < 1e-6


@pytest.mark.parametrize("params", [PARAMS, {**PARAMS, "presence_penalty": 0.0, "top_k": 20, "top_p": 1.0, "temperature": 1.3}])
def test_speculative_sampling_keeps_the_target_distribution(model, tok, params):
    law = markov_law(model, SamplingParams(**params))
    assert chi_square_p(sample_law(model, tok, params, speculate=True), law) > 1e-3


def test_plain_sampling_passes_the_same_test(model, tok):
    """A calibration of the test itself: the engine without speculation."""
    assert chi_square_p(sample_law(model, tok, PARAMS, speculate=False), markov_law(model, SamplingParams(**PARAMS))) > 1e-3


def test_a_biased_correction_is_caught(model, tok, monkeypatch):
    """Drawing the correction from p itself (the draft not removed) over-weights drafts."""
    monkeypatch.setattr(ninfer.speculative, "residual_without", lambda probs, draft: probs)
    law = markov_law(model, SamplingParams(**PARAMS))
    assert chi_square_p(sample_law(model, tok, PARAMS, speculate=True), law) < 1e-6


def test_a_seeded_request_replays_exactly(model, tok):
    """Every uniform is keyed by (seed, absolute position, purpose): no hidden RNG state."""
    outs = []
    for _ in range(2):
        cache = model.allocate_cache(2, 64, "bf16")
        drafter = SuccessorDrafter(model.table)
        eng = LLMEngine(model, cache, ReferenceSampler(), tok, max_context=64, max_batch=2, speculator=drafter)
        eng.generate([5, 6], SamplingParams(seed=3, **{**PARAMS, "max_new_tokens": 9}))  # other traffic first
        outs.append(eng.generate(PROMPT, SamplingParams(seed=11, **{**PARAMS, "max_new_tokens": 12})))
    assert outs[0].new_token_ids == outs[1].new_token_ids
    assert outs[0].stats["spec"]["rounds"] > 0


def test_the_real_mtp_round_keeps_the_target_distribution(tmp_path, tok):
    """The same test end to end on a tiny checkpoint with a 16-token vocabulary and its own (random)
    MTP layer: verify, rollback of the Gated DeltaNet state, drafting, all real."""
    model = load_model(make_tiny("qwen3.6-27b", tmp_path / "v16", vocab=16, layers=4, seed=4), spec="mtp")
    p = dict(temperature=1.0, top_k=20, top_p=1.0, presence_penalty=0.5, max_new_tokens=3, ignore_eos=True, stop_token_ids=())
    prompt, sampler, sp = [3, 9, 1, 12], ReferenceSampler(), SamplingParams(**p)

    def probs_after(seq):
        cache = model.allocate_cache(1, 16, "bf16")
        logits = model.compute_logits(model.forward(torch.tensor(prompt + list(seq)), cache, 0, 0)[-1:])
        return sampler.probs(logits, [sp], [list(seq)])[0]

    law = exact_law(probs_after, 3)
    counts = outcome_counts(make_engine(model, tok, k=2, max_batch=16, max_context=32), prompt, p, 1000)
    assert chi_square_p(counts, law) > 1e-3
    # the joint law has 4,096 cells for 1,000 runs: the pairs (t1, t2) and (t2, t3) have power
    for i in (0, 1):
        assert chi_square_p(_marginal(counts, i), _marginal(law, i)) > 1e-3


def _marginal(table: dict, i: int) -> dict:
    out: dict = {}
    for seq, v in table.items():
        out[seq[i : i + 2]] = out.get(seq[i : i + 2], 0) + v
    return out
