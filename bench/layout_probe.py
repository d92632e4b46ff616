"""Does the packed weights' memory layout cap the M = 1 kernels? One GPU call answers it.

    python3 bench/layout_probe.py [--out DIR]

Every M = 1 quantized kernel so far stalls at 30-40% of the copy bandwidth whatever its
instruction count (BENCHMARKS.md, "Decode GEMV"), and the share follows the length of the
contiguous run one CTA reads from a row per trip (q8, 512-byte runs: 55%; q4, 128: 36%;
q5/q6/NVFP4, 64 plus a side plane: 28-30%). Two measurements:

1. a load-only kernel (int32 loads summed, nothing decoded) over 512 MB laid out as rows of 2,560
   or 8,704 bytes (a q4 row of K = 5120 or 17408): each CTA reads a [BN rows, R bytes] tile a trip,
   either from the row-major matrix (BN runs of R bytes, row stride apart) or from a tile-major
   copy (one contiguous BN * R run); bandwidth against the copy bandwidth of the same run;
2. the q4 GEMV (gemv.py) on the 27B's big q4 shapes, row-major with its tuned config against the
   tile-major layout (gemv.tile_layout) over a small grid of configs, M = 1 and 4, each timed
   inside one CUDA graph cycling >= 256 MB of copies (bench/quant_linear.py's method), the winner
   checked against the fp32 reference.

Writes OUT/layout_probe.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
T0 = time.time()


def log(*a):
    print(*a, flush=True)


@triton.jit
def _load_probe(W, OUT, row_words, trips, BN: tl.constexpr, RW: tl.constexpr, TILED: tl.constexpr):
    """Sum of int32 words over this CTA's trips of [BN, RW] words (RW words = 4 RW bytes)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n_k = tl.num_programs(1)
    r = tl.arange(0, BN)
    c = tl.arange(0, RW)
    acc = tl.zeros((BN, RW), dtype=tl.int32)
    for t in range(trips):
        if TILED:
            tile = (pid_n.to(tl.int64) * n_k + pid_k) * trips + t
            ptr = W + tile * (BN * RW) + r[:, None] * RW + c[None, :]
        else:
            ptr = W + (pid_n.to(tl.int64) * BN + r[:, None]) * row_words + (pid_k * trips + t) * RW + c[None, :]
        acc += tl.load(ptr)
    tl.store(OUT + pid_n * n_k + pid_k, tl.sum(tl.sum(acc, axis=1), axis=0))


