"""The prefill path (dequant.py): the bf16 weight bit-exact against the fp32 reference rounded to
bf16, and dequantize + cuBLAS through TritonQuantLinear.apply against the fp32 matmul.

CPU (CI): the dequantize kernel under TRITON_INTERPRET=1, every format, random codes and scales
(every code, subnormal and zero scales), n and k tails, row offsets, the chunked matmul.
GPU (`-m gpu`): every linear shape of the registered models bit-exact (PTX and plain NVFP4
decode), apply() at M = 1024, the chunked vocabulary head, the M threshold.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    # Triton runs on the CPU only interpreted; decided before the kernels module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

from ninfer.linear import PackedWeight  # noqa: E402
from ninfer_plugins.quant_int import dequant as D  # noqa: E402
from ninfer_plugins.quant_int import formats as F  # noqa: E402
from ninfer_plugins.quant_int import kernels as K  # noqa: E402
from ninfer_plugins.quant_int.linear import dequantize_int_prepared, int_kernels, prepare_int  # noqa: E402
from ninfer_plugins.quant_nvfp4 import formats as NF  # noqa: E402
from ninfer_plugins.quant_nvfp4.kernels import dequantize_prepared, nvfp4_kernels, prepare_nvfp4  # noqa: E402

INT_SCHEMES = sorted(F.FORMATS)
SCHEMES = INT_SCHEMES + ["nvfp4"]

# every distinct [n, k] of Qwen3.6/3.8-27B (incl. the MTP fc) and Qwen3.6-35B-A3B linears
SHAPES_27B = [(12288, 5120), (1024, 5120), (5120, 6144), (10240, 5120), (6144, 5120), (17408, 5120), (5120, 17408), (5120, 10240)]
HEAD_27B = (248320, 5120)
SHAPES_35B = [(8192, 2048), (512, 2048), (2048, 4096), (4096, 2048), (1024, 2048), (2048, 512)]
HEAD_35B = (248320, 2048)

interp = pytest.mark.skipif(not INTERPRET, reason="interpreter tests run where there is no GPU (CI), or with TRITON_INTERPRET=1")
needs_cuda = pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")


def random_int_packed(scheme: str, n: int, k: int, device: str = "cpu", seed: int = 0) -> PackedWeight:
    """Every code of the format (qmin included, which the encoder never writes) and fp16 scales
    from every bit pattern up to the largest finite one: zero, subnormals, 65504."""
    fmt = F.FORMATS[scheme]
    g = torch.Generator().manual_seed(seed)
    kp = F.padded_k(k)
    codes = torch.randint(fmt.qmin, fmt.qmax + 1, (n, kp), generator=g, dtype=torch.int16).to(torch.int8)
    scales = torch.randint(0, 0x7C00, (n, kp // fmt.group), generator=g, dtype=torch.int16).view(torch.float16)
    scales[0, :2] = torch.tensor([0.0, 2.0**-24], dtype=torch.float16)
    return F.pack(codes.to(device), scales.to(device), fmt, k)


def random_nvfp4_packed(n: int, k: int, device: str = "cpu", seed: int = 0) -> PackedWeight:
    """All 16 codes, E4M3 scales from 0 and the smallest subnormal to 448, a global scale per row."""
    g = torch.Generator().manual_seed(seed)
    kp = NF.padded_k(k)
    codes = torch.randint(0, 16, (n, kp), generator=g, dtype=torch.uint8)
    bits = torch.randint(0, 0x7F, (n, kp // 16), generator=g, dtype=torch.uint8)  # 0x7F (NaN) excluded
    bits[0, :2] = torch.tensor([0x01, 0x7E], dtype=torch.uint8)
    gscale = torch.rand(n, generator=g) * 3 + 1e-3
    return PackedWeight(
        "nvfp4",
        (n, k),
        {
            "weight": NF.pack_codes(codes).to(device),
            "weight_scale": bits.view(torch.float8_e4m3fn).to(device),
            "weight_scale_2": gscale.to(device),
        },
    )


def prepare(scheme: str, packed: PackedWeight) -> K.Prepared:
    return prepare_nvfp4(packed) if scheme == "nvfp4" else prepare_int(packed)


def reference_bf16(p: K.Prepared) -> torch.Tensor:
    """The fp32 reference dequantization of the prepared weight, rounded once to bf16."""
    deq = dequantize_prepared(p) if p.fmt == K.NVFP4 else dequantize_int_prepared(p)
    return deq.to(torch.bfloat16)


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit for bit, except the sign of a zero (NVFP4's code 8 is -0: the GPU's fused multiply
    gives +0 where the reference's product keeps -0; x + 0.0 maps -0 to +0 and nothing else)."""
    assert a.shape == b.shape and a.dtype == b.dtype == torch.bfloat16
    a, b = (t.float().add(0.0).to(torch.bfloat16) for t in (a, b))
    diff = a.view(torch.int16) != b.view(torch.int16)
    if bool(diff.any()):
        i = diff.nonzero()[0].tolist()
        raise AssertionError(f"{int(diff.sum())} of {diff.numel()} differ; first at {i}: {a[tuple(i)]} vs {b[tuple(i)]}")


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))


