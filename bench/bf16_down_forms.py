"""The 27B bf16 down projection at M = 1 (x [1, 17408] against W [5120, 17408]) in several call
forms, since cuBLAS takes split-K for F.linear here (a memset and a reduce kernel beside the GEMM:
about 0.19 ms of the bf16 step on the H200, BENCHMARKS.md thirty-fourth run: every form below
landed on the same 48.7-49.8 µs). µs a call in one CUDA graph of 20 calls (dense_gemv_bench's
timing), each form's result checked against F.linear's.

    python3 bench/bf16_down_forms.py [--n 5120 --k 17408]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dense_gemv_bench import timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5120)
    ap.add_argument("--k", type=int, default=17408)
    a = ap.parse_args()
    dev = torch.device("cuda")
    w = torch.randn(a.n, a.k, device=dev, dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, a.k, device=dev, dtype=torch.bfloat16)
    forms = {
        "F.linear(x, W)": lambda: F.linear(x, w),
        "torch.mv(W, x[0])": lambda: torch.mv(w, x[0]).unsqueeze(0),
        "(W @ x.T).T": lambda: (w @ x.t()).t(),
        "matmul(x, W.T)": lambda: torch.matmul(x, w.t()),
        "F.linear(x2 pad M=2)[:1]": lambda: F.linear(x.expand(2, -1).contiguous(), w)[:1],
    }
    ref = F.linear(x, w).float()
    mb = a.n * a.k * 2 / 1e6
    for name, fn in forms.items():
        err = (fn().float() - ref).abs().max().item()
        t = timed(fn)
        print(f"{name:28s} {t:8.2f} us  {mb / t * 1e3:6.0f} GB/s  max err {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
