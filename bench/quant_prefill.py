"""Quantized prefill on one GPU, one call: the dequantize + cuBLAS path against the fused kernel.

    python bench/quant_prefill.py --out $OUT [--no-tests] [--formats q4_g64,nvfp4] [--quick]

1. Compiles the fused kernel's prefill variants in parallel processes (bench/quant_linear.py's
   prewarm), then `pytest -m gpu tests/plugins/quant_int/test_dequant.py` (OUT/gpu_tests.log).
2. Per format and linear shape of Qwen3.6/3.8-27B and Qwen3.6-35B-A3B (bench/quant_linear.py's
   SHAPES), at M = 1024 and 8192, in this one process: the fused kernel (kernels.launch, its
   default config), dequantize + cuBLAS (TritonQuantLinear.apply through dequant.matmul,
   dequantize included; the heads in row chunks) and bf16 cuBLAS on a bf16 weight of the shape;
   TFLOP/s = 2MNK / time, shares of bf16 cuBLAS. The dequantize kernel alone, once per shape:
   packed bytes read + bf16 written over time, share of the copy bandwidth of the same run.
3. Crossover: a few shapes at M = 64..512, fused against dequantize + cuBLAS (sets DEQUANT_MIN_M).
4. Dequantize configs (rows per program, warps) on the largest 27B matrix, every format.
5. The 27B's linears at prefill (every linear once, the head excluded: prefill computes logits
   for the last token only), per recipe: the sum of count x time per path at M = 8192 and 1024,
   and the arithmetic floor (dequant bytes / 4.2 TB/s + GEMM FLOPs / 790 TFLOP/s).

Writes OUT/results.json and OUT/summary.md; prints the summary last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quant_linear import SHAPES, _stride_facts, _warm_one, copy_bandwidth, cuda_ms, log, make_prepared, prepared_bytes, warm_items  # noqa: E402

FORMATS = ("q4_g64", "q5_g64", "q6_g64", "q8_g32", "nvfp4")
PREFILL_MS = (1024, 8192)
CROSS_MS = (64, 96, 128, 192, 256, 384, 512)
CROSS_CASES = (
    ("q4_g64", "27b.gate_proj|up_proj"),
    ("q4_g64", "27b.k_proj|v_proj"),
    ("q5_g64", "27b.q_proj"),
    ("q5_g64", "27b.down_proj"),
    ("q5_g64", "27b.o_proj|out_proj"),
    ("q8_g32", "35b.q_proj|in_proj_qkv"),
    ("nvfp4", "27b.gate_proj|up_proj"),
    ("q4_g64", "35b.expert.gate_up"),
)
# the arithmetic floor's rates (H200): copy bandwidth and dense bf16 cuBLAS, both measured before
FLOOR_TBPS, FLOOR_TFLOPS = 4.2, 790.0
BITS = {"q4_g64": 4.25, "q5_g64": 5.25, "q6_g64": 6.25, "q8_g32": 8.5, "nvfp4": 4.5}


def kernel_for(fmt: str):
    if fmt == "nvfp4":
        from ninfer_plugins.quant_nvfp4.kernels import nvfp4_kernels

        return nvfp4_kernels()[0]
    from ninfer_plugins.quant_int.linear import int_kernels

    return int_kernels(fmt)[0]


def reps_for(m: int, n: int, k: int) -> int:
    return 5 if 2 * m * n * k > 2e12 else 10


def model_linears_27b() -> list[tuple[str, int, int, dict[str, str]]]:
    """(name, n, k, scheme per recipe) of every 27B linear but the head, from the shape contract."""
    from ninfer_plugins.quant_int.recipes import recipe
    from ninfer_plugins.quant_nvfp4.plugin import _nvfp4_scheme_for
    from ninfer_plugins.qwen36_27b.plugin import SHAPE
    from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape

    shape = QwenHybridShape(**SHAPE)
    recipes = {"int4": recipe("int4", shape, None).scheme_for, "int8": recipe("int8", shape, None).scheme_for, "nvfp4": _nvfp4_scheme_for}
    return [(name, n, k, {r: f(name, n, k) for r, f in recipes.items()}) for name, n, k in shape.linear_shapes() if name != "lm_head"]


def floor_ms(linears, recipe: str, m: int, dequant_passes: int = 1) -> tuple[float, float]:
    """(GEMM ms at FLOOR_TFLOPS, dequant ms at FLOOR_TBPS) of every linear once at M = m."""
    flops = sum(2 * m * n * k for _, n, k, _ in linears)
    dq = sum(n * k * (BITS[s[recipe]] / 8 + 2) for _, n, k, s in linears if s[recipe] in BITS)
    return flops / FLOOR_TFLOPS / 1e9, dequant_passes * dq / FLOOR_TBPS / 1e9


DEQUANT_CONFIGS = ((32, 4), (64, 4), (64, 8), (128, 8), (256, 8))


def _warm(item) -> str:
    """Compile one variant in a worker: ("fused", quant_linear item) or ("dequant", fmt, k, cfg, fast)."""
    if item[0] == "fused":
        return _warm_one(item[1])
    _, fmt, k, cfg, fast = item
    sys.path.insert(0, str(ROOT))
    from ninfer_plugins.quant_int import dequant as D

    try:
        p = make_prepared(fmt, 256, k)
        D.dequantize_into(p, torch.empty((1, k), device="cuda", dtype=torch.bfloat16), 0, D.DequantConfig(*cfg), fast)
        torch.cuda.synchronize()
        return ""
    except Exception as e:
        return f"{item}: {type(e).__name__}: {str(e)[:200]}"


def prewarm_all(formats, workers: int = 14) -> float:
    """Compile every fused and dequantize variant the run launches, in parallel processes (Triton's
    on-disk cache then serves this process and the tests)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    from ninfer_plugins.quant_int import dequant as D

    t0 = time.time()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    nk = sorted({(n, k) for n, k, _ in SHAPES.values()})
    unique: dict = {}
    for fmt, k, cfg, fast in warm_items(formats, nk, (64, 1024), sms):
        unique.setdefault(("fused", fmt, cfg, fast, _stride_facts(fmt, k)), ("fused", (fmt, k, cfg, fast)))
    default = (D.DEFAULT_CONFIG.block_r, D.DEFAULT_CONFIG.num_warps)
    for fmt in formats:
        for _, k in nk:
            unique.setdefault(("dequant", fmt, default, True, _stride_facts(fmt, k)), ("dequant", fmt, k, default, True))
        for cfg in DEQUANT_CONFIGS:
            for fast in (True, False) if fmt == "nvfp4" else (True,):
                unique.setdefault(("dequant", fmt, cfg, fast, _stride_facts(fmt, 5120)), ("dequant", fmt, 5120, cfg, fast))
    items = list(unique.values())
    with cf.ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=mp.get_context("spawn")) as ex:
        errors = [e for e in ex.map(_warm, items) if e]
    log(f"prewarm: {len(items)} variants in {time.time() - t0:.0f} s" + (f"; errors: {errors[:3]}" if errors else ""))
    return round(time.time() - t0, 1)


