"""Waves of every dense decode/verify kernel at the 27B's shapes, without a GPU: each kernel of
bench/compile_sm90_dense.py compiled for sm_90, its registers and shared memory read from the
cubin, how many of its programs an SM holds, and how many waves its grid takes on 132 SMs.

    /tmp/t36/bin/python bench/occupancy.py [--sms 132] [--all]

Why: a grid sized to "fill the GPU" by a constant goes to two waves when the kernel's registers
or shared memory grow. The split-K attention at T = 4 did: 150 registers, one program an SM, 264
programs, twice the T = 1 time for the same bytes (BENCHMARKS.md, nineteenth run). A kernel whose
last wave is less than half full, or whose grid leaves SMs idle, is flagged; the figures are
estimates (registers in the warp's units of 256 out of 64 K, shared memory plus 1 KB out of 228 KB,
2,048 threads an SM), not measurements. Grids given as functions are not counted. Run it under the
H200's Triton (3.6), as compile_sm90_dense.py says.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compile_sm90_dense as CD  # noqa: E402  (installs the compile-only driver)
import skinny_sass as S  # noqa: E402


def resident(regs: int, smem: int, num_warps: int) -> int:
    """Programs of a kernel one sm_90 SM holds at once."""
    by_regs = 65536 // (math.ceil(regs * 32 / 256) * 256 * num_warps)
    by_smem = 233472 // (smem + 1024) if smem else 32
    return max(0, min(by_regs, by_smem, 2048 // (32 * num_warps), 32))


# the 27B's decode GEMV shapes (fmt, n, k): gate+up, down, qkv+z, q+v, o_proj, k_proj, the head, the
# MTP shortlist head
GEMVS = [(4, 34816, 5120), (5, 5120, 17408), (5, 16384, 5120), (5, 13312, 5120), (5, 5120, 6144), (4, 1024, 5120),
         (6, 248320, 5120), (4, 131072, 5120)]


def dispatched_cases():
    """The decode GEMVs as the engine dispatches them (the K-walk and tensor-core K-walk tables on)
    at M = 1 and 4, at the 27B's real shapes."""
    import os

    import torch

    from ninfer_plugins.quant_int import gemv_tkw as TKW
    from ninfer_plugins.quant_int import kernels as K

    TKW.COMPILE_ONLY = True  # launch the Gluon kernels on CPU tensors (compile only)

    os.environ.pop("NINFER_KW", None)  # compile_sm90_dense turns the tables off for its f16x2 cases
    os.environ.pop("NINFER_TKW", None)
    for fmt, n, k in GEMVS:
        p = S.empty_prepared(fmt, n, k)
        for m in (1, 4):
            cfg = K.pick_gemv(fmt, m, n, k, 132)
            if cfg is None:
                continue
            K.Workspace.get(p.device).reserve(*cfg.workspace(p))
            yield (f"dispatched q{fmt} {n}x{k} M={m} {cfg.describe()}",
                   lambda p=p, k=k, m=m, cfg=cfg: cfg.run(torch.empty(m, k, dtype=torch.bfloat16), p))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--all", action="store_true", help="every kernel, not only the flagged ones")
    args = ap.parse_args()
    CD.L.pdl_enabled = lambda device: False
    print(f"{'case / kernel':72s} {'regs':>5s} {'smem':>7s} {'warps':>5s} {'/SM':>4s} {'grid':>7s} {'waves':>6s}  note")
    import itertools

    for name, run in itertools.chain(CD.cases(), dispatched_cases()):
        before = len(S._compiled)
        try:
            run()
        except Exception as e:  # noqa: BLE001 - reported, the sweep goes on
            print(f"{name}: did not compile: {type(e).__name__}: {str(e)[:100]}")
            continue
        for kernel, grid in zip(S._compiled[before:], S._grids[before:]):
            regs, _, smem = S.resources(kernel)
            warps = kernel.metadata.num_warps
            per_sm = resident(regs, smem, warps)
            if grid is None or per_sm == 0:
                continue
            ctas = math.prod(grid)
            slots = per_sm * args.sms
            waves = ctas / slots
            full = math.ceil(waves)
            last = ctas - (full - 1) * slots
            note = ""
            if ctas < args.sms:
                note = f"{args.sms - ctas} SMs idle"
            elif 1 < full <= 4 and last < slots / 2:
                note = f"last wave {100 * last / slots:.0f}% full"
            if note or args.all:
                print(f"{(name + ' / ' + kernel.name)[:72]:72s} {regs:5d} {smem:7d} {warps:5d} {per_sm:4d} {ctas:7d} "
                      f"{waves:6.2f}  {note}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
