"""Parity with transformers' own Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM in fp32 on CPU.

Tiny checkpoints come from `make_tiny` (the published layout: model.language_model.*, mtp.*,
model.visual.*, fused or per-expert MoE, sharded or not) and from transformers' `save_pretrained`
(the CausalLM layout: model.*). Both sides read the same bf16/fp32 values, so the only difference
left is arithmetic order: logits agree to 1e-4 relative and greedy tokens are identical.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from ninfer.testing import greedy_generate, load_model, make_tiny  # noqa: E402
from ninfer_plugins.qwen_hybrid.weights import init_tensor  # noqa: E402

PROMPT_LEN, NEW_TOKENS, VOCAB = 64, 32, 512
CASES = {
    # id -> make_tiny arguments
    "qwen3.6-27b": dict(like="qwen3.6-27b"),
    "qwen3.8-27b-sharded": dict(like="qwen3.8-27b", shards=3, seed=1),
    "qwen3.6-35b-a3b-fused": dict(like="qwen3.6-35b-a3b", seed=2),
    "qwen3.6-35b-a3b-per-expert": dict(like="qwen3.6-35b-a3b", seed=2, expert_layout="per_expert"),
}


def _hf_class(model):
    return transformers.Qwen3_5MoeForCausalLM if model.shape.is_moe else transformers.Qwen3_5ForCausalLM


def _save_hf(tmp_path_factory, moe: bool):
    """A small model built and saved by transformers itself, weights drawn like make_tiny's."""
    common = dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
    )  # fmt: skip
    if moe:
        cfg = transformers.Qwen3_5MoeTextConfig(
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40, **common
        )
        model = transformers.Qwen3_5MoeForCausalLM(cfg)
    else:
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(intermediate_size=96, **common))
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init_tensor(name, tuple(p.shape), gen))
    out = tmp_path_factory.mktemp("hf-moe" if moe else "hf-dense")
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=[*CASES, "hf-save-dense", "hf-save-moe"])
def checkpoint(request, tmp_path_factory):
    if request.param.startswith("hf-save"):
        return _save_hf(tmp_path_factory, moe=request.param.endswith("moe"))
    return make_tiny(out_dir=tmp_path_factory.mktemp(request.param), vocab=VOCAB, **CASES[request.param])


@pytest.fixture(scope="module")
def pair(checkpoint):
    ours = load_model(checkpoint)
    theirs = _hf_class(ours).from_pretrained(checkpoint, dtype=torch.float32).eval()
    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(3))
    return ours, theirs, prompt


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _prefill_logits(model, ids, chunk):
    cache = model.allocate_cache(2, 128, "bf16")
    # slot 1: a non-zero slot catches indexing that only works for slot 0
    outs = [model.forward(ids[s : s + chunk], cache, 1, s) for s in range(0, len(ids), chunk)]
    return model.compute_logits(torch.cat(outs))


def test_prompt_logits_match(pair):
    ours, theirs, prompt = pair
    with torch.no_grad():
        ref = theirs(prompt[None]).logits[0].float()
    assert _rel(_prefill_logits(ours, prompt, PROMPT_LEN), ref) < 1e-4


@pytest.mark.parametrize("chunk", [16, 24])
def test_chunked_prefill_equals_one_pass(pair, chunk):
    ours, _, prompt = pair
    whole = _prefill_logits(ours, prompt, PROMPT_LEN)
    assert _rel(_prefill_logits(ours, prompt, chunk), whole) < 1e-5


def test_greedy_tokens_identical(pair):
    ours, theirs, prompt = pair
    with torch.no_grad():
        ref = theirs.generate(prompt[None], max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)
    ref = ref[0, PROMPT_LEN:]
    assert greedy_generate(ours, prompt, NEW_TOKENS, chunk=24) == ref.tolist()


def test_decode_equals_full_recompute(pair):
    ours, theirs, prompt = pair
    tokens = greedy_generate(ours, prompt, 8)
    full = torch.cat([prompt, torch.tensor(tokens)])
    recompute = _prefill_logits(ours, full, len(full))
    cache = ours.allocate_cache(1, 128, "bf16")
    stepped = [ours.compute_logits(ours.forward(prompt, cache, 0, 0))]
    for i, tok in enumerate(tokens[:-1]):
        h = ours.decode(torch.tensor([tok]), cache, torch.tensor([0]), torch.tensor([PROMPT_LEN + i]))
        stepped.append(ours.compute_logits(h))
    assert _rel(torch.cat(stepped), recompute[: len(full) - 1]) < 1e-5
    with torch.no_grad():
        ref = theirs(full[None]).logits[0].float()
    assert _rel(recompute, ref) < 1e-4
