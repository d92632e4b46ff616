"""Tiny checkpoints of the family in the exact published layout, for tests and the CLI default.

The published config.json is copied and its numbers scaled down, keeping what the math depends
on: 3 Gated DeltaNet layers then 1 attention layer, the GQA ratio (6 or 8), the GDN value heads
per key head (3 or 2), partial RoPE 0.25 with its MRoPE sections, eps and theta. Tensors carry the
real names (`model.language_model.*`, `lm_head.weight`, `mtp.*`, `model.visual.*`), bf16, fused
MoE experts unless asked for per-expert. Same seed, same bytes.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import torch

from ninfer_plugins.qwen_hybrid.shape import parse_hf_config
from ninfer_plugins.qwen_hybrid.weights import (
    PUBLISHED_PREFIX,
    hf_name,
    init_tensor,
    is_fused_experts,
    mtp_tensors,
    text_tensors,
)

TINY_HIDDEN = 64
TINY_HEAD_DIM = 64  # partial rotary 0.25 -> 16 rotary dims, 8 frequency pairs
TINY_KV_HEADS = 2
TINY_GDN_KEY_HEADS = 2
TINY_GDN_HEAD_DIM = 32
TINY_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "num_position_embeddings": 16}


def _mrope_section(pairs: int) -> list[int]:
    # interleaved MRoPE: pair i is temporal if i%3==0, height if 1, width if 2 ([11,11,10] for 32)
    t, h = math.ceil(pairs / 3), math.ceil((pairs - 1) / 3)
    return [t, h, pairs - t - h]


def tiny_config(published: dict[str, Any], vocab: int, layers: int | None = None) -> dict[str, Any]:
    cfg = copy.deepcopy(published)
    text = cfg["text_config"] if "text_config" in cfg else cfg
    moe = "num_experts" in text
    gqa = text["num_attention_heads"] // text["num_key_value_heads"]
    gva = text["linear_num_value_heads"] // text["linear_num_key_heads"]
    n = layers or (4 if moe else 8)
    interval = int(text.get("full_attention_interval", 4))
    text.update(
        hidden_size=TINY_HIDDEN,
        num_hidden_layers=n,
        num_attention_heads=TINY_KV_HEADS * gqa,
        num_key_value_heads=TINY_KV_HEADS,
        head_dim=TINY_HEAD_DIM,
        linear_num_key_heads=TINY_GDN_KEY_HEADS,
        linear_num_value_heads=TINY_GDN_KEY_HEADS * gva,
        linear_key_head_dim=TINY_GDN_HEAD_DIM,
        linear_value_head_dim=TINY_GDN_HEAD_DIM,
        vocab_size=vocab,
    )
    if "layer_types" in text:
        text["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    if moe:
        text.update(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    else:
        text["intermediate_size"] = 128
    rope = text.get("rope_parameters")
    if rope and "mrope_section" in rope:
        partial = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))
        rope["mrope_section"] = _mrope_section(int(TINY_HEAD_DIM * partial) // 2)
    if isinstance(cfg.get("vision_config"), dict):
        cfg["vision_config"].update(TINY_VISION, out_hidden_size=TINY_HIDDEN)
    return cfg


def visual_tensors(vision: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """model.visual.* names and shapes (the published ViT layout, at the config's size)."""
    h, inner, out = vision["hidden_size"], vision["intermediate_size"], vision["out_hidden_size"]
    merged = h * vision.get("spatial_merge_size", 2) ** 2
    side = vision["patch_size"]
    patch = (h, vision.get("in_channels", 3), vision.get("temporal_patch_size", 2), side, side)
    p = "model.visual."
    t: dict[str, tuple[int, ...]] = {}
    for b in range(vision["depth"]):
        q = f"{p}blocks.{b}."
        t.update({
            f"{q}attn.proj.bias": (h,), f"{q}attn.proj.weight": (h, h),
            f"{q}attn.qkv.bias": (3 * h,), f"{q}attn.qkv.weight": (3 * h, h),
            f"{q}mlp.linear_fc1.bias": (inner,), f"{q}mlp.linear_fc1.weight": (inner, h),
            f"{q}mlp.linear_fc2.bias": (h,), f"{q}mlp.linear_fc2.weight": (h, inner),
            f"{q}norm1.bias": (h,), f"{q}norm1.weight": (h,), f"{q}norm2.bias": (h,), f"{q}norm2.weight": (h,),
        })  # fmt: skip
    t.update({
        f"{p}merger.linear_fc1.bias": (merged,), f"{p}merger.linear_fc1.weight": (merged, merged),
        f"{p}merger.linear_fc2.bias": (out,), f"{p}merger.linear_fc2.weight": (out, merged),
        f"{p}merger.norm.bias": (h,), f"{p}merger.norm.weight": (h,),
        f"{p}patch_embed.proj.bias": (h,), f"{p}patch_embed.proj.weight": patch,
        f"{p}pos_embed.weight": (vision["num_position_embeddings"], h),
    })  # fmt: skip
    return t


def _split_experts(name: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """A fused experts tensor as transformers' per-expert tensors."""
    base = name.rsplit(".", 1)[0]
    out = {}
    for e in range(t.shape[0]):
        if name.endswith("gate_up_proj"):
            gate, up = t[e].chunk(2, dim=0)
            out[f"{base}.{e}.gate_proj.weight"] = gate.contiguous()
            out[f"{base}.{e}.up_proj.weight"] = up.contiguous()
        else:
            out[f"{base}.{e}.down_proj.weight"] = t[e].contiguous()
    return out


def tiny_tensors(cfg: dict[str, Any], seed: int, expert_layout: str) -> dict[str, torch.Tensor]:
    """Every tensor of the tiny checkpoint, bf16, in a fixed order."""
    shape = parse_hf_config(cfg)
    wanted: dict[str, tuple[int, ...]] = {hf_name(k, PUBLISHED_PREFIX): v for k, v in text_tensors(shape).items()}
    wanted.update(mtp_tensors(shape))
    if isinstance(cfg.get("vision_config"), dict):
        wanted.update(visual_tensors(cfg["vision_config"]))
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shp in wanted.items():
        t = init_tensor(name, shp, gen).to(torch.bfloat16)
        if expert_layout == "per_expert" and is_fused_experts(name):
            out.update(_split_experts(name, t))
        else:
            out[name] = t
    return out


def write_tiny(
    published: dict[str, Any],
    out_dir: Path,
    *,
    seed: int = 0,
    vocab: int = 248320,
    expert_layout: str = "fused",
    shards: int = 1,
    layers: int | None = None,
) -> None:
    from safetensors.torch import save_file

    cfg = tiny_config(published, vocab, layers)
    tensors = tiny_tensors(cfg, seed, expert_layout)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the published files are 4-space indented without a trailing newline
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=4))
    meta = {"format": "pt"}
    if shards <= 1:
        save_file(tensors, str(out_dir / "model.safetensors"), metadata=meta)
        return
    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(shards):
        part = names[i * per : (i + 1) * per]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(out_dir / file), metadata=meta)
        for n in part:
            weight_map[n] = file
            total += tensors[n].numel() * tensors[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