def run_tests(out: Path, results: dict) -> int:
    t0 = time.time()
    try:
        import xdist  # noqa: F401

        par = ["-n", "4"]
    except ImportError:
        par = []
    cmd = [sys.executable, "-m", "pytest", "-q", *par, "-m", "gpu", "-p", "no:cacheprovider", "tests/plugins/quant_int/test_dequant.py"]
    with open(out / "gpu_tests.log", "w") as logf:  # streamed: a killed run still leaves its log
        proc = subprocess.run(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, text=True)
    text = (out / "gpu_tests.log").read_text()
    tail = (text.strip().splitlines() or ["(no output)"])[-1]
    results["gpu_tests"] = {"rc": proc.returncode, "summary": tail, "seconds": round(time.time() - t0, 1)}
    log(f"gpu tests: rc={proc.returncode} {tail} ({time.time() - t0:.0f} s)")
    if proc.returncode != 0:
        log("\n".join(l for l in text.splitlines() if "FAILED" in l or "Error" in l)[-3000:])
    return proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--quick", action="store_true", help="three 27B shapes, M = 1024 only")
    ap.add_argument("--formats", default=",".join(FORMATS))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    from ninfer_plugins.quant_int import dequant as D
    from ninfer_plugins.quant_int import kernels as K

    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "dequant_min_m": D.DEQUANT_MIN_M,
                     "chunk_bytes": D.CHUNK_BYTES, "dequant_config": list(vars(D.DEFAULT_CONFIG).values())}
    formats = [f for f in args.formats.split(",") if f]
    shapes = {k: SHAPES[k] for k in ("27b.gate_proj|up_proj", "27b.q_proj", "27b.down_proj")} if args.quick else SHAPES
    ms_list = (1024,) if args.quick else PREFILL_MS
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results["prewarm_s"] = prewarm_all(formats)

    if not args.no_tests:
        run_tests(out, results)

    import triton

    props = torch.cuda.get_device_properties(0)
    results["device"] = {"name": props.name, "sms": props.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__}
    bw = copy_bandwidth()
    results["copy_tbps"] = bw
    log(f"device: {props.name}, {sms} SMs, torch {torch.__version__}, triton {triton.__version__}; copy {bw:.2f} TB/s")

    # bf16 cuBLAS per shape and M
    xs = {(m, k): torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for m in set(ms_list) | set(CROSS_MS) for k in {k for _, k, _ in SHAPES.values()}}
    cublas: dict = results.setdefault("cublas_ms", {})
    for name, (n, k, _) in shapes.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in ms_list:
            cublas[f"{name}@{m}"] = cuda_ms(lambda: torch.nn.functional.linear(xs[(m, k)], w), reps=reps_for(m, n, k))
        del w
    torch.cuda.empty_cache()

    rows = results.setdefault("rows", [])
    for fmt in formats:
        kernel = kernel_for(fmt)
        for name, (n, k, _) in shapes.items():
            row = {"fmt": fmt, "shape": name, "n": n, "k": k}
            try:
                p = make_prepared(fmt, n, k)
                D.reserve(p)
                full = torch.empty((n, k), device="cuda", dtype=torch.bfloat16)
                dq = cuda_ms(lambda: D.dequantize_into(p, full), reps=10)
                moved = prepared_bytes(p) + 2 * n * k
                row.update(dequant_us=dq * 1e3, dequant_tbps=moved / dq / 1e9, dequant_share=moved / dq / 1e9 / bw)
                del full
                for m in ms_list:
                    x = xs[(m, k)]
                    reps = reps_for(m, n, k)
                    t_f = cuda_ms(lambda: K.launch(x, p), reps=reps)
                    t_d = cuda_ms(lambda: kernel.apply(x, p, dequant_min_m=0), reps=reps)
                    t_b = cublas[f"{name}@{m}"]
                    row[f"m{m}"] = {"fused_us": t_f * 1e3, "dequant_cublas_us": t_d * 1e3, "bf16_us": t_b * 1e3,
                                    "fused_share": t_b / t_f, "dequant_cublas_share": t_b / t_d,
                                    "dequant_cublas_tflops": 2 * m * n * k / t_d / 1e9, "bf16_tflops": 2 * m * n * k / t_b / 1e9}
                del p
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            torch.cuda.empty_cache()
            rows.append(row)
            log(line(row, ms_list))
            (out / "results.json").write_text(json.dumps(results, indent=1))

    if not args.quick:
        cross = results.setdefault("crossover", [])
        for fmt, name in CROSS_CASES:
            if fmt not in formats:
                continue
            n, k, _ = SHAPES[name]
            p = make_prepared(fmt, n, k)
            D.reserve(p)
            kernel = kernel_for(fmt)
            c = {"fmt": fmt, "shape": name, "m": {}}
            for m in CROSS_MS:
                x = xs[(m, k)]
                c["m"][m] = {"fused_us": cuda_ms(lambda: K.launch(x, p)) * 1e3,
                             "dequant_cublas_us": cuda_ms(lambda: kernel.apply(x, p, dequant_min_m=0)) * 1e3}
            # the smallest M from which dequantize + cuBLAS wins at every larger M of the sweep
            c["dequant_wins_from"] = None
            for m in reversed(CROSS_MS):
                if c["m"][m]["dequant_cublas_us"] >= c["m"][m]["fused_us"]:
                    break
                c["dequant_wins_from"] = m
            cross.append(c)
            log(f"crossover {fmt} {name}: " + " ".join(f"M={m} {v['fused_us']:.0f}/{v['dequant_cublas_us']:.0f}" for m, v in c["m"].items())
                + f" us (fused/dequant); dequant wins from {c['dequant_wins_from']}")
            del p
            torch.cuda.empty_cache()

        cfgs = results.setdefault("dequant_configs", [])
        n, k, _ = SHAPES["27b.gate_proj|up_proj"]
        full = torch.empty((n, k), device="cuda", dtype=torch.bfloat16)
        for fmt in formats:
            p = make_prepared(fmt, n, k)
            moved = prepared_bytes(p) + 2 * n * k
            for cfg in (D.DequantConfig(*c) for c in DEQUANT_CONFIGS):
                for fast in (True, False) if fmt == "nvfp4" else (True,):
                    try:
                        t = cuda_ms(lambda: D.dequantize_into(p, full, 0, cfg, fast), reps=10)
                        cfgs.append({"fmt": fmt, "block_r": cfg.block_r, "warps": cfg.num_warps, "fast": fast, "us": t * 1e3, "tbps": moved / t / 1e9})
                    except Exception as e:
                        cfgs.append({"fmt": fmt, "block_r": cfg.block_r, "warps": cfg.num_warps, "fast": fast, "error": str(e)[:200]})
            del p
        del full
        torch.cuda.empty_cache()

    results["model_27b"] = model_sum(results, ms_list)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    summary = summarize(results, bw, ms_list)
    (out / "summary.md").write_text(summary)
    log(summary)
    return 0


