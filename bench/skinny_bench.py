"""The q4 decode kernel of quant_int/skinny.py against the current dispatch, on the GPU.

    python bench/skinny_bench.py [--out $OUT] [--budget-s 110] [--shapes 17408x5120,...] [--ms 1,4,8,16]

For each 27B q4 shape and M: the engine's dispatch (`kernels.launch`, tuned MMA kernel or GEMV)
and a few skinny configs, each timed per launch inside one CUDA graph that cycles through enough
weight copies (>= 256 MB, bench/quant_linear.py's method) that the 60 MB L2 holds none; every
result checked against dequantize-then-matmul in fp32 (rel err < 6e-3). Prints µs and share of
the copy bandwidth measured in the same run; writes OUT/skinny.json. Compiles first, in parallel
processes, so the timed part starts warm; stops adding work when the budget is spent.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

T0 = time.time()
SHAPES = [(17408, 5120), (5120, 17408), (12288, 5120), (6144, 5120), (248320, 5120)]


def log(*a) -> None:
    print(f"[{time.time() - T0:5.1f} s]", *a, flush=True)


def configs(n: int, k: int, sms: int) -> list:
    """The default first, then a few alternatives (tile, warps, stages, splits)."""
    from ninfer_plugins.quant_int import skinny as SK

    out = [
        SK.default_config(n, k, sms),
        SK.SkinnyConfig(128, SK.split_for(n, k, 128, sms, 6), 4, 4),
        SK.SkinnyConfig(256, SK.split_for(n, k, 256, sms, 2), 8, 3),
        SK.SkinnyConfig(64, SK.split_for(n, k, 64, sms, 4), 4, 4),
    ]
    return list(dict.fromkeys(out))


def _warm_one(item: tuple) -> str:
    """Compile one (config, K) in a fresh process: Triton's disk cache serves the timed run (the
    key is the constexprs plus the divisibility of K and the strides, the same for every 27B K)."""
    cfg_t, k = item
    sys.path.insert(0, str(ROOT))
    try:
        from ninfer_plugins.quant_int import formats as F
        from ninfer_plugins.quant_int import skinny as SK
        from ninfer_plugins.quant_int.linear import prepare_int

        cfg = SK.SkinnyConfig(*cfg_t)
        p = prepare_int(F.quantize(torch.randn(256, k, device="cuda"), "q4_g64"))
        SK.reserve_workspace(p, cfg)
        SK.launch(torch.randn(1, k, device="cuda", dtype=torch.bfloat16), p, cfg)
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # reported, the timed run then fails loudly on that config
        return f"{item}: {type(e).__name__}: {str(e)[:300]}"


def prewarm(shapes: list, sms: int) -> None:
    from dataclasses import astuple

    items = sorted({(astuple(c), k) for n, k in shapes for c in configs(n, k, sms)})
    with cf.ProcessPoolExecutor(max_workers=min(12, len(items)), mp_context=mp.get_context("spawn")) as ex:
        errors = [e for e in ex.map(_warm_one, items) if e]
    log(f"prewarm: {len(items)} variants" + (f"; errors: {errors}" if errors else ""))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--budget-s", type=float, default=110.0)
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    ap.add_argument("--ms", default="1,4,8,16")
    ap.add_argument("--no-prewarm", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import quant_linear as QL
    import triton

    from ninfer_plugins.quant_int import formats as F
    from ninfer_plugins.quant_int import kernels as K
    from ninfer_plugins.quant_int import skinny as SK
    from ninfer_plugins.quant_int.linear import prepare_int

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    ms = [int(v) for v in args.ms.split(",") if v]
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    if not args.no_prewarm:
        prewarm(shapes, sms)
    bw = QL.copy_bandwidth()
    res: dict = {"device": props.name, "torch": torch.__version__, "triton": triton.__version__, "copy_tbps": bw, "rows": []}
    log(f"{props.name}, torch {torch.__version__}, Triton {triton.__version__}, copy bandwidth {bw:.2f} TB/s")
    log(f"{'shape':>12s} {'M':>3s} {'kernel':36s} {'us':>8s} {'share':>6s} {'rel err':>8s}")
    for n, k in shapes:
        if time.time() - T0 > args.budget_s:
            log(f"budget spent: {n}x{k} and later shapes skipped")
            break
        g = torch.Generator(device="cuda").manual_seed(n + k)
        pk = F.quantize(torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16), "q4_g64")
        p = prepare_int(pk)
        deq = F.dequantize(pk)
        del pk
        K.reserve_workspace(p)
        cands = configs(n, k, sms)
        for cfg in cands:
            SK.reserve_workspace(p, cfg)
        nb = QL.prepared_bytes(p)
        copies = [p] + [QL.clone_prepared(p) for _ in range(max(1, min(64, math.ceil(QL.L2_DEFEAT_BYTES / nb))) - 1)]
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
            ref = x.float() @ deq.T
            moved = nb + 2 * m * (n + k)
            runs = [("dispatch (kernels.launch)", lambda c, x=x: K.launch(x, c))]
            runs += [(cfg.describe(), lambda c, x=x, cfg=cfg: SK.launch(x, c, cfg)) for cfg in cands]
            for name, fn in runs:
                try:
                    err = rel_err(fn(p), ref)
                    ms_call = QL.graph_ms_per_call([lambda c=c, fn=fn: fn(c) for c in copies])
                except Exception as e:  # one failing config must not stop the others
                    log(f"{n}x{k} M={m} {name}: {type(e).__name__}: {str(e)[:300]}")
                    res["rows"].append({"n": n, "k": k, "m": m, "kernel": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                    continue
                share = moved / (ms_call * 1e-3) / 1e12 / bw
                ok = err < 6e-3
                res["rows"].append({"n": n, "k": k, "m": m, "kernel": name, "us": ms_call * 1e3, "share": share, "rel_err": err, "ok": ok})
                log(f"{n:>6d}x{k:<5d} {m:3d} {name:36s} {ms_call * 1e3:8.2f} {share:6.1%} {err:8.1e}{'' if ok else '  WRONG'}")
        del copies, p, deq
        torch.cuda.empty_cache()
        (out / "skinny.json").write_text(json.dumps(res, indent=1))
    summary(res)
    (out / "skinny.json").write_text(json.dumps(res, indent=1))
    log(f"wrote {out / 'skinny.json'}")
    return 0 if all(r.get("ok", False) for r in res["rows"]) else 1


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def summary(res: dict) -> None:
    """Best skinny config per (shape, M) against the dispatch."""
    best: dict = {}
    for r in res["rows"]:
        if "us" not in r or not r["ok"]:
            continue
        key = (r["n"], r["k"], r["m"])
        slot = best.setdefault(key, {})
        if r["kernel"].startswith("dispatch"):
            slot["base"] = r
        elif "skinny" not in slot or r["us"] < slot["skinny"]["us"]:
            slot["skinny"] = r
    log("summary: shape, M, dispatch us (share), best skinny us (share) [config], speed-up")
    for (n, k, m), s in sorted(best.items()):
        b, sk = s.get("base"), s.get("skinny")
        if b and sk:
            log(f"  {n}x{k} M={m}: {b['us']:.1f} ({b['share']:.0%})  {sk['us']:.1f} ({sk['share']:.0%}) [{sk['kernel']}]  x{b['us'] / sk['us']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
