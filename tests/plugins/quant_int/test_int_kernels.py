"""The fused Triton kernel against its oracle (dequantize, matmul in fp32), for the int formats.

CPU (CI): the kernel runs under TRITON_INTERPRET=1 at tiny sizes, tails included.
GPU (`-m gpu`): every linear shape of the registered checkpoints, M = 1, 3, 16, 17, 100, both
the PTX decode and the plain one, split-K determinism, and the encoder's bits on the GPU.
"""

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
from ninfer_plugins.quant_int import formats as F  # noqa: E402
from ninfer_plugins.quant_int import kernels as K  # noqa: E402
from ninfer_plugins.quant_int.linear import int_kernels, prepare_int  # noqa: E402

SCHEMES = sorted(F.FORMATS)

# every distinct [n, k] of the linears of Qwen3.6-27B / Qwen3.8-27B (same shapes) and
# Qwen3.6-35B-A3B: attention q/kv/o, GDN qkv/z/out, MLP or expert / shared expert, head, MTP fc
SHAPES_27B = [(12288, 5120), (1024, 5120), (5120, 6144), (10240, 5120), (6144, 5120), (17408, 5120), (5120, 17408), (248320, 5120), (5120, 10240)]
SHAPES_35B = [(8192, 2048), (512, 2048), (2048, 4096), (4096, 2048), (1024, 2048), (2048, 512), (248320, 2048), (2048, 4096)]
REGISTERED = sorted(set(SHAPES_27B + SHAPES_35B))


def reference(x: torch.Tensor, packed: PackedWeight) -> torch.Tensor:
    return x.float() @ F.dequantize(packed).to(x.device).T


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def tol(m: int) -> float:
    # bf16 output rounding alone gives about 3.5e-3; prefill blocks (M > 64) multiply the group
    # scale into bf16 weights, one more rounding of the same size
    return 6e-3 if m <= 64 else 1e-2


# --- CPU, interpreted ------------------------------------------------------------------------------

interp = pytest.mark.skipif(not INTERPRET, reason="interpreter tests run where there is no GPU (CI), or with TRITON_INTERPRET=1")


@interp
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m,n,k", [(1, 70, 200), (3, 64, 128), (16, 130, 300), (17, 40, 96), (100, 33, 260)])
def test_interpreted_kernel_matches_reference(scheme, m, n, k):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    packed = F.quantize(torch.randn(n, k, generator=g), scheme)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    y = K.launch(x, prepare_int(packed))
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert bool(torch.isfinite(y).all())
    assert rel_err(y, reference(x, packed)) < tol(m)


@interp
@pytest.mark.parametrize("scheme", ["q4_g64", "q8_g32"])
def test_interpreted_split_k_and_kb_step(scheme):
    g = torch.Generator().manual_seed(7)
    packed = F.quantize(torch.randn(64, 1024, generator=g), scheme)
    x = torch.randn(2, 1024, generator=g).to(torch.bfloat16)
    p = prepare_int(packed)
    ref = reference(x, packed)
    outs = []
    for cfg in (K.Config(64, 16, 1, 4, 1, 1), K.Config(64, 16, 4, 4, 1, 2), K.Config(64, 16, 3, 4, 1, 1)):
        y = K.launch(x, p, cfg)
        assert rel_err(y, ref) < tol(2)
        outs.append(y)
    # the counters were reset by the last split: a second call gives the same bits
    assert torch.equal(K.launch(x, p, K.Config(64, 16, 4, 4, 1, 2)), outs[1])
    assert int(K.Workspace.get(torch.device("cpu")).counters.abs().sum()) == 0


def test_linear_kernel_objects_on_cpu():
    from ninfer.device import probe

    triton_k, ref_k = int_kernels("q5_g64")
    assert "cuda" in (triton_k.requirements.problem(probe("cpu")) or "")
    assert ref_k.requirements.problem(probe("cpu")) is None
    packed = F.quantize(torch.randn(48, 80), "q5_g64")
    w = ref_k.prepare(packed)
    x = torch.randn(2, 3, 80)
    y = ref_k.apply(x, w)
    assert y.shape == (2, 3, 48) and torch.allclose(y, x @ F.dequantize(packed).T)
    yb = ref_k.apply(x.to(torch.bfloat16), w)
    assert yb.dtype == torch.bfloat16


# --- GPU -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n,k", REGISTERED)
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")
def test_gpu_registered_shapes(scheme, n, k):
    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16)
    packed = F.quantize(w, scheme)
    kernel, _ = int_kernels(scheme)
    prepared = kernel.prepare(packed)
    deq = F.dequantize(packed)
    for m in (1, 3, 16, 17, 100):
        x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        y = kernel.apply(x, prepared)
        ref = x.float() @ deq.T
        assert bool(torch.isfinite(y).all())
        assert rel_err(y, ref) < tol(m), (m, rel_err(y, ref))
    del deq, prepared, packed, w
    torch.cuda.empty_cache()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")
