"""NVFP4 through the fused Triton kernel (W4A16) against dequantize-then-matmul in fp32."""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    # Triton runs on the CPU only interpreted; decided before the kernels module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

from ninfer.linear import PackedWeight  # noqa: E402
from ninfer_plugins.quant_int import kernels as K  # noqa: E402
from ninfer_plugins.quant_nvfp4 import formats as F  # noqa: E402
from ninfer_plugins.quant_nvfp4.importer import concat_rows  # noqa: E402
from ninfer_plugins.quant_nvfp4.kernels import dequantize_prepared, nvfp4_kernels, prepare_nvfp4  # noqa: E402

SHAPES_27B = [(12288, 5120), (1024, 5120), (5120, 6144), (10240, 5120), (6144, 5120), (17408, 5120), (5120, 17408), (248320, 5120)]
SHAPES_35B = [(8192, 2048), (512, 2048), (2048, 4096), (4096, 2048), (1024, 2048), (2048, 512), (248320, 2048)]
REGISTERED = sorted(set(SHAPES_27B + SHAPES_35B))


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def tol(m: int) -> float:
    # bf16 output rounding alone gives about 3.5e-3; prefill blocks (M > 64) multiply the group
    # scale into bf16 weights, one more rounding of the same size
    return 6e-3 if m <= 64 else 1e-2