def line(row: dict, ms_list) -> str:
    if "error" in row:
        return f"{row['fmt']:7s} {row['shape']:28s} FAILED {row['error']}"
    parts = [f"{row['fmt']:7s} {row['shape']:28s} dequant {row['dequant_us']:7.1f} us {row['dequant_tbps']:.2f} TB/s ({row['dequant_share']:.0%})"]
    for m in ms_list:
        r = row[f"m{m}"]
        parts.append(f"M={m}: fused {r['fused_share']:.0%}, dequant+cuBLAS {r['dequant_cublas_share']:.0%} of cuBLAS ({r['dequant_cublas_tflops']:.0f} TFLOP/s)")
    return " | ".join(parts)


def model_sum(results: dict, ms_list) -> dict:
    """The 27B's linears (head excluded) once, per recipe and M: sum of count x measured time."""
    by = {(r["fmt"], r["n"], r["k"]): r for r in results.get("rows", []) if "error" not in r}
    out: dict = {}
    linears = model_linears_27b()
    for recipe in ("int4", "nvfp4", "int8"):
        for m in ms_list:
            tot = {"fused": 0.0, "dequant_cublas": 0.0, "bf16": 0.0}
            missing = False
            for name, n, k, schemes in linears:
                s = schemes[recipe]
                if s == "bf16":
                    continue  # a/b projections: bf16 in every recipe, the same on every path
                r = by.get((s, n, k))
                if r is None:
                    missing = True
                    break
                tot["fused"] += r[f"m{m}"]["fused_us"]
                tot["dequant_cublas"] += r[f"m{m}"]["dequant_cublas_us"]
                tot["bf16"] += r[f"m{m}"]["bf16_us"]
            if missing:
                continue
            gemm, dq = floor_ms([l for l in linears if l[3][recipe] != "bf16"], recipe, m)
            out[f"{recipe}@{m}"] = {k2: v / 1e3 for k2, v in tot.items()} | {"floor_gemm_ms": gemm, "floor_dequant_ms": dq}
    return out


