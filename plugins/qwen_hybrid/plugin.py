"""The Qwen3.5/3.6/3.8 hybrid family: Gated DeltaNet + gated attention, dense or MoE.

Hookimpls: recognise the family's config.json, open its HF safetensors, build the model (torch
reference layers, every projection a QLinear), offer the reference attention backends (full and
linear) and the reference MoE kernel, and say before anything loads when a request cannot fit
the device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import structlog

from ninfer import hookimpl
from ninfer.errors import UserError
from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape, parse_hf_config

log = structlog.get_logger("ninfer.qwen_hybrid")

# Bits per weight of the linear layers under each --quant, for memory planning before loading
# (int4/int8: groupwise codes + fp16 scale per 64 or 32; nvfp4: e2m1 + e4m3 scale per 16).
_LINEAR_BITS = {"bf16": 16.0, "auto": 16.0, "int8": 8.5, "int4": 4.25, "nvfp4": 4.5}


def _ours(shape: Any) -> bool:
    return isinstance(shape, QwenHybridShape)


@hookimpl
def ninfer_parse_config(hf_config):
    if hf_config.get("family") == "qwen_hybrid":
        # a registered spec's own shape fields (weights not at hand: `ninfer plugins`, --random-weights)
        import msgspec

        return msgspec.convert(hf_config, QwenHybridShape)
    return parse_hf_config(hf_config)


@hookimpl
def ninfer_load_weights(path, shape, config, device):
    if not _ours(shape):
        return None
    p = Path(path)
    # pre-quantized checkpoints and `ninfer convert` output belong to the quantization plugins
    if (p / "ninfer.json").is_file() or (p / "hf_quant_config.json").is_file():
        return None
    cfg_file = p / "config.json"
    if cfg_file.is_file():
        from ninfer.checkpoint import load_hf_config

        if "quantization_config" in load_hf_config(p):
            return None
    from ninfer.checkpoint import WeightSource

    return WeightSource(p)


def model_dtype(config, device) -> Any:
    import torch

    if config.dtype == "auto":
        return torch.float32 if device.kind == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[config.dtype]


@hookimpl
def ninfer_model(shape, config, device, weights):
    if not _ours(shape):
        return None
    import torch

    from ninfer.checkpoint import match_spec
    from ninfer.linear import LinearFactory
    from ninfer.plugins import get_plugin_manager
    from ninfer_plugins.qwen_hybrid.model import QwenHybridModel

    pm = get_plugin_manager()
    recipe, schemes = None, {}
    if config.quant not in ("auto", "bf16"):
        # the weights' directory tells Qwen3.6-27B from Qwen3.8-27B (same shape, different recipes)
        spec = match_spec(shape, pm.collect("ninfer_checkpoints"), getattr(weights, "path", None))
        recipe = pm.hook.ninfer_quant_recipe(quant=config.quant, shape=shape, spec=spec)
        if recipe is None:
            raise UserError(
                f"--quant {config.quant}: no installed plugin provides it; use --quant bf16.", param="quant"
            )
        schemes = {s.name: s for s in pm.collect("ninfer_quant_schemes")}
    full = pm.choose(
        "ninfer_attention_backend",
        device,
        slot="attention[full]",
        kind="full",
        kv_dtype=config.kv_dtype,
        head_dim=shape.head_dim,
    )
    linear = pm.choose(
        "ninfer_attention_backend",
        device,
        slot="attention[linear]",
        kind="linear",
        kv_dtype=config.kv_dtype,
        head_dim=shape.linear_key_head_dim,
    )
    factory = LinearFactory(pm, device, recipe)
    model = QwenHybridModel(
        shape, factory, torch.device(device.torch_device), model_dtype(config, device), full.impl, linear.impl, schemes
    )
    model.backend_choices = {"full": full, "linear": linear}
    if weights is None:
        if not config.random_weights:
            log.warning("no weights to load: the model gets random weights", model=config.model)
        model.random_weights(seed=0)
    else:
        model.load_weights(weights)
        if config.spec == "mtp":
            model.load_mtp_weights()
    return model


@hookimpl
def ninfer_attention_backend(kind, device, kv_dtype, head_dim):
    if kind == "full":
        from ninfer_plugins.qwen_hybrid.attention import ReferenceFullAttention

        return ReferenceFullAttention()
    if kind == "linear":
        from ninfer_plugins.qwen_hybrid.gdn import ReferenceLinearAttention

        return ReferenceLinearAttention()
    return None


@hookimpl
def ninfer_moe_kernel(scheme_gate_up, scheme_down, device, num_experts, hidden, inner):
    from ninfer_plugins.qwen_hybrid.layers import ReferenceMoe

    return ReferenceMoe()


def memory_estimate(shape: QwenHybridShape, config, device) -> dict[str, int]:
    """Bytes the request needs on the device: weights, KV for max_context per slot, GDN state."""
    on_cpu = device.kind == "cpu"
    act_bytes = 4 if (config.dtype == "float32" or (config.dtype == "auto" and on_cpu)) else 2
    embed = shape.vocab_size * shape.hidden_size
    # everything but the embedding is a linear layer (norms and gates are a rounding error)
    linear_params = shape.param_count() - embed
    bits = 8.0 * act_bytes if config.quant in ("auto", "bf16") else _LINEAR_BITS.get(config.quant, 16.0)
    weights = embed * act_bytes + int(linear_params * bits / 8)
    if config.spec == "mtp":
        weights += int(shape.mtp_param_count() * bits / 8)
    slots = config.max_batch
    kv_per_token = shape.kv_bytes_per_token(config.kv_dtype)
    if act_bytes == 4 and config.kv_dtype == "bf16":
        kv_per_token *= 2  # "bf16" KV is kept in the model dtype: fp32 on the CPU parity path
    return {
        "weights": weights,
        "kv": kv_per_token * config.max_context * slots,
        "state": shape.state_bytes_per_sequence(conv_bytes=act_bytes) * slots,
    }


@hookimpl
def ninfer_validate(device, config, shape):
    if not _ours(shape):
        return []
    need = memory_estimate(shape, config, device)
    total = sum(need.values())
    if device.total_memory and total > device.total_memory:
        gib = lambda b: f"{b / 2**30:.1f} GiB"  # noqa: E731
        return [
            f"This model needs about {gib(total)} (weights {gib(need['weights'])} at --quant {config.quant}, "
            f"KV {gib(need['kv'])} for --max-context {config.max_context} x {config.max_batch} sequences, "
            f"state {gib(need['state'])}) but {device.describe()} has {gib(device.total_memory)}: "
            "use a smaller --quant (int4), a smaller --max-context or --max-batch, or a bigger device."
        ]
    return []
