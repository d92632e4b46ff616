"""NVFP4 on FP4 tensor cores (sm_100 / sm_120): W4A4 through cuBLASLt's block-scaled matmul.

A separate plugin from the W4A16 kernels (`quant_nvfp4.plugin`) so that startup validation picks
it where the device has FP4 tensor cores and passes it over elsewhere with its reason ("needs
sm_100+, this device is sm_90"). It is registered after that plugin, so pluggy asks it first.

How a call runs (`NativeFp4Linear.apply`), for x [M, K] in bf16:
1. The activations are quantized to NVFP4 by one Triton launch (`quantize_activations`): E2M1
   codes packed two to a byte (element 2j in the low nibble, as torch's float4_e2m1fn_x2 and
   ModelOpt pack them), an E4M3 scale per 16, written straight into cuBLAS's 128x4 tiled scale
   layout (`swizzle_offsets`). Its global scale is the checkpoint's `input_scale` (ModelOpt's
   calibrated W4A4 scale) when there is one, else each row's own amax / 2688 (one reduction
   launch, never read on the host), multiplied back into that row's outputs after the matmul, so
   a token's result does not depend on what else is in the batch. The rounding is formats.py's, exactly:
   the activation's codes and scales equal `formats.encode_blocks` on the same values.
2. `torch.nn.functional.scaled_mm` with BlockWise1x16 + TensorWise scales on both sides.
3. A weight whose rows carry different global scales (rows of several matrices stacked by the
   importer) is multiplied with g = 1 and its output columns scaled by each row's g after.

The weight is kept as published (codes and K-major packing are what cuBLAS reads); prepare only
pads K to 64 and N to 128 with zero codes and scales and lays the scales out in tiles.

Not measured and not run on a GPU: no FP4 hardware was lent to this project (the H200 is sm_90).
The activation quantizer is tested under Triton's interpreter against formats.py, and the whole
`apply` against the W4A4 reference with `emulate_scaled_mm` standing in for cuBLAS, which decodes
the same swizzled operands in fp32. The GPU test (`-m gpu`) skips below sm_100.
`NINFER_NVFP4_NATIVE=0` keeps the W4A16 kernels on Blackwell too (no activation quantization).
Layers a published checkpoint quantized weight-only (no activation scale, or ModelOpt's
W4A16_NVFP4: the importer marks them `weight_only`) stay on the W4A16 kernels here as well; our own
`--quant nvfp4` from bf16 runs W4A4 with each token's own activation scale.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ninfer import hookimpl
from ninfer.device import Requirements
from ninfer.linear import PackedWeight
from ninfer_plugins.quant_nvfp4 import formats as F

FP4_TENSOR_CORES = Requirements(devices=("cuda",), min_capability=(10, 0), features=("fp4", "triton"))
K_ALIGN = 64  # K padded so that the scale columns (K / 16) fill whole 4-column tiles
N_ALIGN = 128  # rows padded to whole 128-row scale tiles
TILE_ROWS, TILE_COLS = 128, 4


def enabled() -> bool:
    return os.environ.get("NINFER_NVFP4_NATIVE", "1") != "0"


def _align(v: int, a: int) -> int:
    return -(-v // a) * a


# --- cuBLAS's block-scale layout ------------------------------------------------------------------


def swizzle_offsets(rows: torch.Tensor, cols: torch.Tensor, padded_cols: int) -> torch.Tensor:
    """Byte offset of scale [row, col] in cuBLAS's tiled layout (the 1x16 / 1x32 block scales of
    its block-scaled matmuls): 128x4 tiles, row-major over tiles, and inside a tile the 128 rows
    split into four runs of 32, stored [row % 32][row // 32][col % 4]. `padded_cols` = scale
    columns rounded up to 4. Works on tensors of any shape (broadcast), in torch or as the same
    arithmetic in the Triton kernel below."""
    tiles_per_row = padded_cols // TILE_COLS
    tile = (rows // TILE_ROWS) * tiles_per_row + cols // TILE_COLS
    r = rows % TILE_ROWS
    return tile * (TILE_ROWS * TILE_COLS) + (r % 32) * 16 + (r // 32) * 4 + cols % TILE_COLS


def swizzle(scales: torch.Tensor) -> torch.Tensor:
    """[rows, cols] -> the flat tiled layout, rows padded to 128 and cols to 4 with zeros."""
    rows, cols = scales.shape
    pr, pc = _align(rows, TILE_ROWS), _align(cols, TILE_COLS)
    out = torch.zeros(pr * pc, dtype=scales.dtype, device=scales.device)
    r = torch.arange(rows, device=scales.device).view(-1, 1)
    c = torch.arange(cols, device=scales.device).view(1, -1)
    out[swizzle_offsets(r, c, pc).reshape(-1)] = scales.reshape(-1)
    return out


def unswizzle(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The inverse of `swizzle`: [rows, cols] read back from the tiled layout."""
    pc = _align(cols, TILE_COLS)
    r = torch.arange(rows, device=flat.device).view(-1, 1)
    c = torch.arange(cols, device=flat.device).view(1, -1)
    return flat[swizzle_offsets(r, c, pc)]


# --- activation quantizer ---------------------------------------------------------------------------


def quantize_activations_reference(x: torch.Tensor, kp: int, g: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The oracle of `quantize_activations`: (packed codes uint8 [M, kp/2], swizzled E4M3 scales
    [rows padded to 128, kp/16] flat, global scale fp32). g given (the checkpoint's static scale):
    that scale, [1]. g None: each row's own, amax of the row / 2688, [M], so a token's codes do not
    depend on the other rows of the call (batch, speculative columns, padding)."""
    m, k = x.shape
    xf = torch.zeros((m, kp), dtype=torch.float32, device=x.device)
    xf[:, :k] = x.float()
    gg = F.global_scale_of(xf.abs().amax(dim=1, keepdim=True)) if g is None else g.reshape(()).float()
    codes, s8 = F.encode_blocks(xf, gg)
    scales = swizzle(s8.view(torch.uint8)).view(torch.float8_e4m3fn)
    return F.pack_codes(codes), scales, (gg.reshape(m) if g is None else gg.reshape(1)).clone()


def quantize_activations(x: torch.Tensor, kp: int, g: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] (K <= kp, kp % 64 == 0) -> (codes [M, kp/2] uint8, swizzled scales flat E4M3
    [rows to 128 x kp/16], global scale fp32), equal to `quantize_activations_reference`.
    g: the static activation scale (fp32, one element; returned as [1]) or None for each row's
    amax / 2688 (returned as [M])."""
    m, k = x.shape
    if kp % K_ALIGN or k > kp:
        raise ValueError(f"quantize_activations: kp {kp} must be a multiple of {K_ALIGN} and >= K {k}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    kb = kp // 16
    rows = _align(max(m, 1), TILE_ROWS)
    q = torch.empty((m, kp // 2), dtype=torch.uint8, device=x.device)
    s = torch.empty(rows * kb, dtype=torch.uint8, device=x.device)
    dynamic = g is None
    if dynamic:
        amax = torch.linalg.vector_norm(x, float("inf"), dim=1, dtype=torch.float32)
        gbuf = torch.empty(m, dtype=torch.float32, device=x.device)
    else:
        amax = gbuf = g.reshape(1).to(torch.float32)
    from ninfer_plugins.quant_nvfp4.act_kernel import quantize_kernel

    br, nb = 8, 16
    grid = (rows // br, -(-kb // nb))
    quantize_kernel[grid](x, x.stride(0), q, q.stride(0), s, gbuf, amax, m, k, kb, DYNAMIC=dynamic, BR=br, NB=nb)
    return q, s.view(torch.float8_e4m3fn), gbuf


# --- the matmul --------------------------------------------------------------------------------------


def emulate_scaled_mm(a_q: torch.Tensor, a_s: torch.Tensor, a_g: torch.Tensor, w_q: torch.Tensor, w_s: torch.Tensor,
                      w_g: torch.Tensor) -> torch.Tensor:
    """What the block-scaled matmul computes, decoded in fp32 from the same operands (codes as
    uint8 [rows, K/2], swizzled scales, [1] global scales): the CPU tests' stand-in for cuBLAS."""

    def values(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        rows, kp = q.shape[0], q.shape[1] * 2
        scales = unswizzle(s.view(torch.uint8), rows, kp // 16).view(torch.float8_e4m3fn).float()
        return (F.decode_packed(q).view(rows, kp // 16, 16) * scales.unsqueeze(-1)).view(rows, kp)

    y = values(a_q, a_s) @ values(w_q, w_s).T
    return (y * (a_g * w_g)).to(torch.bfloat16)


def cublas_scaled_mm(a_q: torch.Tensor, a_s: torch.Tensor, a_g: torch.Tensor, w_q: torch.Tensor, w_s: torch.Tensor,
                     w_g: torch.Tensor) -> torch.Tensor:
    fn = torch.nn.functional
    st, sw = fn.ScalingType, fn.SwizzleType
    return fn.scaled_mm(
        a_q.view(torch.float4_e2m1fn_x2),
        w_q.view(torch.float4_e2m1fn_x2).t(),
        [a_s, a_g], [st.BlockWise1x16, st.TensorWise],
        [w_s, w_g], [st.BlockWise1x16, st.TensorWise],
        swizzle_a=[sw.SWIZZLE_32_4_4, sw.NO_SWIZZLE], swizzle_b=[sw.SWIZZLE_32_4_4, sw.NO_SWIZZLE],
        output_dtype=torch.bfloat16,
    )


@dataclass
class NativePrepared:
    n: int
    k: int
    kp: int
    codes: torch.Tensor  # uint8 [n padded to 128, kp / 2], as published (low nibble = even element)
    scales: torch.Tensor  # E4M3, flat, tiled (swizzle)
    gscale: torch.Tensor  # fp32 [1]: the weight's global scale, or 1 when `row_scale` is set
    row_scale: torch.Tensor | None  # fp32 [n]: each row's g, where rows differ
    input_scale: torch.Tensor | None  # fp32 [1]: the checkpoint's static activation scale
    ones: torch.Tensor  # fp32 [1] = 1: the matmul's activation scale when each token has its own


class NativeFp4Linear:
    """y = x @ W.T on FP4 tensor cores, activations quantized to NVFP4 per call (module doc)."""

    name = "nvfp4.w4a4-fp4-mma"
    requirements = FP4_TENSOR_CORES
    # prepare keeps the published codes (padded) and a tiled copy of the scales
    repacks = True

    def __init__(self, matmul=cublas_scaled_mm, quantize=quantize_activations) -> None:
        # both swappable: the CPU tests run `emulate_scaled_mm` and the interpreted quantizer
        self._matmul = matmul
        self._quantize = quantize
        self._weight_only = None  # the W4A16 kernel, made for the first weight-only layer

    def prepare(self, weight: PackedWeight) -> Any:
        F.check_packed(weight)
        if weight.meta.get("weight_only"):
            # published weight-only NVFP4 (importer: no activation scale, or W4A16_NVFP4): its
            # activations were never calibrated for 4 bits, so they stay bf16 on the W4A16 kernels
            return self._w4a16().prepare(weight)
        n, k = weight.shape
        dev = weight.tensors["weight"].device
        kp, rows = _align(k, K_ALIGN), _align(n, N_ALIGN)
        codes = torch.zeros((rows, kp // 2), dtype=torch.uint8, device=dev)
        w = weight.tensors["weight"].view(torch.uint8)
        codes[:n, : w.shape[1]] = w
        s = torch.zeros((rows, kp // 16), dtype=torch.uint8, device=dev)
        ws = weight.tensors["weight_scale"].view(torch.uint8)
        s[:n, : ws.shape[1]] = ws
        g = F.global_scale_rows(weight).to(dev)
        uniform = bool((g == g[0]).all())
        inp = weight.meta.get("input_scale")
        return NativePrepared(
            n=n, k=k, kp=kp, codes=codes, scales=swizzle(s).view(torch.float8_e4m3fn),
            gscale=g[:1].clone() if uniform else torch.ones(1, dtype=torch.float32, device=dev),
            row_scale=None if uniform else g.contiguous(),
            input_scale=None if inp is None else torch.tensor([float(inp)], dtype=torch.float32, device=dev),
            ones=torch.ones(1, dtype=torch.float32, device=dev),
        )

    def _w4a16(self) -> Any:
        from ninfer_plugins.quant_nvfp4.kernels import nvfp4_kernels

        if self._weight_only is None:
            self._weight_only = nvfp4_kernels()[0]
        return self._weight_only

    def apply(self, x: torch.Tensor, p: Any) -> torch.Tensor:
        if not isinstance(p, NativePrepared):
            return self._w4a16().apply(x, p)  # a weight-only layer (prepare)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, p.k)
        if x2.shape[0] == 0:
            return x.new_empty((*lead, p.n))
        a_q, a_s, a_g = self._quantize(x2, p.kp, p.input_scale)
        per_token = p.input_scale is None  # then the quantizer gave each row its own scale
        one = p.ones if per_token else a_g
        y = self._matmul(a_q, a_s, one, p.codes, p.scales, p.gscale)[:, : p.n]
        if per_token or p.row_scale is not None:
            y = y.float()
            if per_token:
                y = y * a_g.view(-1, 1)  # each token's own activation scale
            if p.row_scale is not None:
                y = y * p.row_scale
        return y.to(x.dtype).reshape(*lead, p.n)


@hookimpl(specname="ninfer_linear_kernel", tryfirst=True)
def native_linear_kernel(scheme, device, n, k):
    if scheme != F.SCHEME or not enabled() or not torch_supports_nvfp4_mm():
        return None
    return NativeFp4Linear()


def torch_supports_nvfp4_mm() -> bool:
    """This torch has the block-scaled matmul API and the packed FP4 dtype (recent releases only;
    an older one keeps the W4A16 kernels)."""
    fn = torch.nn.functional
    return all(hasattr(fn, a) for a in ("scaled_mm", "ScalingType", "SwizzleType")) and hasattr(torch, "float4_e2m1fn_x2")
