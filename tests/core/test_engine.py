"""The step loop: chunked prefill, batched decode, stops, limits, aborts, slots given back."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from ninfer.config import SamplingParams
from ninfer.engine import AsyncEngine, LLMEngine
from ninfer.errors import UserError
from ninfer.frontend.tokenizer import load_tokenizer
from ninfer.kernels.sampling import ReferenceSampler

VOCAB = 248320


class FakeCache:
    def __init__(self, num_slots: int, max_context: int) -> None:
        self.num_slots = num_slots
        self.max_context = max_context
        self.resets: list[int] = []

    def reset(self, slot: int) -> None:
        self.resets.append(slot)


class ChainModel:
    """Emits nxt[last token]: a successor table makes any scripted output deterministic."""

    def __init__(self, nxt: dict[int, int], default: int = 11) -> None:
        self.nxt = nxt
        self.default = default
        self.shape = SimpleNamespace(vocab_size=VOCAB)
        self.device = torch.device("cpu")
        self.calls: list[tuple[str, int, int]] = []

    def allocate_cache(self, num_slots, max_context, kv_dtype):
        return FakeCache(num_slots, max_context)

    def forward(self, ids, cache, slot, start_pos):
        self.calls.append(("forward", int(ids.numel()), start_pos))
        return ids.to(torch.float32)[:, None]

    def decode(self, ids, cache, slots, positions):
        self.calls.append(("decode", int(ids.numel()), int(positions[0])))
        return ids.to(torch.float32)[:, None]

    def compute_logits(self, hidden):
        logits = torch.zeros(hidden.shape[0], VOCAB)
        for row, tok in enumerate(hidden[:, 0].long().tolist()):
            logits[row, self.nxt.get(tok, self.default)] = 30.0
        return logits


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def chain(ids: list[int], then: int = 248046) -> dict[int, int]:
    """A successor table that walks `ids` then emits `then`. ids must be distinct."""
    table = {a: b for a, b in zip(ids, ids[1:])}
    table[ids[-1]] = then
    return table


def make_engine(tok, nxt, *, max_context=256, prefill_chunk=1024, prefill_chunk_busy=None, max_batch=4):
    model = ChainModel(nxt)
    cache = model.allocate_cache(max_batch, max_context, "bf16")
    eng = LLMEngine(model, cache, ReferenceSampler(), tok, max_context=max_context, prefill_chunk=prefill_chunk,
                    prefill_chunk_busy=prefill_chunk_busy, max_batch=max_batch)
    return eng, model


GREEDY = dict(temperature=0.0)


def test_generates_until_stop_token_and_counts_it(tok):
    words = tok.encode(" one two three")
    eng, _ = make_engine(tok, chain([5] + words))
    out = eng.generate([1, 2, 5], SamplingParams(**GREEDY, max_new_tokens=50))
    assert out.finish_reason == "stop"
    assert out.new_token_ids == words + [248046]
    assert out.text_delta == " one two three"
    assert out.completion_tokens == len(words) + 1
    assert eng.stats()["free_slots"] == eng.stats()["num_slots"]


def test_max_new_tokens_is_length(tok):
    eng, _ = make_engine(tok, {})
    out = eng.generate([3], SamplingParams(**GREEDY, max_new_tokens=4))
    assert out.finish_reason == "length"
    assert out.new_token_ids == [11, 11, 11, 11]


def test_context_limit_is_length(tok):
    eng, _ = make_engine(tok, {}, max_context=20)
    out = eng.generate(list(range(100, 115)), SamplingParams(**GREEDY, max_new_tokens=100))
    assert out.finish_reason == "length"
    assert out.prompt_tokens + out.completion_tokens == 20


def test_prompt_over_context_is_refused_with_both_counts(tok):
    eng, _ = make_engine(tok, {}, max_context=32)
    with pytest.raises(UserError, match=r"40 tokens.*holds 32"):
        eng.add_request(list(range(40)), SamplingParams())
    with pytest.raises(UserError, match="empty"):
        eng.add_request([], SamplingParams())
    with pytest.raises(UserError, match="outside the vocabulary"):
        eng.add_request([VOCAB], SamplingParams())


def test_stop_string_truncates_exactly(tok):
    words = tok.encode(" alpha beta STOP gamma")
    eng, _ = make_engine(tok, chain([7] + words))
    out = eng.generate([7], SamplingParams(**GREEDY, max_new_tokens=50, stop=("STOP",)))
    assert out.finish_reason == "stop"
    assert out.text_delta == " alpha beta "


def test_chunked_prefill_runs_in_chunks_and_interleaves_decode(tok):
    eng, model = make_engine(tok, {}, prefill_chunk=8)
    eng.add_request(list(range(100, 120)), SamplingParams(**GREEDY, max_new_tokens=3))
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    forwards = [c for c in model.calls if c[0] == "forward"]
    assert forwards == [("forward", 8, 0), ("forward", 8, 8), ("forward", 4, 16)]
    assert [o.new_token_ids[0] for o in outs] == [11, 11, 11]
    # a second request's prefill alternates with the first one's decode steps
    model.calls.clear()
    eng.add_request(list(range(100, 104)), SamplingParams(**GREEDY, max_new_tokens=6))
    eng.step()  # prefill of request A (4 tokens: one chunk)
    eng.add_request(list(range(200, 220)), SamplingParams(**GREEDY, max_new_tokens=2))
    kinds = []
    for _ in range(5):
        eng.step()
        kinds.append(model.calls[-1][0])
    # A's prefill was the last step, so A decodes first, then B's chunks alternate with A's steps
    assert kinds[:4] == ["decode", "forward", "decode", "forward"]


def prompt_beside_a_decoding_request(eng):
    """A: a two-token prompt, then three decode steps; B (20 tokens) arrives once A decodes."""
    eng.add_request([1, 2], SamplingParams(**GREEDY, max_new_tokens=4))
    eng.step()
    eng.add_request(list(range(200, 220)), SamplingParams(**GREEDY, max_new_tokens=1))
    while eng.has_unfinished():
        eng.step()


def test_prefill_takes_the_busy_chunk_only_while_others_decode(tok):
    """Alone, a prompt takes chunks of prefill_chunk; while another request decodes, chunks of
    prefill_chunk_busy between its decode steps; full chunks again once that request is done."""
    eng, model = make_engine(tok, {}, prefill_chunk=8, prefill_chunk_busy=3, max_batch=2)
    eng.runner.lookahead = False  # one model call a step: the calls are the schedule
    eng.add_request(list(range(100, 120)), SamplingParams(**GREEDY, max_new_tokens=1))
    while eng.has_unfinished():
        eng.step()
    assert model.calls == [("forward", 8, 0), ("forward", 8, 8), ("forward", 4, 16)]
    model.calls.clear()
    prompt_beside_a_decoding_request(eng)
    assert model.calls == [
        ("forward", 2, 0),
        ("decode", 1, 2), ("forward", 3, 0),
        ("decode", 1, 3), ("forward", 3, 3),
        ("decode", 1, 4),  # A's fourth token: its last
        ("forward", 8, 6), ("forward", 6, 14),
    ]  # fmt: skip


@pytest.mark.parametrize("busy", [None, 8, 100])
def test_busy_chunk_is_never_longer_than_the_chunk(tok, busy):
    """None means prefill_chunk; a larger busy value is cut to it."""
    eng, model = make_engine(tok, {}, prefill_chunk=8, prefill_chunk_busy=busy, max_batch=2)
    prompt_beside_a_decoding_request(eng)
    assert [c for c in model.calls if c[0] == "forward"] == [
        ("forward", 2, 0), ("forward", 8, 0), ("forward", 8, 8), ("forward", 4, 16)
    ]  # fmt: skip


@pytest.mark.parametrize("busy", [0, -2])
def test_busy_chunk_below_one_is_refused(tok, busy):
    """The engine takes None for "the same as prefill_chunk"; EngineConfig's 0 (its default) is
    resolved by startup.plan, so a 0 here is a caller's mistake, not a silent full chunk."""
    with pytest.raises(ValueError, match="prefill_chunk_busy"):
        make_engine(tok, {}, prefill_chunk=8, prefill_chunk_busy=busy)


