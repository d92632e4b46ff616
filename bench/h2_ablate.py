"""Where the f16x2 GEMV's time goes: the same kernel, config and walk with and without its
decode and multiply-adds (`gemv_h2.launch(..., ablate=1)`: one xor a word instead; the loads, x's
preparation, the per-trip reduction, the partial stores and the last CTA's sum stay).

    python3 bench/h2_ablate.py [--out DIR]

bench/read_ceiling.py showed (H200, 2026-12-05) that reading the 27B's big q4/q5 matrices
reaches 82-90% of the copy rate as a flat stream, and 84% along the GEMV's own tile walk (qkv+z),
while the GEMV moves them at 42-57%. If the ablated kernel runs near the ceiling, the decode and
FMAs (instructions, registers) are what cost; if it stays near the full kernel, the structure
around them (x preparation, reductions, split-K partials, occupancy) does. Per shape at M = 1,
with the config the engine dispatches: µs per launch in one CUDA graph cycling >= 256 MB of
weight copies, and the share of the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (format, N, K): the 27B's big decode matrices and the 35B's q8 attention/GDN projections
SHAPES = [
    ("q4_g64", 34816, 5120), ("q5_g64", 5120, 17408), ("q5_g64", 16384, 5120), ("q5_g64", 13312, 5120),
    ("q5_g64", 5120, 6144), ("q6_g64", 248320, 5120), ("q8_g32", 12288, 2048), ("q8_g32", 2048, 4096),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--first", type=int, default=len(SHAPES), help="only the first N shapes")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("h2_ablate: needs a CUDA GPU (the ablation runs only on the compiled fast path)")
        return 0
    import quant_linear as QL

    from ninfer_plugins.quant_int import formats as IF
    from ninfer_plugins.quant_int import gemv_h2 as H2
    from ninfer_plugins.quant_int import kernels as K

    copy_tbs, sms = QL.device_and_copy()
    rows = []
    for fmt_name, n, k in SHAPES[: args.first]:
        fmt = IF.FORMATS[fmt_name].bits
        p = QL.make_prepared(fmt_name, n, k)
        cfg = K.pick_gemv(fmt, 1, n, k, sms)
        if not isinstance(cfg, H2.H2Config):
            print(f"  {fmt_name} {n}x{k}: dispatch is not the f16x2 GEMV ({cfg}); skipped", flush=True)
            continue
        nbytes = QL.prepared_bytes(p)
        copies = [p] + [QL.clone_prepared(p) for _ in range(max(1, -(-QL.L2_DEFEAT_BYTES // nbytes) - 1))]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        row = dict(fmt=fmt_name, n=n, k=k, mb=round(nbytes / 1e6, 1), config=cfg.describe())
        for ablate in (0, 1):
            ms = QL.graph_ms_per_call([lambda q=q, a=ablate: H2.launch(x, q, cfg, ablate=a) for q in copies])
            share = nbytes / (ms * 1e-3) / (copy_tbs * 1e12)
            row[f"us{ablate}"], row[f"share{ablate}"] = round(ms * 1e3, 2), round(share, 3)
        rows.append(row)
        print(f"  {fmt_name} {n}x{k} ({row['mb']} MB, {row['config']}): full {row['us0']:.2f} us {row['share0']:.1%}, "
              f"no decode/FMA {row['us1']:.2f} us {row['share1']:.1%}", flush=True)
        del copies, p
        torch.cuda.empty_cache()
    QL.write_result(args.out, "h2_ablate.json", dict(copy_tbs=copy_tbs, rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
