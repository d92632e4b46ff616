"""NVFP4 linear kernels: W4A16 through the shared fused Triton kernel (quant_int/kernels.py).

On sm_90 there are no FP4 tensor cores, so the weights are decoded in registers to bf16 (exact:
e2m1 * e4m3 has at most 5 significant bits) and multiplied by bf16 activations on the bf16 MMA.

`prepare` repacks the published layout once, on the weight's device, into "g16-split8-f16": per
16-element block, byte j holds element j ("A") and element 8 + j ("B"). Both codes of a byte then
share the block scale, and the activations each needs are runs of 8 consecutive elements (16-byte
loads), where the published pairing (2j, 2j+1) would need every other activation. Within the byte
the bits sit where the decode GEMV's f16 lanes want them (`pack_byte`): A's sign on bit 7 and its
magnitude on bits 1-3, B's magnitude on bits 4-6 and its sign on bit 0. Shifted up 8, A is an f16
high byte (sign 15, E2M1 magnitude on bits 9-11: the value times 2^-14) with one shift and one
AND, or with the AND alone for bytes 1 and 3; B takes three or four instructions. With a code's
four bits together (the nibbles of the first layout, "g16-split8") every code took three or four,
15 instructions a word of 8 codes against 10 now (gemv_h2._word_asm_nvfp4). Scales keep their
bits; K is padded to 128 and rows to 128.

Where the device has FP4 tensor cores (sm_100 / sm_120), the separate plugin `quant_nvfp4_native`
(native.py: W4A4 through cuBLAS's block-scaled matmul) is asked first and wins; elsewhere startup
validation passes it over and this W4A16 kernel serves.
"""

from __future__ import annotations

import torch

from ninfer.linear import PackedWeight
from ninfer_plugins.quant_int import kernels as K
from ninfer_plugins.quant_int.linear import ReferenceQuantLinear, TritonQuantLinear, sm_count
from ninfer_plugins.quant_nvfp4 import formats as F

LAYOUT = "g16-split8-f16"


def pack_byte(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Codes (sign bit 3 | magnitude bits 0-2, uint8) of elements j and 8 + j -> their byte."""
    return ((a & 7) << 1) | ((a & 8) << 4) | ((b & 7) << 4) | ((b >> 3) & 1)


def unpack_byte(byte: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `pack_byte`: a byte tile -> the codes of elements j and 8 + j."""
    a = ((byte >> 1) & 7) | ((byte >> 4) & 8)
    b = ((byte >> 4) & 7) | ((byte & 1) << 3)
    return a, b


def prepare_nvfp4(weight: PackedWeight) -> K.Prepared:
    F.check_packed(weight)
    n, k = weight.shape
    dev = weight.tensors["weight"].device
    rows = -(-n // K.ROW_PAD) * K.ROW_PAD
    kp = -(-k // 128) * 128
    codes = F.unpack_codes(weight.tensors["weight"])
    c = torch.zeros((rows, kp), dtype=torch.uint8, device=dev)
    c[:n, : codes.shape[1]] = codes
    c = c.view(rows, kp // 16, 2, 8)
    packed = pack_byte(c[:, :, 0], c[:, :, 1]).reshape(rows, kp // 2)
    scales = torch.zeros((rows, kp // 16), dtype=torch.uint8, device=dev)
    s = weight.tensors["weight_scale"].view(torch.uint8)
    scales[:n, : s.shape[1]] = s
    g = torch.zeros(rows, dtype=torch.float32, device=dev)
    g[:n] = F.global_scale_rows(weight).to(dev)
    return K.Prepared(fmt=K.NVFP4, n=n, k=k, qweight=packed, scales=scales, gscale=g, sm_count=sm_count(dev))


def dequantize_prepared(p: K.Prepared) -> torch.Tensor:
    """fp32 [n, k] from the prepared layout (the kernel's fallback for non-bf16 activations)."""
    rows, half = p.qweight.shape
    a, b = unpack_byte(p.qweight.view(rows, half // 8, 1, 8))
    codes = torch.cat([a, b], dim=2).reshape(rows, half * 2)
    vals = F.e2m1_values(codes.device)[codes.long()]
    s = p.scales.view(torch.float8_e4m3fn).to(torch.float32)
    w = vals.view(rows, -1, 16) * s.unsqueeze(-1) * p.gscale.view(rows, 1, 1)
    return w.view(rows, -1)[: p.n, : p.k].contiguous()


def nvfp4_kernels() -> tuple[TritonQuantLinear, ReferenceQuantLinear]:
    return TritonQuantLinear(F.SCHEME, prepare_nvfp4, dequantize_prepared, repacks=True), ReferenceQuantLinear(F.SCHEME, F.dequantize)
