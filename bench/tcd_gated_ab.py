"""The 27B down projection (q5, 5120 x 17408) as the verify runs it: silu_mul then the dispatched
GEMV, against the SwiGLU folded into the GEMV (`TritonQuantLinear.apply_gated`: the f16x2 GEMV at
M = 1, the direct tensor-core GEMV where the dispatch picks it), at M = 1, 2, 4, 8.

    python3 bench/tcd_gated_ab.py

µs per projection inside one CUDA graph cycling >= 256 MB of weight copies (bench/quant_linear.py's
timer); the folded output against the unfolded one (relative error; the kernels differ).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gemv_tune as GT  # noqa: E402
import quant_linear as QL  # noqa: E402


def main() -> int:
    from ninfer_plugins.cuda_fast.ops import silu_mul
    from ninfer_plugins.quant_int import kernels as K
    from ninfer_plugins.quant_int.linear import TritonQuantLinear

    kern = TritonQuantLinear.__new__(TritonQuantLinear)
    scheme, n, k = "q5_g64", 5120, 17408
    ps, deq, one = GT.timing_copies(scheme, n, k)
    for p in ps:
        K.reserve_workspace(p)
    print(f"copy bandwidth {QL.copy_bandwidth():.2f} TB/s; {scheme} {n}x{k}, {one / 1e6:.1f} MB", flush=True)
    for m in (1, 2, 4, 8):
        gu = (torch.randn(m, 2 * k, device="cuda") * 2).bfloat16()
        cfg = K.pick_gemv(ps[0].fmt, m, n, k, ps[0].sm_count)
        plain = lambda p: K.launch(silu_mul(gu[:, :k], gu[:, k:]), p)  # noqa: E731
        folded = lambda p: kern.apply_gated(gu, p)  # noqa: E731
        if folded(ps[0]) is None:
            print(f"M={m}: no folded path for {cfg}", flush=True)
            continue
        err = float((folded(ps[0]).float() - plain(ps[0]).float()).norm() / plain(ps[0]).float().norm())
        t_plain = 1e3 * QL.graph_ms_per_call([lambda p=p: plain(p) for p in ps])
        t_fold = 1e3 * QL.graph_ms_per_call([lambda p=p: folded(p) for p in ps])
        print(f"M={m}: silu_mul + GEMV {t_plain:6.1f} µs, folded {t_fold:6.1f} µs ({cfg}), rel diff {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
