"""The GDN verify columns (`gdn_verify_columns`, M tokens of one sequence, every column's state
written) at the 27B's shapes (`--model 35b`: the 35B-A3B's), per value-column block and warp count, against the
M = 1 decode step:

    python3 bench/gdn_columns.py [--m 4] [--reps 30] [--variants 128:4,32:4,32:4:n,32:4:p] [--decode-variants 128:4,128:4:p]

One CUDA graph holds the 48 GDN layers of a step (distinct weights, states and columns per layer,
so the L2 holds none of them), the gates computed in the launch as the round does. A variant
BV:warps with BV < 128 splits each value head over 128 / BV programs and runs the gated RMSNorm as
a second launch (it needs the whole head), or with ":n" in the same launch (the last program of a
head normalizes it, NINFER_GDN_SPLIT_NORM=1); "p" in the suffix (":p", ":np") takes the delta rule's
paired reductions (NINFER_GDN_PAIRED=1), for the decode step's variants too; "a", the conv inputs
loaded a token ahead (NINFER_GDN_AHEAD=1); "r", the replay form the round uses by default (each token's
g, k and delta stored instead of its state: `replay=`); "c" (with "r"), the M tokens taken together
(NINFER_GDN_CHUNK=1, `_gdn_columns_chunk_kernel`). Every variant's output and columns are checked against
the first one's. Floor per layer: the slot's state read once (48 x 128 x 128 fp32 = 3.1 MB) and M
states written (12.6 MB at M = 4), at the copy rate.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gdn_ab  # noqa: E402
from kernels import graph_ms  # noqa: E402

from ninfer.kernels.triton import gdn_decode_step, gdn_verify_columns  # noqa: E402

DEV = "cuda"
BF = torch.bfloat16
# --model: (hidden, k heads, v heads, GDN layers); head dims 128 in both
SHAPES = {"27b": (5120, 16, 48, 48), "35b": (2048, 16, 32, 30)}
HID, HK, HV, LAYERS = SHAPES["27b"]  # main() sets them from --model
D = 128


def layer(m: int) -> dict:
    L = gdn_ab.layer(HID, HK, HV, D, m)
    conv = (2 * HK + HV) * D
    L.update(col_conv=torch.zeros(m, conv, 3, dtype=BF, device=DEV), col_state=torch.zeros(m, HV, D, D, device=DEV),
             slots=torch.zeros(1, dtype=torch.int32, device=DEV),
             replay=(torch.zeros(m, HV, device=DEV), torch.zeros(m, HK, D, device=DEV),
                     torch.zeros(m, HV, D, device=DEV)))
    return L


def columns(L: dict, m: int, bv: int, warps: int, norm_in: bool = False, paired: bool = False,
            ahead: bool = False, replay: bool = False) -> torch.Tensor:
    os.environ["NINFER_GDN_SPLIT_NORM"] = "1" if norm_in else "0"
    os.environ["NINFER_GDN_PAIRED"] = "1" if paired else "0"
    os.environ["NINFER_GDN_AHEAD"] = "1" if ahead else "0"
    os.environ["NINFER_GDN_CHUNK"] = "1" if replay == "c" else "0"
    return gdn_verify_columns(
        L["qkv"], None, None, L["conv_weight"], L["conv_state"], L["A_log"], L["dt_bias"], L["state"],
        L["col_conv"], L["col_state"], L["slots"], m=m, num_k_heads=HK, head_k_dim=D, head_v_dim=D, z=L["z"],
        norm_weight=L["norm"], block_v=bv, num_warps=warps, ab_input=(L["x"], L["w_ab"]),
        replay=L["replay"] if replay else None,
    )  # fmt: skip


def decode(L: dict, bv: int | None = None, warps: int | None = None, paired: bool = False) -> torch.Tensor:
    os.environ["NINFER_GDN_PAIRED"] = "1" if paired else "0"
    return gdn_decode_step(
        L["qkv"][:1], None, None, L["conv_weight"], L["conv_state"], L["A_log"], L["dt_bias"], L["state"],
        num_k_heads=HK, head_k_dim=D, head_v_dim=D, z=L["z"][:1], norm_weight=L["norm"], ab_input=(L["x"][:1], L["w_ab"]),
        block_v=bv, num_warps=warps,
    )  # fmt: skip


def parse(v: str) -> tuple[int, int, bool, bool, bool, bool]:
    """BV:warps[:flags] -> (BV, warps, norm in the launch, paired reductions, conv inputs ahead, replay);
    the flag c (chunked) is carried in `replay` as the string "c"."""
    bv, w, *flags = v.split(":")
    f = flags[0] if flags else ""
    return int(bv), int(w), "n" in f, "p" in f, "a" in f, ("c" if "c" in f else True) if "r" in f else False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--model", choices=sorted(SHAPES), default="27b",
                    help="the GDN shapes: the 27B's (48 v heads, 48 layers) or the 35B-A3B's (32, 30)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--variants", default="128:4,128:8,64:4,64:2,32:4,32:2,16:2,16:1")
    ap.add_argument("--decode-variants", default="128:4",
                    help="the M = 1 decode step's BV:warps (BV < 128: the norm as a second launch)")
    args = ap.parse_args()
    global HID, HK, HV, LAYERS
    HID, HK, HV, LAYERS = SHAPES[args.model]
    m = args.m
    # BV:warps[:flags]: n, the split heads' norm in the same launch (NINFER_GDN_SPLIT_NORM=1); p, the
    # paired reductions (NINFER_GDN_PAIRED=1); a, the conv inputs a token ahead (NINFER_GDN_AHEAD=1);
    # r, the replay form (compared with the first replay variant: its outputs and stored deltas)
    variants = [parse(v) for v in args.variants.split(",")]
    print(torch.cuda.get_device_name(), flush=True)
    layers = [layer(m) for _ in range(LAYERS)]
    floor_us = (HV * D * D * 4 * (1 + m)) / 4.2e12 * 1e6
    print(f"{args.model.upper()} GDN, {LAYERS} layers, M = {m}: floor {floor_us:.1f} us/layer (state read once, {m} written, "
          f"4.2 TB/s)", flush=True)
    L = layers[0]
    refs: dict[bool, tuple] = {}
    for bv, w, nin, pr, ah, rp in variants:
        L["col_state"].zero_()
        o = columns(L, m, bv, w, nin, pr, ah, rp).float()
        cs = (L["replay"][2] if rp else L["col_state"]).clone()
        if bool(rp) not in refs:
            refs[bool(rp)] = (o, cs)
            continue
        ref = refs[bool(rp)]
        err = max((o - ref[0]).abs().max().item(), (cs - ref[1]).abs().max().item())
        print(f"  BV {bv:3d} w{w}{' n' if nin else ''}{' p' if pr else ''}{' a' if ah else ''}{' r' if rp else ''}"
              f"{' c' if rp == 'c' else ''}: "
              f"max difference from the first variant of its form {err:.3g}" + ("" if err < 6e-2 else "  <-- MISMATCH"),
              flush=True)
    if len(refs) == 2:
        err = (refs[True][0] - refs[False][0]).abs().max().item()
        print(f"  replay against columns, outputs: max difference {err:.3g}" + ("" if err < 6e-2 else "  <-- MISMATCH"))
    # the decode step mutates its state: fine for timing
    for bv, w, _, pr, _, _ in [parse(v) for v in args.decode_variants.split(",")]:
        ms = graph_ms(lambda bv=bv, w=w, pr=pr: [decode(x, bv, w, pr) for x in layers], reps=args.reps)
        print(f"  decode step (M = 1) BV {bv:3d} w{w}{' p' if pr else '  '} {ms:7.4f} ms/replay  {ms / LAYERS * 1e3:6.2f} us/layer", flush=True)
    for bv, w, nin, pr, ah, rp in variants:
        flags = "".join(f" {c}" if on else "  " for c, on in (("n", nin), ("p", pr), ("a", ah), ("r", rp), ("c", rp == "c")))
        tag = f"BV {bv:3d} w{w}{flags}"
        try:
            ms = graph_ms(lambda bv=bv, w=w, nin=nin, pr=pr, ah=ah, rp=rp: [columns(x, m, bv, w, nin, pr, ah, rp)
                                                                          for x in layers], reps=args.reps)
        except Exception as exc:  # noqa: BLE001 - report and go on
            print(f"  columns {tag}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        us = ms / LAYERS * 1e3
        print(f"  columns {tag}   {ms:7.4f} ms/replay  {us:6.2f} us/layer  "
              f"({100 * floor_us / us:4.1f}% of floor)", flush=True)


if __name__ == "__main__":
    main()
