"""Compile the f16x2 GEMV (quant_int/gemv_h2.py) for sm_90 on the CPU and count its loop's SASS.

    /tmp/t36/bin/python bench/h2_sass.py [--dump DIR]

Per (format, rows of x, config): registers, local memory, instructions in the row loop and
instructions per weight (the loop's count over the weights one thread handles a trip). Run under
the H200's Triton (3.6, see bench/compile_sm90_dense.py). Exit 1 when a variant fails to compile.
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", type=Path, default=None)
    ap.add_argument("--formats", default="4,5,6,8")
    ap.add_argument("--ms", default="1,4")
    ap.add_argument("--cfgs", default="32:4:4,16:8:6,32:8:4,16:4:8", help="block_n:kbs:ctas[:num_warps],...")
    ap.add_argument("--shape", default="17408x5120", help="N x K of the weight")
    args = ap.parse_args()
    n, k = (int(v) for v in args.shape.split("x"))
    cfgs = [H.H2Config(*(int(v) for v in c.split(":"))) for c in args.cfgs.split(",")]
    fails = S.sweep(H.launch, cfgs, [int(f) for f in args.formats.split(",")], [int(x) for x in args.ms.split(",")], n, k,
                    lambda cfg: cfg.block_n * cfg.kbs * 128 // (32 * cfg.num_warps), args.dump)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