def test_decode_batches_all_running(tok):
    eng, model = make_engine(tok, {}, max_batch=3)
    for i in range(3):
        eng.add_request([100 + i], SamplingParams(**GREEDY, max_new_tokens=4))
    while eng.has_unfinished():
        eng.step()
    decode_sizes = [n for kind, n, _ in model.calls if kind == "decode"]
    assert max(decode_sizes) == 3


def test_abort_frees_slot_and_next_request_runs(tok):
    eng, _ = make_engine(tok, {}, max_batch=1)
    rid = eng.add_request([1, 2, 3], SamplingParams(**GREEDY, max_new_tokens=100))
    eng.step()
    assert eng.stats()["free_slots"] == 0
    assert eng.abort(rid)
    assert eng.stats()["free_slots"] == 1
    assert not eng.abort(rid)
    out = eng.generate([4], SamplingParams(**GREEDY, max_new_tokens=2))
    assert out.finish_reason == "length"


def test_waiting_requests_take_freed_slots(tok):
    eng, _ = make_engine(tok, {}, max_batch=2)
    ids = [eng.add_request([i + 1], SamplingParams(**GREEDY, max_new_tokens=3)) for i in range(5)]
    done = set()
    while eng.has_unfinished():
        done |= {o.request_id for o in eng.step() if o.finished}
    assert done == set(ids)
    assert eng.stats()["free_slots"] == 2


def test_async_engine_streams_and_cancel_frees(tok):
    words = tok.encode(" a b c d e f")
    eng, _ = make_engine(tok, chain([9] + words), max_batch=2)
    aeng = AsyncEngine(eng)

    async def main():
        texts = []
        async for out in aeng.generate([9], SamplingParams(**GREEDY, max_new_tokens=50)):
            texts.append(out.text_delta)
        assert "".join(texts) == " a b c d e f"
        # a consumer that walks away mid-stream: the request is aborted, its slot returned
        gen = aeng.generate([1], SamplingParams(**GREEDY, max_new_tokens=10_000))
        await gen.__anext__()
        await gen.aclose()
        for _ in range(200):
            if aeng.stats()["free_slots"] == 2:
                break
            await asyncio.sleep(0.01)
        assert aeng.stats()["free_slots"] == 2
        with pytest.raises(UserError):
            async for _ in aeng.generate([], SamplingParams()):
                pass

    try:
        asyncio.run(main())
    finally:
        aeng.shutdown(drain=False)
