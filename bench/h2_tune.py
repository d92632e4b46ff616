"""The f16x2 GEMV (quant_int/gemv_h2.py) on the GPU against what the engine dispatches today.

    python bench/h2_tune.py [--out DIR] [--budget-s 300] [--pairs q4_g64:27b.gate_up_merged,...]

Per (format, shape): the dispatched kernel (kernels.launch: the tuned CUDA-core GEMV or the MMA
kernel) and the f16x2 candidates of CANDS at M = 1 (µs per launch inside one CUDA graph cycling
through >= 256 MB of weight copies, so the L2 holds none), then the best three candidates and the
dispatch at M = 4; the winners are checked against dequantize-then-matmul in fp32. Writes
OUT/h2.json, OUT/tuned_h2.py (TUNED_H2 entries: the winner where it beat the dispatch, () where
not) and a table with the share of the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gemv_tune as GT  # noqa: E402
import quant_linear as QL  # noqa: E402

T0 = time.time()
DEFAULT_PAIRS = ("q4_g64:27b.gate_up_merged,q4_g64:27b.gate_proj|up_proj,q5_g64:27b.down_proj,q5_g64:27b.in_proj_qkvz,"
                 "q5_g64:27b.q_v_merged,q5_g64:27b.o_proj|out_proj,q6_g64:27b.lm_head,q8_g32:35b.q_proj|in_proj_qkv,"
                 "q8_g32:35b.o_proj|out_proj,q4_g64:27b.k_proj|v_proj,q5_g64:27b.in_proj_z,q8_g32:27b.gate_proj|up_proj,"
                 "q8_g32:35b.in_proj_qkvz,q8_g32:35b.qkv_merged,q6_g64:35b.lm_head")


def cands():
    from ninfer_plugins.quant_int.gemv_h2 import H2Config

    return [H2Config(32, 4, 4), H2Config(32, 8, 4), H2Config(64, 2, 4), H2Config(16, 4, 8), H2Config(32, 4, 6),
            H2Config(64, 4, 4, 8), H2Config(32, 2, 6), H2Config(16, 8, 6), H2Config(64, 2, 6, 8),
            H2Config(16, 8, 6, 4, 2), H2Config(32, 4, 4, 4, 2), H2Config(16, 4, 8, 4, 2),
            H2Config(16, 8, 6, 4, 1, True), H2Config(16, 4, 8, 4, 1, True),
            # the next tile's loads pinned ahead of the math (sixteenth session: ptxas had sunk them to the loop's end)
            H2Config(16, 8, 6, 4, 1, False, True), H2Config(32, 4, 4, 4, 1, False, True), H2Config(16, 8, 6, 4, 2, False, True),
            H2Config(32, 4, 4, 4, 2, False, True), H2Config(16, 4, 8, 4, 1, True, True)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench_out")))
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--pairs", default=DEFAULT_PAIRS)
    ap.add_argument("--quick", action="store_true", help="three candidates per shape")
    ap.add_argument("--m4-all", action="store_true",
                    help="time every candidate at M = 4 too (default: M = 1's best three), e.g. for the verify's head")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from ninfer_plugins.quant_int import gemv_h2 as H
    from ninfer_plugins.quant_int import kernels as K

    bw = QL.copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy bandwidth {bw:.2f} TB/s, {sms} SMs", flush=True)
    shapes = {**QL.SHAPES, **QL.MERGED_SHAPES, **QL.DRAFT_SHAPES}
    rows, tuned, skipped = [], {}, []
    all_cands = cands()
    if args.quick:
        all_cands = [c for c in all_cands if (c.block_n, c.kbs, c.ctas) in ((16, 8, 6), (32, 4, 4))]
    for pair in [p for p in args.pairs.split(",") if p]:
        scheme, name = pair.split(":", 1)
        if time.time() - T0 > args.budget_s:
            skipped.append(pair)
            continue
        fmt = GT.FORMAT_IDS[scheme]
        n, k, _ = shapes[name]
        ps, deq, one = GT.timing_copies(scheme, n, k)
        for p in ps:
            K.reserve_workspace(p)

        def time_it(m: int, cfg) -> float:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            if cfg is None:  # the dispatch as it was before this kernel
                os.environ["NINFER_H2"] = "0"
                try:
                    return 1e3 * QL.graph_ms_per_call([lambda p=p: K.launch(x, p) for p in ps])
                finally:
                    os.environ.pop("NINFER_H2")
            else:
                K.Workspace.get(x.device).reserve(*H.workspace_need(ps[0], cfg))
                calls = [lambda p=p: H.launch(x, p, cfg) for p in ps]
            return 1e3 * QL.graph_ms_per_call(calls)

        row = {"format": scheme, "shape": name, "n": n, "k": k, "bytes": one, "m1": {}, "m4": {}}
        try:
            d1 = time_it(1, None)
            row["m1"]["dispatch"] = d1
            res = GT.rank(time_it, 1, [c for c in all_cands if H.supports(ps[0], c)], row["m1"], lambda cfg, exc: print(
                f"  {pair} {cfg.describe()}: {type(exc).__name__}: {str(exc)[:200]}", flush=True))
            d4 = time_it(4, None)
            row["m4"]["dispatch"] = d4
            pool4 = [cfg for _, cfg in res] if args.m4_all else [cfg for _, cfg in res[:3]]
            res4 = GT.rank(time_it, 4, pool4, row["m4"])
            (g1, c1), (g4, c4) = res[0], res4[0]
            for m, cfg in ((1, c1), (2, c4), (3, c4), (4, c4)):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                ref = x.float() @ deq.T
                err = float((H.launch(x, ps[0], cfg).float() - ref).norm() / ref.norm())
                row[f"err_m{m}"] = err
                if err > 6e-3:
                    raise AssertionError(f"{cfg.describe()} rel err {err:.2e} at M={m}")
            tuned[(fmt, n, k, "m1")] = tuple(vars(c1).values()) if g1 < d1 else ()
            tuned[(fmt, n, k, "m4")] = tuple(vars(c4).values()) if g4 < d4 else ()
            row.update(best_m1=c1.describe(), h2_m1=g1, best_m4=c4.describe(), h2_m4=g4,
                       h2_share=one / (g1 * 1e-6) / (bw * 1e12), dispatch_share=one / (d1 * 1e-6) / (bw * 1e12))
            print(f"{scheme:7s} {name:26s} M=1 dispatch {d1:7.1f} µs h2 {g1:7.1f} µs ({100 * row['h2_share']:4.1f}% of copy, "
                  f"{c1.describe()}) | M=4 dispatch {d4:7.1f} h2 {g4:7.1f} ({c4.describe()}) err {row['err_m1']:.1e} "
                  f"[t={time.time() - T0:.0f}s]", flush=True)
        except Exception as exc:  # noqa: BLE001 - keep the other shapes
            row["error"] = f"{type(exc).__name__}: {exc}"
            print(f"{pair}: ERROR {row['error'][:400]}", flush=True)
        rows.append(row)
        ps = deq = None  # free the copies before the next shape (a del would leave time_it a dangling name)
        torch.cuda.empty_cache()
    (out / "h2.json").write_text(json.dumps({"copy_tbs": bw, "skipped": skipped, "rows": rows}, indent=1))
    GT.write_tuned(out / "tuned_h2.py", "TUNED_H2", tuned)
    print(f"\n=== f16x2 GEMV vs dispatch (copy {bw:.2f} TB/s; {time.time() - T0:.0f} s) ===")
    print(f"{'format':7s} {'shape':26s} {'MB':>6s} {'disp1':>7s} {'h2 1':>7s} {'share':>6s} {'disp4':>7s} {'h2 4':>7s} {'4/1':>5s}  best")
    for r in rows:
        if "error" in r:
            print(f"{r['format']:7s} {r['shape']:26s} ERROR {r['error'][:120]}")
            continue
        print(f"{r['format']:7s} {r['shape']:26s} {r['bytes'] / 1e6:6.1f} {r['m1']['dispatch']:7.1f} {r['h2_m1']:7.1f} "
              f"{100 * r['h2_share']:5.1f}% {r['m4']['dispatch']:7.1f} {r['h2_m4']:7.1f} {r['h2_m4'] / r['h2_m1']:5.2f}  "
              f"{r['best_m1']} / {r['best_m4']}")
    if skipped:
        print(f"skipped (budget): {', '.join(skipped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
