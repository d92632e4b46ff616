"""The W4A4 FP4-tensor-core kernel (quant_nvfp4/native.py): its activation quantizer (interpreted
here) against formats.py's encoder, its tiled scale layout, the whole apply with the matmul
emulated in fp32, its selection per device, and (on sm_100+ only) cuBLAS against the emulation."""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

from ninfer.device import DeviceInfo, _features_for  # noqa: E402
from ninfer.linear import PackedWeight  # noqa: E402
from ninfer.plugins import PluginManager  # noqa: E402
from ninfer_plugins.quant_nvfp4 import formats as F  # noqa: E402
from ninfer_plugins.quant_nvfp4 import native as N  # noqa: E402
from ninfer_plugins.quant_nvfp4.importer import concat_rows  # noqa: E402

if INTERPRET or CUDA:
    import triton
    import triton.language as tl

    from ninfer_plugins.quant_nvfp4.act_kernel import _e4m3

    @triton.jit
    def _e4m3_kernel(X, V, B, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v, b = _e4m3(tl.load(X + o, mask=o < n, other=0.0))
        tl.store(V + o, v, mask=o < n)
        tl.store(B + o, b, mask=o < n)


interp = pytest.mark.skipif(not INTERPRET, reason="interpreter tests run where there is no GPU (CI), or with TRITON_INTERPRET=1")


def fake_gpu(cap: tuple[int, int]) -> DeviceInfo:
    return DeviceInfo("cuda", 0, "test GPU", cap, 80 << 30, 80 << 30, 132, _features_for(cap))


def test_swizzle_is_cublas_tile_layout():
    # A second derivation of the 128x4 tile layout, by reshapes: tiles row-major, inside a tile
    # [row % 32][row // 32][col].
    rows, cols = 300, 10
    s = torch.randint(1, 255, (rows, cols), dtype=torch.uint8)
    pr, pc = 384, 12
    padded = torch.zeros(pr, pc, dtype=torch.uint8)
    padded[:rows, :cols] = s
    want = padded.view(pr // 128, 128, pc // 4, 4).permute(0, 2, 1, 3).reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1)
    assert torch.equal(N.swizzle(s), want)
    assert torch.equal(N.unswizzle(N.swizzle(s), rows, cols), s)


@interp
def test_e4m3_rounding_equals_torch():
    import triton

    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # every finite value >= 0
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat([grid, mids, torch.nextafter(mids, torch.zeros_like(mids)), torch.nextafter(mids, torch.full_like(mids, 500.0)),
                   torch.rand(4000) * 448, torch.rand(1000) * 0.02, torch.tensor([448.0])])
    v = torch.empty_like(x)
    b = torch.empty(x.shape, dtype=torch.int32)
    _e4m3_kernel[(triton.cdiv(x.numel(), 256),)](x, v, b, x.numel(), BLOCK=256)
    ref = x.to(torch.float8_e4m3fn)
    assert torch.equal(v, ref.float())
    assert torch.equal(b.to(torch.uint8), ref.view(torch.uint8))


def activations(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * (torch.rand(m, 1, generator=g) * 8 + 0.01)
    x[0, : min(16, k)] = 0  # an all-zero block
    if k > 40:
        x[0, 32:48] = 0
        x[0, 40] = 1e-12  # a nonzero block whose scale rounds to 0 (takes 2^-9)
    return x.to(torch.bfloat16)


@interp
@pytest.mark.parametrize("m,k", [(1, 64), (3, 200), (8, 128), (9, 1000), (130, 192)])
@pytest.mark.parametrize("static", [False, True])
def test_interpreted_quantizer_equals_encoder(m, k, static):
    x = activations(m, k, m * 1000 + k)
    # a static scale small enough that some blocks saturate (scale 448, codes at 6)
    g = torch.tensor([0.0009]) if static else None
    kp = -(-k // 64) * 64
    q, s, gg = N.quantize_activations(x, kp, g)
    rq, rs, rg = N.quantize_activations_reference(x, kp, g)
    assert torch.equal(q, rq)
    assert torch.equal(s.view(torch.uint8), rs.view(torch.uint8))
    assert torch.equal(gg, rg)
    # and the reference is formats.py's encoder, row for row, with a global scale it derived
    xf = torch.zeros(m, kp)
    xf[:, :k] = x.float()
    want_g = F.global_scale_of(xf.abs().amax(dim=1, keepdim=True)) if g is None else g.reshape(())
    codes, s8 = F.encode_blocks(xf, want_g)
    assert torch.equal(q, F.pack_codes(codes))
    assert torch.equal(N.unswizzle(s.view(torch.uint8), m, kp // 16), s8.view(torch.uint8))
    if static:
        assert (s8.view(torch.uint8) == 0x7E).any()  # saturated


@interp
def test_interpreted_quantizer_ties_to_even():
    # static g = 1 and a block max of 6 give the block scale 1, so these values reach the code
    # rounding unchanged: every midpoint between E2M1 magnitudes, both signs
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    block = torch.tensor([6.0] + mids + [-m for m in mids] + [-6.0])
    x = torch.cat([block, torch.zeros(48)]).view(1, 64).to(torch.bfloat16)
    q, s, _ = N.quantize_activations(x, 64, torch.tensor([1.0]))
    codes = F.unpack_codes(q)[0, :16].tolist()
    # ties go to the even code: 0.25 -> 0, 0.75 -> 2 (1.0), 1.25 -> 2, 1.75 -> 4, 2.5 -> 4, 3.5 -> 6, 5 -> 6
    assert codes == [7, 0, 2, 2, 4, 4, 6, 6, 0, 10, 10, 12, 12, 14, 14, 15]
    assert N.unswizzle(s.view(torch.uint8), 1, 4)[0, 0] == 0x38  # E4M3 1.0


def w4a4_reference(x: torch.Tensor, w: PackedWeight, g: torch.Tensor | None) -> torch.Tensor:
    """x quantized to NVFP4 by formats.py, then both dequantized and multiplied in fp32."""
    n, k = w.shape
    kp = -(-k // 64) * 64
    xf = torch.zeros(x.shape[0], kp)
    xf[:, :k] = x.float()
    gx = F.global_scale_of(xf.abs().amax(dim=1)) if g is None else g.reshape(()).expand(x.shape[0])
    codes, s8 = F.encode_blocks(xf, gx.view(-1, 1))
    xa = PackedWeight("nvfp4", (x.shape[0], kp), {"weight": F.pack_codes(codes), "weight_scale": s8,
                                                   "weight_scale_2": gx.contiguous()})
    return (F.dequantize(xa)[:, :k] @ F.dequantize(w).T)


def emulated() -> N.NativeFp4Linear:
    quant = N.quantize_activations if INTERPRET else N.quantize_activations_reference
    return N.NativeFp4Linear(matmul=N.emulate_scaled_mm, quantize=quant)


@pytest.mark.parametrize("m,n,k", [(1, 40, 64), (5, 130, 200), (17, 8, 1000)])
def test_apply_emulated_equals_w4a4_reference(m, n, k):
    torch.manual_seed(n + k)
    w = F.quantize(torch.randn(n, k))
    kern = emulated()
    p = kern.prepare(w)
    assert p.row_scale is None and p.codes.shape == (-(-n // 128) * 128, -(-k // 64) * 32)
    x = activations(m, k, n)
    y = kern.apply(x.view(1, m, k), p)
    assert y.shape == (1, m, n) and y.dtype == torch.bfloat16
    ref = w4a4_reference(x, w, None)
    assert torch.allclose(y[0].float(), ref, rtol=8e-3, atol=1e-3 * ref.abs().max())
    # against W4A16 (the activations as given): the activation's own 4-bit error, no more
    full = x.float() @ F.dequantize(w).T
    assert float((y[0].float() - full).norm() / full.norm()) < 0.15


def test_per_row_global_scales_and_static_input_scale():
    torch.manual_seed(3)
    parts = [F.quantize(torch.randn(64, 128) * s) for s in (1.0, 30.0)]
    w = concat_rows(parts)  # rows of two matrices: two global scales
    w.meta["input_scale"] = 0.002
    kern = emulated()
    p = kern.prepare(w)
    assert p.row_scale is not None and float(p.gscale) == 1.0
    assert p.input_scale is not None and float(p.input_scale) == pytest.approx(0.002)
    x = activations(4, 128, 9)
    y = kern.apply(x, p)
    ref = w4a4_reference(x, w, torch.tensor(0.002))
    assert torch.allclose(y.float(), ref, rtol=8e-3, atol=1e-3 * ref.abs().max())


def test_a_token_does_not_depend_on_its_batch():
    """Without a static input scale each row has its own: a row alone and the same row next to a
    200x larger one give the same output (a speculative verify's columns, a bucket's padding rows
    and the batch's other requests must not move a token's result)."""
    torch.manual_seed(11)
    w = F.quantize(torch.randn(40, 128))
    kern = emulated()
    p = kern.prepare(w)
    x = activations(2, 128, 4)
    x[1] = x[1] * 200
    alone = kern.apply(x[:1], p)
    together = kern.apply(x, p)
    assert torch.equal(alone[0], together[0])


def test_cublas_arguments_pass_torch_checks_on_meta():
    """The real call's operands (prepare's layout, the quantizer's outputs) as meta tensors: torch's
    own argument checks for the NVFP4 block-scaled matmul accept them, at decode and prefill sizes.
    (No FP4 GPU here: this checks shapes, dtypes, strides and scale counts, not values.)"""
    if not N.torch_supports_nvfp4_mm():
        pytest.skip("this torch has no NVFP4 scaled_mm")
    for m, n, k in ((1, 40, 64), (5, 130, 200), (300, 5120, 4096)):
        kp, rows = -(-k // 64) * 64, -(-n // 128) * 128
        meta = torch.device("meta")
        a_q = torch.empty(m, kp // 2, dtype=torch.uint8, device=meta)
        a_s = torch.empty(-(-m // 128) * 128 * (kp // 16), dtype=torch.float8_e4m3fn, device=meta)
        w_q = torch.empty(rows, kp // 2, dtype=torch.uint8, device=meta)
        w_s = torch.empty(rows * (kp // 16), dtype=torch.float8_e4m3fn, device=meta)
        one = torch.empty(1, dtype=torch.float32, device=meta)
        y = N.cublas_scaled_mm(a_q, a_s, one, w_q, w_s, one)
        assert tuple(y.shape) == (m, rows) and y.dtype == torch.bfloat16


def test_merged_rows_keep_the_largest_input_scale():
    parts = [F.quantize(torch.randn(8, 64)) for _ in range(2)]
    parts[0].meta["input_scale"], parts[1].meta["input_scale"] = 0.001, 0.003
    assert concat_rows(parts).meta["input_scale"] == pytest.approx(0.003)
    parts[1].meta.pop("input_scale")
    assert "input_scale" not in concat_rows(parts).meta


def test_weight_only_layers_keep_bf16_activations():
    """A layer published weight-only (the importer's `weight_only`: no activation scale, or
    W4A16_NVFP4) is prepared and run by the W4A16 kernel even here: no activation quantization, so
    its output is the dequantized weight times the bf16 activations; a calibrated one stays W4A4."""
    torch.manual_seed(4)
    w = F.quantize(torch.randn(40, 128))
    w.meta["weight_only"] = True
    kern = emulated()
    p = kern.prepare(w)
    assert not isinstance(p, N.NativePrepared)
    x = activations(3, 128, 5)
    full = x.float() @ F.dequantize(w).T
    y = kern.apply(x, p)
    assert torch.allclose(y.float(), full, rtol=1e-2, atol=1e-2 * full.abs().max())
    w.meta.pop("weight_only")
    assert isinstance(kern.prepare(w), N.NativePrepared)


def test_importer_marks_weight_only_modules():
    from ninfer_plugins.quant_nvfp4.importer import import_linears, parse_quant_config

    p = F.quantize(torch.randn(16, 64))
    t = p.tensors
    plain = {"a.weight": t["weight"], "a.weight_scale": t["weight_scale"], "a.weight_scale_2": t["weight_scale_2"]}
    calibrated = {**plain, "a.input_scale": torch.tensor(0.5)}
    cfg = parse_quant_config(hf_quant_config={"quantization": {"quant_algo": "NVFP4", "group_size": 16}})
    assert dict(import_linears(plain, cfg))["a"].meta["weight_only"] is True
    assert "weight_only" not in dict(import_linears(calibrated, cfg))["a"].meta
    mixed = parse_quant_config(hf_quant_config={"quantization": {
        "quant_algo": "MIXED_PRECISION", "quantized_layers": {"a": {"quant_algo": "W4A16_NVFP4", "group_size": 16}}}})
    assert dict(import_linears(calibrated, mixed))["a"].meta["weight_only"] is True
    parts = [F.quantize(torch.randn(8, 64)) for _ in range(2)]
    parts[1].meta["weight_only"] = True
    assert concat_rows(parts).meta["weight_only"] is True


def test_chosen_only_with_fp4_tensor_cores(monkeypatch):
    pm = PluginManager()
    blackwell = pm.choose("ninfer_linear_kernel", fake_gpu((10, 0)), scheme="nvfp4", n=128, k=256)
    assert blackwell.name == N.NativeFp4Linear.name and blackwell.plugin == "quant_nvfp4_native"
    assert pm.choose("ninfer_linear_kernel", fake_gpu((12, 0)), scheme="nvfp4", n=128, k=256).name == N.NativeFp4Linear.name
    hopper = pm.choose("ninfer_linear_kernel", fake_gpu((9, 0)), scheme="nvfp4", n=128, k=256)
    assert hopper.name == "triton.nvfp4"
    assert any(name == N.NativeFp4Linear.name and "needs sm_100+" in why for _, name, why in hopper.passed_over)
    # other schemes never see it
    assert pm.choose("ninfer_linear_kernel", fake_gpu((10, 0)), scheme="q4_g64", n=128, k=256).name == "triton.q4_g64"
    monkeypatch.setenv("NINFER_NVFP4_NATIVE", "0")
    assert pm.choose("ninfer_linear_kernel", fake_gpu((10, 0)), scheme="nvfp4", n=128, k=256).name == "triton.nvfp4"


def test_moe_stack_repoints_native_experts_to_w4a16_views():
    """On FP4 hardware the experts' QLinears get the native kernel; the MoE's stack then serves
    them, so each expert holds views of it (W4A16), not a second copy of its weights."""
    from ninfer.linear import QLinear
    from ninfer_plugins.moe_triton.moe import stack_experts
    from ninfer_plugins.quant_nvfp4.kernels import dequantize_prepared

    torch.manual_seed(5)
    n, k = 256, 64  # rows a multiple of the W4A16 kernel's row padding, as the views need
    packed = [F.quantize(torch.randn(n, k)) for _ in range(3)]
    linears = []
    for e, w in enumerate(packed):
        q = QLinear(f"experts.{e}.down_proj", n, k, "nvfp4", N.NativeFp4Linear())
        q.set_weight(w)
        linears.append(q)
    m = stack_experts(packed, linears=linears)
    for e, q in enumerate(linears):
        assert q.kernel.name == "triton.nvfp4"
        assert q.prepared.qweight.data_ptr() == m.q[e * n].data_ptr()
        assert torch.equal(dequantize_prepared(q.prepared), F.dequantize(packed[e]))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or torch.cuda.get_device_capability() < (10, 0), reason="needs FP4 tensor cores (sm_100+)")
@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (16, 1000, 2048), (300, 5120, 4096)])
def test_gpu_cublas_equals_emulation(m, n, k):
    torch.manual_seed(m + n)
    w = F.quantize(torch.randn(n, k)).to("cuda")
    native = N.NativeFp4Linear()
    p = native.prepare(w)
    x = activations(m, k, k).cuda()
    y = native.apply(x, p)
    a_q, a_s, a_g = N.quantize_activations(x, p.kp, None)
    rq, rs, rg = N.quantize_activations_reference(x, p.kp, None)
    assert torch.equal(a_q, rq) and torch.equal(a_s.view(torch.uint8), rs.view(torch.uint8))
    ref = N.emulate_scaled_mm(a_q, a_s, p.ones, p.codes, p.scales, p.gscale)[:, :n].float() * a_g[:, None]
    assert torch.allclose(y.float(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max())
