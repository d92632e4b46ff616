"""Decode GEMV (M = 1 and 4) on the GPU: the CUDA-core GEMV's candidates against the MMA kernel.

    python bench/gemv_tune.py [--out DIR] [--budget-s 240] [--formats q4_g64,nvfp4] [--no-tests]

1. `pytest -m gpu tests/plugins/quant_int/test_gemv.py` (correctness of every candidate family);
2. the copy bandwidth (bytes read + written) measured in this run;
3. per format and linear shape of the 27B and 35B-A3B (bench/quant_linear.py's SHAPES): the MMA
   kernel's tuned config and every GEMV candidate at M = 1 (time per launch inside one CUDA graph
   cycling through >= 256 MB of weight copies, so the 60 MB L2 holds none), then the best three
   GEMV configs and the MMA kernel at M = 4; the winner is checked against the fp32 reference;
4. OUT/gemv.json, OUT/tuned_gemv.py (the TUNED_GEMV entries: the GEMV config where it beat the MMA
   kernel, () where it did not) and a table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import quant_linear as QL  # noqa: E402

T0 = time.time()
FORMAT_IDS = {"q4_g64": 4, "q5_g64": 5, "q6_g64": 6, "q8_g32": 8, "nvfp4": 16}
BASE = [(16, 2, 2), (16, 4, 4), (32, 2, 4), (32, 4, 4), (32, 1, 2), (64, 2, 4), (64, 4, 8)]


def log(*a):
    print(*a, flush=True)


def build(scheme: str, n: int, k: int, copies: int):
    from ninfer_plugins.quant_int import formats as F
    from ninfer_plugins.quant_int.linear import prepare_int
    from ninfer_plugins.quant_nvfp4 import formats as NF
    from ninfer_plugins.quant_nvfp4.kernels import prepare_nvfp4

    out = []
    for c in range(copies):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        if scheme == "nvfp4":
            pk = NF.quantize(w)
            p = prepare_nvfp4(pk)
            deq = NF.dequantize(pk) if c == 0 else None
        else:
            pk = F.quantize(w, scheme)
            p = prepare_int(pk)
            deq = F.dequantize(pk) if c == 0 else None
        out.append((p, deq))
        del w, pk
    return out


def timing_copies(scheme: str, n: int, k: int):
    """(prepared copies, fp32 dequantized first copy, bytes of one copy): enough copies of an
    [n, k] weight that cycling through them defeats the L2 (QL.L2_DEFEAT_BYTES, 2..256)."""
    first = build(scheme, n, k, 1)
    one = packed_bytes(first[0][0])
    copies = max(2, min(256, math.ceil(QL.L2_DEFEAT_BYTES / one)))
    built = first + build(scheme, n, k, copies - 1)
    return [p for p, _ in built], built[0][1], one


def write_tuned(path: Path, table: str, tuned: dict) -> None:
    """A tuned-table update (`TABLE.update({...})`) to paste into quant_int/tuned.py."""
    lines = [f"{table}.update({{"] + [f"    {key!r}: {val!r}," for key, val in sorted(tuned.items())] + ["})"]
    path.write_text("\n".join(lines) + "\n")


def packed_bytes(p) -> int:
    b = p.qweight[: p.n].numel() * p.qweight.element_size() + p.scales[: p.n].numel() * p.scales.element_size()
    if p.qhigh is not None:
        b += p.qhigh[: p.n].numel()
    if p.gscale is not None:
        b += 4 * p.n
    return b


def splits_for(n: int, k: int, bn: int, kb: int, sms: int) -> list[int]:
    tiles = -(-n // bn)
    n_kb = -(-k // 128)
    out = set()
    for per_sm in (2, 4, 8):
        s = max(1, 2 ** round(math.log2(max(1.0, per_sm * sms / tiles))))
        out.add(min(s, max(1, n_kb // kb)))
    return sorted(out)


def rank(time_fn, m: int, cfgs, times: dict, on_error=None) -> list:
    """Time each config at M = m (µs) into times[cfg.describe()]; the (µs, cfg) pairs, fastest
    first. on_error(cfg, exc): a config that fails is reported and left out; None: it raises."""
    out = []
    for cfg in cfgs:
        try:
            us = time_fn(m, cfg)
        except Exception as exc:  # noqa: BLE001 - the caller decides (on_error) whether this is fatal
            if on_error is None:
                raise
            on_error(cfg, exc)
            continue
        times[cfg.describe()] = us
        out.append((us, cfg))
    return sorted(out, key=lambda t: t[0])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "bench_out")))
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--formats", default="q4_g64,q5_g64,nvfp4,q6_g64,q8_g32")
    ap.add_argument("--shapes", default="", help="comma-separated names of bench/quant_linear.py SHAPES (default all but the heads)")
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--pairs", default="", help="format:shape,... (shapes of SHAPES or MERGED_SHAPES); replaces --formats/--shapes")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tests = "skipped"
    if not args.no_tests:
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-x", "tests/plugins/quant_int/test_gemv.py"]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)
            (out / "gemv_tests.log").write_text(proc.stdout + proc.stderr)
            tests = f"rc={proc.returncode}: " + ([ln for ln in proc.stdout.splitlines() if ln.strip()] or [""])[-1]
        except subprocess.TimeoutExpired:
            tests = "timeout after 150 s"
        log("tests:", tests)

    from ninfer_plugins.quant_int import gemv as G
    from ninfer_plugins.quant_int import kernels as K

    bw = QL.copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    log(f"copy bandwidth {bw:.2f} TB/s, {sms} SMs")
    names = [s for s in args.shapes.split(",") if s] or [s for s in QL.SHAPES if "lm_head" not in s]
    pairs = [tuple(p.split(":", 1)) for p in args.pairs.split(",") if p] or [(f, n) for f in args.formats.split(",") for n in names]
    shapes = {**QL.SHAPES, **QL.MERGED_SHAPES}
    results, tuned, skipped = [], {}, []
    for scheme, name in pairs:
        fmt = FORMAT_IDS[scheme]
        if True:
            if time.time() - T0 > args.budget_s:
                skipped.append(f"{scheme} {name}")
                continue
            n, k, _ = shapes[name]
            ps, deq, one = timing_copies(scheme, n, k)

            def time_cfg(m: int, cfg) -> float:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                if cfg is None:
                    mcfg = K.pick_config(fmt, m, n, k, sms)
                    for p in ps:
                        K.reserve_workspace(p)
                    calls = [lambda p=p: K.launch(x, p, mcfg) for p in ps]
                else:
                    K.Workspace.get(x.device).reserve(*G.workspace_need(cfg, n, k))
                    calls = [lambda p=p: G.launch(x, p, cfg) for p in ps]
                return 1e3 * QL.graph_ms_per_call(calls)  # µs

            row = {"format": scheme, "shape": name, "n": n, "k": k, "bytes": one, "m1": {}, "m4": {}}
            try:
                mma1 = time_cfg(1, None)
                row["m1"]["mma"] = mma1
                cfgs = [G.GemvConfig(bn, kb, s, nw) for bn, kb, nw in BASE for s in splits_for(n, k, bn, kb, sms)]
                cands = rank(time_cfg, 1, cfgs, row["m1"], lambda cfg, exc: log(
                    f"  {scheme} {name} {cfg.describe()}: {type(exc).__name__}: {str(exc)[:120]}"))
                mma4 = time_cfg(4, None)
                row["m4"]["mma"] = mma4
                best4 = rank(time_cfg, 4, [cfg for _, cfg in cands[:3]], row["m4"])
                g1, c1 = cands[0]
                g4, c4 = best4[0] if best4 else (math.inf, None)
                # the winner must be right before it is recorded
                for m, cfg in ((1, c1), (4, c4)):
                    if cfg is None:
                        continue
                    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                    err = float((G.launch(x, ps[0], cfg).float() - x.float() @ deq.T).norm() / (x.float() @ deq.T).norm())
                    row[f"err_m{m}"] = err
                    if err > 6e-3:
                        raise AssertionError(f"{cfg.describe()} rel err {err:.2e} at M={m}")
                tuned[(fmt, n, k, "m1")] = (c1.block_n, c1.kb, c1.split_k, c1.num_warps, c1.num_stages) if g1 < mma1 else ()
                tuned[(fmt, n, k, "m4")] = (c4.block_n, c4.kb, c4.split_k, c4.num_warps, c4.num_stages) if c4 and g4 < mma4 else ()
                row.update(best_m1=c1.describe(), gemv_m1=g1, gemv_m4=g4, best_m4=c4.describe() if c4 else None,
                           gemv_m1_share=one / (g1 * 1e-6) / (bw * 1e12), mma_m1_share=one / (mma1 * 1e-6) / (bw * 1e12))
                log(f"{scheme:7s} {name:28s} M=1 mma {mma1:7.1f} µs gemv {g1:7.1f} µs ({100 * row['gemv_m1_share']:4.1f}% of copy, "
                    f"{c1.describe()}) | M=4 mma {mma4:7.1f} gemv {g4:7.1f}  [t={time.time() - T0:.0f}s]")
            except Exception as exc:  # noqa: BLE001 - keep the other shapes
                row["error"] = f"{type(exc).__name__}: {exc}"
                log(f"{scheme} {name}: ERROR {row['error'][:300]}")
            results.append(row)
            del ps, deq
            torch.cuda.empty_cache()

    (out / "gemv.json").write_text(json.dumps({"copy_tbs": bw, "tests": tests, "skipped": skipped, "rows": results}, indent=1))
    write_tuned(out / "tuned_gemv.py", "TUNED_GEMV", tuned)
    log(f"\n=== GEMV vs MMA, M=1 and M=4 (copy {bw:.2f} TB/s; {time.time() - T0:.0f} s) ===\ntests: {tests}")
    log(f"{'format':7s} {'shape':28s} {'MB':>6s} {'mma1 µs':>8s} {'gemv1 µs':>8s} {'share':>6s} {'mma4':>7s} {'gemv4':>7s}  best M=1")
    for r in results:
        if "error" in r:
            log(f"{r['format']:7s} {r['shape']:28s} ERROR {r['error'][:100]}")
            continue
        log(f"{r['format']:7s} {r['shape']:28s} {r['bytes'] / 1e6:6.1f} {r['m1']['mma']:8.1f} {r['gemv_m1']:8.1f} "
            f"{100 * r['gemv_m1_share']:5.1f}% {r['m4']['mma']:7.1f} {r['gemv_m4']:7.1f}  {r['best_m1']}")
    if skipped:
        log(f"skipped (budget): {len(skipped)}: {', '.join(skipped[:20])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
