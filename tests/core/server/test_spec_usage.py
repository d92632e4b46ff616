"""`usage.ninfer_spec` (drafted, accepted, rounds, accepted per position) when the server speculates,
through the official openai and anthropic SDKs, streamed and not; absent without --spec."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .conftest import Served, _serve
from .test_openai import collect

MSGS = [{"role": "user", "content": "Name three colours."}]
K = 2


@pytest.fixture(scope="module")
def spec_server() -> Iterator[Served]:
    from ninfer.config import EngineConfig
    from ninfer.engine import AsyncEngine
    from ninfer.startup import build_engine
    from ninfer.testing import default_tiny_path

    config = EngineConfig(model=str(default_tiny_path()), device="cpu", max_context=256, max_batch=2, spec="mtp", draft_tokens=K)
    engine = AsyncEngine(build_engine(config))
    yield from _serve(engine)
    engine.shutdown(drain=False)


def _check(spec: dict, completion_tokens: int) -> None:
    assert set(spec) == {"drafted", "accepted", "rounds", "accepted_per_position"}
    assert spec["drafted"] == K * spec["rounds"] and len(spec["accepted_per_position"]) in (0, K)
    assert sum(spec["accepted_per_position"]) == spec["accepted"]
    # the first token comes from prefill; each round yields 1 + its accepted drafts
    assert spec["rounds"] > 0 and spec["rounds"] + spec["accepted"] <= completion_tokens


def test_openai_usage_carries_spec_stats(spec_server):
    client = spec_server.openai()
    model = spec_server.llm.info["model"]
    full = client.chat.completions.create(model=model, messages=MSGS, max_tokens=12, temperature=0)
    _check(full.usage.model_extra["ninfer_spec"], full.usage.completion_tokens)
    *_, usage, _ = collect(
        client.chat.completions.create(model=model, messages=MSGS, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True})
    )
    assert usage.model_extra["ninfer_spec"] == full.usage.model_extra["ninfer_spec"]


def test_anthropic_usage_carries_spec_stats(spec_server):
    client = spec_server.anthropic()
    # this SDK has no `temperature` argument: it travels as an extra field
    body = dict(model="tiny", max_tokens=12, messages=MSGS, extra_body={"temperature": 0})
    msg = client.messages.create(**body)
    spec = msg.usage.model_extra["ninfer_spec"]
    _check(spec, msg.usage.output_tokens)
    # streamed: on the message_delta event's usage (the SDK's accumulated final message copies only
    # the standard usage fields from it)
    with client.messages.stream(**body) as stream:
        deltas = [e for e in stream if e.type == "message_delta"]
    assert [d.usage.model_extra["ninfer_spec"] for d in deltas] == [spec]


def test_no_spec_field_without_speculation(fake):
    r = fake.openai().chat.completions.create(model="fake-qwen", messages=MSGS, max_tokens=4)
    assert "ninfer_spec" not in (r.usage.model_extra or {})
