"""The split-K decode attention (ninfer.kernels.triton.decode_attention) over the 27B's full-attention
shape (24 q heads, 4 KV heads, head dim 256, bf16 cache), one sequence, at T = 1 (a plain step)
and T = 4 (the MTP verify of 3 drafts), across splits, block_n, warps and stages.

    python3 bench/attn_sweep.py [--ctx 8192] [--ts 1,4] [--out DIR]

µs a call (decode + merge launches) in one CUDA graph cycling 8 caches (8 x 33.6 MB at 8K, past
the L2), the KV bytes' share of the copy bandwidth measured in the same run, each config's max
error against the default's output. The graph profile of the round (bench/graph_kernels.py,
H100, 2026-12-05) had the verify's decode kernel at 32.2 µs a layer against the plain step's 16.7.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--ts", default="1,4")
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("attn_sweep: needs a CUDA GPU")
        return 0
    import quant_linear as QL

    from ninfer.kernels.triton import attention as AT

    dev = torch.device("cuda", 0)
    hq, hkv, d, cap = 24, 4, 256, args.ctx + 64
    caches = [(torch.randn(1, cap, hkv, d, device=dev, dtype=torch.bfloat16),
               torch.randn(1, cap, hkv, d, device=dev, dtype=torch.bfloat16)) for _ in range(args.copies)]
    table = torch.zeros(1, 1, dtype=torch.int32, device=dev)
    lens = torch.full((1,), args.ctx, dtype=torch.int32, device=dev)
    kv_bytes = 2 * args.ctx * hkv * d * 2
    copy_tbs = QL.copy_bandwidth()
    default_splits = AT.default_num_splits(1, hkv, cap, dev)
    print(f"copy {copy_tbs:.3f} TB/s, {torch.cuda.get_device_name(0)}; KV {kv_bytes / 1e6:.1f} MB a call; "
          f"default splits {default_splits}", flush=True)
    rows = []
    for t in [int(v) for v in args.ts.split(",")]:
        q = torch.randn(1, t, hq, d, device=dev, dtype=torch.bfloat16)
        gate = torch.randn(1, t, hq, d, device=dev, dtype=torch.bfloat16)
        ref = AT.decode_attention(q, *caches[0], table, lens, gate=gate).float()
        results = []
        for splits, bn, warps, stages in itertools.product((8, 16, 33, 66, 132), (32, 64, 128), (4, 8), (2, 3)):
            kw = dict(gate=gate, num_splits=splits, block_n=bn, num_warps=warps, num_stages=stages)
            try:
                out = AT.decode_attention(q, *caches[0], table, lens, **kw).float()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a config that does not compile is reported
                print(f"  T={t} S{splits} BN{bn} w{warps} s{stages}: {type(e).__name__} {str(e)[:120]}", flush=True)
                continue
            err = (out - ref).abs().max().item()
            fns = [lambda c=c: AT.decode_attention(q, *c, table, lens, **kw) for c in caches]
            ms = QL.graph_ms_per_call(fns * 2)
            results.append(dict(t=t, splits=splits, block_n=bn, warps=warps, stages=stages, us=round(ms * 1e3, 2),
                                share=round(kv_bytes / (ms * 1e-3) / (copy_tbs * 1e12), 3), err=err))
        # the default grid (splits from the compiled kernel's occupancy, attention.resident_ctas)
        fns = [lambda c=c: AT.decode_attention(q, *c, table, lens, gate=gate) for c in caches]
        ms = QL.graph_ms_per_call(fns * 2)
        fitted = [v for key, v in AT._RESIDENT.items() if dict(key[-1])["T"] == t]  # key: (..., meta-parameters)
        print(f"T={t} default (occupancy: {fitted[-1] if fitted else '?'} an SM): {ms * 1e3:.2f} us, "
              f"{100 * kv_bytes / (ms * 1e-3) / (copy_tbs * 1e12):.1f}% of copy", flush=True)
        results.sort(key=lambda r: r["us"])
        dflt = [r for r in results if (r["splits"], r["block_n"], r["warps"], r["stages"]) == (default_splits, 64, 8, 2)]
        if dflt:
            r = dflt[0]
            print(f"T={t} two-an-SM rule S{r['splits']} BN64 w8 s2: {r['us']} us, {100 * r['share']:.1f}% of copy", flush=True)
        for r in results[:12]:
            print(f"  T={t} S{r['splits']:3d} BN{r['block_n']:3d} w{r['warps']} s{r['stages']}: {r['us']:7.2f} us "
                  f"{100 * r['share']:5.1f}%  err {r['err']:.1e}", flush=True)
        rows += results
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "attn_sweep.json").write_text(json.dumps(dict(copy_tbs=copy_tbs, rows=rows,
                                                                     device=torch.cuda.get_device_name(0))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
