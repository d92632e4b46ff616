"""Compile the tensor-core GEMV (quant_int/gemv_tc.py, ring and direct variants) for sm_90 on the
CPU and count its main loop's SASS (registers, shared memory, instructions a weight).

    /tmp/t36/bin/python bench/tc_sass.py [--cfgs kb:stages:warps:ctas:direct,...] [--pdl] [--dump DIR]
    /tmp/t36/bin/python bench/tc_sass.py --tkw [--cfgs tb:pf:warps:splits,...]   # gemv_tkw.py's K-walk

Run it under the H200's Triton (3.6; see bench/compile_sm90_dense.py). Exit 1 when a variant
fails to compile.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import skinny_sass as S  # noqa: E402

S.install()

from ninfer_plugins.quant_int import gemv_tc as T  # noqa: E402
from ninfer_plugins.quant_int import gemv_tkw as TK  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", type=Path, default=None)
    ap.add_argument("--formats", default="4,5")
    ap.add_argument("--ms", default="1,4")
    ap.add_argument("--shape", default="34816x5120")
    ap.add_argument("--pdl", action="store_true")
    ap.add_argument("--cfgs", default=None)
    ap.add_argument("--tkw", action="store_true", help="the tensor-core K-walk (gemv_tkw.py); cfgs tb:pf:warps:splits")
    args = ap.parse_args()
    T.COMPILE_ONLY = TK.COMPILE_ONLY = "pdl" if args.pdl else True
    n, k = (int(v) for v in args.shape.split("x"))
    formats, ms = [int(f) for f in args.formats.split(",")], [int(x) for x in args.ms.split(",")]
    if args.tkw:
        cfgs = [TK.TKWConfig(*(int(v) for v in c.split(":"))) for c in (args.cfgs or "2:1:4:1,2:2:4:1,4:1:4:2,1:1:2:1").split(",")]
        # a loop trip: TB blocks of 128 K for 16 rows a warp, 32 lanes (ping-pong, pf 0: two trips a loop)
        fails = S.sweep(TK.launch, cfgs, formats, ms, n, k, lambda cfg: cfg.tb * 128 * 16 // 32 * (2 if cfg.pf == 0 else 1),
                        args.dump, smem=True)
        return 1 if fails else 0
    args.cfgs = args.cfgs or "4:4:4:4:0,4:0:4:4:1,4:0:4:4:2,8:0:4:4:2,2:0:4:6:2"
    cfgs = [T.TCConfig(*(int(v) for v in c.split(":"))) for c in args.cfgs.split(",")]
    # a loop trip: KB blocks of 128 K for 16 x warps rows (ring) or one block (direct: the
    # unrolled KB loop is one trip of the row loop either way)
    fails = S.sweep(T.launch, cfgs, formats, ms, n, k,
                    lambda cfg: cfg.kb * 128 * 16 * cfg.num_warps // (32 * cfg.num_warps), args.dump, smem=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
