"""Fused sparse-MoE kernels in Triton (Qwen3.6-35B-A3B: 256 experts, top 8, plus a gated shared
expert, hidden 2048, expert width 512).

Hookimpl: `ninfer_moe_kernel`, tried first, for routed experts in bf16, quant_int's formats
(q4_g64 / q5_g64 / q6_g64 / q8_g32) or NVFP4; it needs CUDA sm_80+ and takes bf16 activations, and the
family's torch reference serves everything else.
Files: moe.py (the kernel object: prepare, experts, forward_layer), router.py (softmax, top-k,
renormalise, shared gate and the decode tile plan, one launch; route_gemv: the router GEMV and
the routing in one launch for a decode token), pair_gemv.py (decode at T <= 4: one GEMV per
token-expert pair, combine fused), grouped_gemv.py (the grouped gate_up / down / combine tile
kernels, decode configs), grouped_gemm.py (prefill plan and configs).
"""

from __future__ import annotations

from ninfer import hookimpl

# routed-expert schemes the grouped kernels read (ninfer.linear.DENSE, quant_int's formats and
# quant_nvfp4's, decoded by quant_int's block step)
SCHEMES = ("bf16", "q4_g64", "q5_g64", "q6_g64", "q8_g32", "nvfp4")


@hookimpl(tryfirst=True)
def ninfer_moe_kernel(scheme_gate_up, scheme_down, device, num_experts, hidden, inner):
    if scheme_gate_up not in SCHEMES or scheme_down not in SCHEMES:
        return None
    from ninfer_plugins.moe_triton.moe import TritonMoe

    return TritonMoe()


@hookimpl
def ninfer_workspace_bytes(shape, config, device, recipe):
    """The grouped MoE prefill's scratch (prefill_grouped.py, when switched on): every expert of a
    layer decoded to bf16 (kept between calls) and one chunk's sorted-token activations."""
    from ninfer_plugins.moe_triton import prefill_grouped as G

    experts = getattr(shape, "num_experts", 0) or 0
    if not experts or recipe is None or not G.enabled():
        return None
    tokens = min(config.prefill_chunk, config.max_context)
    if tokens < G.min_tokens():
        return None
    hidden, inner = shape.hidden_size, shape.moe_intermediate_size
    gu = recipe.scheme_for("layers.0.mlp.experts.0.gate_up_proj", 2 * inner, hidden)
    dn = recipe.scheme_for("layers.0.mlp.experts.0.down_proj", hidden, inner)
    if gu not in G.INT_SCHEMES or dn not in G.INT_SCHEMES:
        return None
    return G.scratch_bytes(experts, inner, hidden, tokens, shape.num_experts_per_tok)
