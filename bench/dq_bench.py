"""The prefill's dequantize step alone, and dequantize + cuBLAS at M = 1024, by format (NVFP4's
three store forms were A/B'd here, BENCHMARKS.md thirty-first run; the winner is the only one kept).

    python3 bench/dq_bench.py [--shapes nvfp4:34816x5120,q4_g64:34816x5120,...]
    python3 bench/dq_bench.py --tile [--shapes nvfp4:34816x5120,...] [--ms 8,16,32,64]

Per shape: the bf16 bytes written plus the packed bytes read over the dequant's time, as a share
of the copy bandwidth measured in the same run; then the M = 1024 matmul's TFLOP/s against
cuBLAS on the bf16 weight.

--tile: the fused tile kernel (quant_int/kernels.py, M = 5..127: batched decode, chunks below
dequant.DEQUANT_MIN_M) at each M instead, NVFP4's block scales broadcast from the [rows, 8]
decoded scales (as committed) and gathered per column (NINFER_NV_SG=1, read at each launch); µs a
call in one CUDA graph cycling >= 256 MB of weight copies, the weight bytes over that time as a
share of copy.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="q4_g64:34816x5120,nvfp4:34816x5120,nvfp4:5120x17408,q5_g64:5120x17408")
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--tile", action="store_true", help="the fused tile kernel at --ms instead")
    ap.add_argument("--ms", default="8,16,32,64")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("dq_bench: needs a CUDA GPU")
        return 0
    import quant_linear as QL

    from ninfer_plugins.quant_int import dequant as D

    copy_tbs, _ = QL.device_and_copy()
    if args.tile:
        return tile(args, copy_tbs)
    for fmt, n, k in QL.parse_shapes(args.shapes):
        p = QL.make_prepared(fmt, n, k)
        D.reserve(p)
        moved = QL.prepared_bytes(p) + 2 * n * k
        x = torch.randn(args.m, k, device="cuda", dtype=torch.bfloat16)
        wb = D.dequantize(p)
        cub = QL.cuda_ms(lambda w=wb: torch.nn.functional.linear(x, w), reps=10)
        flops = 2 * args.m * n * k
        t = QL.cuda_ms(lambda q=p, o=wb: D.dequantize_into(q, o), reps=20)
        tm = QL.cuda_ms(lambda q=p: D.matmul(x, q), reps=10)
        print(f"{fmt} {n}x{k}: dequant {t * 1e3:.1f} us ({moved / (t * 1e-3) / (copy_tbs * 1e12):.0%} of copy); "
              f"M={args.m} matmul {tm * 1e3:.1f} us, {flops / tm / 1e9:.0f} TFLOP/s ({cub / tm:.0%} of cuBLAS "
              f"on the bf16 weight, {cub * 1e3:.1f} us)", flush=True)
        del p, wb
        torch.cuda.empty_cache()
    return 0


def tile(args, copy_tbs: float) -> int:
    import quant_linear as QL

    from ninfer_plugins.quant_int import kernels as K

    for fmt, n, k in QL.parse_shapes(args.shapes):
        p = QL.make_prepared(fmt, n, k)
        K.reserve_workspace(p)
        nbytes = QL.prepared_bytes(p)
        copies = [p] + [QL.clone_prepared(p) for _ in range(max(1, -(-QL.L2_DEFEAT_BYTES // nbytes) - 1))]
        for m in (int(v) for v in args.ms.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            line = f"{fmt:7s} {n}x{k} M={m:3d}:"
            first = None
            for sg in ("0", "1") if fmt == "nvfp4" else ("0",):
                os.environ["NINFER_NV_SG"] = sg
                y = K.launch(x, p)
                same = "" if first is None else f" (equal: {bool(torch.equal(y, first))})"
                first = y if first is None else first
                t = QL.graph_ms_per_call([lambda q=q: K.launch(x, q) for q in copies])
                line += f"  sg={sg} {t * 1e3:8.2f} us {nbytes / (t * 1e-3) / (copy_tbs * 1e12):5.1%}{same}"
            print(line, flush=True)
        os.environ.pop("NINFER_NV_SG", None)
        del copies, p
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
