"""The family's shape: every number of config.json the model code needs, read once, frozen.

`parse_hf_config` accepts the published files as they are (the multimodal wrapper with a nested
`text_config`, `model_type` qwen3_5 / qwen3_5_moe) and transformers' own CausalLM saves (a flat
text config, `model_type` qwen3_5_text / qwen3_5_moe_text).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ninfer.errors import CheckpointError

FAMILY = "qwen_hybrid"
DENSE_TYPES = ("qwen3_5", "qwen3_5_text")
MOE_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")
LINEAR, FULL = "linear_attention", "full_attention"

# KV bytes per element. int8: one fp16 scale per 64-element group (spec section 5).
KV_ELEMENT_BYTES = {"bf16": 2.0, "int8": 1.0 + 2.0 / 64, "fp8": 1.0}


class QwenHybridShape(msgspec.Struct, frozen=True, kw_only=True):
    family: str = FAMILY
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    # dense SwiGLU width; 0 for MoE checkpoints
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    # the leading dims of each head that RoPE rotates (head_dim * partial_rotary_factor)
    rotary_dim: int
    rope_theta: float
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    mtp_num_hidden_layers: int = 0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 262144

    # --- derived facts ---------------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        # in_proj_qkv rows: [q all key heads | k all key heads | v all value heads]
        return 2 * self.linear_key_dim + self.linear_value_dim

    # --- sizes for memory planning -----------------------------------------------------------------

    def _attention_params(self) -> int:
        h = self.hidden_size
        return 2 * self.q_width * h + 2 * self.kv_width * h + h * self.q_width + 2 * self.head_dim

    def _gdn_params(self) -> int:
        h, hv = self.hidden_size, self.linear_num_value_heads
        return (
            self.conv_dim * h  # in_proj_qkv
            + self.linear_value_dim * h  # in_proj_z
            + 2 * hv * h  # in_proj_a, in_proj_b
            + self.conv_dim * self.linear_conv_kernel_dim  # conv1d
            + 2 * hv  # A_log, dt_bias
            + self.linear_value_head_dim  # norm
            + h * self.linear_value_dim  # out_proj
        )

    def _ffn_params(self) -> int:
        h = self.hidden_size
        if not self.is_moe:
            return 3 * h * self.intermediate_size
        routed = self.num_experts * 3 * h * self.moe_intermediate_size
        shared = 3 * h * self.shared_expert_intermediate_size
        return routed + shared + self.num_experts * h + h  # + router + shared_expert_gate

    def param_count(self) -> int:
        """Parameters of the text decoder and head: embedding, layers, final norm, lm_head."""
        h = self.hidden_size
        per_layer = 2 * h + self._ffn_params()
        mixers = len(self.full_layers) * self._attention_params() + len(self.linear_layers) * self._gdn_params()
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * per_layer + mixers + h + head

    def mtp_param_count(self) -> int:
        """The MTP block: fc [H, 2H], three norms, one full-attention decoder layer."""
        h = self.hidden_size
        layer = 2 * h + self._attention_params() + self._ffn_params()
        return self.mtp_num_hidden_layers * layer + (2 * h * h + 3 * h if self.mtp_num_hidden_layers else 0)

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """K and V bytes one token adds across all full-attention layers."""
        per_elem = KV_ELEMENT_BYTES[kv_dtype]
        return int(round(2 * self.kv_width * per_elem * len(self.full_layers)))

    def state_bytes_per_sequence(self, conv_bytes: int = 2) -> int:
        """fp32 recurrent state plus the conv state (last k-1 pre-conv inputs) of every GDN layer."""
        rec = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim * 4
        conv = (self.linear_conv_kernel_dim - 1) * self.conv_dim * conv_bytes
        return len(self.linear_layers) * (rec + conv)

    def linear_shapes(self) -> list[tuple[str, int, int]]:
        """Every linear the model builds, as (canonical name, n, k): what the startup report and
        memory plan ask kernels for before any module exists. MoE experts are one linear each."""
        from ninfer_plugins.qwen_hybrid.weights import text_tensors

        out: list[tuple[str, int, int]] = []
        for name, shp in text_tensors(self).items():
            if name.endswith(".experts.gate_up_proj") or name.endswith(".experts.down_proj"):
                base, _, leaf = name.rpartition(".")
                out.extend((f"{base}.{e}.{leaf}", shp[1], shp[2]) for e in range(shp[0]))
            elif name.endswith(".weight") and len(shp) == 2 and name != "embed_tokens.weight":
                out.append((name.removesuffix(".weight"), shp[0], shp[1]))
        return out

    def spec_fields(self) -> dict[str, Any]:
        """The fields a registered CheckpointSpec pins (everything but the family name)."""
        out = msgspec.structs.asdict(self)
        out.pop("family")
        return out


def text_config_of(hf_config: dict[str, Any]) -> dict[str, Any] | None:
    """The text part of a config.json, or None when the file is not this family's."""
    top_type = hf_config.get("model_type")
    if top_type in ("qwen3_5", "qwen3_5_moe") and isinstance(hf_config.get("text_config"), dict):
        text = dict(hf_config["text_config"])
        text.setdefault("model_type", top_type + "_text")
        return text
    if top_type in DENSE_TYPES + MOE_TYPES:
        return dict(hf_config)
    return None