# bf16 weights (one rounding) and a bf16 output (another): about 5e-3 relative in the worst case
TOL = 1e-2


# --- CPU, interpreted ------------------------------------------------------------------------------


@interp
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n,k", [(70, 300), (33, 128), (130, 96)])
def test_interpreted_dequant_is_the_reference_in_bf16(scheme, n, k):
    if scheme == "nvfp4":
        k = NF.padded_k(k)  # published NVFP4 has K % 16 == 0; the prepared layout pads it to 128
        packed = random_nvfp4_packed(n, k, seed=n + k)
    else:
        packed = random_int_packed(scheme, n, k, seed=n + k)
    p = prepare(scheme, packed)
    ref = reference_bf16(p)
    assert_bits_equal(D.dequantize(p), ref)
    # a narrower row block: the last block of rows is partial
    assert_bits_equal(D.dequantize(p, D.DequantConfig(32, 2)), ref)


@interp
@pytest.mark.parametrize("scheme", ["q4_g64", "q6_g64", "nvfp4"])
def test_interpreted_encoded_weights_and_row_offsets(scheme):
    # weights from the encoders (what a checkpoint holds), 300 rows: two ROW_PAD blocks
    w = torch.randn(300, 200, generator=torch.Generator().manual_seed(5))
    packed = NF.quantize(w) if scheme == "nvfp4" else F.quantize(w, scheme)
    p = prepare(scheme, packed)
    ref = reference_bf16(p)
    out = torch.full((300 - K.ROW_PAD, 200), float("nan"), dtype=torch.bfloat16)
    D.dequantize_into(p, out, row0=K.ROW_PAD)
    assert_bits_equal(out, ref[K.ROW_PAD:])
    # an output with a row stride wider than k (a slice of a bigger buffer)
    wide = torch.zeros((300, 256), dtype=torch.bfloat16)
    D.dequantize_into(p, wide[:, :200])
    assert_bits_equal(wide[:, :200], ref)
    assert not bool(wide[:, 200:].any())
    with pytest.raises(ValueError):
        D.dequantize_into(p, out, row0=100)


@interp
@pytest.mark.parametrize("scheme", ["q5_g64", "q8_g32", "nvfp4"])
def test_interpreted_chunked_matmul(scheme):
    g = torch.Generator().manual_seed(9)
    n, k = 600, 256
    packed = random_nvfp4_packed(n, k, seed=3) if scheme == "nvfp4" else F.quantize(torch.randn(n, k, generator=g), scheme)
    p = prepare(scheme, packed)
    w = reference_bf16(p)
    x = torch.randn(5, k, generator=g).to(torch.bfloat16)
    # 256 rows a chunk: three chunks, the last one 88 rows
    assert D.chunk_rows(n, k, 256 * k * 2) == 256
    y = D.matmul(x, p, chunk_bytes=256 * k * 2)
    assert y.shape == (5, n) and y.dtype == torch.bfloat16
    assert rel_err(y, x.float() @ w.float().T) < TOL
    whole = D.matmul(x, p)
    assert rel_err(whole, x.float() @ w.float().T) < TOL


def test_chunk_rows_and_the_memory_plan():
    from ninfer.memory import DEQUANT_SCRATCH

    assert D.CHUNK_BYTES <= DEQUANT_SCRATCH
    # every linear but the heads is one chunk: its GEMM runs unsplit
    for n, k in SHAPES_27B + SHAPES_35B:
        assert D.chunk_rows(n, k) == n
    for (n, k), chunks in ((HEAD_27B, 13), (HEAD_35B, 6)):
        rows = D.chunk_rows(n, k)
        assert rows % K.ROW_PAD == 0 and rows * k * 2 <= D.CHUNK_BYTES
        assert -(-n // rows) == chunks
        # balanced: the last chunk is not a sliver
        assert n - (chunks - 1) * rows > rows // 2
    assert D.chunk_rows(1000, 1 << 20, 1 << 20) == K.ROW_PAD  # never below one row block


# --- GPU -------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def encoded(scheme: str, n: int, k: int) -> K.Prepared:
    """A prepared weight from the encoder of a random bf16 weight (cached: the heads are large)."""
    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16)
    packed = NF.quantize(w) if scheme == "nvfp4" else F.quantize(w, scheme)
    kernel = nvfp4_kernels()[0] if scheme == "nvfp4" else int_kernels(scheme)[0]
    return kernel.prepare(packed)


