"""Compile-only probe (Triton 3.6 Gluon, sm_90, on the CPU): packed words loaded in a chosen
register layout, expanded in registers to eight values a word by inline asm, permuted and reshaped,
reach the `mma_v2` A-operand layout with no shared memory (the design of the next decode kernel,
BENCHMARKS.md "f16x2 GEMV"). The asm here only copies (a placeholder for gemv_h2's decode); what is
checked is the layout path.

    /tmp/t36/bin/python bench/gluon_mma_probe.py

Prints the decoded tile's linear layout and the count of layout conversions, shared-memory
allocations and STS/LDS/HMMA instructions (2026-12-03: 1 conversion, a register permutation only;
0 allocations; 0 STS, 0 LDS, 2 HMMA).
"""

import os
import re
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import skinny_sass as S  # noqa: E402

S.install()

import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

@gluon.jit
def probe(W, X, Y, stride_w):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    l3: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [8, 0, 0]], lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]], block_bases=[], shape=[64, 4, 8])
    wl: gl.constexpr = gl.SliceLayout(2, l3)
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, wl))
    cols = gl.arange(0, 4, layout=gl.SliceLayout(0, wl))
    w = gl.load(W + rows[:, None] * stride_w + cols[None, :])
    wb = gl.expand_dims(w, 2)
    wb = gl.broadcast(wb, gl.full([64, 4, 8], 0, gl.int32, layout=l3))[0]
    d = gl.inline_asm_elementwise(
        "mov.b32 $0, $4; mov.b32 $1, $5; mov.b32 $2, $6; mov.b32 $3, $7;", "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [wb],
        dtype=gl.float16, is_pure=True, pack=8)
    # k = j_hi * 8 + word * 2 + j_lo
    d = gl.reshape(d, [64, 4, 4, 2])          # row, word, j_hi, j_lo
    d = gl.permute(d, [0, 2, 1, 3])           # row, j_hi, word, j_lo
    a = gl.reshape(d, [64, 32])
    gl.static_print(a.type)
    a = gl.convert_layout(a, a_l)
    kk = gl.arange(0, 32, layout=gl.SliceLayout(1, b_l))
    nn = gl.arange(0, 8, layout=gl.SliceLayout(0, b_l))
    b = gl.load(X + kk[:, None] * 8 + nn[None, :])
    acc = gl.zeros([64, 8], gl.float32, layout=mma)
    acc = mma_v2(a, b, acc)
    ym = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    yn = gl.arange(0, 8, layout=gl.SliceLayout(0, mma))
    gl.store(Y + ym[:, None] * 8 + yn[None, :], acc)

probe[(1,)](torch.empty(64, 4, dtype=torch.int32), torch.empty(32, 8, dtype=torch.float16), torch.empty(64, 8), 4, num_warps=4)
k = S._compiled[-1]
ttgir = k.asm["ttgir"]
print("convert_layout:", ttgir.count("convert_layout"), "local_alloc:", ttgir.count("local_alloc"))
p = Path(tempfile.mkdtemp()) / "k.cubin"
p.write_bytes(k.asm["cubin"])
txt = S._run("nvdisasm", "-c", str(p))
print("STS", len(re.findall(r"\bSTS", txt)), "LDS", len(re.findall(r"\bLDS", txt)), "HMMA", len(re.findall(r"HMMA", txt)))
