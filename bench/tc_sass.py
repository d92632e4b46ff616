"""Compile the tensor-core GEMV (quant_int/gemv_tc.py, ring and direct variants) for sm_90 on the
CPU and count its main loop's SASS (registers, shared memory, instructions a weight).

    /tmp/t36/bin/python bench/tc_sass.py [--cfgs kb:stages:warps:ctas:direct,...] [--pdl] [--dump DIR]

Run it under the H200's Triton (3.6; see bench/compile_sm90_dense.py). Exit 1 when a variant
fails to compile.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import skinny_sass as S  # noqa: E402

S.install()

import torch  # noqa: E402

from ninfer_plugins.quant_int import gemv_tc as T  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", type=Path, default=None)
    ap.add_argument("--formats", default="4,5")
    ap.add_argument("--ms", default="1,4")
    ap.add_argument("--shape", default="34816x5120")
    ap.add_argument("--pdl", action="store_true")
    ap.add_argument("--cfgs", default="4:4:4:4:0,4:0:4:4:1,4:0:4:4:2,8:0:4:4:2,2:0:4:6:2")
    args = ap.parse_args()
    T.COMPILE_ONLY = "pdl" if args.pdl else True
    n, k = (int(v) for v in args.shape.split("x"))
    fails = 0
    cfgs = [T.TCConfig(*(int(v) for v in c.split(":"))) for c in args.cfgs.split(",")]
    print(f"{'variant':36s} {'regs':>5s} {'smem':>6s} {'local':>5s} {'loop':>5s} {'w/thr':>6s} {'ins/w':>6s}  top opcodes")
    for fmt in (int(f) for f in args.formats.split(",")):
        p = S.empty_prepared(fmt, n, k)
        for m in (int(x) for x in args.ms.split(",")):
            for cfg in cfgs:
                name = f"q{fmt} M={m} {cfg.describe()}"
                S._compiled.clear()
                try:
                    T.launch(torch.empty(m, k, dtype=torch.bfloat16), p, cfg)
                    kern = S._compiled[-1]
                except Exception:
                    fails += 1
                    print(f"FAIL {name}\n{traceback.format_exc()[-2500:]}", flush=True)
                    continue
                # a loop trip: KB blocks of 128 K for 16 x warps rows (ring) or one block (direct: the
                # unrolled KB loop is one trip of the row loop either way)
                wpt = cfg.kb * 128 * 16 * cfg.num_warps // (32 * cfg.num_warps)
                st = S.analyse(name, kern, wpt, args.dump)
                top = sorted(((v, f) for f, v in st.counts.items() if v), reverse=True)[:8]
                print(f"{name:36s} {st.regs:5d} {st.smem:6d} {st.local:5d} {st.loop:5d} {wpt:6d} {st.loop / wpt:6.2f}  "
                      + " ".join(f"{f}:{v}" for v, f in top), flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
