"""NVFP4 weights: E2M1 codes, one E4M3 scale per 16 along K, one fp32 global scale per matrix.

`W[n, k] = e2m1(code[n, k]) * fp32(e4m3 scale[n, k // 16]) * g` (formats.md section 9).

The canonical PackedWeight ("nvfp4", version 1) keeps NVIDIA ModelOpt's tensors as published, so
an imported checkpoint is stored unchanged:
* `weight` uint8 [n, Kp/2]: two codes per byte, element 2j in the LOW nibble, 2j+1 in the high;
  a code is sign (bit 3) | E2M1 magnitude (bits 2..0: 0, 0.5, 1, 1.5, 2, 3, 4, 6).
* `weight_scale` float8_e4m3fn [n, Kp/16] (non-negative).
* `weight_scale_2` fp32 scalar: g, a multiplier (compressed-tensors stores 1/g as a divisor);
  [n] when rows of matrices with different g were stacked (`importer.concat_rows`).
Kp = K rounded up to 16 (zero codes, zero scales); published checkpoints have K % 16 == 0.

Our own quantizer (from bf16/fp32), rounding documented here because NVFP4 has no canonical one:
* g = fp32(amax / 2688) with amax = max|W| (2688 = 6 * 448, the E2M1 max times the E4M3 max);
  g = 1 for an all-zero matrix.
* block scale s = e4m3_rne(min(fp32(blockamax / fp32(6 * g)), 448)); a nonzero block whose scale
  rounds to 0 takes the smallest E4M3 subnormal (2^-9).
* code = nearest E2M1 to fp32(x / fp32(s * g)), ties to the even code (the one whose mantissa bit
  is 0, as IEEE round-half-even does), saturating at 6; a zero magnitude is stored as +0.
"""

from __future__ import annotations

import torch

from ninfer.linear import PackedWeight

SCHEME = "nvfp4"
VERSION = 1
BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
# magnitudes of the 3-bit E2M1 field, index = code & 7
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# midpoints between neighbouring magnitudes; a tie goes to the even code
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def padded_k(k: int) -> int:
    return -(-k // BLOCK) * BLOCK


def expected_parts(n: int, k: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    kp = padded_k(k)
    return {
        "weight": (torch.uint8, (n, kp // 2)),
        "weight_scale": (torch.float8_e4m3fn, (n, kp // BLOCK)),
        "weight_scale_2": (torch.float32, ()),
    }


def e2m1_values(device: torch.device | str | None = None) -> torch.Tensor:
    """fp32 [16]: the value of each 4-bit code (bit 3 = sign)."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def unpack_codes(weight: torch.Tensor) -> torch.Tensor:
    """uint8 [n, k/2] -> codes uint8 [n, k] (low nibble = even element)."""
    w = weight.to(torch.uint8)
    return torch.stack([w & 0xF, w >> 4], dim=-1).reshape(w.shape[0], w.shape[1] * 2)


def decode_packed(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [r, c/2] as `weight` stores codes (low nibble = even element) -> fp32 [r, c] values."""
    return e2m1_values(packed.device)[unpack_codes(packed).long()]


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """codes [n, k] (k even) -> uint8 [n, k/2]."""
    c = codes.to(torch.uint8).view(codes.shape[0], codes.shape[1] // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).contiguous()


def nearest_e2m1(q: torch.Tensor) -> torch.Tensor:
    """fp32 values already divided by their scale -> 4-bit codes (uint8), ties to even."""
    a = q.abs()
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=q.device)
    idx = torch.bucketize(a, mids)  # number of midpoints < a: a tie lands on the lower code
    at_mid = (idx < len(_MIDPOINTS)) & (a == mids[idx.clamp(max=len(_MIDPOINTS) - 1)])
    idx = torch.where(at_mid & (idx % 2 == 1), idx + 1, idx)  # odd lower code -> take the even upper
    sign = ((q < 0) & (idx > 0)).to(torch.uint8) << 3
    return idx.to(torch.uint8) | sign


def encode_blocks(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [n, kp] (kp % 16 == 0) and a global scale g (fp32, 0-dim or broadcastable to [n, 1])
    -> (codes uint8 [n, kp], E4M3 block scales [n, kp / 16]), rounded as this module's doc says.
    The weight quantizer below and the W4A4 activation quantizer (native.py's reference) share it."""
    n, kp = x.shape
    xb = x.view(n, kp // BLOCK, BLOCK)
    bamax = xb.abs().amax(-1)
    s32 = (bamax / (g * E2M1_MAX)).clamp_(max=E4M3_MAX)
    s8 = s32.to(torch.float8_e4m3fn)
    tiny = torch.tensor(2.0**-9, device=x.device).to(torch.float8_e4m3fn)
    s8 = torch.where((s8.to(torch.float32) == 0) & (bamax > 0), tiny, s8)
    denom = s8.to(torch.float32) * g
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    q = torch.where(denom.unsqueeze(-1) > 0, xb / safe.unsqueeze(-1), torch.zeros_like(xb))
    return nearest_e2m1(q).view(n, kp), s8.contiguous()


def global_scale_of(amax: torch.Tensor) -> torch.Tensor:
    """g = fp32(amax / 2688), or 1 for an all-zero tensor (0-dim fp32, on amax's device)."""
    g = amax / torch.full_like(amax, E2M1_MAX * E4M3_MAX)
    return torch.where(amax > 0, g, torch.ones_like(g))


def quantize(w: torch.Tensor) -> PackedWeight:
    from ninfer_plugins.quant_int.formats import finite_fp32_padded

    n, k = w.shape[0], w.shape[-1]
    kp = padded_k(k)
    x = finite_fp32_padded(w, SCHEME, kp)
    g = global_scale_of(x.abs().amax())
    codes, s8 = encode_blocks(x, g)
    return PackedWeight(
        SCHEME,
        (n, k),
        {"weight": pack_codes(codes), "weight_scale": s8, "weight_scale_2": g.reshape(()).clone()},
    )


def dequantize(packed: PackedWeight) -> torch.Tensor:
    """The oracle: fp32 [n, k] = e2m1 * fp32(e4m3 scale) * g (the first product is exact)."""
    n, k = packed.shape
    vals = decode_packed(packed.tensors["weight"])
    s = packed.tensors["weight_scale"].to(torch.float32)
    kp = vals.shape[1]
    g = global_scale_rows(packed).view(n, 1, 1)
    w = (vals.view(n, kp // BLOCK, BLOCK) * s.unsqueeze(-1)) * g
    return w.view(n, kp)[:, :k].contiguous()


def global_scale_rows(packed: PackedWeight) -> torch.Tensor:
    """fp32 [n]: g of each row (one g per matrix, or per row after `importer.concat_rows`)."""
    g = packed.tensors["weight_scale_2"].to(torch.float32).reshape(-1)
    return g.expand(packed.shape[0]) if g.numel() == 1 else g


def check_packed(packed: PackedWeight) -> None:
    from ninfer_plugins.quant_int.formats import check_parts

    want = expected_parts(*packed.shape)
    g = packed.tensors.get("weight_scale_2")
    if g is not None and tuple(g.shape) in ((1,), (packed.shape[0],)):
        want["weight_scale_2"] = (torch.float32, tuple(g.shape))  # a per-row g (fused rows) is also valid
    check_parts(packed, want)
