"""Every hook of ninfer: the whole contract between the core and its plugins.

A plugin is a module (or object) with functions decorated by `ninfer.hookimpl` whose names match
the specs below. Built-in plugins (ninfer_plugins.*) register through the same entry-point group
(`ninfer`) a third-party package uses; nothing in the core names a plugin.

Two kinds of hook:

* collect hooks return a list from every plugin (checkpoints, quant schemes, speculators, problems);
* choose hooks are `firstresult`: plugins are asked in pluggy order (`tryfirst` impls first, then
  the most recently registered) and the first non-None answer wins. A plugin answers None when the
  question is not its own (another scheme, another family). The core walks the same order itself
  (`PluginManager.choose`) so it can also check each answer's `requirements` against the device,
  skip those that cannot run, and print what was chosen and why (`ninfer plugins`).

So a faster kernel is a package with one `@hookimpl(tryfirst=True)` that returns an object with
stricter requirements: where they hold it wins, elsewhere the default still serves.

Objects returned by choose hooks carry `name: str` and `requirements: ninfer.device.Requirements`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ninfer.config import CheckpointSpec, EngineConfig
    from ninfer.device import DeviceInfo

PROJECT = "ninfer"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# --- checkpoints and model families -------------------------------------------------------------


@hookspec
def ninfer_checkpoints() -> list[CheckpointSpec]:
    """Registered checkpoints: id, aliases, HF repo ids, family, exact shape, presets."""


@hookspec(firstresult=True)
def ninfer_parse_config(hf_config: dict[str, Any]) -> Any:
    """Recognise a checkpoint's config.json (the whole dict, text_config possibly nested).

    Return the family's shape object (with at least `family: str`, `vocab_size: int`,
    `num_hidden_layers: int`, `hidden_size: int`, and methods `param_count() -> int`,
    `kv_bytes_per_token(kv_dtype: str) -> int`, `state_bytes_per_sequence() -> int`), or None when
    the config is not this family's.
    """


@hookspec(firstresult=True)
def ninfer_model(shape: Any, config: EngineConfig, device: DeviceInfo, weights: Any) -> Any:
    """Build the model for `shape` (from ninfer_parse_config) on `device`, or None if not yours.

    `weights` is the object ninfer_load_weights returned (or None with random weights). The model
    follows `ninfer.model.CausalLM`: `allocate_cache`, `forward`, `compute_logits`.
    """


@hookspec(firstresult=True)
def ninfer_load_weights(path: str, shape: Any, config: EngineConfig, device: DeviceInfo) -> Any:
    """Open the weights at `path` for `shape`: HF safetensors (bf16), a published pre-quantized
    checkpoint (NVFP4 ModelOpt / compressed-tensors), or a `ninfer convert` directory.

    Return a `ninfer.checkpoint.WeightSource` (names -> tensors, lazily) or None if the layout is
    not one this plugin reads. A source of pre-packed weights also has
    `get_packed(hf_name) -> PackedWeight | list[PackedWeight] | None` (a list, one per expert, for
    a fused experts name); the model then takes each linear's scheme from its weight.
    """


@hookspec(firstresult=True)
def ninfer_convert(path: str, shape: Any, spec: CheckpointSpec | None, quant: str, out: str) -> Any:
    """`ninfer convert`: pack the checkpoint at `path` (`shape` from ninfer_parse_config, `spec` its
    registered checkpoint or None) by `--quant quant`'s recipe into the directory `out` (absent or
    empty), for ninfer_load_weights to read back. Return the directory written, or None if the
    family is not yours."""


# --- quantization and linear kernels ------------------------------------------------------------


@hookspec
def ninfer_quant_schemes() -> list[Any]:
    """Weight formats this plugin provides (`ninfer.linear.QuantScheme`: name, bits per weight,
    quantize, dequantize reference, version)."""


@hookspec(firstresult=True)
def ninfer_quant_recipe(quant: str, shape: Any, spec: CheckpointSpec | None) -> Any:
    """For `--quant quant` on this model: a `ninfer.linear.QuantRecipe` (linear name -> scheme),
    or None if this plugin does not define `quant`."""


@hookspec(firstresult=True)
def ninfer_linear_kernel(scheme: str, device: DeviceInfo, n: int, k: int) -> Any:
    """The matmul for one weight of `scheme` shaped [n, k] on `device`: a `ninfer.linear.LinearKernel`,
    or None. Tuned kernels register with `tryfirst=True` and state their requirements."""


@hookspec(firstresult=True)
def ninfer_moe_kernel(
    scheme_gate_up: str, scheme_down: str, device: DeviceInfo, num_experts: int, hidden: int, inner: int
) -> Any:
    """The routed experts of one sparse-MoE layer: `num_experts` experts, each a fused gate/up
    weight [2 * inner, hidden] in `scheme_gate_up` and a down weight [hidden, inner] in
    `scheme_down`; or None. The family's torch code is the default; tuned kernels use `tryfirst`.

    The object has `name`, `requirements`, `fused_dtypes` (the activation dtypes it runs: other
    activations take the family's reference code) and:

    * `prepare(bank, gate_up, down) -> Any`: once per layer, when both halves are loaded (lists of
      `PackedWeight`, one per expert); the family keeps the result as `bank.moe_prepared`;
    * `experts(bank, x [N, H], ids [N, k], weights [N, k] fp32) -> [N, H]`:
      sum_k weights * down_e(silu(gate_e x) * up_e x), in x's dtype;
    * `forward_layer(moe, x [N, H]) -> [N, H]`: the whole layer (router softmax in fp32, top-k,
      renormalise, routed experts, sigmoid-gated shared expert) without a host sync, so that a
      decode step can be captured in a CUDA graph.
    """


# --- attention, sampling, speculation -----------------------------------------------------------


@hookspec(firstresult=True)
def ninfer_attention_backend(kind: str, device: DeviceInfo, kv_dtype: str, head_dim: int) -> Any:
    """Attention for `kind` "full" (softmax over a KV cache: prefill and decode) or "linear"
    (Gated DeltaNet: chunked prefill and recurrent decode), or None."""


@hookspec(firstresult=True)
def ninfer_sampler(device: DeviceInfo) -> Any:
    """Turns logits into tokens (greedy, temperature, top-k/p, min-p, penalties, seeded):
    a `ninfer.sampling.Sampler`, or None."""


@hookspec
def ninfer_speculators() -> list[Any]:
    """Drafting strategies (name such as "mtp" or "dflash", requirements, factory)."""


# --- memory -------------------------------------------------------------------------------------


@hookspec
def ninfer_workspace_bytes(shape: Any, config: EngineConfig, device: DeviceInfo, recipe: Any) -> int | None:
    """Device bytes this plugin's kernels keep for this configuration beyond the memory plan's own
    estimate (activations, the library allowance, the prefill's dequant scratch): scratch made on
    first use and held, which would otherwise surface as an out-of-memory error mid-request.

    `recipe` is the QuantRecipe (None for bf16). Return None or 0 when none. The plan adds every
    plugin's answer before any weight loads (ninfer.memory.plan_memory).
    """


# --- validation ---------------------------------------------------------------------------------


@hookspec
def ninfer_validate(device: DeviceInfo, config: EngineConfig, shape: Any) -> list[str]:
    """Problems this plugin sees with this device and request, before any weight loads.

    Each problem is one sentence that names the fix (a flag, a smaller model, another device).
    `shape` may be None when the model is not known yet.
    """
