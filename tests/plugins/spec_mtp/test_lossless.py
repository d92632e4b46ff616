"""Speculation never changes greedy output: fp32 tiny checkpoints, dense and MoE, K = 1..5.

The tiny checkpoints' MTP layers are random, so their drafts are nearly always rejected (the
rollback path); a scripted drafter that is right for a chosen number of tokens per round drives
every accepted count 0..K, the bonus token, stops and limits inside a round.
"""

from __future__ import annotations

import pytest
import torch
from spec_helpers import ScriptedDrafter, make_engine, params, prompt_ids

from ninfer.testing import greedy_generate

NEW = 128
PROMPT = prompt_ids(40)


@pytest.fixture(scope="module")
def reference(dense, moe):
    return {"dense": greedy_generate(dense, PROMPT, NEW + 8), "moe": greedy_generate(moe, PROMPT, NEW + 8)}


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("which", ["dense", "moe"])
def test_mtp_greedy_equals_plain_greedy(request, reference, which, k, tok):
    model = request.getfixturevalue(which)
    out = make_engine(model, tok, k=k).generate(PROMPT, params(max_new_tokens=NEW))
    assert out.new_token_ids == reference[which][:NEW]
    spec = out.stats["spec"]
    assert spec["rounds"] > 0 and spec["drafted"] == k * spec["rounds"]
    assert len(spec["accepted_per_position"]) == k


@pytest.mark.parametrize("rollback", ["columns", "replay"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_every_accepted_count_is_exact(dense, reference, tok, k, rollback):
    seq = PROMPT + reference["dense"]
    drafter = ScriptedDrafter(seq, k)
    eng = make_engine(dense, tok, drafter=drafter, rollback=rollback)
    out = eng.generate(PROMPT, params(max_new_tokens=NEW))
    assert out.new_token_ids == reference["dense"][:NEW]
    spec = out.stats["spec"]
    # round i verified the drafts of log[i]: each was accepted exactly as far as it was right
    assert spec["accepted"] == sum(drafter.log[: spec["rounds"]])
    assert spec["accepted_per_position"] == [sum(n > i for n in drafter.log[: spec["rounds"]]) for i in range(k)]
    assert set(drafter.log[: spec["rounds"]]) == set(range(k + 1))


def test_replay_rollback_with_the_mtp_layer(moe, reference, tok):
    out = make_engine(moe, tok, k=2, rollback="replay").generate(PROMPT, params(max_new_tokens=48))
    assert out.new_token_ids == reference["moe"][:48]


def _state(cache, slot):
    return [t[slot].clone() for t in cache.conv + cache.recurrent]


def _first_new(ref: list[int], start: int, k: int) -> int:
    """An index >= start, inside a round (all-accepted rounds hold output indices 1+m(k+1) ..
    (m+1)(k+1)), whose token does not occur earlier in the output."""
    j = start
    while ref[j] in ref[:j] or j % (k + 1) == 0:
        j += 1
    return j


@pytest.mark.parametrize("rollback", ["columns", "replay"])
def test_stop_token_inside_a_round_truncates_and_rolls_back(dense, reference, tok, rollback, monkeypatch):
    # no round launched ahead (NINFER_SPEC_AHEAD=0): one that ran ahead has already moved the slot
    # past the cut, and a finished request's slot is reset when next allocated instead
    # (test_spec_ahead.py checks the tokens that way)
    monkeypatch.setenv("NINFER_SPEC_AHEAD", "0")
    k = 3
    ref = reference["dense"]
    j = _first_new(ref, 5, k)
    eng = make_engine(dense, tok, drafter=ScriptedDrafter(PROMPT + ref, k, right=lambda p: k), rollback=rollback)
    out = eng.generate(PROMPT, params(max_new_tokens=NEW, stop_token_ids=(ref[j],), ignore_eos=False))
    assert out.new_token_ids == ref[: j + 1]
    assert out.finish_reason == "stop" and out.completion_tokens == j + 1
    # the released slot holds exactly prompt + output minus the stop (the stop was never run)
    fresh = dense.allocate_cache(1, 512, "bf16")
    dense.forward(torch.tensor(PROMPT + ref[:j]), fresh, 0, 0)
    for got, want in zip(_state(eng.runner.cache, 0), _state(fresh, 0)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_stop_string_and_limits_inside_a_round_match_plain(dense, reference, tok):
    k = 4
    ref = reference["dense"]
    stop = tok.decode(ref[9:11])
    cases = [
        dict(stop=(stop,)) if stop.strip() and "\ufffd" not in stop else dict(max_new_tokens=11),
        dict(max_new_tokens=7),  # ends inside the second round
    ]
    for kw in cases:
        p = params(**{"max_new_tokens": NEW, **kw})
        want = make_engine(dense, tok).generate(PROMPT, p)
        got = make_engine(dense, tok, drafter=ScriptedDrafter(PROMPT + ref, k, right=lambda q: k)).generate(PROMPT, p)
        assert (got.new_token_ids, got.text_delta, got.finish_reason) == (want.new_token_ids, want.text_delta, want.finish_reason)


def test_near_the_context_end_falls_back_to_plain_steps(dense, reference, tok):
    k, ctx = 5, len(PROMPT) + 23
    eng = make_engine(dense, tok, drafter=ScriptedDrafter(PROMPT + reference["dense"], k, right=lambda p: 1), max_context=ctx)
    out = eng.generate(PROMPT, params(max_new_tokens=NEW))
    assert out.finish_reason == "length" and len(PROMPT) + len(out.new_token_ids) == ctx
    assert out.new_token_ids == reference["dense"][: ctx - len(PROMPT)]
    assert out.stats["spec"]["fallback_steps"] > 0


def test_batched_requests_with_chunked_prefill_match_plain(dense, tok):
    prompts = [prompt_ids(n, seed=n) for n in (21, 40, 7)]
    ps = [params(max_new_tokens=n) for n in (30, 17, 25)]

    def run(eng):
        ids = [eng.add_request(p, sp) for p, sp in zip(prompts, ps)]
        got = {i: [] for i in ids}
        while eng.has_unfinished():
            for o in eng.step():
                got[o.request_id] += o.new_token_ids
        return [got[i] for i in ids]

    want = run(make_engine(dense, tok, max_batch=3, prefill_chunk=16))
    assert run(make_engine(dense, tok, k=3, max_batch=3, prefill_chunk=16)) == want


def test_no_step_runs_ahead_under_speculation(dense, reference, tok, monkeypatch):
    """NINFER_LOOKAHEAD=1 is ignored by a speculative engine (a round moves the state a step run
    ahead would already have moved): near the context end, where rounds give way to plain steps,
    the output is still plain greedy's."""
    monkeypatch.setenv("NINFER_LOOKAHEAD", "1")
    k, ctx = 3, len(PROMPT) + 23
    eng = make_engine(dense, tok, drafter=ScriptedDrafter(PROMPT + reference["dense"], k, right=lambda p: 1), max_context=ctx)
    assert not eng.runner.lookahead
    out = eng.generate(PROMPT, params(max_new_tokens=NEW))
    assert out.new_token_ids == reference["dense"][: ctx - len(PROMPT)]
    assert out.stats["spec"]["fallback_steps"] > 0
    assert make_engine(dense, tok, max_context=ctx).runner.lookahead  # a plain engine does look ahead
