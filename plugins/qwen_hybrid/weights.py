"""Tensor names and shapes of the family as published, and how they reach the model.

One list (`text_tensors`, `mtp_tensors`) says what a checkpoint holds; the loader checks a
checkpoint against it, random weights and `make-tiny` are generated from it. Names are canonical:
the HF name without the `model.language_model.` (published multimodal layout) or `model.`
(transformers' CausalLM layout) prefix. MoE experts are canonical in the fused layout of the
official checkpoints (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]); the
per-expert layout (`experts.{e}.gate_proj.weight`, ...) is stacked into it on load.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable

import torch
from tqdm import tqdm

from ninfer.errors import CheckpointError
from ninfer_plugins.qwen_hybrid.shape import FULL, QwenHybridShape

Shape = tuple[int, ...]
PUBLISHED_PREFIX = "model.language_model."
CAUSAL_LM_PREFIX = "model."


def _attention(s: QwenHybridShape, p: str) -> dict[str, Shape]:
    h = s.hidden_size
    return {
        f"{p}self_attn.q_proj.weight": (2 * s.q_width, h),
        f"{p}self_attn.k_proj.weight": (s.kv_width, h),
        f"{p}self_attn.v_proj.weight": (s.kv_width, h),
        f"{p}self_attn.o_proj.weight": (h, s.q_width),
        f"{p}self_attn.q_norm.weight": (s.head_dim,),
        f"{p}self_attn.k_norm.weight": (s.head_dim,),
    }


def _gdn(s: QwenHybridShape, p: str) -> dict[str, Shape]:
    h, hv = s.hidden_size, s.linear_num_value_heads
    return {
        f"{p}linear_attn.in_proj_qkv.weight": (s.conv_dim, h),
        f"{p}linear_attn.in_proj_z.weight": (s.linear_value_dim, h),
        f"{p}linear_attn.in_proj_b.weight": (hv, h),
        f"{p}linear_attn.in_proj_a.weight": (hv, h),
        f"{p}linear_attn.conv1d.weight": (s.conv_dim, 1, s.linear_conv_kernel_dim),
        f"{p}linear_attn.A_log": (hv,),
        f"{p}linear_attn.dt_bias": (hv,),
        f"{p}linear_attn.norm.weight": (s.linear_value_head_dim,),
        f"{p}linear_attn.out_proj.weight": (h, s.linear_value_dim),
    }


def _ffn(s: QwenHybridShape, p: str) -> dict[str, Shape]:
    h = s.hidden_size
    if not s.is_moe:
        i = s.intermediate_size
        return {
            f"{p}mlp.gate_proj.weight": (i, h),
            f"{p}mlp.up_proj.weight": (i, h),
            f"{p}mlp.down_proj.weight": (h, i),
        }
    e, i, si = s.num_experts, s.moe_intermediate_size, s.shared_expert_intermediate_size
    return {
        f"{p}mlp.gate.weight": (e, h),
        f"{p}mlp.experts.gate_up_proj": (e, 2 * i, h),
        f"{p}mlp.experts.down_proj": (e, h, i),
        f"{p}mlp.shared_expert.gate_proj.weight": (si, h),
        f"{p}mlp.shared_expert.up_proj.weight": (si, h),
        f"{p}mlp.shared_expert.down_proj.weight": (h, si),
        f"{p}mlp.shared_expert_gate.weight": (1, h),
    }


def _layer(s: QwenHybridShape, p: str, kind: str) -> dict[str, Shape]:
    h = s.hidden_size
    out = {f"{p}input_layernorm.weight": (h,), f"{p}post_attention_layernorm.weight": (h,)}
    out.update(_attention(s, p) if kind == FULL else _gdn(s, p))
    out.update(_ffn(s, p))
    return out


def text_tensors(s: QwenHybridShape) -> dict[str, Shape]:
    """Canonical name -> shape of the text decoder and head."""
    h = s.hidden_size
    out: dict[str, Shape] = {"embed_tokens.weight": (s.vocab_size, h)}
    for i, kind in enumerate(s.layer_types):
        out.update(_layer(s, f"layers.{i}.", kind))
    out["norm.weight"] = (h,)
    if not s.tie_word_embeddings:
        out["lm_head.weight"] = (s.vocab_size, h)
    return out


def mtp_tensors(s: QwenHybridShape) -> dict[str, Shape]:
    """The MTP block's tensors (names as published, `mtp.` prefix kept)."""
    if not s.mtp_num_hidden_layers:
        return {}
    h = s.hidden_size
    out: dict[str, Shape] = {
        "mtp.fc.weight": (h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,),
        "mtp.norm.weight": (h,),
    }
    for i in range(s.mtp_num_hidden_layers):
        out.update(_layer(s, f"mtp.layers.{i}.", FULL))
    return out


