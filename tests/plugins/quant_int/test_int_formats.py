"""The groupwise-int encoder against a slow scalar oracle written from spec 4.1 (numpy scalars)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer.errors import CheckpointError
from ninfer_plugins.quant_int import formats as F


def oracle_group(xs: list[float], bits: int) -> tuple[np.float16, list[int]]:
    """MAXABS_F16_RECIP_RNE_V1 for one group, one number at a time."""
    qmax = 2 ** (bits - 1) - 1
    qmin = -qmax if bits == 8 else -(2 ** (bits - 1))
    x32 = [np.float32(v) for v in xs]
    amax = np.float32(0.0)
    for v in x32:
        if abs(v) > amax:
            amax = np.float32(abs(v))
    if amax == 0:
        return np.float16(0.0), [0] * len(xs)
    with np.errstate(over="ignore", under="ignore"):
        s16 = np.float16(np.float32(amax / np.float32(qmax)))
    if s16 == 0:
        s16 = np.frombuffer(np.uint16(1).tobytes(), dtype=np.float16)[0]
    inv = np.float32(np.float32(1.0) / np.float32(s16))
    codes = []
    for v in x32:
        p = np.float32(v * inv)
        r = int(np.rint(p))  # numpy rint: round half to even
        codes.append(min(max(r, qmin), qmax))
    return s16, codes


def oracle(w: torch.Tensor, fmt: F.IntFormat) -> tuple[np.ndarray, np.ndarray]:
    n, k = w.shape
    kp = F.padded_k(k)
    x = np.zeros((n, kp), dtype=np.float32)
    x[:, :k] = w.to(torch.float32).numpy()
    codes = np.zeros((n, kp), dtype=np.int64)
    scales = np.zeros((n, kp // fmt.group), dtype=np.float16)
    for r in range(n):
        for g in range(kp // fmt.group):
            s, c = oracle_group(x[r, g * fmt.group : (g + 1) * fmt.group].tolist(), fmt.bits)
            scales[r, g] = s
            codes[r, g * fmt.group : (g + 1) * fmt.group] = c
    return codes, scales


def _nasty(n: int, k: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    """Random rows at very different magnitudes, ties, zeros, subnormal-scale rows."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-8, 3, n).unsqueeze(1)
    w[0, :] = 0.0  # all-zero row: scale +0, codes 0
    if n > 2:
        w[1, : min(k, 64)] = 1e-30  # scale underflows fp16: 0x0001
    if n > 3:
        # exact halves after scaling (ties): amax 7 -> scale 1, x*inv = k + 0.5
        w[2, :8] = torch.tensor([7.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5])[: min(8, k)]
    return w.to(dtype)


@pytest.mark.parametrize("name", sorted(F.FORMATS))
@pytest.mark.parametrize("shape", [(5, 64), (4, 200), (3, 1), (6, 257)])
def test_encoder_bit_exact_against_oracle(name, shape):
    fmt = F.FORMATS[name]
    w = _nasty(*shape, seed=hash((name, shape)) % 1000)
    codes, scales = F.encode(w, fmt)
    ocodes, oscales = oracle(w, fmt)
    assert np.array_equal(scales.numpy().view(np.uint16), oscales.view(np.uint16))
    assert np.array_equal(codes.numpy().astype(np.int64), ocodes)


@pytest.mark.parametrize("name", sorted(F.FORMATS))
def test_pack_round_trip_and_dequant(name):
    fmt = F.FORMATS[name]
    w = torch.randn(7, 300, dtype=torch.float32)
    packed = F.quantize(w, fmt)
    F.check_packed(packed)
    codes, scales = F.encode(w, fmt)
    assert torch.equal(F.unpack_codes(packed), codes.to(torch.int16))
    assert codes.min() >= fmt.qmin and codes.max() <= fmt.qmax
    deq = F.dequantize(packed)
    assert deq.shape == (7, 300) and deq.dtype == torch.float32
    kp = F.padded_k(300)
    want = (codes.float().view(7, kp // fmt.group, fmt.group) * scales.float().unsqueeze(-1)).view(7, kp)[:, :300]
    assert torch.equal(deq, want)
    # the error is within half a step of each group's scale
    err = (deq - w).abs().view(7, -1)
    assert float(err.max()) <= float(scales.float().max()) * 0.5 + 1e-7
    # a re-encode of the dequantized weight reproduces the same codes (idempotent grid)
    assert torch.equal(F.encode(deq, fmt)[0], codes)
    assert packed.nbytes <= 7 * kp * fmt.bits_per_weight / 8 + 1


def test_layout_bytes_by_hand():
    # q4: element j -> low nibble of byte j, element 64+j -> high nibble (block of 128)
    codes = torch.zeros(1, 128, dtype=torch.int8)
    codes[0, 0], codes[0, 64], codes[0, 1], codes[0, 127] = 3, -8, -1, 7
    p = F.pack(codes, torch.ones(1, 2, dtype=torch.float16), F.Q4, 128)
    q = p.tensors["qweight"][0]
    assert int(q[0]) == (3 | (0x8 << 4)) and int(q[1]) == 0xF and int(q[63]) == (7 << 4)
    # q5: bit 4 of element e at byte e // 8, bit e % 8
    codes5 = torch.zeros(1, 128, dtype=torch.int8)
    codes5[0, 9] = -16  # 0b10000
    codes5[0, 70] = 15  # 0b01111: no high bit
    codes5[0, 71] = -1  # 0b11111
    p5 = F.pack(codes5, torch.ones(1, 2, dtype=torch.float16), F.Q5, 128)
    h = p5.tensors["qhigh"][0]
    assert int(h[1]) == 1 << 1 and int(h[8]) == 1 << 7 and int(h.sum()) == 2 + 128
    # q6: bits 4..5 of element e at byte e // 4, bits 2*(e % 4)
    codes6 = torch.zeros(1, 128, dtype=torch.int8)
    codes6[0, 6] = -32  # 0b100000 -> high bits 0b10
    p6 = F.pack(codes6, torch.ones(1, 2, dtype=torch.float16), F.Q6, 128)
    assert int(p6.tensors["qhigh"][0, 1]) == 0b10 << 4
    for c, p in ((codes, p), (codes5, p5), (codes6, p6)):
        assert torch.equal(F.unpack_codes(p), c.to(torch.int16))


def test_q8_never_uses_minus_128_and_amax_maps_to_qmax():
    w = torch.tensor([[-1.0] + [0.5] * 31])
    codes, _ = F.encode(w, F.Q8)
    assert int(codes.min()) == -127
    # qmax, not |qmin|, sets the scale: the largest magnitude lands on +-qmax
    for fmt in F.FORMATS.values():
        x = torch.randn(3, 128) * 3
        c, _ = F.encode(x, fmt)
        a = c.view(3, -1, fmt.group).abs().amax(-1)
        assert bool((a == fmt.qmax).all())


def test_non_finite_and_overflow_fail_clearly():
    w = torch.zeros(2, 64)
    w[1, 3] = float("nan")
    with pytest.raises(CheckpointError, match="NaN or inf"):
        F.quantize(w, "q4_g64")
    with pytest.raises(CheckpointError, match="fp16 scale range"):
        F.quantize(torch.full((1, 64), 1e30), "q8_g32")


def test_check_packed_names_the_bad_part():
    p = F.quantize(torch.randn(4, 128), "q5_g64")
    p.tensors["qhigh"] = p.tensors["qhigh"][:, :3]
    with pytest.raises(CheckpointError, match="qhigh"):
        F.check_packed(p)
