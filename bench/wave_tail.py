"""Does a decode GEMV's last, part-full wave cost a whole CTA walk? The dispatched config of a
27B matrix timed at its real row count and at row counts that fill a whole number of waves.

    python3 bench/wave_tail.py [--m 1] [--out DIR]

bench/occupancy.py (compile-only, sm_90) estimates the M = 1 K-walk GEMV on q4 gate+up
(34816x5120, KW BN16: 2,176 CTAs, 4 an SM by registers) at 4.12 waves, and q5 qkv+z (16384x5120:
1,024 CTAs, 3 an SM) at 2.59. A K-walk CTA walks its rows' whole K, so if the GPU runs waves, the
last 64 gate+up CTAs run a full walk on an almost idle GPU: about 17% of the launch. Prediction:
µs per 1,000 rows drops by ~15% from 34,816 rows to 33,792 (2,112 CTAs, 4.0 waves) and rises
again at 35,840 (4.24). If it does, the fix is a grid of whole waves, not a faster loop; the real
row count is then timed with its last wave's row blocks in two K shares (KWConfig.tail). µs a call in one CUDA graph cycling >= 256 MB
of weight copies, the same config for every row count, the copy share measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (format, real n, k, row counts to time, multiples of ROW_PAD): about whole waves of the dispatched
# config's CTAs (gate+up: 3.76, 4.0, 4.12 (real), 4.24; qkv+z: 1.98, 2.5, 2.59 (real), 2.99)
CASES = [("q4_g64", 34816, 5120, [31744, 33792, 34816, 35840]),
         ("q5_g64", 16384, 5120, [12544, 15872, 16384, 18944])]
# at the real row count, the same config with its part-full last wave's row blocks in K shares
# (KWConfig.tail, tail_splits): gate+up's last 64 of 2,176 blocks (4 an SM), qkv+z's last 232 of 1,024 (3)
TAILS = {34816: [(64, 2), (128, 2)], 16384: [(232, 2), (100, 2)]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("wave_tail: needs a CUDA GPU")
        return 0
    import kw_bench as KB
    import quant_linear as QL

    from ninfer_plugins.quant_int import formats as IF
    from ninfer_plugins.quant_int import gemv_kw as KW
    from ninfer_plugins.quant_int import kernels as K

    copy_tbs, sms = QL.device_and_copy()
    rows = []
    for name, n_real, k, ns in CASES:
        bits = IF.FORMATS[name].bits
        cfg = K.pick_gemv(bits, args.m, n_real, k, sms)
        print(f"{name} {n_real}x{k} M={args.m}: {cfg.describe()}", flush=True)
        shapes = [(name, n, k) for n in ns]
        for _, n, _, p, nbytes, copies in KB.weight_copies(shapes, time.time(), 1e9):
            K.Workspace.get(p.device).reserve(*cfg.workspace(p))
            x = torch.randn(args.m, k, device="cuda", dtype=torch.bfloat16)
            ms = QL.graph_ms_per_call([lambda q=q: cfg.run(x, q) for q in copies])
            share = nbytes / (ms * 1e-3) / (copy_tbs * 1e12)
            print(f"  n={n:6d}: {ms * 1e3:7.2f} us, {ms * 1e3 / n * 1000:6.3f} us a 1000 rows, {share:6.1%} of copy",
                  flush=True)
            rows.append(dict(fmt=name, n=n, k=k, m=args.m, config=cfg.describe(), us=round(ms * 1e3, 2),
                             share=round(share, 4)))
            want = cfg.run(x, p)
            for tail, ts in TAILS.get(n, []):
                if not isinstance(cfg, KW.KWConfig):
                    print(f"    tail {tail}x{ts}: {cfg.describe()} is not a K-walk config", flush=True)
                    continue
                tcfg = dataclasses.replace(cfg, tail=tail, tail_splits=ts)
                if not KW.supports(p, tcfg):
                    print(f"    tail {tail}x{ts}: does not fit {cfg.describe()}", flush=True)
                    continue
                K.Workspace.get(p.device).reserve(*tcfg.workspace(p))
                err = float((tcfg.run(x, p).float() - want.float()).norm() / want.float().norm())
                ms = QL.graph_ms_per_call([lambda q=q: tcfg.run(x, q) for q in copies])
                share = nbytes / (ms * 1e-3) / (copy_tbs * 1e12)
                print(f"    {tcfg.describe()}: {ms * 1e3:7.2f} us, {share:6.1%} of copy, err vs no tail {err:.1e}",
                      flush=True)
                rows.append(dict(fmt=name, n=n, k=k, m=args.m, config=tcfg.describe(), us=round(ms * 1e3, 2),
                                 share=round(share, 4), err=err))
    QL.write_result(args.out, "wave_tail.json", dict(copy_tbs=copy_tbs, rows=rows, device=torch.cuda.get_device_name(0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