def _need(cfg: dict[str, Any], key: str, where: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise CheckpointError(f"{where}: config.json has no {key!r}; it is not a complete Qwen3.5/3.6 hybrid config.")
    return cfg[key]


def parse_hf_config(hf_config: dict[str, Any], where: str = "config.json") -> QwenHybridShape | None:
    """QwenHybridShape for a Qwen3.5/3.6/3.8 hybrid config.json, None for any other model."""
    cfg = text_config_of(hf_config)
    if cfg is None:
        return None
    moe = cfg.get("model_type") in MOE_TYPES or "num_experts" in cfg
    n_layers = int(_need(cfg, "num_hidden_layers", where))
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        interval = int(cfg.get("full_attention_interval", 4))
        layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers)]
    layer_types = tuple(layer_types)
    if len(layer_types) != n_layers or not set(layer_types) <= {LINEAR, FULL}:
        raise CheckpointError(
            f"{where}: layer_types must list {n_layers} entries of 'linear_attention'/'full_attention', "
            f"got {list(layer_types)}."
        )
    # Newer transformers keep rope facts in rope_parameters (and drop the top-level copies on save).
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise CheckpointError(f"{where}: rope_type {rope_type!r} is not supported (only the native 'default' RoPE).")
    hidden = int(_need(cfg, "hidden_size", where))
    heads = int(_need(cfg, "num_attention_heads", where))
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    rotary_dim = int(head_dim * float(partial))
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise CheckpointError(f"{where}: partial_rotary_factor {partial} gives an odd rotary width {rotary_dim}.")
    shape = QwenHybridShape(
        vocab_size=int(_need(cfg, "vocab_size", where)),
        hidden_size=hidden,
        num_hidden_layers=n_layers,
        layer_types=layer_types,
        intermediate_size=0 if moe else int(_need(cfg, "intermediate_size", where)),
        num_attention_heads=heads,
        num_key_value_heads=int(_need(cfg, "num_key_value_heads", where)),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=float(theta),
        mrope_section=tuple(int(x) for x in rope.get("mrope_section", cfg.get("mrope_section", ())) or ()),
        mrope_interleaved=bool(rope.get("mrope_interleaved", cfg.get("mrope_interleaved", False))),
        linear_num_key_heads=int(_need(cfg, "linear_num_key_heads", where)),
        linear_num_value_heads=int(_need(cfg, "linear_num_value_heads", where)),
        linear_key_head_dim=int(_need(cfg, "linear_key_head_dim", where)),
        linear_value_head_dim=int(_need(cfg, "linear_value_head_dim", where)),
        linear_conv_kernel_dim=int(cfg.get("linear_conv_kernel_dim", 4)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        num_experts=int(_need(cfg, "num_experts", where)) if moe else 0,
        num_experts_per_tok=int(_need(cfg, "num_experts_per_tok", where)) if moe else 0,
        moe_intermediate_size=int(_need(cfg, "moe_intermediate_size", where)) if moe else 0,
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size", 0)) if moe else 0,
        mtp_num_hidden_layers=int(cfg.get("mtp_num_hidden_layers", 0) or 0),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", hf_config.get("tie_word_embeddings", False))),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 262144)),
    )
    _check(shape, where)
    return shape


def _check(s: QwenHybridShape, where: str) -> None:
    problems = []
    if s.num_attention_heads % s.num_key_value_heads:
        problems.append(
            f"num_attention_heads {s.num_attention_heads} is not a multiple of num_key_value_heads "
            f"{s.num_key_value_heads}"
        )
    if s.linear_num_value_heads % s.linear_num_key_heads:
        problems.append(
            f"linear_num_value_heads {s.linear_num_value_heads} is not a multiple of linear_num_key_heads "
            f"{s.linear_num_key_heads}"
        )
    if s.is_moe and not 0 < s.num_experts_per_tok <= s.num_experts:
        problems.append(f"num_experts_per_tok {s.num_experts_per_tok} is not in 1..{s.num_experts}")
    if problems:
        raise CheckpointError(f"{where}: " + "; ".join(problems) + ".")
