"""Compile the f16x2 GEMV (quant_int/gemv_h2.py) and the K-walk GEMV (gemv_kw.py) for sm_90 on
the CPU and count their loops' SASS.

    /tmp/t36/bin/python bench/h2_sass.py [--cfgs 16:8:6,...] [--kw 16:128:1:4,...] [--shape NxK] [--dump DIR]

Per (format, rows of x, config): registers, local memory, instructions in the main loop (gemv_h2:
the row loop; gemv_kw: the K loop) and instructions per weight (the loop's count over the weights
one thread decodes a trip). Run under the H200's Triton (3.6, see bench/compile_sm90_dense.py).
Exit 1 when a variant fails to compile.
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

from ninfer_plugins.quant_int import gemv_h2 as H  # noqa: E402
from ninfer_plugins.quant_int import gemv_kw as KW  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", type=Path, default=None)
    ap.add_argument("--formats", default="4,5,6,8")
    ap.add_argument("--ms", default="1,4")
    ap.add_argument("--cfgs", default="32:4:4,16:8:6,32:8:4,16:4:8", help="gemv_h2: block_n:kbs:ctas[:num_warps],... ('' none)")
    ap.add_argument("--kw", default="", help="gemv_kw: block_n:bw:splits:num_warps[:prefetch[:inline[:pin]]],... (e.g. 16:128:1:4)")
    ap.add_argument("--shape", default="17408x5120", help="N x K of the weight")
    args = ap.parse_args()
    n, k = (int(v) for v in args.shape.split("x"))
    h2 = [H.H2Config(*(int(v) for v in c.split(":"))) for c in args.cfgs.split(",") if c]
    kw = [KW.KWConfig(*(int(v) for v in c.split(":")[:5]), *(bool(int(v)) for v in c.split(":")[5:7]))
          for c in args.kw.split(",") if c]
    ms = [int(x) for x in args.ms.split(",")]
    fails = 0
    for fmt in (int(f) for f in args.formats.split(",")):
        if h2:
            fails += S.sweep(H.launch, h2, [fmt], ms, n, k, lambda c: c.block_n * c.kbs * 128 // (32 * c.num_warps), args.dump)
        fits = [c for c in kw if KW._fits(fmt, k, c)]
        if fits:
            per_trip = 128 // KW.WORDS[fmt]  # weights a word of a trip stands for, per row
            fails += S.sweep(KW.launch, fits, [fmt], ms, n, k,
                             # a ping-pong loop (prefetch 2) covers two trips
                             lambda c: c.bw * per_trip * c.block_n * (2 if c.prefetch == 2 else 1) // (32 * c.num_warps),
                             args.dump)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