def probe_loads(bw: float) -> list[dict]:
    total = 512 << 20
    buf = torch.randint(-1000, 1000, (total // 4,), dtype=torch.int32, device="cuda")
    rows_out = []
    for row_bytes in (2560, 8704):
        row_words = row_bytes // 4
        n_rows = total // row_bytes // 64 * 64
        for bn in (16, 32, 64):
            for run in (64, 128, 256, 512):
                rw = run // 4
                if row_words % rw:
                    continue
                per_row_trips = row_words // rw
                # split each row range so every SM holds several CTAs, >= 2 trips a CTA
                for trips in sorted({t for t in (4, per_row_trips) if per_row_trips % t == 0}):
                    splits = per_row_trips // trips
                    grid = (n_rows // bn, splits)
                    out = torch.empty(grid[0] * grid[1], dtype=torch.int32, device="cuda")
                    res = {"row_bytes": row_bytes, "bn": bn, "run": run, "trips": trips, "splits": splits}
                    for tiled in (False, True):
                        fn = lambda: _load_probe[grid](buf, out, row_words, trips, BN=bn, RW=rw, TILED=tiled, num_warps=4)  # noqa: E731
                        fn()
                        ms = triton.testing.do_bench(fn, warmup=5, rep=40)
                        res["tiled" if tiled else "rows"] = n_rows * row_bytes / (ms * 1e-3) / (bw * 1e12)
                    rows_out.append(res)
                    log(f"loads row {row_bytes:5d} B  BN {bn:2d} run {run:4d} B trips {trips:3d}: row-major {100 * res['rows']:5.1f}%  "
                        f"tile-major {100 * res['tiled']:5.1f}% of copy")
    del buf
    torch.cuda.empty_cache()
    return rows_out


def probe_gemv(bw: float, budget_s: float) -> list[dict]:
    import quant_linear as QL

    from ninfer_plugins.quant_int import formats as F
    from ninfer_plugins.quant_int import gemv as G
    from ninfer_plugins.quant_int import kernels as K
    from ninfer_plugins.quant_int.linear import prepare_int

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = {"gate/up 17408x5120": (17408, 5120), "down 5120x17408": (5120, 17408), "q_proj 12288x5120": (12288, 5120),
              "in_proj_z 6144x5120": (6144, 5120)}
    out = []
    for name, (n, k) in shapes.items():
        if time.time() - T0 > budget_s:
            log(f"budget: skipped {name}")
            continue
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        pk = F.quantize(w, "q4_g64")
        base = prepare_int(pk)
        deq = F.dequantize(pk)
        one = base.qweight[:n].numel() + base.scales[:n].numel() * 2
        copies = max(2, min(64, math.ceil(QL.L2_DEFEAT_BYTES / one)))
        ps = [base] + [K.Prepared(fmt=base.fmt, n=n, k=k, qweight=base.qweight.clone(), scales=base.scales.clone(),
                                  fast=base.fast, sm_count=base.sm_count) for _ in range(copies - 1)]
        row = {"shape": name, "n": n, "k": k, "bytes": one}

        def timed(m, cfg, tiled, weights):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            if cfg is None:
                for p in weights:
                    K.reserve_workspace(p)
                calls = [lambda p=p: K.launch(x, p) for p in weights]
            else:
                K.Workspace.get(x.device).reserve(*G.workspace_need(cfg, n, k))
                calls = [lambda p=p: G.launch(x, p, cfg, tiled=tiled) for p in weights]
            return 1e3 * QL.graph_ms_per_call(calls)

        row["current_m1"] = timed(1, None, False, ps)
        row["current_m4"] = timed(4, None, False, ps)
        best = (math.inf, None)
        n_kb = k // 128
        for bn in (16, 32, 64):
            for kb in (1, 2, 4, 8):
                if n_kb % kb:
                    continue
                for per_sm in (2, 4, 8):
                    s = max(1, 2 ** round(math.log2(max(1.0, per_sm * sms / (n // bn)))))
                    while s > 1 and (n_kb // kb) % s:
                        s //= 2
                    cfg = G.GemvConfig(bn, kb, s, 4)
                    key = f"tiled {cfg.describe()}"
                    if key in row:
                        continue
                    try:
                        tps = [G.tile_layout(p, bn, kb) for p in ps]
                        us = timed(1, cfg, True, tps)
                        row[key] = us
                        row[f"rows {cfg.describe()}"] = timed(1, cfg, False, ps)
                    except Exception as exc:  # noqa: BLE001 - a config that cannot run is reported, not fatal
                        log(f"  {name} {key}: {type(exc).__name__}: {str(exc)[:150]}")
                        continue
                    finally:
                        tps = None
                    if us < best[0]:
                        best = (us, cfg)
        us, cfg = best
        if cfg is not None:
            t0 = G.tile_layout(base, cfg.block_n, cfg.kb)
            for m in (1, 4):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                ref = x.float() @ deq.T
                row[f"err_m{m}"] = float((G.launch(x, t0, cfg, tiled=True).float() - ref).norm() / ref.norm())
            tps = [G.tile_layout(p, cfg.block_n, cfg.kb) for p in ps]
            row["best_tiled"] = cfg.describe()
            row["best_tiled_m1"] = us
            row["best_tiled_m4"] = timed(4, cfg, True, tps)
            del tps
        share = lambda t: one / (t * 1e-6) / (bw * 1e12)  # noqa: E731
        log(f"q4 {name:22s} {one / 1e6:6.1f} MB  current M=1 {row['current_m1']:6.1f} µs ({100 * share(row['current_m1']):4.1f}%)  "
            f"tiled best {us:6.1f} µs ({100 * share(us):4.1f}%, {row.get('best_tiled')}, err {row.get('err_m1', float('nan')):.1e})  "
            f"M=4: current {row['current_m4']:6.1f} tiled {row.get('best_tiled_m4', float('nan')):6.1f}  [t={time.time() - T0:.0f}s]")
        out.append(row)
        del ps, base, deq, w, pk
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench_out")))
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--skip-loads", action="store_true")
    args = ap.parse_args()
    import quant_linear as QL

    bw = QL.copy_bandwidth()
    log(f"copy bandwidth {bw:.3f} TB/s")
    loads = [] if args.skip_loads else probe_loads(bw)
    gemv = probe_gemv(bw, args.budget_s)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "layout_probe.json").write_text(json.dumps({"copy_tbs": bw, "loads": loads, "gemv": gemv}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
