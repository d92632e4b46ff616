"""The tensor-core K-walk GEMV (quant_int/gemv_tkw.py) against the dispatched decode kernel, shape
by shape, at M = 1, 4, 8.

    python3 bench/tkw_bench.py [--out DIR] [--first N] [--ms 1,4,8] [--budget-s S]

Per shape and M: the kernel the engine dispatches today (the K-walk or f16x2 GEMV at M = 1, the
K-walk or tensor-core GEMV at M = 4), then every config of the tensor-core K-walk that fits (its
x-preparation launch included: two kernels a call); µs a call in one CUDA graph cycling >= 256 MB
of weight copies, the share of the copy bandwidth measured in the same run, and each result's
error against the dispatched kernel's. Issue 3's ratio is printed per shape: the best M = 4 time
over the best M = 1 time (any kernel). Prediction (BENCHMARKS.md, eighteenth run): M = 4 within
5% of M = 1 for this kernel (same instructions), q4 near the f16x2 K-walk's M = 1 share (2.17
SASS instructions a weight against its 2.43), q5 somewhat below it (3.26 against 3.49 but more
loads a weight). Writes tkw_bench.json and tuned_tkw.py (TUNED_TKW entries) under --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]

# the 27B's q4/q5 decode matrices (gate+up, down, qkv+z, q+v, o_proj, k_proj) and the MTP shortlist head
SHAPES = [("q4_g64", 34816, 5120), ("q5_g64", 5120, 17408), ("q5_g64", 16384, 5120), ("q5_g64", 13312, 5120),
          ("q5_g64", 5120, 6144), ("q4_g64", 1024, 5120), ("q4_g64", 131072, 5120)]
# tb, pf, num_warps, splits[, pin] (gemv_tkw.TKWConfig; pf 0: ping-pong whole trips)
# (the first H100 run's best were TB 4-8 with two blocks ahead: more bytes in flight a warp)
CFGS = [(2, 1, 4, 1), (4, 2, 4, 1), (8, 1, 4, 1), (4, 4, 4, 4), (4, 1, 4, 4), (2, 2, 2, 4),
        # ping-pong whole trips (pf 0): the next trip's loads in registers no math reads
        (2, 0, 4, 1), (2, 0, 4, 4), (2, 0, 2, 2),
        # the blocks ahead pinned where the code loads them (a warp barrier): on the H200 (nineteenth
        # run) the pinned forms won every big matrix at M = 4 (gate+up 46.6 vs 58.4 us unpinned)
        (2, 1, 4, 1, True), (4, 1, 4, 1, True), (8, 1, 4, 1, True), (4, 2, 4, 1, True), (8, 2, 4, 1, True),
        (4, 3, 4, 1, True), (4, 4, 4, 1, True), (2, 1, 4, 2, True), (4, 2, 4, 2, True), (4, 1, 4, 4, True),
        (2, 2, 4, 4, True), (4, 2, 4, 4, True), (2, 2, 2, 4, True), (4, 4, 2, 4, True)]
# the cp.async ring (ring = stages; pf and pin unused): bytes in flight that cost no registers
RING_CFGS = [(2, 1, 4, 1, False, 4), (2, 1, 4, 1, False, 3), (1, 1, 4, 1, False, 6), (4, 1, 4, 1, False, 3),
             (1, 1, 4, 1, False, 4), (2, 1, 4, 2, False, 4), (2, 1, 4, 4, False, 4), (1, 1, 4, 4, False, 6),
             (2, 1, 8, 1, False, 3), (2, 1, 2, 2, False, 4), (2, 1, 4, 1, False, 6)]


def _warm_one(item) -> str:
    fmt_name, k, cfg, m = item
    sys.path.insert(0, str(ROOT / "bench"))
    import quant_linear as QL

    from ninfer_plugins.quant_int import gemv_tkw as TK
    from ninfer_plugins.quant_int import kernels as K

    try:
        c = TK.TKWConfig(*cfg)
        p = QL.make_prepared(fmt_name, K.ROW_PAD, k)
        K.Workspace.get(torch.device("cuda", 0)).reserve(*TK.workspace_need(p, c))
        TK.launch(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), p, c)
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # noqa: BLE001 - reported, the run goes on
        return f"{item}: {type(e).__name__}: {str(e)[:300]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--first", type=int, default=len(SHAPES))
    ap.add_argument("--ms", default="1,4,8")
    ap.add_argument("--set", default="all", choices=("all", "ring", "regs"),
                    help="ring: the cp.async ring configs and the H200's pinned winners only; regs: no ring")
    ap.add_argument("--budget-s", type=float, default=1e9, help="no new shape starts after this (the table still prints)")
    args = ap.parse_args()
    t_start = time.time()
    if not torch.cuda.is_available():
        print("tkw_bench: needs a CUDA GPU")
        return 0
    import kw_bench as KB
    import quant_linear as QL

    from ninfer_plugins.quant_int import formats as IF
    from ninfer_plugins.quant_int import gemv_tkw as TK

    global CFGS
    if args.set == "ring":
        CFGS = [c for c in CFGS if len(c) > 4 and c[4]][:6] + RING_CFGS
    elif args.set == "all":
        CFGS = CFGS + RING_CFGS
    os.environ["NINFER_TKW"] = "0"  # the baseline: today's dispatch
    ms = [int(v) for v in args.ms.split(",")]
    shapes = SHAPES[: args.first]
    bits = {name: IF.FORMATS[name].bits for name, _, _ in shapes}
    sms0 = torch.cuda.get_device_properties(0).multi_processor_count

    def shape_cfgs(name: str, n: int, k: int) -> list[tuple]:
        """The configs that fit this shape: the lists above, and with the ring the one-wave ring
        configs of this shape (gemv_tkw.one_wave_rings), as tuples."""
        out = [c for c in CFGS if TK._fits(bits[name], k, TK.TKWConfig(*c))]
        if args.set != "regs":
            for c in TK.one_wave_rings(bits[name], n, k, sms0):
                t = (c.tb, c.pf, c.num_warps, c.splits, c.pin, c.ring)
                if t not in out:
                    out.append(t)
        return out

    items = []
    for name, n, k in shapes:
        items += [(name, k, c, m) for c in shape_cfgs(name, n, k) for m in ms]
    KB.prewarm(sorted(set(items)), fn=_warm_one)
    copy_tbs, sms = QL.device_and_copy()
    rows = []
    for name, n, k, p, nbytes, copies in KB.weight_copies(shapes, t_start, args.budget_s):
        fits = [TK.TKWConfig(*c) for c in shape_cfgs(name, n, k)]
        rings = [c for c in fits if c.ring]
        if rings:
            print("    ring CTAs an SM / waves: " + ", ".join(
                f"{c.describe()[4:]} {'%d/%d' % TK.ring_waves(bits[name], n, c, sms)}" for c in rings), flush=True)

        def share(ms_: float) -> float:
            return nbytes / (ms_ * 1e-3) / (copy_tbs * 1e12)

        best = {}
        for m in ms:
            x, row = KB.time_configs(TK, "tkw", fits, name, n, k, m, p, nbytes, copies, share, bits[name], sms)
            # the best agreeing time at this M, any kernel (ms)
            best[m] = min([row["dispatched_us"]] + [c["us"] for c in row["tkw"] if c["err"] <= KB.MAX_ERR]) / 1e3
            tx = QL.graph_ms_per_call([lambda f=p.fmt: TK.xq(x, f, k)] * 64)
            row["xq_us"] = round(tx * 1e3, 2)
            print(f"    x prepared alone {tx * 1e3:.2f} us", flush=True)
            rows.append(row)
        if 1 in best:
            print("    best M / best M=1: " + ", ".join(f"M={m} {best[m] / best[1]:.3f}x" for m in ms if m != 1), flush=True)
        del copies, p
    QL.write_result(args.out, "tkw_bench.json", dict(copy_tbs=copy_tbs, rows=rows, device=torch.cuda.get_device_name(0)))
    table = KB.tuned_table(rows, bits, "tkw", {1: "m1", 4: "m4", 8: "m8"},
                           "bench/tkw_bench.py: paste into quant_int/tuned.py's TUNED_TKW")
    print(table, flush=True)
    if args.out:
        Path(args.out, "tuned_tkw.py").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
