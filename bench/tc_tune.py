"""The tensor-core decode GEMV (quant_int/gemv_tc.py) on the GPU against what the engine dispatches.

    python bench/tc_tune.py [--out DIR] [--budget-s 300] [--pairs q4_g64:27b.gate_up_merged,...]

Per (format, shape): the dispatch (kernels.launch: the f16x2 GEMV at M <= 4, the MMA kernel
above) and the TC candidates of CANDS at M = 1 (µs per launch inside one CUDA graph cycling
through >= 256 MB of weight copies, so the L2 holds none); then the best three candidates and the
dispatch at M = 4 and M = 8; the winners checked against dequantize-then-matmul in fp32. Writes
OUT/tc.json, OUT/tuned_tc.py (TUNED_TC entries: the winner where it beat the dispatch, () where
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
DEFAULT_PAIRS = ("q4_g64:27b.gate_up_merged,q5_g64:27b.down_proj,q5_g64:27b.in_proj_qkvz,q5_g64:27b.q_v_merged,"
                 "q5_g64:27b.o_proj|out_proj,q5_g64:27b.in_proj_z,q4_g64:27b.gate_proj|up_proj,q4_g64:27b.k_proj|v_proj")


def cands():
    from ninfer_plugins.quant_int.gemv_tc import TCConfig

    return [TCConfig(4, 4, 1, 8), TCConfig(4, 3, 1, 10), TCConfig(2, 4, 1, 16), TCConfig(2, 6, 1, 12),
            TCConfig(8, 2, 1, 6), TCConfig(4, 2, 1, 12), TCConfig(4, 4, 2, 4), TCConfig(4, 3, 2, 5),
            TCConfig(2, 4, 2, 8), TCConfig(8, 2, 4, 2), TCConfig(2, 3, 1, 16), TCConfig(8, 3, 1, 5)]


def direct_cands():
    from ninfer_plugins.quant_int.gemv_tc import TCConfig

    return [TCConfig(4, 0, 4, 6, 2), TCConfig(4, 0, 4, 4, 2), TCConfig(4, 0, 4, 8, 2), TCConfig(8, 0, 4, 4, 2),
            TCConfig(8, 0, 4, 6, 2), TCConfig(4, 0, 2, 8, 2), TCConfig(4, 0, 2, 12, 2), TCConfig(8, 0, 2, 8, 2),
            TCConfig(4, 0, 8, 3, 2), TCConfig(4, 0, 4, 6, 1), TCConfig(16, 0, 4, 4, 2)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench_out")))
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--pairs", default=DEFAULT_PAIRS)
    ap.add_argument("--direct", action="store_true",
                    help="the direct kernel's candidates (weights straight into registers), against the full dispatch")
    ap.add_argument("--cands", default="",
                    help="the candidates instead of the built-in lists: kb:stages:warps:ctas:direct,...")
    ap.add_argument("--rank-m", type=int, default=1, choices=(1, 4, 8),
                    help="rank every candidate at this M (default 1; the best three then run at the others)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from ninfer_plugins.quant_int import gemv_tc as TC
    from ninfer_plugins.quant_int import kernels as K

    # with --cands, direct candidates among them count as --direct (the baseline they are ranked against)
    direct = args.direct or any(c.strip().endswith((":1", ":2")) for c in args.cands.split(","))
    bw = QL.copy_bandwidth()
    print(f"copy bandwidth {bw:.2f} TB/s", flush=True)
    shapes = {**QL.SHAPES, **QL.MERGED_SHAPES}
    rows, tuned, skipped = [], {}, []
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
            if cfg is None:
                # direct candidates are compared with the full dispatch (tuned TC entries included)
                os.environ["NINFER_TC"] = "1" if direct else "0"
                try:
                    return 1e3 * QL.graph_ms_per_call([lambda p=p: K.launch(x, p) for p in ps])
                finally:
                    os.environ.pop("NINFER_TC")
            K.Workspace.get(x.device).reserve(*cfg.workspace(ps[0]))
            return 1e3 * QL.graph_ms_per_call([lambda p=p: TC.launch(x, p, cfg) for p in ps])

        row = {"format": scheme, "shape": name, "n": n, "k": k, "bytes": one, "m1": {}, "m4": {}, "m8": {}}
        try:
            d = {m: time_it(m, None) for m in (1, 4, 8)}
            for m in (1, 4, 8):
                row[f"m{m}"]["dispatch"] = d[m]
            pool = ([TC.TCConfig(*map(int, c.split(":"))) for c in args.cands.split(",") if c.strip()] if args.cands
                    else direct_cands() if args.direct else cands())
            first = GT.rank(time_it, args.rank_m, [c for c in pool if TC.supports(ps[0], c)], row[f"m{args.rank_m}"],
                            lambda cfg, exc: print(f"  {pair} {cfg.describe()}: {type(exc).__name__}: {str(exc)[:300]}",
                                                   flush=True))
            if args.rank_m != 1:
                print(f"  {pair} M={args.rank_m}: " + ", ".join(f"{c.describe()} {us:.1f}" for us, c in first), flush=True)
            top = [cfg for _, cfg in first[:3]]
            res = {args.rank_m: first}
            for m in (1, 4, 8):
                if m != args.rank_m:
                    res[m] = GT.rank(time_it, m, top, row[f"m{m}"])
            best = {m: r[0] for m, r in res.items()}
            for m in (1, 2, 4, 8):
                cfg = best[1 if m == 1 else 4 if m <= 4 else 8][1]
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                ref = x.float() @ deq.T
                err = float((TC.launch(x, ps[0], cfg).float() - ref).norm() / ref.norm())
                row[f"err_m{m}"] = err
                if err > 4e-3:
                    raise AssertionError(f"{cfg.describe()} rel err {err:.2e} at M={m}")
            for m in (1, 4, 8):
                us, cfg = best[m]
                tuned[(fmt, n, k, f"m{m}")] = tuple(vars(cfg).values()) if us < d[m] else ()
                row[f"best_m{m}"] = cfg.describe()
                row[f"tc_m{m}"] = us
            row["tc_share"] = one / (best[1][0] * 1e-6) / (bw * 1e12)
            print(f"{scheme:7s} {name:26s} dispatch {d[1]:6.1f}/{d[4]:6.1f}/{d[8]:6.1f} µs  tc {best[1][0]:6.1f}/"
                  f"{best[4][0]:6.1f}/{best[8][0]:6.1f} µs (M=1/4/8; {100 * row['tc_share']:4.1f}% of copy at M=1, "
                  f"{best[1][1].describe()}) err {row['err_m1']:.1e} [t={time.time() - T0:.0f}s]", flush=True)
        except Exception as exc:  # noqa: BLE001 - keep the other shapes
            row["error"] = f"{type(exc).__name__}: {exc}"
            print(f"{pair}: ERROR {row['error'][:600]}", flush=True)
        rows.append(row)
        ps = deq = None  # free the copies before the next shape (a del would leave time_it a dangling name)
        torch.cuda.empty_cache()
    (out / "tc.json").write_text(json.dumps({"copy_tbs": bw, "skipped": skipped, "rows": rows}, indent=1))
    GT.write_tuned(out / "tuned_tc.py", "TUNED_TC", tuned)
    print(f"\n=== tensor-core GEMV vs dispatch (copy {bw:.2f} TB/s; {time.time() - T0:.0f} s) ===")
    print(f"{'format':7s} {'shape':26s} {'MB':>6s} {'disp1':>7s} {'tc1':>7s} {'share':>6s} {'disp4':>7s} {'tc4':>7s} "
          f"{'disp8':>7s} {'tc8':>7s}  best M=1")
    for r in rows:
        if "error" in r:
            print(f"{r['format']:7s} {r['shape']:26s} ERROR {r['error'][:160]}")
            continue
        print(f"{r['format']:7s} {r['shape']:26s} {r['bytes'] / 1e6:6.1f} {r['m1']['dispatch']:7.1f} {r['tc_m1']:7.1f} "
              f"{100 * r['tc_share']:5.1f}% {r['m4']['dispatch']:7.1f} {r['tc_m4']:7.1f} {r['m8']['dispatch']:7.1f} "
              f"{r['tc_m8']:7.1f}  {r['best_m1']}")
    if skipped:
        print(f"skipped (budget): {', '.join(skipped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
