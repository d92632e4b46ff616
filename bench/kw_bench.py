"""The K-walk GEMV (quant_int/gemv_kw.py) against the dispatched decode kernel, shape by shape.

    python3 bench/kw_bench.py [--out DIR] [--first N] [--ms 1,4] [--shapes nvfp4:34816x5120,...]

Per shape and M: the dispatched kernel (gemv_h2 at M = 1 on every 27B/35B shape), each K-walk
config that fits (its x-pairs launch included: two kernels a call; one with `inline`), the first fitting config with
its decode and FMAs ablated, and the x-pairs launch alone; µs a call in one CUDA graph cycling
>= 256 MB of weight copies, the share of the copy bandwidth measured in the same run, and each
K-walk result's error against the dispatched kernel's (a check that the fast path is right, as
well as fast). Prediction (BENCHMARKS.md, fifteenth session): the ablated K-walk near the read
ceiling's 82-90% on the big matrices, the full one above gemv_h2's 42-57%. The ablated kernel
loads x row 0's pairs only, so at M = 4 it understates what x's loads cost.
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
ROOT = Path(__file__).resolve().parents[1]

# (format, N, K): the 27B's decode matrices (q4 gate+up, q5 down/qkv+z/q+v/o_proj, q6 head), an
# NVFP4 down, the 35B's q8 attention/GDN projections and its q6 head, the MTP drafter's shapes
SHAPES = [
    ("q4_g64", 34816, 5120), ("q5_g64", 5120, 17408), ("q5_g64", 16384, 5120), ("q5_g64", 13312, 5120),
    ("q5_g64", 5120, 6144), ("nvfp4", 5120, 17408), ("q8_g32", 12288, 2048), ("q8_g32", 2048, 4096),
    ("q6_g64", 248320, 5120), ("q8_g32", 9216, 2048), ("q6_g64", 248320, 2048),
    # the 27B's k_proj (q4), then the MTP drafter's q8 layer and the q4 shortlist head (a round's
    # three drafts run them at M = 1)
    ("q4_g64", 1024, 5120), ("q8_g32", 14336, 5120), ("q8_g32", 5120, 10240), ("q8_g32", 34816, 5120),
    ("q8_g32", 5120, 17408), ("q8_g32", 5120, 6144), ("q4_g64", 131072, 5120),
]
# block_n, bw, splits, num_warps[, prefetch[, inline[, pin]]] (gemv_kw.KWConfig)
CFGS = [(16, 128, 1, 4), (32, 128, 1, 8), (8, 128, 1, 2), (16, 64, 1, 4), (16, 128, 1, 4, 2), (16, 128, 1, 4, 1, True),
        (16, 128, 1, 4, 2, True), (16, 128, 2, 4), (32, 128, 2, 8), (16, 128, 4, 4), (16, 128, 4, 4, 1, True),
        # more CTAs for the 5,120-row matrices (q5 down's 17 trips split ragged: 9 + 8, 5 + 5 + 5 + 2)
        (8, 128, 2, 2), (8, 128, 4, 2), (8, 128, 2, 2, 2), (8, 64, 2, 2),
        # the next trip's loads pinned ahead of the math (sixteenth session: the SASS had them sunk
        # two thirds into the trip or to its end)
        (16, 128, 1, 4, 1, False, True), (16, 128, 1, 4, 2, False, True), (8, 128, 1, 2, 1, False, True),
        (16, 64, 1, 4, 1, False, True), (8, 128, 2, 2, 1, False, True)]


def _warm_one(item) -> str:
    fmt_name, k, cfg, m, ablate = item
    sys.path.insert(0, str(ROOT / "bench"))
    import quant_linear as QL

    from ninfer_plugins.quant_int import gemv_kw as KW
    from ninfer_plugins.quant_int import kernels as K

    try:
        c = KW.KWConfig(*cfg)
        p = QL.make_prepared(fmt_name, K.ROW_PAD, k)
        K.Workspace.get(torch.device("cuda", 0)).reserve(*KW.workspace_need(p, c))
        KW.launch(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), p, c, ablate=ablate)
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # noqa: BLE001 - reported, the run goes on
        return f"{item}: {type(e).__name__}: {str(e)[:300]}"


def prewarm(items: list, workers: int = 14, fn=None) -> None:
    """Compile every variant once, in parallel processes (fn(item) -> error text; default _warm_one)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    t0 = time.time()
    with cf.ProcessPoolExecutor(max_workers=min(workers, max(1, len(items))), mp_context=mp.get_context("spawn")) as ex:
        errors = [e for e in ex.map(fn or _warm_one, items) if e]
    print(f"prewarm: {len(items)} variants in {time.time() - t0:.0f} s" + (f"; errors: {errors[:4]}" if errors else ""), flush=True)


