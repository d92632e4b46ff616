"""The q4 decode kernel of quant_int/skinny.py against dequantize-then-matmul in fp32.

CPU (CI): the PTX word decode run by test_ptx_decode's emulator over every byte value, checked
against the plain decode's positions; the permuted K order; the kernel interpreted at tiny sizes
with K and row tails, M = 1, 3, 16, 17, split-K with uneven splits.
GPU (`-m gpu`): the 27B's q4 shapes at M = 1, 4, 8, 16, the PTX decode and the plain one, split-K
bit-reproducibility.
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from test_ptx_decode import halves, run_ptx, signed_nibble  # noqa: E402  (same folder: pytest puts it on sys.path)

from ninfer_plugins.quant_int import formats as F  # noqa: E402
from ninfer_plugins.quant_int import kernels as K  # noqa: E402
from ninfer_plugins.quant_int import skinny as SK  # noqa: E402
from ninfer_plugins.quant_int.linear import prepare_int  # noqa: E402

interp = pytest.mark.skipif(not INTERPRET, reason="interpreter tests run where there is no GPU (CI), or with TRITON_INTERPRET=1")


def packed_and_ref(w: torch.Tensor):
    pk = F.quantize(w, "q4_g64")
    return prepare_int(pk), F.dequantize(pk)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))


# --- the PTX decode, emulated -------------------------------------------------------------------


def test_word_decode_every_byte():
    """$0..$3 hold (b0, b1) low nibbles, (b0, b1) high, (b2, b3) low, (b2, b3) high, as exact
    bf16 codes: every value of every byte position."""
    for v in range(256):
        bs = [v, (v * 37 + 11) & 0xFF, (v * 91 + 5) & 0xFF, (255 - v) & 0xFF]
        word = bs[0] | bs[1] << 8 | bs[2] << 16 | bs[3] << 24
        out = run_ptx(SK.ASM_Q4_WORD.value, {4: word})
        lo = [signed_nibble(b & 0xF) for b in bs]
        hi = [signed_nibble(b >> 4) for b in bs]
        assert halves(out["$0"]) == (lo[0], lo[1]), v
        assert halves(out["$1"]) == (hi[0], hi[1]), v
        assert halves(out["$2"]) == (lo[2], lo[3]), v
        assert halves(out["$3"]) == (hi[2], hi[3]), v


def test_sigma_is_a_permutation_of_consecutive_pairs():
    j = torch.arange(64)
    sig = 16 * ((j // 2) % 4) + 4 * (j // 16) + 2 * ((j // 8) % 2) + j % 2
    assert sorted(sig.tolist()) == list(range(64))
    assert bool((sig[1::2] == sig[0::2] + 1).all())  # x is read in 4-byte pairs


@triton.jit
def _order_probe(Wp, Sig, Out, R: tl.constexpr):
    """The plain decode of one K block of R rows, laid out by _mma_order, and _sigma."""
    r = tl.arange(0, R)[:, None]
    hw = tl.load(Wp + r * 32 + tl.arange(0, 32)[None, :])
    n0, n1, n2, n3 = SK._codes(hw, False)
    lo = SK._mma_order(n0, n2, R).to(tl.float32)
    hi = SK._mma_order(n1, n3, R).to(tl.float32)
    j = tl.arange(0, 64)[None, :]
    tl.store(Out + r * 128 + j, lo)
    tl.store(Out + r * 128 + 64 + j, hi)
    tl.store(Sig + tl.arange(0, 64), SK._sigma())


@interp
def test_interpreted_mma_order_matches_sigma():
    """Column j of the decoded low (high) tile is the code of k = sigma(j) (64 + sigma(j))."""
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(-8, 8, (16, 128), generator=g, dtype=torch.int16)
    blocks = (codes & 0xF).view(16, 1, 2, 64)
    packed = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).to(torch.uint8).reshape(16, 64)
    out = torch.zeros(16, 128)
    sig = torch.zeros(64, dtype=torch.int32)
    _order_probe[(1,)](packed.view(torch.int16), sig, out, R=16)
    s = sig.long()
    torch.testing.assert_close(out[:, :64], codes[:, s].float(), rtol=0, atol=0)
    torch.testing.assert_close(out[:, 64:], codes[:, 64 + s].float(), rtol=0, atol=0)


# --- the kernel, interpreted ----------------------------------------------------------------------


@interp
@pytest.mark.parametrize(
    "m,n,k,cfg",
    [
        (1, 70, 200, SK.SkinnyConfig(64, 1)),  # K tail inside a block, row tail
        (3, 64, 256, SK.SkinnyConfig(64, 2)),
        (16, 40, 640, SK.SkinnyConfig(128, 3)),  # 5 K blocks over 3 splits of 2: uneven
        (17, 33, 384, SK.SkinnyConfig(64, 2)),  # two row blocks of x
    ],
)
def test_interpreted_skinny_matches_reference(m, n, k, cfg):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    p, deq = packed_and_ref(torch.randn(n, k, generator=g))
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    y = SK.launch(x, p, cfg)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert rel_err(y, x.float() @ deq.T) < 6e-3


@interp
def test_interpreted_split_k_reproducible_and_counters_reset():
    g = torch.Generator().manual_seed(3)
    p, deq = packed_and_ref(torch.randn(48, 1024, generator=g))
    x = torch.randn(4, 1024, generator=g).to(torch.bfloat16)
    cfg = SK.SkinnyConfig(64, 8)
    a = SK.launch(x, p, cfg)
    b = SK.launch(x, p, cfg)
    assert torch.equal(a, b)
    assert int(K.Workspace.get(torch.device("cpu")).counters.abs().sum()) == 0
    assert rel_err(a, x.float() @ deq.T) < 6e-3


def test_splits_cover_k_exactly_and_defaults():
    for k in (128, 200, 640, 5120, 17408, 6144):
        n_kb = -(-k // 128)
        for want in (1, 2, 3, 8, 64):
            split, per = SK.resolve_split(SK.SkinnyConfig(128, want), k)
            assert (split - 1) * per < n_kb <= split * per
    for n, k in ((17408, 5120), (5120, 17408), (248320, 5120), (1024, 5120)):
        cfg = SK.default_config(n, k, 132)
        assert cfg.block_n % 64 == 0 and K.ROW_PAD % cfg.block_n == 0
        assert -(-k // 128) // SK.resolve_split(cfg, k)[0] >= 4


def test_other_formats_refused():
    p = prepare_int(F.quantize(torch.randn(16, 128), "q8_g32"))
    with pytest.raises(ValueError, match="q4"):
        SK.launch(torch.zeros(1, 128, dtype=torch.bfloat16), p, SK.SkinnyConfig(64, 1))


# --- GPU -------------------------------------------------------------------------------------------

SHAPES_27B = [(17408, 5120), (5120, 17408), (12288, 5120), (6144, 5120), (248320, 5120)]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")
@pytest.mark.parametrize("n,k", SHAPES_27B)
def test_gpu_skinny_27b_shapes(n, k):
    g = torch.Generator(device="cuda").manual_seed(n + k)
    p, deq = packed_and_ref(torch.randn(n, k, device="cuda", generator=g))
    cfgs = [SK.default_config(n, k, p.sm_count), SK.SkinnyConfig(64, 2, 4, 4), SK.SkinnyConfig(256, 1, 8, 3)]
    for cfg in cfgs:
        SK.reserve_workspace(p, cfg)
    for m in (1, 4, 8, 16):
        x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        ref = x.float() @ deq.T
        for cfg in cfgs:
            for fast in (True, False):
                p.fast = fast
                y = SK.launch(x, p, cfg)
                assert bool(torch.isfinite(y).all())
                assert rel_err(y, ref) < 6e-3, (n, k, m, cfg, fast, rel_err(y, ref))
        p.fast = True
    # split-K sums in a fixed order: the same bits every time
    x = torch.randn(1, k, device="cuda", generator=g, dtype=torch.bfloat16)
    cfg = SK.SkinnyConfig(128, 8)
    SK.reserve_workspace(p, cfg)
    assert torch.equal(SK.launch(x, p, cfg), SK.launch(x, p, cfg))
    del p, deq
    torch.cuda.empty_cache()
