"""One 35B-A3B MoE layer on the decode pair kernels (pair_gemv.py), int4 recipe (q4 gate_up, q5
down, q8 shared), at the real shapes, T tokens with random routing, a few launches for Nsight
Compute to read one of:

    ncu --set full --import-source yes -k regex:_pair_gate_up_kernel -s 3 -c 1 python3 bench/pair_ncu.py --t 4

(`bench/next_session.sh pairncu` runs T = 1 and 4 for both kernels and prints bench/ncu_summary.py
of each.) The verify's MoE at T = 4 is the 35B round's largest extra over its plain step: gate_up
25.1 and down 18.8 µs a layer against 8.9 and 8.5 at T = 1 (H100, PDL off; BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "plugins" / "moe_triton"))
from moe_cases import DEV, expert_bank, logits_hitting, shared_expert  # noqa: E402

from ninfer_plugins.moe_triton.moe import TritonMoe  # noqa: E402
from ninfer_plugins.moe_triton.router import route  # noqa: E402

E, H, I, TOP_K = 256, 2048, 512, 8

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--t", type=int, default=4)
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="toy shapes (8 experts, top 3), interpreted on the CPU")
    args = ap.parse_args()
    e, h, i, top_k = (8, 256, 128, 3) if args.smoke else (E, H, I, TOP_K)
    (w, _, _), (sw, _, sg) = expert_bank(e, h, i, "q4_g64", "q5_g64", seed=0), shared_expert(h, i, "q8_g32", seed=1)
    act = torch.bfloat16 if DEV == "cuda" else torch.float32
    moe = TritonMoe(fused_dtypes=(act,))
    x = torch.randn(args.t, h, device=DEV).to(torch.bfloat16).to(act)
    if not moe.takes_pairs(args.t, w, sw):
        sys.exit(f"the pair kernels do not take T = {args.t}")
    for i in range(args.launches):
        r = route(logits_hitting(args.t, e, seed=i), top_k, x=x, shared_gate_weight=sg)
        moe.run(x, r, w, sw)
    if DEV == "cuda":
        torch.cuda.synchronize()
    print("done")
