"""The 27B bf16 down projection at M = 1 (x [1, 17408] against W [5120, 17408]) in several call
forms, since cuBLAS takes split-K for F.linear here (a memset and a reduce kernel beside the GEMM:
about 0.19 ms of the bf16 step on the H200, BENCHMARKS.md thirty-fourth run). µs a call in one
CUDA graph of 20 calls, each form's result checked against F.linear's.

    python3 bench/bf16_down_forms.py [--n 5120 --k 17408]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


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
        "F.linear(x2 pad M=2)[:1]": lambda: F.linear(x.expand(2, -1).contiguous(), w)[
            :1
        ],
    }
    ref = F.linear(x, w).float()
    gbps = a.n * a.k * 2 / 1e3
    for name, fn in forms.items():
        out = fn()
        err = (out.float() - ref).abs().max().item()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(20):
                fn()
        g.replay()
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            e0, e1 = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            e0.record()
            g.replay()
            e1.record()
            torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3 / 20)
        t = sorted(ts)[len(ts) // 2]
        print(
            f"{name:28s} {t:8.2f} us  {gbps / t:6.0f} GB/s  max err {err:.2e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
