"""Groupwise-int weights: q4_g64, q5_g64, q6_g64 (fp16 scale per 64), q8_g32 (fp16 scale per 32).

Hookimpls: the four schemes (exact spec encoder, fp32 dequantize oracle), the `--quant int4` and
`--quant int8` recipes, and two linear kernels per scheme: the fused Triton kernel (CUDA sm_80+,
tried first) and the dequantize-then-matmul reference (anywhere; CPU CI and tiny models).
Files: formats.py (encoder, layout), recipes.py, kernels.py (Triton), tuned.py (block sizes
measured per registered shape), dequant.py (prefill: dequantize to bf16, then cuBLAS), linear.py
(the LinearKernel objects), artifact.py (packed weights on disk for `ninfer convert`).
"""

from __future__ import annotations

from functools import partial

from ninfer import hookimpl
from ninfer.linear import QuantScheme
from ninfer_plugins.quant_int import formats as F


def _scheme(fmt: F.IntFormat) -> QuantScheme:
    return QuantScheme(
        name=fmt.name,
        bits_per_weight=fmt.bits_per_weight,
        version=fmt.version,
        quantize=partial(F.quantize, fmt=fmt),
        dequantize=F.dequantize,
        description=f"symmetric int{fmt.bits}, fp16 scale per {fmt.group} along K (MAXABS_F16_RECIP_RNE_V1), layout {F.LAYOUT}",
        rowwise=True,
    )


@hookimpl
def ninfer_quant_schemes():
    return [_scheme(f) for f in F.FORMATS.values()]


@hookimpl
def ninfer_quant_recipe(quant, shape, spec):
    from ninfer_plugins.quant_int.recipes import recipe

    return recipe(quant, shape, spec)


@hookimpl(specname="ninfer_linear_kernel", tryfirst=True)
def triton_linear_kernel(scheme, device, n, k):
    if scheme not in F.FORMATS:
        return None
    from ninfer_plugins.quant_int.linear import int_kernels

    return int_kernels(scheme)[0]


@hookimpl(specname="ninfer_linear_kernel")
def reference_linear_kernel(scheme, device, n, k):
    if scheme not in F.FORMATS:
        return None
    from ninfer_plugins.quant_int.linear import int_kernels

    return int_kernels(scheme)[1]
