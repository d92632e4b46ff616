"""The PTX decode strings of the fused kernel, executed by a small emulator of the instructions they
use, against the formats' own decoders: the bit tricks are checked on CPU, for every byte value."""

from __future__ import annotations

import re

import torch

from ninfer_plugins.quant_int import kernels as K
from ninfer_plugins.quant_nvfp4 import formats as NF
from ninfer_plugins.quant_nvfp4 import kernels as NK


def bf16_value(bits: int) -> float:
    return float(torch.tensor([bits & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float())


def bf16_bits(v: float) -> int:
    return int(torch.tensor([v], dtype=torch.float32).to(torch.bfloat16).view(torch.int16).to(torch.int32)) & 0xFFFF


def f16_value(bits: int) -> float:
    return float(torch.tensor([bits & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.float16).double())


def f16_bits(v: float) -> int:
    return int(torch.tensor([v], dtype=torch.float64).to(torch.float16).view(torch.int16).to(torch.int32)) & 0xFFFF


def f32_value(bits: int) -> float:
    return float(torch.tensor([bits & 0xFFFFFFFF], dtype=torch.int64).to(torch.int32).view(torch.float32).double())


def f32_bits(v: float) -> int:
    return int(torch.tensor([v], dtype=torch.float64).to(torch.float32).view(torch.int32).to(torch.int64)) & 0xFFFFFFFF


def _f16x2(fn, *src: int) -> int:
    """An f16x2 instruction: fn over each 16-bit lane, computed exactly, rounded once to fp16."""
    out = 0
    for h in range(2):
        out |= f16_bits(fn(*(f16_value(v >> (16 * h)) for v in src))) << (16 * h)
    return out


def run_ptx(asm: str, inputs: dict[int, int]) -> dict[int, int]:
    """Run straight-line PTX over 32-bit registers; $N operands come from `inputs` (the
    instructions of every decode string in quant_int and quant_nvfp4)."""
    regs: dict[str, int] = {f"${i}": v & 0xFFFFFFFF for i, v in inputs.items()}

    def val(tok: str) -> int:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        if tok.startswith("0f"):  # PTX's hex spelling of an fp32 constant
            return int(tok[2:], 16)
        return int(tok, 0) & 0xFFFFFFFF

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        split = re.fullmatch(r"mov\.b32 \{(\w+), (\w+)\}, (\S+)", line)
        if split:  # a 32-bit register into its two 16-bit halves
            v = val(split.group(3))
            regs[split.group(1)], regs[split.group(2)] = v & 0xFFFF, v >> 16
            continue
        op, rest = line.split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        d, src = args[0], [val(a) for a in args[1:]]
        if op == "mov.b32":
            r = src[0]
        elif op in ("shr.u32", "shr.b32"):
            r = src[0] >> src[1]
        elif op == "shl.b32":
            r = (src[0] << src[1]) & 0xFFFFFFFF
        elif op == "and.b32":
            r = src[0] & src[1]
        elif op == "or.b32":
            r = src[0] | src[1]
        elif op == "xor.b32":
            r = src[0] ^ src[1]
        elif op == "mul.lo.u32":
            r = (src[0] * src[1]) & 0xFFFFFFFF
        elif op == "lop3.b32":
            a, b, c, lut = src
            r = 0
            for bit in range(32):
                idx = ((a >> bit) & 1) << 2 | ((b >> bit) & 1) << 1 | ((c >> bit) & 1)
                r |= ((lut >> idx) & 1) << bit
        elif op == "prmt.b32":
            a, b, c = src
            pool = a | (b << 32)
            r = 0
            for i in range(4):
                sel = (c >> (4 * i)) & 0xF
                byte = (pool >> (8 * (sel & 7))) & 0xFF
                if sel & 8:
                    byte = 0xFF if byte & 0x80 else 0
                r |= byte << (8 * i)
        elif op == "fma.rn.bf16x2":
            a, b, c = src
            r = 0
            for h in range(2):
                x, y, z = (bf16_value(v >> (16 * h)) for v in (a, b, c))
                r |= bf16_bits(x * y + z) << (16 * h)
        elif op == "sub.f16x2":
            r = _f16x2(lambda x, y: x - y, *src)
        elif op == "fma.rn.f16x2":
            r = _f16x2(lambda x, y, z: x * y + z, *src)
        elif op == "cvt.f32.f16":
            r = f32_bits(f16_value(src[0]))
        elif op == "add.f32":
            r = f32_bits(f32_value(src[0]) + f32_value(src[1]))
        elif op == "mul.f32":
            r = f32_bits(f32_value(src[0]) * f32_value(src[1]))
        elif op == "fma.rn.f32":
            r = f32_bits(f32_value(src[0]) * f32_value(src[1]) + f32_value(src[2]))
        elif op == "sub.f32":
            a, b = (float(torch.tensor([v], dtype=torch.int64).to(torch.int32).view(torch.float32)) for v in src)
            r = int(torch.tensor([a - b], dtype=torch.float32).view(torch.int32)) & 0xFFFFFFFF
        else:
            raise AssertionError(f"the emulator lacks {op}")
        assert re.fullmatch(r"\$\d+|\w+", d), d
        regs[d] = r
    return regs


def fp4_codes(byte: int) -> tuple[int, int]:
    """A g16-split8-f16 byte -> the codes of its elements j and 8 + j, by quant_nvfp4's own
    unpack_byte (its bits pinned by test_nvfp4_kernels.test_prepared_byte_bits_are_pinned)."""
    a, c = NK.unpack_byte(torch.tensor([byte], dtype=torch.uint8))
    return int(a), int(c)


def halves(word: int) -> tuple[float, float]:
    return bf16_value(word), bf16_value(word >> 16)


def signed_nibble(v: int) -> int:
    return (v ^ 8) - 8


def test_q4_decode_every_byte_pair():
    for b0 in range(256):
        b1 = (b0 * 37 + 11) & 0xFF
        out = run_ptx(K.ASM_Q4.value, {2: b0 | (b1 << 8)})
        assert halves(out["$0"]) == (signed_nibble(b0 & 0xF), signed_nibble(b1 & 0xF))
        assert halves(out["$1"]) == (signed_nibble(b0 >> 4), signed_nibble(b1 >> 4))


def test_q4_scaled_decode():
    s_lo, s_hi = bf16_bits(0.375), bf16_bits(-3.0)
    for b0 in range(0, 256, 7):
        b1 = 255 - b0
        out = run_ptx(K.ASM_Q4S.value, {2: b0 | (b1 << 8), 3: s_lo | (s_lo << 16), 4: s_hi | (s_hi << 16)})
        assert halves(out["$0"]) == (signed_nibble(b0 & 0xF) * 0.375, signed_nibble(b1 & 0xF) * 0.375)
        assert halves(out["$1"]) == (signed_nibble(b0 >> 4) * -3.0, signed_nibble(b1 >> 4) * -3.0)


def test_e4m3_scale_decode_every_byte():
    for s in range(0, 0x7F):  # 0x7F is NaN
        want = float(torch.tensor([s], dtype=torch.uint8).view(torch.float8_e4m3fn).float()) * 2.0**119
        out = run_ptx(K.ASM_E4M3.value, {1: s | (((s + 1) % 0x7F) << 8)})
        got = halves(out["$0"])
        want2 = float(torch.tensor([(s + 1) % 0x7F], dtype=torch.uint8).view(torch.float8_e4m3fn).float()) * 2.0**119
        assert got == (want, want2), (s, got, want)


def test_fp4_decode_every_byte_with_scales():
    vals = NF.e2m1_values()
    for s in (0x01, 0x08, 0x38, 0x7E, 0x00):  # subnormal 2^-9, 2^-6, 1.0, 448, 0
        scale = float(torch.tensor([s], dtype=torch.uint8).view(torch.float8_e4m3fn).float())
        sb = run_ptx(K.ASM_E4M3.value, {1: s | (s << 8)})["$0"]
        for b0 in range(256):
            b1 = (b0 * 91 + 5) & 0xFF
            out = run_ptx(K.ASM_FP4.value, {2: b0 | (b1 << 8), 3: sb})
            # the kernel folds 2^7 into the global scale
            lo = tuple(v * 128.0 for v in halves(out["$0"]))
            hi = tuple(v * 128.0 for v in halves(out["$1"]))
            (a0, c0), (a1, c1) = (fp4_codes(b) for b in (b0, b1))
            assert lo == (float(vals[a0]) * scale, float(vals[a1]) * scale), (s, b0)
            assert hi == (float(vals[c0]) * scale, float(vals[c1]) * scale), (s, b0)


def test_q8_decode_every_byte_pair():
    for b0 in range(256):
        b1 = (b0 * 53 + 29) & 0xFF
        out = run_ptx(K.ASM_Q8.value, {1: b0 | (b1 << 8)})
        s0, s1 = (b0 ^ 0x80) - 0x80, (b1 ^ 0x80) - 0x80
        assert halves(out["$0"]) == (s0, s1), (b0, b1)


def test_q4_f32_decode_every_byte():
    """The GEMV's q4 decode: four bytes -> four low codes and four 16 x high codes, as fp32."""
    from ninfer_plugins.quant_int import gemv

    for v in range(256):
        word = v | (((v + 37) % 256) << 8) | (((v * 7) % 256) << 16) | (((255 - v) % 256) << 24)
        out = run_ptx(gemv.ASM_Q4_F32.value, {8: word})
        for i in range(4):
            b = (word >> (8 * i)) & 0xFF
            assert f32_value(out[f"${i}"]) == signed_nibble(b & 0xF), (v, i)
            assert f32_value(out[f"${4 + i}"]) == 16 * signed_nibble(b >> 4), (v, i)
