"""The CUDA C++ GEMV (quant_int/gemv_cu.py) against the dispatched kernel, shape by shape.

    python3 bench/cu_gemv_bench.py [--out DIR] [--shapes q4_g64:34816x5120,...] [--pdl 0|1]

Per shape (the 27B's q4/q5 decode matrices and three q8 ones by default) and x row count
(`--ms`): the dispatched kernel (at M = 1 the K-walk and its x-pairs launch), then each CUDA config
(its x-pairs launch included: two kernels a call, as the K-walk), and the x-pairs launch alone; µs a call in one CUDA graph cycling >= 256 MB of
weight copies, the share of the copy bandwidth measured in the same run, and each result's error
against the fp32 reference and the dispatched kernel. The configs include the pipelined walk ("pf");
q5 shapes time each config again on the prepared high-bit words ("words", NINFER_Q5_WORDS; asked to
be bit-equal), whose winners go to <out>/tuned_cu_words.py keyed 21 (gemv_cu.Q5_WORDS: pick takes them
first, and the model makes words for the shapes they name); join both files for NINFER_CU_TUNED.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the 27B's q4/q5 decode matrices, then the MTP drafter's merged q8 gate+up and q+k+v and the 35B's
# q8 qkvz (a round's three draft steps and the 35B's attention/GDN layers run q8 at M = 1)
SHAPES = [("q4_g64", 34816, 5120), ("q5_g64", 5120, 17408), ("q5_g64", 16384, 5120), ("q5_g64", 13312, 5120),
          ("q5_g64", 5120, 6144), ("q4_g64", 1024, 5120), ("q8_g32", 34816, 5120), ("q8_g32", 14336, 5120),
          ("q8_g32", 12288, 2048)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--pdl", default=None, help="NINFER_PDL for the run (default: as the engine)")
    ap.add_argument("--budget-s", type=float, default=1e9)
    ap.add_argument("--ms", default="1,4", help="x rows to time (1-4)")
    ap.add_argument("--no-words", dest="words", action="store_false",
                    help="q5: skip the configs on prepared high-bit words (timed beside each by default)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("cu_gemv_bench: needs a CUDA GPU")
        return 0
    if args.pdl is not None:
        os.environ["NINFER_PDL"] = args.pdl
    import kw_bench
    import quant_linear as QL
    from ninfer_plugins.quant_int import gemv_cu as CU
    from ninfer_plugins.quant_int import gemv_kw as KW
    from ninfer_plugins.quant_int import kernels as K
    from ninfer_plugins.quant_int.linear import dequantize_int_prepared
    from ninfer_plugins.quant_nvfp4.kernels import dequantize_prepared as dequantize_nvfp4

    why = CU.unavailable(torch.device("cuda"))
    if why:
        print(f"cu_gemv_bench: {why}")
        return 0
    t0 = time.time()
    CU.library(torch.device("cuda"))
    print(f"library built or loaded in {time.time() - t0:.1f} s", flush=True)
    shapes = QL.parse_shapes(args.shapes) if args.shapes else SHAPES
    copy_tbs, sms = QL.device_and_copy()
    ms = [int(v) for v in args.ms.split(",")]
    rows = []
    for name, n, k, p, nbytes, copies in kw_bench.weight_copies(shapes, time.time(), args.budget_s):
        def share(ms_: float) -> float:
            return nbytes / (ms_ * 1e-3) / (copy_tbs * 1e12)

        deq = (dequantize_nvfp4(p) if p.fmt == 16 else dequantize_int_prepared(p)).float()
        # q5: each copy's twin with the prepared high-bit words (NINFER_Q5_WORDS), timed beside it
        wcopies = [words_twin(q) for q in copies] if p.fmt == 5 and args.words else []
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ deq.T
            picked = K.pick_gemv(p.fmt, m, n, k, sms)
            want = K.launch(x, p)
            base = QL.graph_ms_per_call([lambda q=q, x=x: K.launch(x, q) for q in copies])
            tx = QL.graph_ms_per_call([lambda x=x, m=m: KW.xpairs(x, p.fmt, k, K.block_rows(m), True)] * 64)
            row = {"fmt": name, "bits": p.fmt, "n": n, "k": k, "m": m, "mb": round(nbytes / 1e6, 1),
                   "dispatched": getattr(picked, "describe", lambda: str(picked))(), "dispatched_us": round(base * 1e3, 2),
                   "dispatched_share": round(share(base), 3), "dispatched_err": rel_err(want, ref),
                   "xpairs_us": round(tx * 1e3, 2), "cu": []}
            print(f"  {name} {n}x{k} M={m} ({row['mb']} MB): dispatched {row['dispatched']} {base * 1e3:.2f} us "
                  f"{share(base):.1%} (err {row['dispatched_err']:.1e}); x pairs alone {tx * 1e3:.2f} us", flush=True)
            for cfg in CU.built_configs(m):
                if not CU.supports(p, cfg, m):
                    continue
                y = CU.launch(x, p, cfg)
                t = QL.graph_ms_per_call([lambda q=q, c=cfg, x=x: CU.launch(x, q, c) for q in copies])
                e_ref, e_disp = rel_err(y, ref), rel_err(y, want.float())
                # the TUNED_CU entry this config would be: (rows, unroll, warps, ksplit[, mma, pf, ofs, kc])
                # (words is the table key's, never the entry's)
                entry = dataclasses.astuple(cfg)[:8] if cfg.mma or cfg.pf else dataclasses.astuple(cfg)[:4]
                row["cu"].append({"config": cfg.describe(), "entry": entry, "us": round(t * 1e3, 2), "share": round(share(t), 3),
                                  "err": e_ref, "err_dispatched": e_disp})
                print(f"    {cfg.describe():16s} {t * 1e3:8.2f} us {share(t):6.1%}  err {e_ref:.1e} "
                      f"(vs dispatched {e_disp:.1e})", flush=True)
                if wcopies:
                    yw = CU.launch(x, wcopies[0], cfg)
                    tw = QL.graph_ms_per_call([lambda q=q, c=cfg, x=x: CU.launch(x, q, c) for q in wcopies])
                    same = bool(torch.equal(yw, y))
                    row.setdefault("cu_words", []).append({"config": cfg.describe() + " words", "entry": entry,
                                                           "us": round(tw * 1e3, 2), "share": round(share(tw), 3),
                                                           "err": rel_err(yw, ref), "bit_equal": same})
                    print(f"    {cfg.describe() + ' words':16s} {tw * 1e3:8.2f} us {share(tw):6.1%}  "
                          f"{'bit-equal' if same else 'DIFFERS from the runs of qhigh'}", flush=True)
            rows.append(row)
        del deq, wcopies
    QL.write_result(args.out, "cu_gemv_bench.json", dict(copy_tbs=copy_tbs, device=torch.cuda.get_device_name(0), rows=rows))
    print("best a shape (µs, share; dispatched in brackets):")
    for r in rows:
        for key in ("cu", "cu_words"):
            if r.get(key):
                b = min(r[key], key=lambda c: c["us"])
                print(f"  {r['fmt']} {r['n']}x{r['k']} M={r['m']}: {b['config']} {b['us']} us {b['share']:.1%} "
                      f"[{r['dispatched']} {r['dispatched_us']} us {r['dispatched_share']:.1%}]")
    table = tuned_table(rows)
    print(table, flush=True)
    words = tuned_table(rows, "cu_words")
    if words.count("\n") > 1:
        print("# on q5's prepared words (keyed gemv_cu.Q5_WORDS; join with the above for NINFER_CU_TUNED)\n" + words, flush=True)
    if args.out:
        Path(args.out, "tuned_cu.py").write_text(table + "\n")
        Path(args.out, "tuned_cu_words.py").write_text(words + "\n")
    return 0


def words_twin(p):
    """A q5 weight sharing p's tensors, with its prepared high-bit words (gemv_cu.attach_words)."""
    from ninfer_plugins.quant_int import gemv_cu as CU

    twin = dataclasses.replace(p)
    CU.attach_words(twin)
    return twin


def tuned_table(rows: list, key: str = "cu") -> str:
    """tuned.TUNED_CU entries for the shapes where a CUDA config won: its fastest config that agrees
    with the fp32 reference, if it beats the dispatched kernel alone by kw_bench's margins (key
    "cu_words": the configs timed on q5's prepared words)."""
    from kw_bench import MAX_ERR, WIN

    lines = ["TUNED_CU = {"]
    for r in rows:
        ok = [c for c in r.get(key, []) if c["err"] < MAX_ERR]
        if not ok:
            continue
        b = min(ok, key=lambda c: c["us"])
        if b["us"] > WIN * r["dispatched_us"]:
            continue
        bits = 21 if key == "cu_words" else r["bits"]  # gemv_cu.Q5_WORDS: a winner on q5's words
        lines.append(f"    ({bits}, {r['n']}, {r['k']}, {r['m']}): {tuple(b['entry'])},  # {b['us']} us "
                     f"{b['share']:.1%} against {r['dispatched']} {r['dispatched_us']} us")
    lines.append("}")
    return "\n".join(lines)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


if __name__ == "__main__":
    raise SystemExit(main())