def hf_name(canonical: str, prefix: str) -> str:
    return canonical if canonical.startswith(("lm_head.", "mtp.")) else prefix + canonical


def per_expert_names(fused: str, num_experts: int) -> list[str]:
    """HF per-expert names standing for a fused experts tensor (gate_up -> gate, up; down -> down)."""
    base = fused.rsplit(".", 1)[0]  # "...mlp.experts"
    if fused.endswith("gate_up_proj"):
        return [f"{base}.{e}.{part}_proj.weight" for e in range(num_experts) for part in ("gate", "up")]
    return [f"{base}.{e}.down_proj.weight" for e in range(num_experts)]


def is_fused_experts(name: str) -> bool:
    return name.endswith(("experts.gate_up_proj", "experts.down_proj"))


# --- values for random weights and tiny checkpoints ----------------------------------------------


def init_tensor(name: str, shape: Shape, gen: torch.Generator, device: torch.device | str = "cpu") -> torch.Tensor:
    """A deterministic fp32 value for one tensor, scaled so a random model's activations stay O(1)
    and every convention (zero-centred norms, gates, decays) is exercised away from its identity."""

    def randn() -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32)

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return torch.rand(shape, generator=gen, device=device, dtype=torch.float32) * (hi - lo) + lo

    if name.endswith("linear_attn.norm.weight"):
        return 1.0 + 0.2 * randn()  # plain RMSNorm: weight around 1
    if name.endswith("A_log"):
        return uniform(0.05, 2.0).log()  # decay rates from slow to fast
    if name.endswith("dt_bias"):
        return uniform(-3.0, 0.5)
    if name.endswith("conv1d.weight"):
        return 0.5 * randn()
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return 0.2 * randn()  # zero-centred: (1 + w)
    if name.endswith("embed_tokens.weight"):
        return randn()
    if len(shape) == 3:  # stacked experts [E, n, k]
        return randn() / math.sqrt(shape[-1])
    if len(shape) == 2:
        return randn() / math.sqrt(shape[-1])
    return 0.02 * randn()


# --- loading -------------------------------------------------------------------------------------


def detect_prefix(source: Any, where: str) -> str:
    for prefix in (PUBLISHED_PREFIX, CAUSAL_LM_PREFIX):
        if source.has(prefix + "embed_tokens.weight"):
            return prefix
    raise CheckpointError(
        f"{where}: no tensor model.language_model.embed_tokens.weight (nor model.embed_tokens.weight); "
        "this is not a Qwen3.5/3.6 hybrid checkpoint in the Hugging Face layout.",
        tensor="model.language_model.embed_tokens.weight",
    )


def read_tensor(source: Any, canonical: str, shape: Shape, prefix: str, num_experts: int) -> torch.Tensor:
    """One canonical tensor from the checkpoint, stacking per-expert tensors when not fused."""
    name = hf_name(canonical, prefix)
    if source.has(name) or not is_fused_experts(canonical):
        return source.get(name, shape=shape)
    parts = per_expert_names(name, num_experts)
    if not source.has(parts[0]):
        # neither layout: name the published (fused) tensor
        return source.get(name, shape=shape)
    e, rows, cols = shape
    per = (rows // 2, cols) if canonical.endswith("gate_up_proj") else (rows, cols)
    tensors = [source.get(p, shape=per) for p in parts]
    if canonical.endswith("gate_up_proj"):
        return torch.stack([torch.cat(tensors[2 * i : 2 * i + 2]) for i in range(e)])
    return torch.stack(tensors)


def load_text_weights(
    source: Any, shape: QwenHybridShape, assign: Callable[[str, torch.Tensor], None], where: str
) -> str:
    """Read every text tensor, checking names and shapes, and hand each to `assign`.

    A source with `get_packed(hf_name) -> PackedWeight | None` (a pre-quantized checkpoint) gives
    linear weights already packed; everything else is read as a tensor. Returns the prefix found.
    A progress bar appears on stderr when loading takes more than a second.
    """
    prefix = detect_prefix(source, where)
    wanted = text_tensors(shape)
    # a loader of pre-quantized checkpoints hands linear weights over already packed
    get_packed = getattr(source, "get_packed", None)
    bar = tqdm(wanted.items(), desc="loading weights", unit="tensor", file=sys.stderr, delay=1.0, leave=False)
    for canonical, shp in bar:
        packed = get_packed(hf_name(canonical, prefix)) if get_packed is not None else None
        if packed is None:
            packed = read_tensor(source, canonical, shp, prefix, shape.num_experts)
        assign(canonical, packed)
    bar.close()
    return prefix
