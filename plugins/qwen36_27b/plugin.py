"""Qwen/Qwen3.6-27B: dense hybrid, 64 layers (48 Gated DeltaNet + 16 gated attention), H 5120.

Shape from the published config.json (shipped beside this file, byte-exact, sha256 69db4eb7...);
parameter counts from the published tensor inventory (26.90 B text, 0.42 B MTP, 0.46 B vision).
"""

from __future__ import annotations

from ninfer import hookimpl
from ninfer.config import CheckpointSpec, SamplingPreset

LIN, FULL = "linear_attention", "full_attention"

SHAPE = dict(
    vocab_size=248320,
    hidden_size=5120,
    num_hidden_layers=64,
    layer_types=(LIN, LIN, LIN, FULL) * 16,
    intermediate_size=17408,
    num_attention_heads=24,
    num_key_value_heads=4,
    head_dim=256,
    rotary_dim=64,
    rope_theta=10_000_000.0,
    mrope_section=(11, 11, 10),
    mrope_interleaved=True,
    linear_num_key_heads=16,
    linear_num_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    num_experts=0,
    num_experts_per_tok=0,
    moe_intermediate_size=0,
    shared_expert_intermediate_size=0,
    mtp_num_hidden_layers=1,
    tie_word_embeddings=False,
    max_position_embeddings=262144,
)

SPEC = CheckpointSpec(
    id="qwen3.6-27b",
    family="qwen_hybrid",
    hf_repo_ids=("Qwen/Qwen3.6-27B",),
    aliases=("qwen36-27b",),
    shape=SHAPE,
    # spec section 7 (later upstream presets): temperature / top_p / top_k / min_p / presence
    presets={
        "thinking": SamplingPreset(temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, presence_penalty=0.0),
        "non_thinking": SamplingPreset(temperature=0.7, top_p=0.80, top_k=20, min_p=0.0, presence_penalty=1.5),
    },
    default_quant="int4",
    # chat_template.jinja of revision 6a9e13bd (7,764 bytes)
    chat_template_sha256="e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259",
    text_params=26_895_998_464,
    mtp_params=424_699_392,
    description="Qwen3.6-27B dense hybrid (Gated DeltaNet + gated attention), 262k context",
)


@hookimpl
def ninfer_checkpoints():
    return [SPEC]
