"""Does asking the L2 for a GEMV's weights during the kernel before it pay? (NINFER_L2PF, prefetch.py)

    python3 bench/l2_ahead.py [--out DIR] [--idle-us 0,3,6] [--budgets 0,8,16,32]

A decode step's GEMVs often follow a kernel that moves few bytes (the GDN step, the attention
split-K, the x-pairs launch). This stands one in: a one-CTA kernel that sleeps IDLE µs after
letting its dependents launch (PDL), then the decode GEMV the engine dispatches for the shape
(`kernels.launch`), one pair a weight copy, captured in one CUDA graph cycling >= 256 MB of
copies. Per shape, idle time and L2 budget: µs a pair, and the GEMV's share of it (the pair less
the stand-in alone). With budget 0 the GEMV's CTAs load one tile into registers before their wait
(as committed); with a budget they also ask the L2 for their next trips. Prediction: with 3-6 µs
idle, o_proj (20.6 MB, 7 µs at copy) gains up to the idle time; the big matrices gain what the
idle time moves at the copy rate (~12-25 MB), a share of their time; with 0 µs idle, nothing
(the previous GEMV holds the DRAM already) or a small loss (the extra instructions).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]

from ninfer.kernels.triton.launch import pdl_kwargs, pdl_prologue  # noqa: E402

# (format, N, K): the 27B's o_proj/out_proj (f16x2 GEMV), q5 down, q5 qkv+z and q4 gate+up
# (K-walk), the 35B's q8 out_proj
SHAPES = [("q5_g64", 5120, 6144), ("q5_g64", 5120, 17408), ("q5_g64", 16384, 5120), ("q4_g64", 34816, 5120),
          ("q8_g32", 2048, 4096)]


@triton.jit
def _idle(T, NS, PDL: tl.constexpr = False):
    """One CTA: lets its dependents launch, then sleeps about NS nanoseconds (globaltimer), then
    writes one word (the dependents' wait ends when it exits)."""
    pdl_prologue(PDL)
    t0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    t = t0
    while t - t0 < NS:
        tl.inline_asm_elementwise("nanosleep.u32 200; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(T, (t - t0).to(tl.int32))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--idle-us", default="0,3,6")
    ap.add_argument("--budgets", default="0,8,16,32", help="MB over the grid (NINFER_L2PF)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("l2_ahead: needs a CUDA GPU")
        return 0
    import quant_linear as QL

    from ninfer_plugins.quant_int import kernels as K

    dev = torch.device("cuda", 0)
    tword = torch.zeros(1, dtype=torch.int32, device=dev)
    idles = [float(v) for v in args.idle_us.split(",")]
    budgets = [float(v) for v in args.budgets.split(",")]
    rows = []
    for fmt, n, k in SHAPES:
        p = QL.make_prepared(fmt, n, k)
        nbytes = QL.prepared_bytes(p)
        copies = [p] + [QL.clone_prepared(p) for _ in range(max(1, -(-QL.L2_DEFEAT_BYTES // nbytes) - 1))]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        cfg = K.pick_gemv(p.fmt, 1, p.n, p.k, p.sm_count)
        K.Workspace.get(dev).reserve(*cfg.workspace(p))
        desc = getattr(cfg, "describe", lambda: str(cfg))()
        for idle in idles:
            ns = int(idle * 1000)
            alone = QL.graph_ms_per_call([lambda: _idle[(1,)](tword, ns, **pdl_kwargs(dev))] * 64) * 1e3
            line = f"{fmt} {n}x{k} ({nbytes / 1e6:.1f} MB, {desc}) idle {idle:g} us (stand-in alone {alone:.2f} us):"
            for mb in budgets:
                os.environ["NINFER_L2PF"] = f"{mb:g}"

                def pair(q):
                    _idle[(1,)](tword, ns, **pdl_kwargs(dev))
                    K.launch(x, q)

                us = QL.graph_ms_per_call([lambda q=q: pair(q) for q in copies]) * 1e3
                rows.append(dict(fmt=fmt, n=n, k=k, mb=nbytes / 1e6, config=desc, idle_us=idle, budget_mb=mb,
                                 pair_us=round(us, 2), alone_us=round(alone, 2), gemv_us=round(us - alone, 2)))
                line += f"  L2PF {mb:g}: {us:.2f} (GEMV {us - alone:.2f})"
            print(line, flush=True)
        os.environ.pop("NINFER_L2PF", None)
        del copies, p
        torch.cuda.empty_cache()
    QL.write_result(args.out, "l2_ahead.json", dict(rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