def weight_copies(shapes: list, t_start: float, budget_s: float):
    """Per shape (name, n, k): (name, n, k, prepared weight, its bytes, copies of it cycling >= 256
    MB so that each call reads from DRAM, the first being the weight), until budget_s seconds from
    t_start are spent; the caller drops its references at the end of each shape (tkw_bench shares it)."""
    import quant_linear as QL

    for name, n, k in shapes:
        if time.time() - t_start > budget_s:
            print(f"budget spent: {name} {n}x{k} and the shapes after it not run", flush=True)
            return
        p = QL.make_prepared(name, n, k)
        nbytes = QL.prepared_bytes(p)
        copies = [p] + [QL.clone_prepared(p) for _ in range(max(1, -(-QL.L2_DEFEAT_BYTES // nbytes) - 1))]
        yield name, n, k, p, nbytes, copies
        del copies, p
        torch.cuda.empty_cache()


def time_configs(kernel, key: str, fits: list, name: str, n: int, k: int, m: int, p, nbytes: int, copies: list,
                 share, fmt_bits: int, sms: int, device: str = "cuda"):
    """One shape at M rows: the dispatched kernel's µs, then each config in `fits` of `kernel` (a
    module with launch and workspace_need: gemv_kw, gemv_tkw) with its error against the dispatched
    output, printed and collected in row[key]. Returns (x, row); tkw_bench shares it."""
    import quant_linear as QL

    from ninfer_plugins.quant_int import kernels as K

    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    picked = K.pick_gemv(fmt_bits, m, n, k, sms)
    want = K.launch(x, p)
    base_ms = QL.graph_ms_per_call([lambda q=q: K.launch(x, q) for q in copies])
    row = dict(fmt=name, n=n, k=k, m=m, mb=round(nbytes / 1e6, 1), dispatched=getattr(picked, "describe", lambda: str(picked))(),
               dispatched_us=round(base_ms * 1e3, 2), dispatched_share=round(share(base_ms), 3))
    row[key] = []
    print(f"  {name} {n}x{k} M={m} ({row['mb']} MB): dispatched {row['dispatched']} {base_ms * 1e3:.2f} us "
          f"{share(base_ms):.1%}", flush=True)
    for cfg in fits:
        K.Workspace.get(x.device).reserve(*kernel.workspace_need(p, cfg))
        err = float((kernel.launch(x, p, cfg).float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))
        t = QL.graph_ms_per_call([lambda q=q, c=cfg: kernel.launch(x, q, c) for q in copies])
        row[key].append(dict(config=cfg.describe(), fields=list(dataclasses.astuple(cfg)), us=round(t * 1e3, 2),
                             share=round(share(t), 3), err=err))
        print(f"    {cfg.describe():24s} {t * 1e3:8.2f} us {share(t):6.1%}  err vs dispatched {err:.1e}", flush=True)
    return x, row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--first", type=int, default=len(SHAPES), help="only the first N shapes")
    ap.add_argument("--ms", default="1,4")
    ap.add_argument("--budget-s", type=float, default=1e9, help="no new shape starts after this (the table still prints)")
    ap.add_argument("--shapes", default="", help="format:NxK,... in place of SHAPES (e.g. nvfp4:34816x5120)")
    args = ap.parse_args()
    t_start = time.time()
    if not torch.cuda.is_available():
        print("kw_bench: needs a CUDA GPU")
        return 0
    import quant_linear as QL

    from ninfer_plugins.quant_int import formats as IF
    from ninfer_plugins.quant_int import gemv_kw as KW
    from ninfer_plugins.quant_int import kernels as K

    # the baseline is the dispatch without the K-walk (tuned.TUNED_KW's winners off)
    os.environ["NINFER_KW"] = "0"
    ms = [int(v) for v in args.ms.split(",")]
    shapes = SHAPES[: args.first]
    if args.shapes:
        shapes = QL.parse_shapes(args.shapes)
    bits = {name: (16 if name == "nvfp4" else IF.FORMATS[name].bits) for name, _, _ in shapes}
    items = []
    for name, n, k in shapes:
        fits = [c for c in CFGS if KW._fits(bits[name], k, KW.KWConfig(*c))]
        for m in ms:
            items += [(name, k, c, m, 0) for c in fits] + [(name, k, fits[0], m, 1)] if fits else []
    prewarm(sorted(set(items)))
    copy_tbs, sms = QL.device_and_copy()
    rows = []
    for name, n, k, p, nbytes, copies in weight_copies(shapes, t_start, args.budget_s):
        fits = [KW.KWConfig(*c) for c in CFGS if KW._fits(bits[name], k, KW.KWConfig(*c))]

        def share(ms_: float) -> float:
            return nbytes / (ms_ * 1e-3) / (copy_tbs * 1e12)

        for m in ms:
            x, row = time_configs(KW, "kw", fits, name, n, k, m, p, nbytes, copies, share, bits[name], sms)
            if fits:
                t = QL.graph_ms_per_call([lambda q=q: KW.launch(x, q, fits[0], ablate=1) for q in copies])
                row["ablated"] = dict(config=fits[0].describe(), us=round(t * 1e3, 2), share=round(share(t), 3))
                tx = QL.graph_ms_per_call([lambda f=p.fmt: KW.xpairs(x, f, k, K.block_rows(m), True)] * 64)
                row["xpairs_us"] = round(tx * 1e3, 2)
                print(f"    ablated {fits[0].describe():16s} {t * 1e3:8.2f} us {share(t):6.1%}; x pairs alone {tx * 1e3:.2f} us",
                      flush=True)
            rows.append(row)
        del copies, p
    QL.write_result(args.out, "kw_bench.json", dict(copy_tbs=copy_tbs, rows=rows))
    table = tuned_table(rows, bits)
    print(table, flush=True)
    if args.out:
        Path(args.out, "tuned_kw.py").write_text(table + "\n")
    return 0


# a winner must beat the dispatched kernel by this much alone (the step then decides: tuned.py)
WIN = 0.97
# and agree with it: both round to bf16 once, so they differ by a few ulps of the output
MAX_ERR = 1e-2


def tuned_table(rows: list, bits: dict, configs: str = "kw", buckets: dict | None = None,
                header: str = "bench/kw_bench.py: paste into quant_int/tuned.py's TUNED_KW") -> str:
    """Tuned-table entries from the rows (their configs under row[configs]; tuned.TUNED_KW's by
    default): the fastest config that agrees with the dispatched kernel where it beats it by WIN,
    else () (it lost there); buckets map M to the table's ("m1", "m4"; other M are not buckets)."""
    buckets = buckets or {1: "m1", 4: "m4"}
    lines = [f"# {header} after the step has confirmed them"]
    for r in rows:
        bucket = buckets.get(r["m"])
        if bucket is None:
            continue
        ok = [c for c in r[configs] if c["err"] <= MAX_ERR]
        best = min(ok, key=lambda c: c["us"], default=None)
        key = f"({bits[r['fmt']]}, {r['n']}, {r['k']}, '{bucket}')"
        if best is not None and best["us"] < WIN * r["dispatched_us"]:
            lines.append(f"    {key}: {tuple(best['fields'])},  # {best['us']} vs {r['dispatched_us']} us ({r['dispatched']})")
        else:
            why = f"best {best['us']} us" if best else "no config agreed with the dispatch"
            lines.append(f"    {key}: (),  # {why} vs {r['dispatched_us']} us ({r['dispatched']})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