def every_code_packed(n: int, k: int, device: str = "cpu") -> PackedWeight:
    """All 16 codes, E4M3 scales from subnormal 2^-9 to 448, per-row global scales."""
    g = torch.Generator().manual_seed(n * k)
    codes = torch.randint(0, 16, (n, F.padded_k(k)), generator=g, dtype=torch.uint8)
    codes[:, k:] = 0  # K padded to 16 with zero codes, as the canonical layout stores it
    codes[0, :16] = torch.arange(16, dtype=torch.uint8)
    bits = torch.randint(0, 0x7F, (n, -(-k // 16)), generator=g, dtype=torch.uint8)  # 0x7F (NaN) excluded
    bits[0, 0] = 0x01  # smallest subnormal scale: 2^-9
    bits[0, -1] = 0x7E  # 448
    return PackedWeight(
        "nvfp4",
        (n, k),
        {
            "weight": F.pack_codes(codes).to(device),
            "weight_scale": bits.view(torch.float8_e4m3fn).to(device),
            "weight_scale_2": (torch.rand(n, generator=g) + 0.5).to(device),
        },
    )


def test_prepared_byte_bits_are_pinned():
    """g16-split8-f16: A's sign on bit 7 and magnitude on bits 1-3, B's magnitude on bits 4-6 and
    sign on bit 0 (the decoders' bit positions depend on it); unpack_byte inverts it on all 256."""
    from ninfer_plugins.quant_nvfp4.kernels import pack_byte, unpack_byte

    u8 = lambda v: torch.tensor([v], dtype=torch.uint8)  # noqa: E731
    assert int(pack_byte(u8(0b1011), u8(0b0110))) == 0b1_110_011_0  # A = -3 (sign, 011), B = +6 (110)
    assert int(pack_byte(u8(0b1000), u8(0))) == 0x80 and int(pack_byte(u8(0), u8(0b1000))) == 0x01
    a = torch.arange(16, dtype=torch.uint8).repeat_interleave(16)
    b = torch.arange(16, dtype=torch.uint8).repeat(16)
    byte = pack_byte(a, b)
    assert byte.unique().numel() == 256
    ua, ub = unpack_byte(byte)
    assert torch.equal(ua, a) and torch.equal(ub, b)


def test_prepared_layout_round_trips():
    p = every_code_packed(5, 200)
    assert torch.equal(dequantize_prepared(prepare_nvfp4(p)), F.dequantize(p))


interp = pytest.mark.skipif(not INTERPRET, reason="interpreter tests run where there is no GPU (CI), or with TRITON_INTERPRET=1")


@interp
@pytest.mark.parametrize("m,n,k", [(1, 70, 208), (3, 64, 128), (16, 130, 304), (17, 40, 96), (100, 33, 256)])
def test_interpreted_kernel_matches_reference(m, n, k):
    p = every_code_packed(n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    y = K.launch(x, prepare_nvfp4(p))
    assert bool(torch.isfinite(y).all())
    assert rel_err(y, x.float() @ F.dequantize(p).T) < tol(m)


@interp
@pytest.mark.parametrize("m,n,k", [(16, 130, 304), (17, 40, 96)])
def test_interpreted_kernel_with_gathered_scales_is_the_same(m, n, k, monkeypatch):
    """NINFER_NV_SG=1 (the tile kernel's block scales gathered per column, an A/B switch): the
    same output as the broadcast form, bit for bit."""
    p = prepare_nvfp4(every_code_packed(n, k))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    cfg = K.Config(64, 16, 1, 4, 1, 1)
    want = K.launch(x, p, cfg)
    monkeypatch.setenv("NINFER_NV_SG", "1")
    assert torch.equal(K.launch(x, p, cfg), want)


@interp
def test_interpreted_quantized_from_bf16_and_fused_rows():
    g = torch.Generator().manual_seed(3)
    a, b = F.quantize(torch.randn(40, 256, generator=g)), F.quantize(torch.randn(24, 256, generator=g) * 30)
    p = concat_rows([a, b])
    x = torch.randn(4, 256, generator=g).to(torch.bfloat16)
    y = K.launch(x, prepare_nvfp4(p), K.Config(64, 16, 2, 4, 1, 1))
    assert rel_err(y, x.float() @ F.dequantize(p).T) < tol(4)


def test_reference_kernel_on_cpu():
    _, ref = nvfp4_kernels()
    p = every_code_packed(8, 64)
    x = torch.randn(3, 64)
    assert torch.allclose(ref.apply(x, ref.prepare(p)), x @ F.dequantize(p).T)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")
def test_gpu_every_code_and_subnormal_scale_exact():
    # one weight per output row: y must equal the fp32 dequantized weight exactly (then bf16)
    p = every_code_packed(64, 128, "cuda")
    kernel, _ = nvfp4_kernels()
    prep = kernel.prepare(p)
    deq = F.dequantize(p)
    x = torch.eye(128, device="cuda", dtype=torch.bfloat16)[:16]
    for fast in (True, False):
        y = K.launch(x, prep, fast=fast)
        assert torch.equal(y, deq[:, :16].T.to(torch.bfloat16)), fast


@pytest.mark.parametrize("n,k", REGISTERED)
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")
def test_gpu_registered_shapes(n, k):
    g = torch.Generator(device="cuda").manual_seed(n + k)
    packed = F.quantize(torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16))
    kernel, _ = nvfp4_kernels()
    prepared = kernel.prepare(packed)
    deq = F.dequantize(packed)
    for m in (1, 3, 16, 17, 100):
        x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        y = kernel.apply(x, prepared)
        assert rel_err(y, x.float() @ deq.T) < tol(m), m
    del deq, prepared, packed
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")
def test_gpu_tails_plain_decode_and_quantizer_bits():
    g = torch.Generator(device="cuda").manual_seed(2)
    for n, k in ((200, 4160), (70, 304), (1000, 144)):
        w = torch.randn(n, k, device="cuda", generator=g)
        packed = F.quantize(w)
        cpu = F.quantize(w.cpu())
        for part, t in cpu.tensors.items():
            assert torch.equal(t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t,
                               packed.tensors[part].cpu().view(torch.uint8) if t.dtype == torch.float8_e4m3fn else packed.tensors[part].cpu()), part
        p = prepare_nvfp4(packed)
        K.reserve_workspace(p)
        deq = F.dequantize(packed)
        for m in (1, 5, 16, 40, 300):
            x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
            ref = x.float() @ deq.T
            assert rel_err(K.launch(x, p), ref) < tol(m) and rel_err(K.launch(x, p, fast=False), ref) < tol(m)
