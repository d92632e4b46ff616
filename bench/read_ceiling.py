"""How fast can a decode GEMV's weights be read at all? Read-only kernels, no decode, no math.

    python3 bench/read_ceiling.py [--out DIR] [--quick]

The tuned q4/q5 GEMVs reach 42-58% of the copy bandwidth at M = 1 (BENCHMARKS.md), while bf16
cuBLAS GEMVs on the same shapes reach 87-94%. This separates the two possible limiters: the
memory access itself (grid, tile, bytes in flight) and the work done per byte. Each kernel
reads every 32-bit word of a packed weight tensor [N, K/8 words] exactly once and folds them
with xor into one word per program (stored, so nothing is eliminated):

* `stream`: the tensor as one flat range, each program a contiguous span, VEC words a load per
  thread, UNROLL loads issued before any is used: the best the device does for these bytes;
* `tiles`: the f16x2 GEMV's walk (gemv_h2): a program owns a K slice of KBS 128-element blocks
  and a chunk of rows, and loads [BLOCK_N rows, KBS x 16 words] tiles one trip at a time, with
  PF tiles (1 or 2) loaded ahead of the one folded, grid from `kernels.row_chunks` at CTAS
  programs an SM, as the tuned configs are launched.

Timing as bench/h2_tune.py: one CUDA graph over copies totalling >= 256 MB (the L2 is 60 MB),
median of 10 replays, µs a launch; share = bytes / time / copy bandwidth measured in the same run.
Without CUDA the kernels run interpreted on a tiny tensor and check their folds (a test of the
script, not a measurement).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (name, N, K, bits a weight incl. scales) of the 27B's big decode matrices (q4/q5 g64, fp16 scales)
SHAPES = [
    ("q4 gate+up 34816x5120", 34816, 5120, 4.25),
    ("q5 down 5120x17408", 5120, 17408, 5.25),
    ("q5 qkv+z 16384x5120", 16384, 5120, 5.25),
    ("q5 o_proj 5120x6144", 5120, 6144, 5.25),
]


@triton.jit
def _stream_kernel(W, OUT, n_words, span, VEC: tl.constexpr, UNROLL: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * span
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK // VEC, VEC], tl.int32)
    offs = tl.reshape(lanes, [BLOCK // VEC, VEC])
    for i in range(0, span, BLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            o = base + i + u * BLOCK + offs
            acc ^= tl.load(W + o, mask=(o < n_words) & (o < base + span), other=0)
    tl.store(OUT + pid, tl.xor_sum(tl.xor_sum(acc, 1), 0))


@triton.jit
def _tiles_kernel(W, OUT, N, stride_n, rows_per_cta, BLOCK_N: tl.constexpr, KBS: tl.constexpr, PF: tl.constexpr):
    pid_c = tl.program_id(0)
    pid_s = tl.program_id(1)
    row_lo = pid_c * rows_per_cta
    row_hi = tl.minimum(row_lo + rows_per_cta, N)
    rr = tl.arange(0, BLOCK_N)
    ww = pid_s * (KBS * 16) + tl.arange(0, KBS * 16)
    acc = tl.zeros([BLOCK_N, KBS * 16], tl.int32)
    p0 = W + ww[None, :]
    t0 = tl.load(p0 + ((row_lo + rr) * stride_n)[:, None], mask=(row_lo + rr < row_hi)[:, None], other=0)
    if PF == 2:
        r1 = row_lo + BLOCK_N + rr
        t1 = tl.load(p0 + (r1 * stride_n)[:, None], mask=(r1 < row_hi)[:, None], other=0)
    for r0 in range(row_lo, row_hi, BLOCK_N):
        rn = r0 + PF * BLOCK_N + rr
        tn = tl.load(p0 + (rn * stride_n)[:, None], mask=(rn < row_hi)[:, None], other=0)
        acc ^= t0
        if PF == 2:
            t0 = t1
            t1 = tn
        else:
            t0 = tn
    tl.store(OUT + pid_c * tl.num_programs(1) + pid_s, tl.xor_sum(tl.xor_sum(acc, 1), 0))


def stream(w: torch.Tensor, out: torch.Tensor, programs: int, vec: int, unroll: int, warps: int) -> None:
    n = w.numel()
    block = 32 * warps * vec
    span = triton.cdiv(triton.cdiv(n, programs), block * unroll) * block * unroll
    grid = triton.cdiv(n, span)
    _stream_kernel[(grid,)](w, out, n, span, VEC=vec, UNROLL=unroll, BLOCK=block, num_warps=warps)


def tiles(w: torch.Tensor, out: torch.Tensor, block_n: int, kbs: int, pf: int, ctas: int, warps: int, sms: int) -> None:
    n, words = w.shape
    n_slices = words // (kbs * 16)
    row_blocks = triton.cdiv(n, block_n)
    want = max(1, (ctas * sms) // n_slices)
    trips = max(1, triton.cdiv(row_blocks, want))
    chunks, rows = triton.cdiv(row_blocks, trips), trips * block_n
    _tiles_kernel[(chunks, n_slices)](w, out, n, w.stride(0), rows, BLOCK_N=block_n, KBS=kbs, PF=pf, num_warps=warps)


def xor_all(w: torch.Tensor) -> int:
    v = 0
    for x in w.flatten().tolist():
        v ^= x
    return v


def check_on_cpu() -> None:
    """The folds equal the xor of every word, interpreted, over tails and several programs."""
    g = torch.Generator().manual_seed(0)
    w = torch.randint(-(2**31), 2**31 - 1, (40, 64), generator=g, dtype=torch.int32)
    want = xor_all(w)
    out = torch.zeros(64, dtype=torch.int32)
    for programs, vec, unroll in ((3, 4, 2), (1, 4, 1), (7, 1, 3)):
        out.zero_()
        stream(w, out, programs, vec, unroll, 1)
        assert xor_all(out) == want, ("stream", programs, vec, unroll)
    for block_n, kbs, pf in ((16, 2, 1), (16, 1, 2), (32, 4, 2)):
        out.zero_()
        tiles(w, out, block_n, kbs, pf, 2, 1, 4)
        assert xor_all(out) == want, ("tiles", block_n, kbs, pf)
    print("read_ceiling: interpreted folds equal the xor of every word (stream 3 ways, tiles 3 ways)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer configs")
    args = ap.parse_args()
    if not CUDA:
        check_on_cpu()
        return 0
    import quant_linear as QL

    copy_tbs, sms = QL.device_and_copy()
    rows = []
    for name, n, k, bits in SHAPES:
        nbytes = int(n * k * bits / 8)
        words = nbytes // 4 // n * n  # the packed bytes incl. scales, as rows of whole words
        copies = max(2, -(-QL.L2_DEFEAT_BYTES // nbytes))
        # the tiles kernel reads q4's 16 words a block; the rest of a row (q5's high plane and the
        # scales) is read as more blocks of the same row, as the same bytes
        wk = words // n // 16 * 16
        ws = [torch.randint(-(2**31), 2**31 - 1, (n, wk), dtype=torch.int32, device="cuda") for _ in range(copies)]
        out = torch.zeros(max(4096, 16 * sms * 8), dtype=torch.int32, device="cuda")
        real = n * wk * 4
        cands = []
        for programs in ((sms, 2 * sms, 4 * sms) if args.quick else (sms, 2 * sms, 4 * sms, 8 * sms)):
            for vec, unroll, warps in ((4, 1, 4), (4, 2, 4), (4, 4, 4), (4, 2, 8), (4, 4, 8)):
                cands.append((f"stream P{programs // sms}xSM V{vec} U{unroll} w{warps}",
                              lambda w, p=programs, v=vec, u=unroll, nw=warps: stream(w, out, p, v, u, nw), real))
        # the first four are the f16x2 GEMV's dispatched configs on these shapes (BENCHMARKS "Fourteenth
        # run", item 4), so h2_ablate's times compare with the same walk
        for block_n, kbs, pf, ctas, warps in ((16, 8, 1, 6, 4), (64, 4, 1, 4, 8), (32, 4, 1, 4, 4), (32, 8, 1, 4, 4),
                                              (16, 8, 2, 6, 4), (16, 4, 1, 8, 4), (32, 4, 2, 6, 4), (64, 8, 1, 2, 8),
                                              (16, 16, 1, 4, 4), (16, 8, 2, 8, 4)):
            # the walk takes whole K slices: each row's words cut to a multiple of the slice (a view,
            # the row stride unchanged), the bytes counted as read
            wk2 = wk // (kbs * 16) * (kbs * 16)
            if wk2 == 0:
                continue
            cands.append((f"tiles BN{block_n} KBS{kbs} PF{pf} C{ctas} w{warps}",
                          lambda w, a=(block_n, kbs, pf, ctas, warps), c=wk2: tiles(w[:, :c], out, *a[:4], a[4], sms),
                          n * wk2 * 4))
        for label, fn, real in cands:
            try:
                ms = QL.graph_ms_per_call([lambda w=w, fn=fn: fn(w) for w in ws])
            except Exception as e:  # a config the device refuses: say so, go on
                print(f"  {name}: {label}: failed ({type(e).__name__}: {e})", flush=True)
                continue
            share = real / (ms * 1e-3) / (copy_tbs * 1e12)
            rows.append(dict(shape=name, config=label, us=round(ms * 1e3, 2), mb=round(real / 1e6, 1),
                             tbs=round(real / (ms * 1e-3) / 1e12, 3), share=round(share, 3)))
            print(f"  {name} ({real / 1e6:.1f} MB): {label}: {ms * 1e3:.2f} us, {share:.1%} of copy", flush=True)
        del ws
    best = {}
    for r in rows:
        key = (r["shape"], r["config"].split()[0])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    print("\nbest per shape and kind:")
    for (shape, kind), r in sorted(best.items()):
        print(f"  {shape:28s} {kind:7s} {r['us']:8.2f} us  {r['share']:.1%}  ({r['config']})")
    QL.write_result(args.out, "read_ceiling.json", dict(copy_tbs=copy_tbs, rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
