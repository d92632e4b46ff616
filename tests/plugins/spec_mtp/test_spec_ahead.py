"""Batched rounds launched one ahead (the default; NINFER_SPEC_AHEAD=0 stops it; `SpeculativeRound._launch_ahead`), on
the CPU through the graph path (test_batched_rounds' stand-in graphs): the round after the one
just launched feeds on that round's results on the device, before the host has read them. The
engine must give exactly the tokens it gives without it, when requests finish on length at
different times (the batch changes under a round in flight), stop on a token inside a round,
and sample with penalties."""

from __future__ import annotations

import pytest
from spec_helpers import params, prompt_ids
from test_batched_rounds import _graph_engine

PROMPTS = [prompt_ids(30, seed=7), prompt_ids(12, seed=1), prompt_ids(20, seed=4)]


def _run(model, tok, ahead: bool, reqs: list[tuple[list[int], dict]], k: int = 3) -> tuple[dict, int]:
    eng, fake = _graph_engine(model, tok, k, max_batch=3)
    spec = eng.speculative
    spec.ahead = ahead
    rids = [eng.add_request(p, params(**kw)) for p, kw in reqs]
    got: dict[str, list[int]] = {r: [] for r in rids}
    finish: dict[str, str | None] = {}
    while eng.has_unfinished():
        for o in eng.step():
            got[o.request_id] += o.new_token_ids
            if o.finished:
                finish[o.request_id] = o.finish_reason
    return {i: (got[r], finish[r]) for i, r in enumerate(rids)}, spec.ahead_rounds


def test_ahead_rounds_give_the_same_tokens(dense, tok):
    sampled = dict(max_new_tokens=26, temperature=0.9, top_k=8, presence_penalty=0.8, frequency_penalty=0.3, seed=3)
    reqs = [(PROMPTS[0], dict(max_new_tokens=40)), (PROMPTS[1], sampled), (PROMPTS[2], dict(max_new_tokens=17))]
    want, none = _run(dense, tok, False, reqs)
    got, used = _run(dense, tok, True, reqs)
    assert none == 0 and used > 0
    assert got == want


def test_ahead_rounds_with_a_stop_token_inside_a_round(dense, tok):
    plain, _ = _run(dense, tok, False, [(PROMPTS[0], dict(max_new_tokens=40))])
    tokens = plain[0][0]
    stop = tokens[11]  # a token the request meets mid-run: it stops there, inside some round
    first = tokens.index(stop)
    reqs = [(PROMPTS[0], dict(max_new_tokens=40, stop_token_ids=[stop], ignore_eos=False)),
            (PROMPTS[1], dict(max_new_tokens=30))]
    want, _ = _run(dense, tok, False, reqs)
    got, used = _run(dense, tok, True, reqs)
    assert want[0] == (tokens[: first + 1], "stop")
    assert used > 0 and got == want


@pytest.mark.parametrize("k", [1, 4])
def test_ahead_rounds_at_other_draft_counts(dense, tok, k):
    reqs = [(PROMPTS[0], dict(max_new_tokens=23)), (PROMPTS[2], dict(max_new_tokens=31))]
    want, _ = _run(dense, tok, False, reqs, k)
    got, used = _run(dense, tok, True, reqs, k)
    assert used > 0 and got == want


# --- drafts that are accepted (a scripted drafter), so rounds keep 1..K+1 tokens ----------------
# On the tiny random model the MTP layer's drafts are never accepted: every round keeps one
# token, and neither a stop inside a round nor the room and budget limits of a round launched
# ahead are reached. The scripted drafter proposes the known greedy continuation, right for
# `right(position)` tokens of each round.

LONG = PROMPTS[0]


@pytest.fixture(scope="module")
def greedy_ref(dense):
    from ninfer.testing import greedy_generate

    return greedy_generate(dense, LONG, 80)


def _scripted(model, tok, ref, ahead: bool, k: int, right, reqs: list[dict], graphs: bool = True, **kw):
    """Every request on LONG with the scripted drafter, through the stand-in graphs (or eagerly);
    (tokens and finish reason per request, counters: rounds run ahead, cuts inside a round, cuts
    while a round ran ahead, kept rows used)."""
    from spec_helpers import ScriptedDrafter, make_engine
    from test_batched_rounds import StandInGraphs

    eng = make_engine(model, tok, drafter=ScriptedDrafter(LONG + ref, k, right=right), **kw)
    spec = eng.speculative
    if graphs:
        fake = StandInGraphs(spec.cache.num_slots, spec.vocab)
        spec.graphs, spec.history, spec.eager_reason = fake, fake.history, None
    else:
        assert spec.graphs is None and spec.eager_reason is not None
    spec.ahead = ahead
    n = {"cut": 0, "cut_ahead": 0, "kept": 0}
    truncate, with_kept = spec.truncate, spec._with_kept

    def cut(r, slot, kept):
        n["cut"] += 1
        n["cut_ahead"] += spec._pending is not None and any(q is r for q in spec._pending.requests)
        return truncate(r, slot, kept)

    def use_kept(rs, kept):
        n["kept"] += sum(v is not None for v in kept)
        return with_kept(rs, kept)

    spec.truncate, spec._with_kept = cut, use_kept
    rids = [eng.add_request(LONG, params(**p)) for p in reqs]
    got = {r: [] for r in rids}
    fin = {}
    while eng.has_unfinished():
        for o in eng.step():
            got[o.request_id] += o.new_token_ids
            if o.finished:
                fin[o.request_id] = o.finish_reason
    return [(got[r], fin[r]) for r in rids], {**n, "ahead": spec.ahead_rounds}


