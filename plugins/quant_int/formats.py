"""Symmetric groupwise-int weights: q4_g64, q5_g64, q6_g64 (fp16 scale per 64) and q8_g32 (per 32).

Encoder: MAXABS_F16_RECIP_RNE_V1 (spec 4.1), exact. Per row and group of K: amax = max|x| in fp32;
amax == 0 gives scale +0 and codes 0; else scale16 = fp16_rne(fp32(amax / qmax)) (0x0001 if that
underflows to 0), inv = fp32(1 / fp32(scale16)), code = clamp(round_half_even(fp32(x * inv)),
qmin, qmax). qmax is 7 / 15 / 31 / 127 (not |qmin|); q8 never uses -128. Non-finite input fails.
Dequantization: w = fp32(scale16) * code.

Storage (layout "kb128-v1", our own; the kernels read it as is, see kernels.py):
* K is padded with zero codes to a multiple of 128 (Kp); a whole padded group has scale 0.
* `scales` fp16 [n, Kp / group], row-major: group g covers k in [g*G, (g+1)*G).
* q4/q5/q6 `qweight` uint8 [n, Kp/2], the low 4 bits of each code (two's complement nibble).
  Each 128-wide block kb is stored as 64 bytes; byte j holds element kb*128+j in its low nibble
  and element kb*128+64+j in its high nibble. So the low nibbles of a block are exactly group 2kb
  and the high nibbles group 2kb+1 (for G = 64): a kernel decodes 64 bytes into two whole
  groups with no interleaving, and each row is a run of 16-byte aligned vectors.
* q5 `qhigh` uint8 [n, Kp/8]: bit 4 of each code; 16 bytes per block, element e of the block at
  byte e // 8, bit e % 8.
* q6 `qhigh` uint8 [n, Kp/4]: bits 4..5 of each code; 32 bytes per block, element e at byte
  e // 4, bits 2*(e % 4).
* q8 `qweight` int8 [n, Kp], codes in natural order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.errors import CheckpointError
from ninfer.linear import PackedWeight

# Every int layout pads K to this; it is also the kernels' K step (one block = 64 bytes of q4).
K_BLOCK = 128
LAYOUT = "kb128-v1"


@dataclass(frozen=True)
class IntFormat:
    name: str
    bits: int
    group: int
    version: int = 1

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1

    @property
    def qmin(self) -> int:
        # q8 is symmetric: -128 is illegal (spec 4.1)
        return -self.qmax if self.bits == 8 else -(2 ** (self.bits - 1))

    @property
    def bits_per_weight(self) -> float:
        return self.bits + 16 / self.group


Q4 = IntFormat("q4_g64", 4, 64)
Q5 = IntFormat("q5_g64", 5, 64)
Q6 = IntFormat("q6_g64", 6, 64)
Q8 = IntFormat("q8_g32", 8, 32)
FORMATS: dict[str, IntFormat] = {f.name: f for f in (Q4, Q5, Q6, Q8)}


def padded_k(k: int) -> int:
    return -(-k // K_BLOCK) * K_BLOCK


def expected_parts(fmt: IntFormat | str, n: int, k: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Tensor name -> (dtype, shape) of a packed [n, k] weight: what loaders check against."""
    fmt = FORMATS[fmt] if isinstance(fmt, str) else fmt
    kp = padded_k(k)
    parts: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    if fmt.bits == 8:
        parts["qweight"] = (torch.int8, (n, kp))
    else:
        parts["qweight"] = (torch.uint8, (n, kp // 2))
        if fmt.bits > 4:
            parts["qhigh"] = (torch.uint8, (n, kp * (fmt.bits - 4) // 8))
    parts["scales"] = (torch.float16, (n, kp // fmt.group))
    return parts


# --- the canonical encoder ------------------------------------------------------------------------


def finite_fp32_padded(w: torch.Tensor, scheme: str, kp: int) -> torch.Tensor:
    """A 2-D weight as fp32 with K zero-padded to kp; NaN or inf is a damaged checkpoint."""
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {list(w.shape)}")
    x = w.detach().to(torch.float32)
    if not bool(torch.isfinite(x).all()):
        raise CheckpointError(
            f"a weight of shape {list(w.shape)} has NaN or inf values, which {scheme} cannot encode; "
            "the checkpoint is damaged: download it again."
        )
    return torch.nn.functional.pad(x, (0, kp - x.shape[1])) if kp != x.shape[1] else x


def encode(w: torch.Tensor, fmt: IntFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes int8 [n, Kp] and scales fp16 [n, Kp/G] of a [n, k] weight (any float dtype, any device)."""
    n, kp = w.shape[0], padded_k(w.shape[-1])
    x = finite_fp32_padded(w, fmt.name, kp)
    xg = x.view(n, kp // fmt.group, fmt.group)
    amax = xg.abs().amax(dim=-1)
    # tensor / tensor: a true fp32 division (a Python scalar divisor may become a reciprocal multiply)
    scale16 = (amax / torch.full_like(amax, float(fmt.qmax))).to(torch.float16)
    if bool(torch.isinf(scale16).any()):
        raise CheckpointError(
            f"a weight of shape {list(w.shape)} has values above {65504 * fmt.qmax:g}, past the fp16 scale "
            f"range of {fmt.name}; keep this tensor in bf16 (a smaller --quant recipe) instead."
        )
    # an amax whose scale underflows fp16 gets the smallest subnormal, 0x0001 = 2^-24
    tiny = torch.tensor(2.0**-24, dtype=torch.float16, device=x.device)
    scale16 = torch.where((scale16 == 0) & (amax > 0), tiny, scale16)
    s32 = scale16.to(torch.float32)
    safe = torch.where(s32 > 0, s32, torch.ones_like(s32))
    inv = torch.where(s32 > 0, torch.ones_like(s32) / safe, torch.zeros_like(s32))
    # torch.round is round-half-to-even
    codes = torch.round(xg * inv.unsqueeze(-1)).clamp_(fmt.qmin, fmt.qmax)
    return codes.to(torch.int8).view(n, kp), scale16


# --- packing ----------------------------------------------------------------------------------------


def pack(codes: torch.Tensor, scales: torch.Tensor, fmt: IntFormat, k: int) -> PackedWeight:
    """Codes int8 [n, Kp] + scales fp16 [n, Kp/G] -> the stored layout (see the module doc)."""
    n, kp = codes.shape
    tensors: dict[str, torch.Tensor] = {}
    if fmt.bits == 8:
        tensors["qweight"] = codes.to(torch.int8).contiguous()
    else:
        c = codes.to(torch.int16)
        blocks = (c & 0xF).view(n, kp // K_BLOCK, 2, K_BLOCK // 2)
        tensors["qweight"] = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).to(torch.uint8).reshape(n, kp // 2)
        if fmt.bits > 4:
            hb = fmt.bits - 4
            per_byte = 8 // hb
            high = ((c >> 4) & ((1 << hb) - 1)).view(n, kp // per_byte, per_byte)
            shifts = torch.arange(per_byte, device=c.device, dtype=torch.int16) * hb
            tensors["qhigh"] = (high << shifts).sum(-1).to(torch.uint8).contiguous()
    tensors["scales"] = scales.to(torch.float16).contiguous()
    return PackedWeight(fmt.name, (n, k), tensors, {"layout": LAYOUT})


def unpack_codes(packed: PackedWeight) -> torch.Tensor:
    """The int codes [n, Kp] (int16) of a packed weight."""
    fmt = FORMATS[packed.scheme]
    q = packed.tensors["qweight"]
    if fmt.bits == 8:
        return q.to(torch.int16)
    n = q.shape[0]
    kp = q.shape[1] * 2
    b = q.to(torch.int16).view(n, kp // K_BLOCK, 1, K_BLOCK // 2)
    low = torch.cat([b & 0xF, (b >> 4) & 0xF], dim=2).reshape(n, kp)
    if fmt.bits == 4:
        v = low
    else:
        hb = fmt.bits - 4
        per_byte = 8 // hb
        h = packed.tensors["qhigh"].to(torch.int16).unsqueeze(-1)
        shifts = torch.arange(per_byte, device=q.device, dtype=torch.int16) * hb
        high = ((h >> shifts) & ((1 << hb) - 1)).reshape(n, kp)
        v = low | (high << 4)
    sign = 1 << (fmt.bits - 1)
    return (v ^ sign) - sign


def quantize(w: torch.Tensor, fmt: IntFormat | str) -> PackedWeight:
    fmt = FORMATS[fmt] if isinstance(fmt, str) else fmt
    codes, scales = encode(w, fmt)
    return pack(codes, scales, fmt, w.shape[1])


def dequantize(packed: PackedWeight) -> torch.Tensor:
    """The oracle: fp32 [n, k], w = fp32(scale16) * code."""
    fmt = FORMATS[packed.scheme]
    n, k = packed.shape
    codes = unpack_codes(packed).to(torch.float32)
    kp = codes.shape[1]
    s = packed.tensors["scales"].to(torch.float32)
    w = (codes.view(n, kp // fmt.group, fmt.group) * s.unsqueeze(-1)).view(n, kp)
    return w[:, :k].contiguous()


def check_parts(packed: PackedWeight, want: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> None:
    """Raise CheckpointError naming the first part of `packed` missing or not of `want`'s dtype/shape."""
    for part, (dtype, shape) in want.items():
        t = packed.tensors.get(part)
        if t is None:
            raise CheckpointError(f"{packed.scheme} weight {list(packed.shape)} lacks its '{part}' tensor.", tensor=part)
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise CheckpointError(
                f"{packed.scheme} weight {list(packed.shape)}: '{part}' is {t.dtype} {list(t.shape)}, "
                f"expected {dtype} {list(shape)}.",
                tensor=part,
            )


def check_packed(packed: PackedWeight) -> None:
    """Raise CheckpointError when a packed weight's tensors are not what its scheme stores."""
    check_parts(packed, expected_parts(packed.scheme, *packed.shape))
