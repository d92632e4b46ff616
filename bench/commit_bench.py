"""The speculative round's GDN commit at the 27B's shapes: the torch form (gather the kept columns
into a temporary, then index_copy_ into the cache) against `commit_columns` (one launch a tensor,
each kept column read once), in CUDA graphs.

    python3 bench/commit_bench.py [--slots 1] [--m 4] [--reps 50]

Floor: the kept columns read once and the slots' state written once (48 layers x 48 x 128 x 128
fp32 = 151 MB each way, plus the bf16 conv state) at the copy rate.
"""

from __future__ import annotations

import argparse

import torch

from ninfer.kernels.triton import commit_columns


def graph_us(fn, reps: int) -> float:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=1)
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    L, S, M, dev = 48, args.slots, args.m, "cuda"
    rec = torch.zeros(L, S, 48, 128, 128, device=dev)
    conv = torch.zeros(L, S, 10240, 3, device=dev, dtype=torch.bfloat16)
    col_rec = torch.randn(L, S, M, 48, 128, 128, device=dev)
    col_conv = torch.randn(L, S, M, 10240, 3, device=dev).bfloat16()
    slots = torch.arange(S, device=dev)
    column = torch.full((S,), M - 1, dtype=torch.long, device=dev)

    def torch_form():
        conv.index_copy_(1, slots, col_conv[:, slots, column])
        rec.index_copy_(1, slots, col_rec[:, slots, column])

    def kernel():
        commit_columns(conv, col_conv, slots, column)
        commit_columns(rec, col_rec, slots, column)

    kernel()
    assert torch.equal(rec, col_rec[:, :, M - 1]) and torch.equal(conv, col_conv[:, :, M - 1])
    nbytes = 2 * (rec.numel() * 4 + conv.numel() * 2)
    for name, fn in (("torch gather + index_copy_", torch_form), ("commit_columns", kernel)):
        us = graph_us(fn, args.reps)
        print(f"{name:28s} {us:8.1f} us  ({nbytes / us / 1e6:.2f} TB/s of the floor's {nbytes / 1e6:.0f} MB)", flush=True)


if __name__ == "__main__":
    main()