def _both(model, tok, ref, k, right, reqs, **kw):
    off, n_off = _scripted(model, tok, ref, False, k, right, reqs, **kw)
    on, n_on = _scripted(model, tok, ref, True, k, right, reqs, **kw)
    if kw.get("graphs", True):
        # eager rounds run ahead on the same rule: the same rounds, ahead, kept rows and cuts
        eager, n_eager = _scripted(model, tok, ref, True, k, right, reqs, **kw, graphs=False)
        assert eager == on and n_eager == n_on, (n_eager, n_on)
    assert n_off["ahead"] == 0 and n_on["ahead"] > 0, n_on
    assert on == off
    return off, n_on


@pytest.mark.parametrize("k", [1, 3, 4])
def test_scripted_rounds_ahead_keep_several_tokens(dense, tok, greedy_ref, k):
    reqs = [dict(max_new_tokens=40), dict(max_new_tokens=23), dict(max_new_tokens=31)]
    off, n = _both(dense, tok, greedy_ref, k, None, reqs, max_batch=3)
    for (tokens, reason), p in zip(off, reqs):
        assert tokens == greedy_ref[: p["max_new_tokens"]] and reason == "length"
    assert n["kept"] > 0  # the batch changed under a round in flight, and its rows were used


def test_scripted_stop_inside_a_round_while_the_next_runs_ahead(dense, tok, greedy_ref):
    """Every draft right (K = 3: four tokens a round): the stop lands inside a round, for one of
    these stops while the next round already runs ahead; the finished request's slot goes to the
    queued third request."""
    cut_ahead = 0
    for stop_at in (10, 19, 25):
        stop = greedy_ref[stop_at]
        reqs = [dict(max_new_tokens=40, stop_token_ids=[stop], ignore_eos=False), dict(max_new_tokens=45),
                dict(max_new_tokens=30)]
        off, n = _both(dense, tok, greedy_ref, 3, lambda p: 3, reqs, max_batch=2)
        first = greedy_ref.index(stop)
        assert off[0] == (greedy_ref[: first + 1], "stop")
        assert n["cut"] >= 1
        cut_ahead += n["cut_ahead"]
    assert cut_ahead >= 1


@pytest.mark.parametrize("ctx", [60, 63, 66])
def test_scripted_rounds_ahead_at_the_context_limit(dense, tok, greedy_ref, ctx):
    _both(dense, tok, greedy_ref, 3, lambda p: 3, [dict(max_new_tokens=80), dict(max_new_tokens=80)], max_batch=2,
          max_context=ctx)


@pytest.mark.parametrize("budget", [10, 13, 16])
def test_scripted_rounds_ahead_at_the_output_budget(dense, tok, greedy_ref, budget):
    _both(dense, tok, greedy_ref, 3, lambda p: 3, [dict(max_new_tokens=budget), dict(max_new_tokens=budget + 2)],
          max_batch=2)


def test_scripted_sampled_rounds_ahead_with_penalties(dense, tok, greedy_ref):
    reqs = [dict(max_new_tokens=40, temperature=0.3, top_k=4, presence_penalty=0.4, frequency_penalty=0.2, seed=1),
            dict(max_new_tokens=33, temperature=0.5, presence_penalty=0.6, seed=11), dict(max_new_tokens=27)]
    _both(dense, tok, greedy_ref, 3, lambda p: 3, reqs, max_batch=3)


def test_a_stale_kept_row_is_refused(dense, tok):
    """A kept row whose request moved on other than by the round before it is a bug, said loudly."""
    from ninfer.speculative import _Round

    eng, _ = _graph_engine(dense, tok, 3, max_batch=2)
    spec = eng.speculative
    rid = eng.add_request(PROMPTS[0], params(max_new_tokens=20))
    eng.step()  # prefill and first token
    r = eng._requests[rid]
    stale = _Round([r], [r.slot], spec._out_host[0], None, (0.0, 0.0, 0.0), [r.num_computed + 5],
                   [len(r.output_ids)], [r.output_ids[-1]], rows=[[0] * (spec.k + 2)])
    with pytest.raises(RuntimeError, match="ran ahead"):
        spec._with_kept([r], [(stale, 0)])
