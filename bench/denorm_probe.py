"""The subnormal int decode's error on the GPU, printed rather than asserted (for the thirty-first
session's failing test_gpu_subnormal_decode): for a few int shapes, K-walk configs and M, the
relative error of the K-walk without NINFER_DENORM=1, with it, and with it but NINFER_DENORM_ACC=0 against dequantize-then-matmul,
plain x, x with outliers 2^12 above its bulk, 2^6 above it on zeroed weight columns (as
test_gpu_subnormal_decode asks) and 2^12 on zeroed columns (past the decode, printed for the
record); and whether a repeat is bit-equal.

    python bench/denorm_probe.py [--shapes q4_g64:34816x5120,...] [--budget-s 100]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "plugins", "quant_int"))
from ninfer_plugins.quant_int import gemv_kw as KW
from ninfer_plugins.quant_int import kernels as K
from test_gemv_h2 import outlier_weights, rel_err, with_outliers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="q8_g32:12288x2048,q4_g64:34816x5120,q5_g64:5120x17408,q6_g64:2048x5120")
    ap.add_argument("--budget-s", type=float, default=100)
    a = ap.parse_args()
    t0 = time.time()
    cfgs = (KW.KWConfig(16, 128), KW.KWConfig(16, 128, 1, 4, 2), KW.KWConfig(16, 128, 1, 4, 2, inline=True))
    for spec in a.shapes.split(","):
        scheme, nk = spec.split(":")
        n, k = map(int, nk.split("x"))
        torch.manual_seed(n + k + 1)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        p, deq, p_out, deq_out = outlier_weights(w, scheme)
        for m in (1, 4):
            x = (torch.randn(m, k, device="cuda") * 2).to(torch.bfloat16)
            wild, _ = with_outliers(x, w)  # 2^12 above the bulk, on the weights as drawn
            mild, _ = with_outliers(x, w, size=128.0)  # 2^6 above it, on zero columns (p_out)
            for cfg in cfgs:
                if time.time() - t0 > a.budget_s:
                    print("out of budget", flush=True)
                    return
                if not KW.supports(p, cfg):
                    continue
                K.Workspace.get(x.device).reserve(*KW.workspace_need(p, cfg))
                row = []
                for xx, pp, ref in ((x, p, x.float() @ deq.T), (wild, p, wild.float() @ deq.T),
                                    (mild, p_out, mild.float() @ deq_out.T), (wild, p_out, wild.float() @ deq_out.T)):
                    errs = []
                    for dn in ("0", "1", "1 acc0"):
                        os.environ["NINFER_DENORM"] = dn[0]
                        os.environ["NINFER_DENORM_ACC"] = "0" if "acc0" in dn else "1"
                        try:
                            y = KW.launch(xx, pp, cfg)
                            same = torch.equal(y, KW.launch(xx, pp, cfg))
                            e = rel_err(y, ref)
                            bad = (y.float() - ref).abs().amax(0)
                            worst = int(bad.argmax())
                            errs.append(f"{e:.2e}{'' if same else '(rep!)'} worst col {worst} "
                                        f"y={float(y.float()[0, worst]):.3g} ref={float(ref[0, worst]):.3g}")
                        except Exception as exc:  # noqa: BLE001 (a probe: print and go on)
                            errs.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                    row.append(" | ".join(errs))
                os.environ.pop("NINFER_DENORM", None)
                os.environ.pop("NINFER_DENORM_ACC", None)
                print(f"{scheme} {n}x{k} M={m} {cfg.describe()}\n  plain x: {row[0]}\n  2^12: {row[1]}\n"
                      f"  2^6 on zero columns: {row[2]}\n  2^12 on zero columns (past the decode): {row[3]}", flush=True)


if __name__ == "__main__":
    main()
