"""The memory plan: what a configuration will hold on the device, checked before weights load.

    weights    every linear in its recipe's scheme (bits per weight of the chosen QuantScheme),
               the embedding table and small tensors in the model dtype
    kv         K and V of every full-attention layer for --max-context tokens x --max-batch slots
    state      the recurrent (fp32) and conv state of every linear-attention layer, per slot
    workspace  the activations of one --prefill-chunk, the decode step's logits and sampler rows,
               the CUDA-graph history counts, a fixed allowance for the CUDA context and
               library workspaces (cuBLAS, Triton), and with a quantized recipe the bf16 scratch
               of the prefill's dequantize + GEMM, and what plugins declare through
               `ninfer_workspace_bytes` (scratch their kernels make on first use and keep)

Everything is read from the shape's contract (`param_count`, `kv_bytes_per_token`,
`state_bytes_per_sequence`, and `linear_shapes` where the family offers it) and the plugins'
quantization recipe, so it costs no weight I/O. A configuration that does not fit raises one
sentence naming --max-context and --kv-dtype (the knobs that decide the KV), with the figures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from msgspec import structs

from ninfer.errors import DeviceError
from ninfer.linear import DENSE, LinearFactory

GIB = 2**30
# CUDA context, cuBLAS and Triton workspaces, allocator slack: measured torch processes on an H200
# hold 0.5-1 GiB beyond their tensors.
FIXED_RESERVE = 1 * GIB
# Quantized recipes: the bf16 scratch prefill dequantizes weights into before cuBLAS, one row chunk
# at a time (ninfer_plugins.quant_int.dequant.CHUNK_BYTES, which a test keeps within this).
DEQUANT_SCRATCH = 192 * 2**20
# The default --prefill-chunk on CUDA (`ninfer`, `ninfer serve`, `ninfer bench`), largest first: the
# first whose plan fits. Each chunk decodes the quantized weights again (quant_int.dequant for the
# dense projections; the MoE's experts in the tiles or the grouped prefill), a fixed cost a chunk
# that longer chunks spread thinner. H100, int4 (BENCHMARKS.md, twenty-ninth run): the 27B's 8K
# prefill 8,257 tok/s in chunks of 1,024 against 11,185 in one; the 35B-A3B's 11,571 against
# 45,400; 16K prompts in one chunk against two of 8,192: the 27B +8%, the 35B-A3B +33%.
PREFILL_CHUNKS = (16384, 8192, 4096, 2048, 1024)
CPU_PREFILL_CHUNK = 1024
# The default --prefill-chunk-busy: the most prompt tokens a chunk takes while other requests
# decode. The scheduler runs one chunk between two of their decode steps, so the chunk's time is
# their stall: about 1.5 s for 16,384 tokens of the 27B. H100, int4 (twenty-ninth run): 2,048
# tokens stall them about 0.2 s on the 27B and 0.09 s on the 35B-A3B: they prefill at 9,501 and
# 23,278 tok/s, 85% and 51% of the one-chunk rate. 1,024 tokens stall them 0.12 s and still
# 0.09 s, at 74% and 25%.
BUSY_PREFILL_CHUNK = 2048


@dataclass(frozen=True)
class MemoryPlan:
    weights: int
    kv: int
    state: int
    workspace: int
    available: int  # bytes the device can give this process
    device: str
    prefill_chunk: int  # the chunk the workspace was planned for (--prefill-chunk 0 resolved)
    # of `weights`, what kernels hold beyond the packed form (the CPU reference path's fp32 copies)
    copies: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.state + self.workspace

    @property
    def fits(self) -> bool:
        return self.available <= 0 or self.total <= self.available

    def as_dict(self) -> dict[str, float]:
        gib = lambda b: round(b / GIB, 3)  # noqa: E731
        return {
            "weights_gib": gib(self.weights),
            "kv_gib": gib(self.kv),
            "state_gib": gib(self.state),
            "workspace_gib": gib(self.workspace),
            "total_gib": gib(self.total),
            "available_gib": gib(self.available),
        }

    def problem(self, config: Any) -> str | None:
        if self.fits:
            return None
        g = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
        return (
            f"This configuration needs about {g(self.total)} (weights {g(self.weights)} at --quant {config.quant}, "
            f"KV {g(self.kv)} for --max-context {config.max_context} x {config.max_batch} sequences at "
            f"--kv-dtype {config.kv_dtype}, state {g(self.state)}, workspace {g(self.workspace)}) but {self.device} "
            f"has {g(self.available)} free: lower --max-context, use --kv-dtype int8, or lower --max-batch or --quant "
            "(ninfer bench sizes the context from --prompt-len/--context-len and the batch from --concurrency)."
            + (f" Of the weights, {g(self.copies)} are the fp32 copies the kernels on {self.device} decode every "
               "quantized weight into (the reference path, meant for tiny models): run on a GPU."
               if self.copies else "")
        )


def _act_bytes(config: Any, device: Any) -> int:
    if config.dtype == "float32" or (config.dtype == "auto" and device.kind == "cpu"):
        return 4
    return 2


def weight_parts(shape: Any, recipe: Any, schemes: dict[str, Any], act_bytes: int,
                 factory: LinearFactory | None = None) -> tuple[int, int]:
    """Bytes of the text decoder's weights as (stored, held beyond that): each linear in its recipe
    scheme, the rest (embedding table, norms, conv taps, gates) in the model dtype; then, with the
    `factory` the model will be built with, what the kernel it chooses for each quantized linear
    holds beyond its packed bytes (`resident_bytes`: the CPU reference path's fp32 copies)."""
    linears = getattr(shape, "linear_shapes", None)
    if linears is None:
        return shape.param_count() * act_bytes, 0
    total, extra, linear_params = 0, 0, 0
    for name, n, k in linears():
        scheme = recipe.scheme_for(name, n, k) if recipe is not None else DENSE
        bits = schemes[scheme].bits_per_weight if scheme in schemes else 8 * act_bytes
        packed = int(n * k * bits / 8)
        total += packed
        linear_params += n * k
        if factory is not None and scheme in schemes:
            try:
                resident = getattr(factory.kernel_for(scheme, n, k), "resident_bytes", None)
            except DeviceError:
                resident = None  # no kernel runs here: building the model names that
            if resident is not None:
                extra += resident(n, k, packed, factory.device) - packed
    return total + (shape.param_count() - linear_params) * act_bytes, extra


def weight_bytes(shape: Any, recipe: Any, schemes: dict[str, Any], act_bytes: int) -> int:
    """The weights' stored bytes (`weight_parts`' first figure): what a decode step reads."""
    return weight_parts(shape, recipe, schemes, act_bytes)[0]


def workspace_bytes(shape: Any, config: Any, act_bytes: int) -> int:
    """Peak activations of one prefill chunk (the widest tensors live at once, with a factor 2 for
    the allocator's rounding), the decode step's vocabulary-wide rows, graph history counts."""
    h = shape.hidden_size
    inner = getattr(shape, "intermediate_size", 0) or getattr(shape, "moe_intermediate_size", 0) or 4 * h
    conv = getattr(shape, "conv_dim", 2 * h)
    q_width = getattr(shape, "q_width", h)
    tokens = min(config.prefill_chunk, config.max_context)
    # residual, normed and projected hidden states; gate, up and their product; the GDN's fp32
    # conv output, q/k/v and gates; q, gate, and the chunk's K/V expanded per query head
    per_token = act_bytes * (6 * h + 3 * inner + 4 * q_width) + 4 * 4 * conv
    prefill = 2 * tokens * per_token
    # logits (fp32), sort keys (int64) and the penalties' copy, per decode row; history counts
    rows = config.max_batch
    decode = rows * shape.vocab_size * (4 + 8 + 4) + (config.max_batch + 1) * shape.vocab_size * 4
    return prefill + decode + FIXED_RESERVE


def _verify_column_bytes(shape: Any, state: int, act: int, device: Any) -> int:
    """What a speculative verify keeps per sequence and verified token so the round can roll the
    GDN state back to its accepted length (spec_mtp.verify.HybridVerifier): on the fused 16-bit
    GPU path (NINFER_GDN_REPLAY, the default; sm_80+ with Triton) the conv state after the token
    and the token's rank-1 update (g, k, delta); elsewhere, or with NINFER_GDN_REPLAY=0, the
    whole state after it."""
    needed = ("linear_layers", "linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
              "linear_value_head_dim", "linear_conv_kernel_dim", "conv_dim")
    # the replay runs on cuda_fast's GDN kernels: sm_80+ with Triton (plugins/cuda_fast)
    fused = device.kind == "cuda" and (device.capability or (0, 0)) >= (8, 0) and "triton" in device.features
    replay = os.environ.get("NINFER_GDN_REPLAY", "1") != "0"
    if not (fused and act == 2 and replay and all(hasattr(shape, n) for n in needed)):
        return state
    hv, dv = shape.linear_num_value_heads, shape.linear_value_head_dim
    update = (hv + shape.linear_num_key_heads * shape.linear_key_head_dim + hv * dv) * 4
    conv = (shape.linear_conv_kernel_dim - 1) * shape.conv_dim * act
    return len(shape.linear_layers) * (update + conv)


def plan_memory(shape: Any, config: Any, device: Any, plugins: Any = None, spec: Any = None) -> MemoryPlan:
    if config.prefill_chunk == 0:  # the default's marker: plan for the chunk it resolves to
        config = structs.replace(config, prefill_chunk=choose_prefill_chunk(shape, config, device, plugins, spec))
    act = _act_bytes(config, device)
    recipe, schemes = None, {}
    if plugins is not None and config.quant not in ("auto", "bf16"):
        recipe = plugins.hook.ninfer_quant_recipe(quant=config.quant, shape=shape, spec=spec)
        schemes = {s.name: s for s in plugins.collect("ninfer_quant_schemes")}
    kv_per_token = shape.kv_bytes_per_token(config.kv_dtype)
    if config.kv_dtype == "bf16" and act == 4:
        kv_per_token *= 2  # "bf16" KV is kept in the model dtype: fp32 on the CPU parity path
    try:
        state = shape.state_bytes_per_sequence(conv_bytes=act)
    except TypeError:
        state = shape.state_bytes_per_sequence()
    available = device.free_memory if device.kind == "cuda" else device.total_memory
    stored, copies = weight_parts(shape, recipe, schemes, act,
                                  LinearFactory(plugins, device, recipe) if recipe is not None else None)
    weights = stored + copies
    if config.spec == "mtp" and hasattr(shape, "mtp_param_count"):
        # the MTP layer: q8_g32 (8.5 bits) in every quantized recipe, the model dtype otherwise
        weights += int(shape.mtp_param_count() * (1.0625 if recipe is not None else act))
        state = state + (config.draft_tokens + 1) * _verify_column_bytes(shape, state, act, device)
    extra = 0
    if plugins is not None:
        extra = sum(int(b or 0) for b in plugins.hook.ninfer_workspace_bytes(
            shape=shape, config=config, device=device, recipe=recipe))
    return MemoryPlan(
        weights=weights,
        kv=kv_per_token * config.max_context * config.max_batch,
        state=state * config.max_batch,
        workspace=workspace_bytes(shape, config, act) + (DEQUANT_SCRATCH if recipe is not None else 0) + extra,
        available=available,
        device=device.describe(),
        prefill_chunk=config.prefill_chunk,
        copies=copies,
    )


def choose_prefill_chunk(shape: Any, config: Any, device: Any, plugins: Any = None, spec: Any = None) -> int:
    """--prefill-chunk's default: on CUDA the largest of PREFILL_CHUNKS (each at most
    --max-context) whose memory plan fits beside the weights, cache and state; 1024 when none
    does (the plan then names the problem) and on the CPU, where no weight is decoded per chunk
    (never more than --max-context)."""
    if device.kind != "cuda":
        return min(CPU_PREFILL_CHUNK, config.max_context)
    for chunk in PREFILL_CHUNKS:
        chunk = min(chunk, config.max_context)
        if plan_memory(shape, structs.replace(config, prefill_chunk=chunk), device, plugins, spec).fits:
            return chunk
    return min(PREFILL_CHUNKS[-1], config.max_context)


def check_memory(plan: MemoryPlan, config: Any) -> None:
    problem = plan.problem(config)
    if problem:
        raise DeviceError(problem)
