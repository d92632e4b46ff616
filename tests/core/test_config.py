"""Request and engine settings are checked where they are made, with messages that name the field."""

from __future__ import annotations

import pytest

from ninfer.config import EngineConfig, SamplingParams
from ninfer.errors import UserError


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("temperature", -0.1, "temperature"),
        ("temperature", 2.5, "temperature"),
        ("temperature", float("nan"), "temperature"),
        ("top_p", 1.5, "top_p"),
        ("top_p", -0.01, "top_p"),
        ("min_p", 2.0, "min_p"),
        ("presence_penalty", 2.5, "presence_penalty"),
        ("frequency_penalty", -3.0, "frequency_penalty"),
        ("top_k", 1.5, "top_k"),
        ("max_new_tokens", 0, "max_new_tokens"),
        ("seed", "x", "seed"),
    ],
)
def test_sampling_params_out_of_range(field, value, match):
    with pytest.raises(UserError, match=match) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field


def test_sampling_defaults_and_top_k_cap():
    p = SamplingParams()
    assert not p.greedy
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(top_k=0).effective_top_k == 20
    assert SamplingParams(top_k=50).effective_top_k == 20
    assert SamplingParams(top_k=5).effective_top_k == 5


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"quant": "int3"}, "--quant"),
        ({"spec": "eagle"}, "--spec"),
        ({"kv_dtype": "int4"}, "--kv-dtype"),
        ({"max_context": 4}, "--max-context"),
        ({"spec": "mtp", "draft_tokens": 6}, "--draft-tokens"),
        ({"spec": "dflash", "draft_tokens": 16}, "--draft-tokens"),
        ({"prefill_chunk": -1}, "--prefill-chunk"),
        ({"prefill_chunk_busy": -1}, "--prefill-chunk-busy"),
    ],
)
def test_engine_config_rejects(kwargs, match):
    with pytest.raises(UserError, match=match):
        EngineConfig(model="x", **kwargs)
