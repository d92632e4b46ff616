"""One quantized linear launched a few times, plainly, for Nsight Compute to read (next session's
limiter hunt: static instruction counts did not predict speed, BENCHMARKS.md "Decode GEMV").

    ncu --clock-control none -k regex:'_gemv_kernel|_qmm_kernel|_skinny' -s 3 -c 1 \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \\
        python3 bench/ncu_linear.py --scheme q5_g64 --n 17408 --k 5120 --m 1 --path gemv

--path: gemv (the CUDA-core GEMV, its tuned or default config), mma (the fused MMA kernel, its
tuned config), skinny (q4 only, quant_int/skinny.py's default), h2 (gemv_h2.py, --h2), tc
(gemv_tc.py, --tc), dispatch (kernels.launch as the engine calls it). Launches 5 times (ncu -s 3 -c 1 profiles the fourth) and checks the result
against dequantize-then-matmul in fp32, so a profile of a wrong kernel cannot pass unnoticed.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scheme", default="q4_g64")
    ap.add_argument("--n", type=int, default=17408)
    ap.add_argument("--k", type=int, default=5120)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--path", choices=("gemv", "mma", "skinny", "h2", "tc", "dispatch"), default="dispatch")
    ap.add_argument("--h2", default="32,8,4,4", help="f16x2 GEMV config: block_n,kbs,ctas,num_warps")
    ap.add_argument("--tc", default="4,4,4,4", help="tensor-core GEMV config: kb,stages,num_warps,ctas")
    args = ap.parse_args()

    from ninfer_plugins.quant_int import formats as F
    from ninfer_plugins.quant_int import gemv as G
    from ninfer_plugins.quant_int import kernels as K
    from ninfer_plugins.quant_int.linear import prepare_int
    from ninfer_plugins.quant_nvfp4 import formats as NF
    from ninfer_plugins.quant_nvfp4.kernels import prepare_nvfp4

    w = torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16)
    if args.scheme == "nvfp4":
        pk = NF.quantize(w)
        p, deq = prepare_nvfp4(pk), NF.dequantize(pk)
    else:
        pk = F.quantize(w, args.scheme)
        p, deq = prepare_int(pk), F.dequantize(pk)
    x = torch.randn(args.m, args.k, device="cuda", dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.path == "gemv":
        cfg = K.pick_gemv(p.fmt, min(args.m, 4), p.n, p.k, sms)
        if not isinstance(cfg, G.GemvConfig):
            cfg = G.default_config(p.fmt, p.n, p.k, sms)
        K.Workspace.get(x.device).reserve(*G.workspace_need(cfg, p.n, p.k))
        run, what = (lambda: G.launch(x, p, cfg)), cfg.describe()
    elif args.path == "mma":
        cfg = K.pick_config(p.fmt, args.m, p.n, p.k, sms)
        K.reserve_workspace(p)
        run, what = (lambda: K.launch(x, p, cfg)), cfg.describe()
    elif args.path == "skinny":
        from ninfer_plugins.quant_int import skinny as SK

        scfg = SK.default_config(p.n, p.k, sms)
        SK.reserve_workspace(p, scfg)
        run, what = (lambda: SK.launch(x, p, scfg)), str(scfg)
    elif args.path == "h2":
        from ninfer_plugins.quant_int import gemv_h2 as H2

        hcfg = H2.H2Config(*(int(v) for v in args.h2.split(",")))
        K.Workspace.get(x.device).reserve(*H2.workspace_need(p, hcfg))
        run, what = (lambda: H2.launch(x, p, hcfg)), hcfg.describe()
    elif args.path == "tc":
        from ninfer_plugins.quant_int import gemv_tc as TC

        tcfg = TC.TCConfig(*(int(v) for v in args.tc.split(",")))
        K.Workspace.get(x.device).reserve(*tcfg.workspace(p))
        run, what = (lambda: TC.launch(x, p, tcfg)), tcfg.describe()
    else:
        K.reserve_workspace(p)
        run, what = (lambda: K.launch(x, p)), "kernels.launch"
    for _ in range(5):
        y = run()
    torch.cuda.synchronize()
    ref = x.float() @ deq.T
    err = float((y.float() - ref).norm() / ref.norm())
    print(f"{args.scheme} {args.n}x{args.k} M={args.m} {args.path} ({what}): rel err {err:.2e}")
    return 0 if err < 6e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
