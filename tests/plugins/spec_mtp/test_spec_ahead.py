"""Batched rounds launched one ahead (NINFER_SPEC_AHEAD=1, `SpeculativeRound._launch_ahead`), on
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
