"""NVFP4 through the fused tile kernel (quant_int/kernels.py, M = 5..127: batched decode, chunked
prefill below dequant.DEQUANT_MIN_M) with its block scales broadcast from the [rows, 8] decoded
scales (as committed) and gathered per column (NINFER_NV_SG=1, read at each launch), beside q4 of
the same shape.

    python3 bench/nv_tile_bench.py [--shapes 34816x5120,5120x17408] [--ms 8,16,32,64]

µs a call in one CUDA graph cycling >= 256 MB of weight copies, the weight bytes over that time as
a share of the copy bandwidth measured in the same run; the gathered form's output against the
broadcast form's, bit for bit.
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
    ap.add_argument("--shapes", default="34816x5120,5120x17408,16384x5120")
    ap.add_argument("--ms", default="8,16,32,64")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("nv_tile_bench: needs a CUDA GPU")
        return 0
    import quant_linear as QL

    from ninfer_plugins.quant_int import kernels as K

    copy_tbs, _ = QL.device_and_copy()
    for nk in args.shapes.split(","):
        n, k = (int(v) for v in nk.split("x"))
        for fmt in ("nvfp4", "q4_g64"):
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
