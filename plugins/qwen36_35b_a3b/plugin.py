"""Qwen/Qwen3.6-35B-A3B: MoE hybrid, 40 layers (30 Gated DeltaNet + 10 gated attention), H 2048,
256 routed experts (top 8, I 512) plus a gated shared expert in every layer and in the MTP layer.

Shape from the published config.json (shipped beside this file, byte-exact, sha256 93a4693f...);
parameter counts from the published tensor inventory (34.66 B text, 0.84 B MTP, 0.45 B vision).
"""

from __future__ import annotations

from ninfer import hookimpl
from ninfer.config import CheckpointSpec, SamplingPreset

LIN, FULL = "linear_attention", "full_attention"

SHAPE = dict(
    vocab_size=248320,
    hidden_size=2048,
    num_hidden_layers=40,
    layer_types=(LIN, LIN, LIN, FULL) * 10,
    intermediate_size=0,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    rotary_dim=64,
    rope_theta=10_000_000.0,
    mrope_section=(11, 11, 10),
    mrope_interleaved=True,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    num_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    mtp_num_hidden_layers=1,
    tie_word_embeddings=False,
    max_position_embeddings=262144,
)

SPEC = CheckpointSpec(
    id="qwen3.6-35b-a3b",
    family="qwen_hybrid",
    hf_repo_ids=("Qwen/Qwen3.6-35B-A3B",),
    aliases=("qwen36-35b-a3b", "qwen3.6-35b"),
    shape=SHAPE,
    # spec section 7 (later upstream presets): temperature / top_p / top_k / min_p / presence
    presets={
        "thinking": SamplingPreset(temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, presence_penalty=1.5),
        "non_thinking": SamplingPreset(temperature=0.7, top_p=0.80, top_k=20, min_p=0.0, presence_penalty=1.5),
    },
    default_quant="int4",
    # same chat_template.jinja bytes as Qwen3.6-27B (revision 995ad96e)
    chat_template_sha256="e84f32a23fdda27689f868aa4a1a5621f41133e51a48d7f3efcbea2839574259",
    text_params=34_660_610_688,
    mtp_params=844_640_768,
    description="Qwen3.6-35B-A3B MoE hybrid (256 experts, top 8, ~3B active), 262k context",
)


@hookimpl
def ninfer_checkpoints():
    return [SPEC]