def summarize(results: dict, bw: float, ms_list) -> str:
    lines = [
        f"copy {bw:.2f} TB/s; tests {results.get('gpu_tests', {}).get('summary', 'not run')}; DEQUANT_MIN_M {results['dequant_min_m']}; "
        f"chunk {results['chunk_bytes'] >> 20} MiB; dequant config {results['dequant_config']}"
    ]
    head = "| fmt | shape | n x k | dequant µs | dequant TB/s (share of copy) |"
    for m in ms_list:
        head += f" M={m} bf16 µs | fused µs (share) | dequant+cuBLAS µs (share) |"
    lines += [head, "|" + "---|" * (5 + 3 * len(ms_list))]
    for r in results.get("rows", []):
        if "error" in r:
            lines.append(f"| {r['fmt']} | {r['shape']} | error: {r['error'][:80]} |")
            continue
        s = f"| {r['fmt']} | {r['shape']} | {r['n']}x{r['k']} | {r['dequant_us']:.1f} | {r['dequant_tbps']:.2f} ({r['dequant_share']:.0%}) |"
        for m in ms_list:
            x = r[f"m{m}"]
            s += f" {x['bf16_us']:.0f} | {x['fused_us']:.0f} ({x['fused_share']:.0%}) | {x['dequant_cublas_us']:.0f} ({x['dequant_cublas_share']:.0%}) |"
        lines.append(s)
    for c in results.get("crossover", []):
        lines.append(f"crossover {c['fmt']} {c['shape']}: " + ", ".join(
            f"M={m} {v['fused_us']:.0f}/{v['dequant_cublas_us']:.0f}" for m, v in c["m"].items()) + f" µs fused/dequant; dequant wins from {c['dequant_wins_from']}")
    for c in results.get("dequant_configs", []):
        if "us" in c:
            lines.append(f"dequant config {c['fmt']} BR{c['block_r']} w{c['warps']}{'' if c['fast'] else ' plain'}: {c['us']:.1f} µs {c['tbps']:.2f} TB/s")
    for key, v in results.get("model_27b", {}).items():
        m = int(key.split("@")[1])
        tps = lambda ms: f"{ms:.1f} ms ({m / ms * 1e3:,.0f} tok/s)"  # noqa: E731
        floor = v["floor_gemm_ms"] + v["floor_dequant_ms"]
        lines.append(
            f"27B linears once (head excluded, quantized ones only), {key}: bf16 {tps(v['bf16'])}, fused {tps(v['fused'])}, "
            f"dequant+cuBLAS {tps(v['dequant_cublas'])}; floor {tps(floor)} (GEMM {v['floor_gemm_ms']:.1f} at {FLOOR_TFLOPS:.0f} TFLOP/s "
            f"+ dequant {v['floor_dequant_ms']:.1f} at {FLOOR_TBPS} TB/s)"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
