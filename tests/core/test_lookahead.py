"""Decode steps launched one ahead (ninfer.runner, NINFER_LOOKAHEAD=1) give exactly the outputs
of plain steps, on a model with per-slot state that fails loudly if a step is applied twice or
skipped: each slot keeps a hash of every token fed and the next position it expects.

The scenarios mix what changes a batch under a step run ahead: stop tokens the host sees one step
late, length limits, requests waiting for a slot and taking a reused one, prefill chunks between
decode steps, aborts, and seeded sampling (the eager sampler reads the history and position the
step ran at, and the penalties its history)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from ninfer.config import SamplingParams
from ninfer.engine import LLMEngine
from ninfer.frontend.tokenizer import load_tokenizer
from ninfer.kernels.sampling import ReferenceSampler
from ninfer.runner import Runner

VOCAB = 248320
STOP = 248046  # <|im_end|>, a default stop token of the tokenizer's chat models
MOD = 1_000_003


class StateCache:
    def __init__(self, num_slots: int, max_context: int) -> None:
        self.num_slots = num_slots
        self.max_context = max_context
        self.acc = [0] * num_slots
        self.pos = [0] * num_slots

    def reset(self, slot: int) -> None:
        self.acc[slot] = 0
        self.pos[slot] = 0


class StateModel:
    """Next token = a function of the hash of everything the slot was fed; a stop token now and
    then. Feeding a position other than the slot's next one is an error."""

    def __init__(self, stop_every: int = 9) -> None:
        self.shape = SimpleNamespace(vocab_size=VOCAB)
        self.device = torch.device("cpu")
        self.stop_every = stop_every

    def allocate_cache(self, num_slots, max_context, kv_dtype):
        return StateCache(num_slots, max_context)

    def _feed(self, cache, slot: int, pos: int, tok: int) -> int:
        if pos != cache.pos[slot]:
            raise AssertionError(f"slot {slot} fed position {pos}, expected {cache.pos[slot]}")
        cache.acc[slot] = (cache.acc[slot] * 31 + tok + 1) % MOD
        cache.pos[slot] += 1
        return cache.acc[slot]

    def forward(self, ids, cache, slot, start_pos):
        return torch.tensor([[float(self._feed(cache, slot, start_pos + i, t))] for i, t in enumerate(ids.tolist())])

    def decode(self, ids, cache, slots, positions):
        rows = zip(slots.tolist(), positions.tolist(), ids.tolist())
        return torch.tensor([[float(self._feed(cache, s, p, t))] for s, p, t in rows])

    def compute_logits(self, hidden):
        logits = torch.zeros(hidden.shape[0], VOCAB)
        for row, h in enumerate(hidden[:, 0].long().tolist()):
            if h % self.stop_every == 0:
                logits[row, STOP] = 30.0
            else:
                # two likely tokens out of a few, so that sampling has something to choose and
                # tokens repeat (the penalties then read the history the step ran with)
                logits[row, 1000 + h % 7] = 3.0
                logits[row, 1007 + (h // 7) % 7] = 2.6
        return logits


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def count_launches_ahead(monkeypatch) -> list[bool]:
    """Spy on Runner._launch_ahead: one entry a call, True where it launched a step."""
    launched: list[bool] = []
    orig = Runner._launch_ahead

    def spy(self, reqs, previous):
        a = orig(self, reqs, previous)
        launched.append(a is not None)
        return a

    monkeypatch.setattr(Runner, "_launch_ahead", spy)
    return launched


def run(tok, monkeypatch, lookahead: bool, *, max_batch: int, plan: list, prefill_chunk: int = 6,
        abort_at: dict | None = None) -> tuple[dict, int]:
    """plan: (step at which to add it, prompt, params) per request. Returns each request's
    tokens and finish reason, and how many steps were launched ahead."""
    monkeypatch.setenv("NINFER_LOOKAHEAD", "1" if lookahead else "0")
    model = StateModel()
    cache = model.allocate_cache(max_batch, 96, "bf16")
    eng = LLMEngine(model, cache, ReferenceSampler(), tok, max_context=96, prefill_chunk=prefill_chunk,
                    max_batch=max_batch)
    assert eng.runner.lookahead == lookahead
    launched = count_launches_ahead(monkeypatch)
    outs: dict[str, list] = {}
    names: dict[str, str] = {}
    step = 0
    pending = sorted(plan, key=lambda p: p[0])
    while pending or eng.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, params = pending.pop(0)
            rid = eng.add_request(prompt, params)
            names[rid] = f"r{len(names)}"
            outs[names[rid]] = [[], None]
        for rid, at in (abort_at or {}).items():
            if at == step:
                assert eng.abort(next(r for r, n in names.items() if n == rid))
                outs[rid][1] = "abort"
        for o in eng.step():
            outs[names[o.request_id]][0] += o.new_token_ids
            if o.finished:
                outs[names[o.request_id]][1] = o.finish_reason
        step += 1
        assert step < 2000
    return outs, sum(launched)


def plan_of(seed: int, n: int, sampled: bool) -> list:
    rng = random.Random(seed)
    plan = []
    for i in range(n):
        params = dict(max_new_tokens=rng.randint(1, 30), presence_penalty=rng.choice([0.0, 0.7]),
                      frequency_penalty=rng.choice([0.0, 0.5]))
        if sampled:
            params.update(temperature=0.8, top_k=5, seed=rng.randint(0, 10**6))
        else:
            params.update(temperature=0.0)
        if rng.random() < 0.2:
            params["ignore_eos"] = True
        plan.append((rng.randint(0, 40), [rng.randint(10, 900) for _ in range(rng.randint(1, 15))],
                     SamplingParams(**params)))
    return plan


@pytest.mark.parametrize("seed,max_batch,sampled", [(1, 1, False), (2, 3, False), (3, 4, True), (4, 2, True)])
def test_lookahead_gives_the_plain_outputs(tok, monkeypatch, seed, max_batch, sampled):
    plan = plan_of(seed, 8, sampled)
    plain, none = run(tok, monkeypatch, False, max_batch=max_batch, plan=plan)
    ahead, launched = run(tok, monkeypatch, True, max_batch=max_batch, plan=plan)
    assert none == 0 and launched > 0
    assert ahead == plain
    assert any(reason == "stop" for _, reason in plain.values())  # stop tokens seen one step late
    assert any(reason == "length" for _, reason in plain.values())


def test_lookahead_with_an_abort_and_a_reused_slot(tok, monkeypatch):
    plan = [(0, [5, 6, 7], SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)),
            (0, [8, 9], SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)),
            (12, [10, 11, 12, 13], SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True))]
    plain, _ = run(tok, monkeypatch, False, max_batch=2, plan=plan, abort_at={"r0": 6})
    ahead, launched = run(tok, monkeypatch, True, max_batch=2, plan=plan, abort_at={"r0": 6})
    assert launched > 0 and ahead == plain
    assert plain["r0"][1] == "abort" and plain["r2"][1] == "length" and len(plain["r2"][0]) == 8


