"""NVFP4 through the f16x2 GEMV (quant_int/gemv_h2.py, format 16): E2M1 codes decoded by shifts
under an f16's exponent and mantissa (value x 2^-14), E4M3 block scales the same way (x 2^-8),
x's pairs laid out as g16-split8-f16 holds the elements.

CPU (CI): the PTX in test_ptx_decode's emulator against exact sums (every code, sign and scale
byte but NaN), the interpreted kernel against dequantize-then-matmul in fp32.
GPU (`-m gpu`): the fast path at the 27B and 35B shape classes, M = 1..4. Not dispatched by
default until that has passed (kernels.pick_gemv sends NVFP4 to the MMA kernel).
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

from ninfer_plugins.quant_int import gemv_h2 as H  # noqa: E402
from ninfer_plugins.quant_nvfp4 import formats as NF  # noqa: E402
from ninfer_plugins.quant_nvfp4.kernels import dequantize_prepared, pack_byte, prepare_nvfp4  # noqa: E402
from test_ptx_decode import f16_bits, f32_value, fp4_codes, run_ptx  # noqa: E402

interp = pytest.mark.skipif(not INTERPRET, reason="interpreter tests run where there is no GPU (CI)")
needs_cuda = pytest.mark.skipif(not CUDA or INTERPRET, reason="needs a CUDA device")

E2M1 = NF.e2m1_values().tolist()  # the format's own code table (bit 3: sign)


def e4m3(b: int) -> float:
    return float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float())


@pytest.mark.parametrize("block_m", [1, 2, 4])
def test_ptx_nvfp4_decode_and_dot_exact(block_m):
    asm, n_in = H.dot_asm(16, block_m)
    g = torch.Generator().manual_seed(block_m)
    for trial in range(40):
        words = [int(v) for v in torch.randint(0, 1 << 32, (4,), generator=g, dtype=torch.int64)]
        if trial == 0:
            # every code as A and as B, both signs of zero: byte i of word j holds A = 4j + i, B = 15 - A
            words = [sum(_byte(4 * j + i, 15 - 4 * j - i) << (8 * i) for i in range(4)) for j in range(4)]
        sc = [int(v) for v in torch.randint(0, 0x7F, (2,), generator=g)]
        sc = [b | (0x80 if trial % 3 == 1 else 0) for b in sc]  # negative scales too
        if trial == 2:
            sc = [0x01, 0x07]  # subnormal scales
        ops: dict[int, int] = {}
        for j in range(4):
            ops[4 + j] = words[j]
        for j in range(4):
            ops[8 + j] = sc[0] | sc[1] << 8 | (0xABCD << 16 if trial % 2 else 0)  # upper half ignored
        slot = 12
        # x: small integers, per word: the A elements (bytes 0..3) and the B ones
        xs = torch.randint(-3, 4, (block_m, 4, 2, 4), generator=g).tolist()
        for m in range(block_m):
            for part in "ABCD":
                for j in range(4):
                    half = 0 if part in "AC" else 1
                    i0, i1 = (0, 2) if part in "AB" else (1, 3)
                    ops[slot + j] = f16_bits(xs[m][j][half][i0]) | f16_bits(xs[m][j][half][i1]) << 16
                slot += 4
        assert slot == 4 + 4 * n_in
        regs = run_ptx(asm, ops)
        for m in range(4):
            got = f32_value(regs[f"${m}"])
            if m >= block_m:
                assert got == 0.0
                continue
            want = 0.0
            for j, w in enumerate(words):
                s = e4m3(sc[j // 2])
                for i in range(4):
                    byte = (w >> (8 * i)) & 0xFF
                    a, c = fp4_codes(byte)
                    want += (E2M1[a] * xs[m][j][0][i] + E2M1[c] * xs[m][j][1][i]) * s
            assert got == want * 2.0**-H.NVFP4_UNDO, (block_m, trial, m, got, want)


def _byte(a: int, b: int) -> int:
    return int(pack_byte(torch.tensor([a], dtype=torch.uint8), torch.tensor([b], dtype=torch.uint8)))


def test_ptx_nvfp4_word_decode_every_byte_in_every_place():
    """_word_asm_nvfp4 alone: each of the 256 bytes in each of a word's four places, the other
    three random, gives pa / pc (A of bytes 0, 2 / 1, 3) and pb / pd (their B) as f16 lanes with
    the code's sign on bit 15, its magnitude on bits 9-11 and nothing else."""
    asm = "\n".join(H._word_asm_nvfp4("$1"))
    g = torch.Generator().manual_seed(7)
    want_lane = {c: ((c & 8) << 12) | ((c & 7) << 9) for c in range(16)}
    for place in range(4):
        others = torch.randint(0, 256, (256, 4), generator=g).tolist()
        for byte in range(256):
            bs = others[byte]
            bs[place] = byte
            word = sum(b << (8 * i) for i, b in enumerate(bs))
            regs = run_ptx(asm, {1: word})
            codes = [fp4_codes(b) for b in bs]
            for reg, (i0, i1), half in (("pa", (0, 2), 0), ("pb", (0, 2), 1), ("pc", (1, 3), 0), ("pd", (1, 3), 1)):
                want = want_lane[codes[i0][half]] | want_lane[codes[i1][half]] << 16
                assert regs[reg] == want, (place, byte, reg, hex(word), hex(regs[reg]), hex(want))


def _case(n, k, m, seed, device):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) / k**0.5
    w[0, :16] *= 1e-3  # a tiny block: subnormal E4M3 scales
    p = prepare_nvfp4(NF.quantize(w.to(device)))
    x = torch.randn(m, k, generator=g).to(device)
    x[0, :7] *= 100.0  # one slice's x dominated by a few values
    ref = x.float() @ dequantize_prepared(p).T
    return p, x, ref


@interp
@pytest.mark.parametrize("m,n,k,cfg", [(1, 70, 512, H.H2Config(32, 2, 1)), (3, 48, 256, H.H2Config(32, 1, 8)),
                                       (4, 80, 512, H.H2Config(16, 2, 6, prefetch=2))])
def test_interpreted_nvfp4_matches_dequantize_then_matmul(m, n, k, cfg):
    p, x, ref = _case(n, k, m, seed=n + k + m, device="cpu")
    y = H.launch(x, p, cfg)
    err = float((y.float() - ref).norm() / ref.norm())
    assert err < 2e-3, err


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("n,k", [(5120, 6144), (34816, 5120), (8192, 2048), (2048, 4096), (12288, 2048)])
def test_gpu_nvfp4_fast_path(n, k):
    for m in (1, 2, 4):
        p, x, ref = _case(n, k, m, seed=m, device="cuda")
        cfg = H.default_config(16, n, k)
        y = H.launch(x.bfloat16(), p, cfg)
        ref = x.bfloat16().float() @ dequantize_prepared(p).T
        err = float((y.float() - ref).norm() / ref.norm())
        assert err < 4e-3, (n, k, m, err)
        assert torch.equal(y, H.launch(x.bfloat16(), p, cfg))
