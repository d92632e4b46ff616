"""NVFP4: exact decode of hand-built bytes, our quantizer's rounding, round-trip error."""

from __future__ import annotations

import pytest
import torch

from ninfer.errors import CheckpointError
from ninfer.linear import PackedWeight
from ninfer_plugins.quant_nvfp4 import formats as F


def _packed(codes: list[int], scales: list[float], g: float, n: int = 1) -> PackedWeight:
    c = torch.tensor(codes, dtype=torch.uint8).view(n, -1)
    return PackedWeight(
        "nvfp4",
        (n, c.shape[1]),
        {
            "weight": F.pack_codes(c),
            "weight_scale": torch.tensor(scales).view(n, -1).to(torch.float8_e4m3fn),
            "weight_scale_2": torch.tensor(g, dtype=torch.float32),
        },
    )


def test_decode_of_hand_built_bytes():
    # byte 0x21: element 0 = code 1 (0.5), element 1 = code 2 (1.0); 0xF8: -0 then -6
    w = torch.tensor([[0x21, 0xF8, 0x73, 0x5C] + [0] * 4], dtype=torch.uint8)
    p = PackedWeight(
        "nvfp4",
        (1, 16),
        {
            "weight": w,
            "weight_scale": torch.tensor([[2.0]]).to(torch.float8_e4m3fn),
            "weight_scale_2": torch.tensor(0.25),
        },
    )
    got = F.dequantize(p)[0, :8]
    want = torch.tensor([0.5, 1.0, -0.0, -6.0, 1.5, 6.0, -2.0, 3.0]) * 2.0 * 0.25
    assert torch.equal(got, want)


def test_all_codes_and_e4m3_extremes_decode_exactly():
    codes = list(range(16))
    vals = F.e2m1_values()
    for s in (448.0, 2.0**-9, 2.0**-6 * 1.875, 1.0):
        p = _packed(codes, [s], 1.0)
        assert torch.equal(F.dequantize(p)[0], vals * s)


def test_nearest_e2m1_ties_to_even_and_saturates():
    q = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, -0.25, -0.3, -5.0, 0.26, 4.99])
    got = [float(F.e2m1_values()[int(c)]) for c in F.nearest_e2m1(q)]
    assert got == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 0.0, -0.5, -4.0, 0.5, 4.0]
    assert int(F.nearest_e2m1(torch.tensor([-0.1]))[0]) == 0  # a zero magnitude is +0


@pytest.mark.parametrize("shape", [(8, 64), (5, 48), (3, 40), (2, 7)])
def test_quantize_round_trip_error(shape):
    torch.manual_seed(sum(shape))
    w = torch.randn(*shape) * torch.logspace(-3, 1, shape[0]).unsqueeze(1)
    p = F.quantize(w.to(torch.bfloat16))
    F.check_packed(p)
    d = F.dequantize(p)
    assert d.shape == w.shape
    wb = w.to(torch.bfloat16).float()
    # within half an E2M1 step of each block: step <= 2 * (block scale * g) (the 4 -> 6 gap)
    kp = F.padded_k(shape[1])
    scale = F.global_scale_rows(p).view(-1, 1) * p.tensors["weight_scale"].float()
    step = 2.0 * scale.repeat_interleave(16, dim=1)[:, : shape[1]]
    assert bool(((d - wb).abs() <= step / 2 + 1e-12).all())
    # relative error of a Gaussian matrix: about 0.08-0.12 in Frobenius norm for NVFP4
    rel = float((d - wb).norm() / wb.norm())
    assert rel < 0.2
    assert p.tensors["weight"].shape == (shape[0], kp // 2)
    # the block amax is represented within rounding of its scale: no saturation loss at the top
    assert float(p.tensors["weight_scale"].float().max()) <= 448.0


def test_quantize_is_idempotent_on_its_own_grid():
    torch.manual_seed(0)
    p = F.quantize(torch.randn(4, 64))
    d = F.dequantize(p)
    p2 = F.quantize(d)
    assert torch.equal(F.dequantize(p2), d)


def test_zero_matrix_and_non_finite():
    p = F.quantize(torch.zeros(2, 32))
    assert float(p.tensors["weight_scale_2"]) == 1.0 and torch.equal(F.dequantize(p), torch.zeros(2, 32))
    with pytest.raises(CheckpointError, match="NaN or inf"):
        F.quantize(torch.tensor([[float("inf")] * 16]))


def test_per_row_global_scale():
    a = F.quantize(torch.randn(3, 32))
    b = F.quantize(torch.randn(2, 32) * 10)
    from ninfer_plugins.quant_nvfp4.importer import concat_rows

    c = concat_rows([a, b])
    F.check_packed(c)
    assert c.tensors["weight_scale_2"].shape == (5,)
    assert torch.equal(F.dequantize(c), torch.cat([F.dequantize(a), F.dequantize(b)]))