def test_no_step_is_launched_ahead_past_the_length_limit(tok, monkeypatch):
    """max_new_tokens = 3: prefill gives token 1, a decode token 2 (and launches no step for
    token 4), the next decode token 3 from the step launched ahead: one launch ahead."""
    plan = [(0, [5, 6, 7], SamplingParams(temperature=0.0, max_new_tokens=3, ignore_eos=True))]
    out, launched = run(tok, monkeypatch, True, max_batch=1, plan=plan)
    assert launched == 1 and len(out["r0"][0]) == 3 and out["r0"][1] == "length"


def test_on_by_default_and_off_with_zero(tok, monkeypatch):
    def made() -> LLMEngine:
        model = StateModel()
        return LLMEngine(model, model.allocate_cache(1, 32, "bf16"), ReferenceSampler(), tok, max_context=32,
                         prefill_chunk=8, max_batch=1)

    monkeypatch.delenv("NINFER_LOOKAHEAD", raising=False)
    assert made().runner.lookahead
    monkeypatch.setenv("NINFER_LOOKAHEAD", "0")
    assert not made().runner.lookahead


def test_a_new_request_reusing_a_finished_ones_id(tok, monkeypatch):
    """A step ran ahead for request "X"; X is aborted and a new request with the same id takes
    its slot: the new X must not pick up the old X's result (kept results are per request, not
    per id)."""

    def go(lookahead: bool) -> dict:
        monkeypatch.setenv("NINFER_LOOKAHEAD", "1" if lookahead else "0")
        model = StateModel(stop_every=10**9)
        eng = LLMEngine(model, model.allocate_cache(2, 96, "bf16"), ReferenceSampler(), tok, max_context=96,
                        prefill_chunk=8, max_batch=2)
        p = SamplingParams(temperature=0.0, max_new_tokens=30, ignore_eos=True)
        got: dict[str, list] = {"X": [], "Y": [], "X2": []}
        eng.add_request([5, 6, 7], p, request_id="X")
        eng.add_request([8, 9], p, request_id="Y")
        for _ in range(6):
            for o in eng.step():
                got[o.request_id] += o.new_token_ids
        assert eng.abort("X")
        eng.add_request([1, 2, 3, 4], p, request_id="X")  # the same id again
        key = {"X": "X2", "Y": "Y"}
        while eng.has_unfinished():
            for o in eng.step():
                got[key[o.request_id]] += o.new_token_ids
        return got

    plain = go(False)
    assert go(True) == plain and len(plain["X2"]) == 30
