"""The one-token bf16 GEMV (cuda_fast/dense_gemv.py) against cuBLAS at the 27B's bf16 shapes.

    python3 bench/dense_gemv_bench.py [--budget-s S]

Per shape: F.linear (for the gated down projection: the SwiGLU launch, then F.linear, as the model
runs them) and every config of CFGS; µs a call in one CUDA graph of 20 calls over one weight (each
weight is past the L2), the share of the copy bandwidth measured in the same run, and each result's
largest difference from F.linear's (quant_linear's graph timing and copy rate). Prints the best config of each shape and a line to paste as
NINFER_DENSE_GEMV_CFG (the best for the gated down projection, where the step gains most).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_linear as QL

# (n, k, gated): down (gated), o_proj / out_proj, GDN in_proj merged, attention q+k+v merged, gate+up
SHAPES = [(5120, 17408, True), (5120, 6144, False), (16480, 5120, False), (14336, 5120, False), (34816, 5120, False)]
CFGS = [(8, 512, 4), (4, 512, 2), (4, 1024, 4), (8, 256, 4), (8, 1024, 4), (8, 1024, 8), (16, 256, 4), (16, 512, 8),
        (2, 1024, 2), (4, 256, 1), (8, 512, 8), (16, 128, 4)]


def timed(fn, reps: int = 20) -> float:
    """µs a call, `reps` calls back to back in one CUDA graph (quant_linear's timing)."""
    return QL.graph_ms_per_call([fn] * reps) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=120)
    ap.add_argument("--shapes", default="", help="NxK,... (a trailing g: the gated down projection); default: the "
                    "27B's five one-token projections")
    args = ap.parse_args()
    shapes = SHAPES
    if args.shapes:
        shapes = []
        for item in args.shapes.split(","):
            n, k = item.rstrip("g").split("x")
            shapes.append((int(n), int(k), item.endswith("g")))
    t0 = time.time()
    from ninfer_plugins.cuda_fast import dense_gemv as D
    from ninfer_plugins.cuda_fast.ops import silu_mul

    bw, _ = QL.device_and_copy()  # TB/s
    best_down = None
    for n, k, gated in shapes:
        if time.time() - t0 > args.budget_s:
            print(f"budget spent: skipped {n}x{k}")
            continue
        g = torch.Generator(device="cuda").manual_seed(n + k)
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        x = torch.randn(1, 2 * k if gated else k, device="cuda", generator=g).to(torch.bfloat16)
        mb = n * k * 2 / 1e6
        if gated:
            def base(x=x, w=w, k=k):
                return F.linear(silu_mul(x[:, :k], x[:, k:]), w)
        else:
            def base(x=x, w=w):
                return F.linear(x, w)
        ref = base().float()
        t = timed(base)
        print(f"{n}x{k}{' gated' if gated else ''} ({mb:.1f} MB): cuBLAS{' + SwiGLU' if gated else ''} {t:7.2f} us "
              f"{mb / t / bw * 100:5.1f}%", flush=True)
        results = []
        for cfg in CFGS:
            try:
                y = D.gemv(x, w, gated=gated, cfg=cfg)
                err = (y.float() - ref).abs().max().item()
                tc = timed(lambda cfg=cfg, x=x, w=w, gated=gated: D.gemv(x, w, gated=gated, cfg=cfg))
            except Exception as e:  # noqa: BLE001 (a config that does not compile or fit: named, not fatal)
                print(f"    BN{cfg[0]} BK{cfg[1]} w{cfg[2]}: {type(e).__name__}: {str(e)[:80]}")
                continue
            results.append((tc, cfg))
            print(f"    BN{cfg[0]} BK{cfg[1]} w{cfg[2]}: {tc:7.2f} us {mb / tc / bw * 100:5.1f}%  max diff {err:.1e}",
                  flush=True)
        if results:
            tb, cb = min(results)
            print(f"  best BN{cb[0]} BK{cb[1]} w{cb[2]} {tb:.2f} us against {t:.2f} ({t - tb:+.2f})", flush=True)
            if gated:
                best_down = cb
    if best_down:
        print(f"NINFER_DENSE_GEMV_CFG={best_down[0]}:{best_down[1]}:{best_down[2]}")


if __name__ == "__main__":
    main()
