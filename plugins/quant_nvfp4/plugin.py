"""NVFP4 weights: E2M1 codes, an E4M3 scale per 16, an fp32 global scale per matrix.

Hookimpls: the "nvfp4" scheme (our quantizer from bf16, the fp32 dequantize oracle), the
`--quant nvfp4` recipe, and two linear kernels: W4A16 through the fused Triton kernel (CUDA
sm_80+, tried first; the FP4 tensor-core kernel for sm_100+ is the separate plugin in
native.py, asked before these) and the
dequantize-then-matmul reference (anywhere). Published checkpoints (NVIDIA ModelOpt and
compressed-tensors `nvfp4-pack-quantized`) are imported unchanged by importer.py.
"""

from __future__ import annotations

from ninfer import hookimpl
from ninfer.linear import DENSE, QuantRecipe, QuantScheme
from ninfer_plugins.quant_nvfp4 import formats as F

# What stays out of NVFP4 when we quantize a bf16 checkpoint ourselves, as in the peer's NVFP4
# artifacts and NVIDIA's own: a/b, router and shared-expert gate in bf16; embedding, head and MTP
# in q8_g32 (the groupwise-int plugin's scheme).
_UNQUANTIZED = ("in_proj_a", "in_proj_b", "shared_expert_gate", "mlp.gate")


def _nvfp4_scheme_for(name: str, n: int, k: int) -> str:
    if any(name.endswith(s) for s in _UNQUANTIZED) or "norm" in name:
        return DENSE
    if name.startswith("mtp.") or name == "lm_head" or name.endswith("embed_tokens"):
        return "q8_g32"
    return F.SCHEME


@hookimpl
def ninfer_quant_schemes():
    return [
        QuantScheme(
            name=F.SCHEME,
            bits_per_weight=4.5,
            version=F.VERSION,
            quantize=F.quantize,
            dequantize=F.dequantize,
            description="E2M1 + E4M3 scale per 16 + fp32 global scale (ModelOpt tensors as published)",
        )
    ]


@hookimpl
def ninfer_quant_recipe(quant, shape, spec):
    if quant != "nvfp4":
        return None
    return QuantRecipe(
        "nvfp4", _nvfp4_scheme_for, "NVFP4 projections; embedding, head and MTP q8_g32; a/b, router, gates bf16"
    )


@hookimpl(specname="ninfer_linear_kernel", tryfirst=True)
def triton_linear_kernel(scheme, device, n, k):
    if scheme != F.SCHEME:
        return None
    from ninfer_plugins.quant_nvfp4.kernels import nvfp4_kernels

    return nvfp4_kernels()[0]


@hookimpl(specname="ninfer_linear_kernel")
def reference_linear_kernel(scheme, device, n, k):
    if scheme != F.SCHEME:
        return None
    # imported without the Triton kernels: the reference must run where Triton is absent
    from ninfer_plugins.quant_int.linear import ReferenceQuantLinear

    return ReferenceQuantLinear(F.SCHEME, F.dequantize)