def kernel_for(scheme: str):
    return nvfp4_kernels()[0] if scheme == "nvfp4" else int_kernels(scheme)[0]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n,k", SHAPES_27B + SHAPES_35B + [HEAD_27B, HEAD_35B])
@pytest.mark.gpu
@needs_cuda
def test_gpu_registered_shapes_bit_exact(scheme, n, k):
    p = encoded(scheme, n, k)
    ref = reference_bf16(p)
    assert_bits_equal(D.dequantize(p), ref)
    if scheme == "nvfp4":
        assert_bits_equal(D.dequantize(p, fast=False), ref)
    del ref
    torch.cuda.empty_cache()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.gpu
@needs_cuda
def test_gpu_every_code_and_scale_bit_exact(scheme):
    for n, k in ((300, 4160), (70, 304), (1000, 144)):
        packed = random_nvfp4_packed(n, k, "cuda") if scheme == "nvfp4" else random_int_packed(scheme, n, k, "cuda")
        p = prepare(scheme, packed)
        ref = reference_bf16(p)
        for fast in (True, False):
            assert_bits_equal(D.dequantize(p, fast=fast), ref)
        if n == 300:
            # other row blocks (the bench times them); 300 rows: the last block is partial
            for cfg in (D.DequantConfig(32, 4), D.DequantConfig(128, 8)):
                assert_bits_equal(D.dequantize(p, cfg), ref)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n,k", SHAPES_27B)
@pytest.mark.gpu
@needs_cuda
def test_gpu_apply_prefill(scheme, n, k):
    p = encoded(scheme, n, k)
    kernel = kernel_for(scheme)
    w = reference_bf16(p)
    x = torch.randn(1024, k, device="cuda", dtype=torch.bfloat16, generator=torch.Generator(device="cuda").manual_seed(1))
    ref = x.float() @ (dequantize_prepared(p) if scheme == "nvfp4" else dequantize_int_prepared(p)).T
    y = kernel.apply(x.view(2, 512, k), p).view(1024, n)  # default threshold: dequantize + cuBLAS
    assert y.dtype == torch.bfloat16 and bool(torch.isfinite(y).all())
    assert rel_err(y, ref) < TOL
    # the same GEMM as the bf16 reference weight's
    assert rel_err(y, torch.nn.functional.linear(x, w).float()) < 1e-3
    fused = kernel.apply(x, p, dequant_min_m=1 << 30)
    assert rel_err(fused, ref) < TOL


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n,k", [HEAD_27B, HEAD_35B])
@pytest.mark.gpu
@needs_cuda
def test_gpu_chunked_head(scheme, n, k):
    p = encoded(scheme, n, k)
    kernel = kernel_for(scheme)
    rows = D.chunk_rows(n, k)
    assert rows < n
    # prepare() grew the scratch at load for the head's chunk; no growth at apply
    scratch = D.Scratch.get(p.device).buf
    assert scratch.numel() >= rows * k
    x = torch.randn(256, k, device="cuda", dtype=torch.bfloat16, generator=torch.Generator(device="cuda").manual_seed(2))
    y = kernel.apply(x, p)
    assert D.Scratch.get(p.device).buf.data_ptr() == scratch.data_ptr()
    ref = x.float() @ (dequantize_prepared(p) if scheme == "nvfp4" else dequantize_int_prepared(p)).T
    assert rel_err(y, ref) < TOL
    del ref
    # chunk by chunk, each column slice of y matches its own slice of the fp32 product
    y_small = D.matmul(x[:8], p, chunk_bytes=D.CHUNK_BYTES // 4)
    assert rel_err(y_small, y[:8].float()) < 1e-3


@pytest.mark.parametrize("scheme", ["q4_g64", "nvfp4"])
@pytest.mark.gpu
@needs_cuda
def test_gpu_threshold_picks_the_path(scheme, monkeypatch):
    n, k = 1024, 5120
    p = encoded(scheme, n, k)
    kernel = kernel_for(scheme)
    calls = []
    real = D.matmul
    monkeypatch.setattr(D, "matmul", lambda x2, prep, **kw: calls.append(x2.shape[0]) or real(x2, prep, **kw))
    x = torch.randn(D.DEQUANT_MIN_M, k, device="cuda", dtype=torch.bfloat16)
    kernel.apply(x[:-1], p)
    assert calls == []
    kernel.apply(x, p)
    assert calls == [D.DEQUANT_MIN_M]
    kernel.apply(x[:4], p, dequant_min_m=4)
    kernel.apply(x, p, dequant_min_m=D.DEQUANT_MIN_M + 1)
    assert calls == [D.DEQUANT_MIN_M, 4]