def test_gpu_tails_plain_decode_and_determinism(scheme):
    g = torch.Generator(device="cuda").manual_seed(1)
    for n, k in ((200, 4160), (70, 300), (1000, 129)):
        packed = F.quantize(torch.randn(n, k, device="cuda", generator=g), scheme)
        p = prepare_int(packed)
        K.reserve_workspace(p)
        deq = F.dequantize(packed)
        for m in (1, 5, 16, 40, 300):
            x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
            ref = x.float() @ deq.T
            y_fast = K.launch(x, p)
            y_plain = K.launch(x, p, fast=False)
            assert rel_err(y_fast, ref) < tol(m) and rel_err(y_plain, ref) < tol(m)
            assert torch.equal(K.launch(x, p), y_fast)  # split-K sums in a fixed order
        x = torch.randn(4, k, device="cuda", generator=g, dtype=torch.bfloat16)
        for split in (1, 2, 3, 8):
            y = K.launch(x, p, K.Config(64, 16, split, 4, 3, 1))
            assert rel_err(y, x.float() @ deq.T) < tol(4)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")
def test_gpu_encoder_bits_equal_cpu(scheme):
    w = torch.randn(96, 1000) * torch.logspace(-6, 2, 96).unsqueeze(1)
    a = F.quantize(w, scheme)
    b = F.quantize(w.cuda(), scheme)
    for part, t in a.tensors.items():
        assert torch.equal(t, b.tensors[part].cpu()), part


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")
def test_gpu_other_dtypes_fall_back_and_batch_dims():
    packed = F.quantize(torch.randn(256, 512, device="cuda"), "q4_g64")
    kernel, _ = int_kernels("q4_g64")
    p = kernel.prepare(packed)
    x = torch.randn(2, 3, 512, device="cuda")
    y = kernel.apply(x, p)
    assert y.dtype == torch.float32 and y.shape == (2, 3, 256)
    assert torch.allclose(y, x @ F.dequantize(packed).T, rtol=1e-4, atol=1e-4)
    yb = kernel.apply(x.to(torch.bfloat16), p)
    assert yb.shape == (2, 3, 256) and rel_err(yb, x.to(torch.bfloat16).float() @ F.dequantize(packed).T) < tol(6)


@interp
@pytest.mark.parametrize("scheme", ["q4_g64", "q8_g32"])
def test_interpreted_tuned_block_shapes(scheme):
    """The block shapes the tuned table uses (mma v2 at 32 rows, 128 rows x 8 warps, 256-wide
    prefill blocks) on a small weight: rows are padded to 256 so every block is whole."""
    g = torch.Generator().manual_seed(11)
    packed = F.quantize(torch.randn(260, 256, generator=g), scheme)
    p = prepare_int(packed)
    for m, cfg in (
        (3, K.Config(32, 16, 2, 2, 6, 1, False, 1)),
        (16, K.Config(128, 16, 2, 8, 4, 1, False, 1)),
        (70, K.Config(256, 128, 1, 8, 3, 1, True)),
        (70, K.Config(128, 256, 1, 8, 3, 1, True)),
    ):
        x = torch.randn(m, 256, generator=g).to(torch.bfloat16)
        assert rel_err(K.launch(x, p, cfg), reference(x, packed)) < tol(m), cfg


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")
def test_gpu_every_tuned_config():
    """Each measured config of tuned.py, on a weight with its K (and 512 rows), against the oracle."""
    from ninfer_plugins.quant_int.tuned import TUNED
    from ninfer_plugins.quant_nvfp4 import formats as NF
    from ninfer_plugins.quant_nvfp4.kernels import prepare_nvfp4

    names = {f.bits: f.name for f in F.FORMATS.values()}
    g = torch.Generator(device="cuda").manual_seed(5)
    seen = set()
    for (fmt, n, k, bucket), c in sorted(TUNED.items()):
        if (fmt, k, c) in seen:
            continue
        seen.add((fmt, k, c))
        w = torch.randn(512, k, device="cuda", generator=g)
        if fmt == 16:
            packed = NF.quantize(w)
            p, deq = prepare_nvfp4(packed), NF.dequantize(packed)
        else:
            packed = F.quantize(w, names[fmt])
            p, deq = prepare_int(packed), F.dequantize(packed)
        m = {"small": 1, "16": 16, "prefill": 200}[bucket]
        x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        y = K.launch(x, p, K.Config(*c))
        assert rel_err(y, x.float() @ deq.T) < tol(m), (fmt, n, k, bucket, c)
