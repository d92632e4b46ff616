"""`--quant int4` and `--quant int8`: which scheme each linear of a Qwen hybrid model gets.

int4 is the peer's groupwise-int profile per checkpoint (spec 4.4); int8 is q8_g32 everywhere.
Both keep in bf16 what the peer keeps unquantized: the GDN a/b projections (in_proj_a,
in_proj_b), the MoE router (mlp.gate) and shared-expert gate; norms, the GDN conv, A_log and
dt_bias are not linears and never reach a recipe.

Names are the model's canonical ones (HF names without `model.language_model.`): `lm_head`,
`embed_tokens`, `layers.N.self_attn.q_proj`, `layers.N.linear_attn.in_proj_qkv`,
`layers.N.mlp.gate_proj`, `layers.N.mlp.experts.E.gate_up_proj`, `mtp.*`, ...

The peer quantizes fused parents whose rows mix two of its choices; our linears follow the HF
tensors, so such a linear takes the wider of the two: `q_proj` holds q (peer: Q4) and the output
gate (Q5) -> q5; `in_proj_qkv` holds q, k (Q4) and v (Q5) -> q5. (A model that splits them
would get the peer's exact choice from the same rules: `..._q`/`..._k` names are not matched.)
"""

from __future__ import annotations

import re
from typing import Any

from ninfer.linear import DENSE, QuantRecipe

# Kept unquantized by every recipe (spec 4.4: BF16 a/b, router, shared-expert gate).
_UNQUANTIZED = re.compile(
    r"(^|\.)(in_proj_a|in_proj_b|shared_expert_gate|conv1d|A_log|dt_bias)$|(^|\.)mlp\.gate$|norm(\.|$)"
)
_LAYER = re.compile(r"^layers\.(\d+)\.")


def _common(name: str, head: str) -> str | None:
    """What every profile decides alike: unquantized tensors, MTP in q8, the head."""
    if _UNQUANTIZED.search(name):
        return DENSE
    if name.startswith("mtp."):
        return "q8_g32"
    if name == "lm_head" or name.endswith(".lm_head"):
        return head
    return None


def _dense_profile(head: str, embed: str):
    """Qwen3.6-27B (head, embed q6) and Qwen3.8-27B (both q8), spec 4.4."""

    def scheme_for(name: str, n: int, k: int) -> str:
        if (decided := _common(name, head)) is not None:
            return decided
        if name.endswith("embed_tokens"):
            return embed
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("gate_proj", "up_proj", "k_proj"):
            return "q4_g64"
        if leaf in ("q_proj", "v_proj", "o_proj", "down_proj", "in_proj_qkv", "in_proj_z", "out_proj"):
            return "q5_g64"
        # anything else (a vision or drafter projection reaching the recipe): the peer's W8
        return "q8_g32"

    return scheme_for


def _moe_profile(num_layers: int):
    """Qwen3.6-35B-A3B (spec 4.4): attention, GDN, shared expert, embedding and MTP in q8; routed
    gate_up q4; routed down q5, q6 in the layers the peer names (34, 38, 39 of 40 = L-6, L-2, L-1);
    lm_head q6."""
    wide_down = {num_layers - 6, num_layers - 2, num_layers - 1}

    def scheme_for(name: str, n: int, k: int) -> str:
        if (decided := _common(name, "q6_g64")) is not None:
            return decided
        if ".experts." in name:
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("gate_up_proj", "gate_proj", "up_proj"):
                return "q4_g64"
            m = _LAYER.match(name)
            return "q6_g64" if m and int(m.group(1)) in wide_down else "q5_g64"
        return "q8_g32"

    return scheme_for


def _everything_q8(name: str, n: int, k: int) -> str:
    return DENSE if _UNQUANTIZED.search(name) else "q8_g32"


def _is_moe(shape: Any) -> bool:
    return bool(getattr(shape, "num_experts", 0) or 0)


def recipe(quant: str, shape: Any, spec: Any) -> QuantRecipe | None:
    """The recipe for `--quant quant` on this model, or None when `quant` is not ours."""
    if quant == "int8":
        return QuantRecipe("int8", _everything_q8, "q8_g32 (fp16 scale per 32) for every projection")
    if quant != "int4":
        return None
    ident = getattr(spec, "id", None) if spec is not None else None
    if _is_moe(shape):
        layers = int(getattr(shape, "num_hidden_layers", 40) or 40)
        return QuantRecipe("int4", _moe_profile(layers), f"groupwise-int, Qwen3.6-35B-A3B profile ({ident or 'by structure: MoE'})")
    if ident == "qwen3.8-27b":
        return QuantRecipe("int4", _dense_profile("q8_g32", "q8_g32"), "groupwise-int, Qwen3.8-27B profile (embedding and head q8)")
    return QuantRecipe(
        "int4", _dense_profile("q6_g64", "q6_g64"), f"groupwise-int, Qwen3.6-27B profile ({ident or 'by structure: dense'})"
    )
