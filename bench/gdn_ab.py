"""The GDN decode step with in_proj_a / in_proj_b inside it (NINFER_GDN_AB) against the two
launches it replaces (NINFER_GDN_AB=0), at the 27B's and the 35B-A3B's shapes, on the lent GPU:

    python3 bench/gdn_ab.py [--reps 30]

Per model, one CUDA graph holds a whole step's GDN layers (distinct weights and states per layer,
so L2 cannot hold them) as either the bf16 [a; b] matmul then the step ("split"), or the step
computing the gates itself. The fused output and new state are first checked against the split
path's (within a bf16 step: the fused gates stay fp32). Prints ms per replay and us per layer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels import graph_ms  # noqa: E402

from ninfer.kernels.triton import gdn_decode_step  # noqa: E402

DEV = "cuda"
BF = torch.bfloat16
# name: hidden, k heads, v heads, GDN layers
MODELS = {"27B": (5120, 16, 48, 48), "35B-A3B": (2048, 16, 32, 30)}
VARIANTS = [False, True]  # gates in the step


def layer(hid, hk, hv, d=128, m=1):
    """One GDN layer's random weights, state and inputs for m tokens (bench/gdn_columns.py: m > 1)."""
    conv = (2 * hk + hv) * d
    return dict(
        x=torch.randn(m, hid, dtype=BF, device=DEV),
        w_ab=torch.randn(2 * hv, hid, dtype=BF, device=DEV) * hid**-0.5,
        qkv=torch.randn(m, conv, dtype=BF, device=DEV),
        z=torch.randn(m, hv * d, dtype=BF, device=DEV),
        conv_weight=torch.randn(conv, 4, dtype=BF, device=DEV) * 0.5,
        conv_state=torch.randn(1, conv, 3, dtype=BF, device=DEV),
        A_log=torch.randn(hv, device=DEV) * 0.5,
        dt_bias=torch.randn(hv, device=DEV) * 0.5,
        state=torch.randn(1, hv, d, d, device=DEV) * 0.1,
        norm=torch.ones(d, dtype=BF, device=DEV),
    )


def step(L, hk, hv, variant, conv_state=None, state=None):
    conv_state = L["conv_state"] if conv_state is None else conv_state
    state = L["state"] if state is None else state
    kw = dict(num_k_heads=hk, head_k_dim=128, head_v_dim=128, z=L["z"], norm_weight=L["norm"])
    if not variant:
        a, b = F.linear(L["x"], L["w_ab"]).split(hv, dim=-1)
        return gdn_decode_step(L["qkv"], a, b, L["conv_weight"], conv_state, L["A_log"], L["dt_bias"], state, **kw)
    return gdn_decode_step(L["qkv"], None, None, L["conv_weight"], conv_state, L["A_log"], L["dt_bias"], state,
                           ab_input=(L["x"], L["w_ab"]), **kw)


def name(variant) -> str:
    return "gates in the step" if variant else "split (bf16 matmul + step)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    for model, (hid, hk, hv, n) in MODELS.items():
        layers = [layer(hid, hk, hv) for _ in range(n)]
        L = layers[0]
        ref_cs, ref_st = L["conv_state"].clone(), L["state"].clone()
        ref = step(L, hk, hv, False, ref_cs, ref_st)
        bad = []
        for v in VARIANTS[1:]:
            cs, st = L["conv_state"].clone(), L["state"].clone()
            o = step(L, hk, hv, v, cs, st)
            err = max((o.float() - ref.float()).abs().max().item(), (st - ref_st).abs().max().item(),
                      (cs.float() - ref_cs.float()).abs().max().item())
            if err > 4e-2:
                bad.append(f"{name(v)}: max error {err:.3g}")
        print(f"{model}: hidden {hid}, {n} GDN layers; outputs against split: {'all close' if not bad else bad}", flush=True)
        base = None
        for v in VARIANTS:
            ms = graph_ms(lambda v=v: [step(x, hk, hv, v) for x in layers], reps=args.reps)
            base = ms if base is None else base
            print(f"  {name(v):36s} {ms:7.4f} ms/replay  {ms / n * 1e3:6.2f} us/layer  "
                  f"{(ms - base) / n * 1e3:+6.2f} us/layer vs split", flush=True)
        layers = None  # free them before the next model (a del would leave the lambda a dangling name)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
