"""Quantized linear kernels on one GPU, one call: GPU tests, then the microbenchmark.

    python bench/quant_linear.py --out $OUT [--no-tests] [--quick] [--formats q4_g64,nvfp4]

1. `pytest -m gpu` for the two quantization plugins (log in OUT/gpu_tests.log).
2. Ceilings measured in the same run: device-to-device copy bandwidth (bytes read + written) and
   bf16 cuBLAS (torch.nn.functional.linear) at M = 1024 for every shape.
3. Every linear shape of Qwen3.6/3.8-27B and Qwen3.6-35B-A3B, every format, M = 1, 4, 8, 16 (time
   per launch inside a CUDA graph that cycles through enough weight copies to defeat the 60 MB
   L2; bytes = packed weight + scales + x + y; share of the copy bandwidth) and M = 1024 (TFLOP/s,
   share of bf16 cuBLAS on the same shape).
4. torch's own int4 kernel (torch._weight_int4pack_mm, group 128) and bf16 cuBLAS at M = 1.
5. Per (format, shape) every candidate config of `candidates` at M = 1, 16 and 1024 (the default
   of `pick_config` first); the table reports the best with its config (the defaults are then set
   from these winners) and the default's own time.

Writes OUT/results.json and OUT/summary.md; prints the summary last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

SHAPES = {
    # name: (n, k, count per model) -- count weights the decode-step aggregate
    "27b.q_proj": (12288, 5120, 16),
    "27b.k_proj|v_proj": (1024, 5120, 32),
    "27b.o_proj|out_proj": (5120, 6144, 64),
    "27b.in_proj_qkv": (10240, 5120, 48),
    "27b.in_proj_z": (6144, 5120, 48),
    "27b.gate_proj|up_proj": (17408, 5120, 128),
    "27b.down_proj": (5120, 17408, 64),
    "27b.lm_head": (248320, 5120, 1),
    "35b.q_proj|in_proj_qkv": (8192, 2048, 40),
    "35b.k_proj|v_proj": (512, 2048, 20),
    "35b.o_proj|out_proj": (2048, 4096, 40),
    "35b.in_proj_z": (4096, 2048, 30),
    "35b.expert.gate_up": (1024, 2048, 320),  # 8 routed experts x 40 layers per token
    "35b.expert.down|shared.down": (2048, 512, 360),
    "35b.shared.gate|up": (512, 2048, 80),
    "35b.lm_head": (248320, 2048, 1),
}
# shapes that exist only after linear.merge_rows stacks same-scheme projections (timed by
# bench/gemv_tune.py --pairs; not in SHAPES, whose counts would then hold their rows twice)
MERGED_SHAPES = {
    "27b.gate_up_merged": (34816, 5120, 64),  # q4 in --quant int4
    "27b.in_proj_qkvz": (16384, 5120, 48),  # q5
    "27b.q_v_merged": (13312, 5120, 16),  # q5 (k_proj is q4)
    "35b.in_proj_qkvz": (12288, 2048, 30),  # q8 in --quant int4 (qkv 8192 + z 4096)
    "35b.qkv_merged": (9216, 2048, 10),  # q8: q with its gate 8192, k 512, v 512
}
# the speculative round's drafter (--spec mtp --lm-head-draft; the MTP layer is q8, spec 4.4): its
# own merged shapes and the shortlist head; gate_up / down / o_proj share the 27B's shapes above
DRAFT_SHAPES = {
    "27b.mtp.qkv_merged": (14336, 5120, 1),  # q|gate 12288, k 1024, v 1024
    "27b.mtp.fc": (5120, 10240, 1),
    "27b.shortlist_head": (131072, 5120, 1),  # q4
}
BIG_27B = ("27b.gate_proj|up_proj", "27b.down_proj", "27b.q_proj", "27b.in_proj_qkv", "27b.lm_head")
FORMATS = ("q4_g64", "q5_g64", "q6_g64", "q8_g32", "nvfp4")
DECODE_M = (1, 4, 8, 16)
PREFILL_M = 1024
L2_DEFEAT_BYTES = 256 << 20  # > 4x the 60 MB L2


def log(*a):
    print(*a, flush=True)


def cuda_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def graph_ms_per_call(calls: list, reps: int = 10) -> float:
    """Median time of one call, the calls captured back to back in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    ms = cuda_ms(g.replay, reps=reps, warmup=2)
    del g
    return ms / len(calls)


# --- ceilings ------------------------------------------------------------------------------------


def write_result(out: str | None, name: str, data: dict) -> None:
    """A bench script's JSON result into the folder `out` (made if needed); nothing without one."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(json.dumps(data, indent=1))


def device_and_copy() -> tuple[float, int]:
    """(copy bandwidth TB/s, SM count) of this GPU, printed as the bench scripts' first line."""
    copy_tbs = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy bandwidth {copy_tbs:.3f} TB/s, {sms} SMs, {torch.cuda.get_device_name(0)}", flush=True)
    return copy_tbs, sms


def copy_bandwidth() -> float:
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_ms(lambda: dst.copy_(src), reps=30)
    del src, dst
    return 2 * n / ms / 1e9  # TB/s


def cublas_prefill_tflops(n: int, k: int, m: int = PREFILL_M) -> float:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ms = cuda_ms(lambda: torch.nn.functional.linear(x, w), reps=10)
    del w, x
    return 2 * m * n * k / ms / 1e9


def cublas_gemv_ms(n: int, k: int) -> tuple[float, int]:
    bytes_w = n * k * 2
    copies = max(2, min(32, math.ceil(L2_DEFEAT_BYTES / bytes_w)))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    ms = graph_ms_per_call([lambda w=w: torch.nn.functional.linear(x, w) for w in ws])
    del ws
    return ms, bytes_w + 2 * k + 2 * n


def torch_int4_ms(n: int, k: int) -> tuple[float, int] | str:
    try:
        group = 128
        copies_needed = max(2, min(64, math.ceil(L2_DEFEAT_BYTES / (n * k // 2))))
        packs = []
        for _ in range(copies_needed):
            q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
            packs.append(torch._convert_weight_to_int4pack(q, 8))
        sz = torch.randn(k // group, n, 2, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ms = graph_ms_per_call([lambda p=p: torch._weight_int4pack_mm(x, p, group, sz) for p in packs])
        nbytes = n * k // 2 + sz.numel() * 2 + 2 * k + 2 * n
        del packs
        return ms, nbytes
    except Exception as e:  # an API change in torch must not stop the campaign
        return f"{type(e).__name__}: {e}"[:200]


# --- ours ------------------------------------------------------------------------------------------


def parse_shapes(text: str) -> list[tuple[str, int, int]]:
    """"nvfp4:34816x5120,q4_g64:5120x17408" -> [(format, N, K), ...] (the benches' --shapes)."""
    out = []
    for item in text.split(","):
        fmt, nk = item.split(":")
        n, k = nk.split("x")
        out.append((fmt, int(n), int(k)))
    return out


def make_prepared(fmt: str, n: int, k: int):
    from ninfer_plugins.quant_int import formats as IF
    from ninfer_plugins.quant_int.linear import prepare_int
    from ninfer_plugins.quant_nvfp4 import formats as NF
    from ninfer_plugins.quant_nvfp4.kernels import prepare_nvfp4

    g = torch.Generator(device="cuda").manual_seed(n * 7 + k)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    if fmt == "nvfp4":
        p = prepare_nvfp4(NF.quantize(w))
    else:
        p = prepare_int(IF.quantize(w, fmt))
    del w
    return p


def prepared_bytes(p) -> int:
    ts = [p.qweight, p.scales] + [t for t in (p.qhigh, p.gscale) if t is not None]
    return sum(t.numel() * t.element_size() for t in ts)


def clone_prepared(p):
    from dataclasses import replace

    return replace(
        p,
        qweight=p.qweight.clone(),
        scales=p.scales.clone(),
        qhigh=None if p.qhigh is None else p.qhigh.clone(),
        gscale=None if p.gscale is None else p.gscale.clone(),
    )


def bench_decode(p, copies: list, m: int, cfg=None) -> float:
    from ninfer_plugins.quant_int import kernels as K

    x = torch.randn(m, p.k, device="cuda", dtype=torch.bfloat16)
    return graph_ms_per_call([lambda c=c: K.launch(x, c, cfg) for c in copies])


def bench_prefill(p, m: int, cfg=None) -> float:
    from ninfer_plugins.quant_int import kernels as K

    x = torch.randn(m, p.k, device="cuda", dtype=torch.bfloat16)
    return cuda_ms(lambda: K.launch(x, p, cfg), reps=10)


FMT_ID = {"q4_g64": 4, "q5_g64": 5, "q6_g64": 6, "q8_g32": 8, "nvfp4": 16}


def _stride_facts(fmt: str, k: int) -> tuple[bool, ...]:
    """Which int arguments are multiples of 16: Triton compiles one variant per pattern."""
    kp = -(-k // 128) * 128
    w = kp if fmt == "q8_g32" else kp // 2
    h = {"q5_g64": kp // 8, "q6_g64": kp // 4}.get(fmt, w)
    sc = {"q8_g32": kp // 32, "nvfp4": kp // 16}.get(fmt, kp // 64)
    return tuple(v % 16 == 0 for v in (k, w, h, sc))


def warm_items(formats, ks_by_fmt, ms, sms: int, extra_cfgs=(), fast_values=(True,)) -> list:
    """One (fmt, k, config, fast) per distinct compiled variant the run will launch."""
    from ninfer_plugins.quant_int import kernels as K

    seen, items = set(), []
    for fmt in formats:
        for n, k in ks_by_fmt:
            cfgs = [K.pick_config(FMT_ID[fmt], m, n, k, sms) for m in ms] + list(extra_cfgs)
            for cfg in cfgs:
                split, kb_step, _ = K.resolve_split(cfg, k)
                pf = int(bool(cfg.prefetch) and fmt != "nvfp4" and not cfg.scale_w and kb_step == 1)
                for fast in fast_values:
                    key = (fmt, cfg.block_n, cfg.block_m, split, kb_step, cfg.num_warps, cfg.num_stages, cfg.scale_w, pf, fast, _stride_facts(fmt, k))
                    if key not in seen:
                        seen.add(key)
                        items.append((fmt, k, (cfg.block_n, cfg.block_m, split, cfg.num_warps, cfg.num_stages, kb_step, cfg.scale_w, pf), fast))
    return items


def _warm_one(item) -> str:
    fmt, k, cfg, fast = item
    sys.path.insert(0, str(ROOT))
    from ninfer_plugins.quant_int import kernels as K

    try:
        c = K.Config(*cfg)
        p = make_prepared(fmt, c.block_n, k)
        K.launch(torch.randn(1, k, device="cuda", dtype=torch.bfloat16), p, c, fast=fast)
        torch.cuda.synchronize()
        return ""
    except Exception as e:
        return f"{item}: {type(e).__name__}: {str(e)[:200]}"


def prewarm(items: list, workers: int = 14) -> None:
    """Compile every variant in parallel processes (Triton's on-disk cache serves the rest)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    t0 = time.time()
    with cf.ProcessPoolExecutor(max_workers=min(workers, max(1, len(items))), mp_context=mp.get_context("spawn")) as ex:
        errors = [e for e in ex.map(_warm_one, items) if e]
    log(f"prewarm: {len(items)} variants in {time.time() - t0:.0f} s" + (f"; errors: {errors[:3]}" if errors else ""))


def candidates(fmt: str, n: int, k: int, m: int, sms: int) -> list:
    """The default (first) and the alternatives tried for one (format, shape, M)."""
    from ninfer_plugins.quant_int import kernels as K

    auto = K.pick_config(FMT_ID[fmt], m, n, k, sms)
    if m > 64:
        return [
            auto,
            K.Config(128, 256, 1, 8, 3, 1, True),
            K.Config(128, 128, 1, 8, 4, 1, True),
            K.Config(256, 128, 1, 8, 3, 1, True),
            K.Config(128, 64, 1, 4, 4, 1, True),
        ] if fmt in ("q4_g64", "nvfp4") else [auto, K.Config(128, 128, 1, 8, 4, 1, True), K.Config(128, 64, 1, 4, 4, 1, True)]
    a = auto.split_k
    pf = 0 if fmt == "nvfp4" else 1
    cands = [
        auto,
        K.Config(64, 16, a, 4, 6, 1, False, pf),
        K.Config(64, 16, a * 2, 4, 4, 1, False, pf),
        K.Config(64, 16, max(1, a // 2), 4, 3, 1, False, pf),
        K.Config(32, 16, a, 2, 4, 1, False, pf),
        K.Config(64, 16, a, 4, 4, 2, False, 0),
        K.Config(32, 16, a * 2, 2, 6, 1, False, pf),
        K.Config(128, 16, max(1, a // 2), 8, 4, 1, False, pf),
    ]
    if fmt != "nvfp4":
        cands.append(K.Config(64, 16, a, 4, 4, 1, True, 0))
    return cands if fmt in ("q4_g64", "nvfp4") else [cands[0], cands[2], cands[4], cands[-1]]


def measure(fmt: str, name: str, sms: int, cublas_tf: float | None, bw: float, results: dict) -> dict:
    """Every candidate at M = 1, 16 and 1024; M = 4 and 8 with the M = 1 winner."""
    from ninfer_plugins.quant_int import kernels as K

    n, k, count = SHAPES[name]
    p = make_prepared(fmt, n, k)
    K.reserve_workspace(p)
    nb = prepared_bytes(p)
    copies = [p] + [clone_prepared(p) for _ in range(max(1, min(256, math.ceil(L2_DEFEAT_BYTES / nb))) - 1)]
    row = {"fmt": fmt, "shape": name, "n": n, "k": k, "count": count, "weight_bytes": nb, "copies": len(copies)}
    tried = results.setdefault("tried", [])
    for m in (1, 16, PREFILL_M):
        best = None
        for i, cfg in enumerate(candidates(fmt, n, k, m, sms)):
            try:
                split, _, _ = K.resolve_split(cfg, k)
                K.Workspace.get(p.device).reserve(-(-n // cfg.block_n) * split * cfg.block_n * cfg.block_m, -(-n // cfg.block_n))
                ms = bench_decode(p, copies, m, cfg) if m <= 64 else bench_prefill(p, m, cfg)
            except Exception as e:
                tried.append({"fmt": fmt, "shape": name, "m": m, "cfg": cfg.describe(), "error": f"{type(e).__name__}: {str(e)[:150]}"})
                continue
            tried.append({"fmt": fmt, "shape": name, "m": m, "cfg": cfg.describe(), "us": ms * 1e3, "default": i == 0})
            if i == 0:
                row[f"m{m}_default_us"] = ms * 1e3
            if best is None or ms < best[0]:
                best = (ms, cfg)
        ms, cfg = best
        row[f"m{m}_us"] = ms * 1e3
        row[f"m{m}_cfg"] = cfg.describe()
        if m <= 64:
            moved = nb + 2 * m * (n + k)
            row[f"m{m}_tbps"] = moved / ms / 1e9
            row[f"m{m}_share"] = moved / ms / 1e9 / bw
            if m == 1:
                for m2 in (4, 8):
                    ms2 = bench_decode(p, copies, m2, cfg)
                    row[f"m{m2}_us"] = ms2 * 1e3
                    row[f"m{m2}_tbps"] = (nb + 2 * m2 * (n + k)) / ms2 / 1e9
        else:
            tf = 2 * m * n * k / ms / 1e9
            row["m1024_tflops"] = tf
            row["m1024_share_cublas"] = tf / cublas_tf if cublas_tf else None
            # what a prefill actually runs at this M (LinearKernel.apply from dequant.DEQUANT_MIN_M
            # rows): the weight dequantized to a bf16 scratch in row chunks, then cuBLAS
            try:
                from ninfer_plugins.quant_int import dequant as D

                D.reserve(p)
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                ms_d = cuda_ms(lambda: D.matmul(x, p), reps=10)
                tf_d = 2 * m * n * k / ms_d / 1e9
                row["m1024_dispatch_tflops"] = tf_d
                row["m1024_dispatch_share_cublas"] = tf_d / cublas_tf if cublas_tf else None
            except Exception as e:  # the fused kernel's figures above stand on their own
                row["m1024_dispatch_error"] = f"{type(e).__name__}: {str(e)[:150]}"
    del copies, p
    torch.cuda.empty_cache()
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--tests-only", action="store_true", help="prewarm and GPU tests, no benchmark")
    ap.add_argument("--quick", action="store_true", help="fewer shapes and formats (smoke run)")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--baselines", choices=("all", "big", "none"), default="all", help="torch int4 / cuBLAS GEMV shapes")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    from ninfer_plugins.quant_int import kernels as K

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    formats = [f for f in args.formats.split(",") if f]
    shapes = dict(list(SHAPES.items())[:3]) if args.quick else SHAPES
    nk = sorted({(n, k) for n, k, _ in shapes.values()})
    items = []
    for fmt in [] if args.tests_only else formats:
        for n, k in nk:
            for m in (1, 16, PREFILL_M):
                items += warm_items([fmt], [(n, k)], (), sms, extra_cfgs=candidates(fmt, n, k, m, sms))
    if not args.no_tests:
        test_nk = sorted({(n, k) for n, k, _ in SHAPES.values()} | {(5120, 10240)})
        items += warm_items(FORMATS, test_nk, (1, 3, 16, 17, 100), sms)
        items += warm_items(FORMATS, [(200, 4160)], (1, 5, 16, 40, 300), sms, fast_values=(True, False))
        items += warm_items(FORMATS, [(200, 4160)], (), sms, extra_cfgs=[K.Config(64, 16, s, 4, 3, 1) for s in (1, 2, 3, 8)])
    unique: dict = {}
    for fmt, k, cfg, fast in items:
        unique.setdefault((fmt, cfg, fast, _stride_facts(fmt, k)), (fmt, k, cfg, fast))
    prewarm(list(unique.values()))

    if not args.no_tests:
        t0 = time.time()
        try:
            import xdist  # noqa: F401

            par = ["-n", "4"]
        except ImportError:
            par = []
        cmd = [sys.executable, "-m", "pytest", "-q", *par, "-m", "gpu", "-p", "no:cacheprovider", "tests/plugins/quant_int", "tests/plugins/quant_nvfp4"]
        with open(out / "gpu_tests.log", "w") as logf:  # streamed: a killed run still leaves its log
            proc = subprocess.run(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, text=True)
        proc.stdout = (out / "gpu_tests.log").read_text()
        tail = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        results["gpu_tests"] = {"rc": proc.returncode, "summary": tail, "seconds": round(time.time() - t0, 1)}
        log(f"gpu tests: rc={proc.returncode} {tail} ({time.time() - t0:.0f} s)")
        if proc.returncode != 0:
            log("\n".join(l for l in proc.stdout.splitlines() if "FAILED" in l or "Error" in l)[-3000:])
        if args.tests_only:
            (out / "results.json").write_text(json.dumps(results, indent=1))
            return proc.returncode

    import triton

    props = torch.cuda.get_device_properties(0)
    results["device"] = {"name": props.name, "sms": props.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__}
    log(f"device: {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
    bw = copy_bandwidth()
    results["copy_tbps"] = bw
    log(f"copy bandwidth (read + write): {bw:.2f} TB/s")
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    results["cublas_8k_tflops"] = 2 * 8192**3 / cuda_ms(lambda: big @ big, reps=10) / 1e9
    del big
    log(f"bf16 cuBLAS 8192^3: {results['cublas_8k_tflops']:.0f} TFLOP/s")

    t_table = time.time()

    rows = results.setdefault("rows", [])
    cublas = results.setdefault("cublas_prefill_tflops", {})
    for name, (n, k, _) in shapes.items():
        try:
            cublas[name] = cublas_prefill_tflops(n, k)
        except Exception as e:
            cublas[name] = None
            log(f"cublas {name}: {e}")
    for fmt in formats:
        for name in shapes:
            try:
                row = measure(fmt, name, sms, cublas.get(name), bw, results)
                rows.append(row)
                (out / "results.json").write_text(json.dumps(results, indent=1))
                log(
                    f"{fmt:7s} {name:28s} M=1 {row['m1_us']:7.1f} us {row['m1_tbps']:.2f} TB/s ({row['m1_share']:.0%}) [{row['m1_cfg']}] "
                    f"default {row.get('m1_default_us', float('nan')):.1f} us | M=4/M=1 {row['m4_us'] / row['m1_us']:.2f} | "
                    f"M=16 {row['m16_us']:.1f} us [{row['m16_cfg']}] | M=1024 {row['m1024_tflops']:.0f} TFLOP/s "
                    f"({(row['m1024_share_cublas'] or 0):.0%} of cuBLAS) [{row['m1024_cfg']}]"
                )
            except Exception as e:
                rows.append({"fmt": fmt, "shape": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                log(f"{fmt} {name}: FAILED {type(e).__name__}: {str(e)[:300]}")
                torch.cuda.empty_cache()
    log(f"table: {time.time() - t_table:.0f} s")
    t0 = time.time()
    base = results.setdefault("baselines", {})
    for name, (n, k, _) in shapes.items():
        if args.baselines == "none" or (args.baselines == "big" and name not in BIG_27B):
            continue
        r = torch_int4_ms(n, k)
        if isinstance(r, str):
            base[f"torch_int4.{name}"] = {"error": r}
        else:
            base[f"torch_int4.{name}"] = {"us": r[0] * 1e3, "tbps": r[1] / r[0] / 1e9, "share": r[1] / r[0] / 1e9 / bw}
        if name in BIG_27B and name != "27b.lm_head":
            ms, nb = cublas_gemv_ms(n, k)
            base[f"cublas_bf16_m1.{name}"] = {"us": ms * 1e3, "tbps": nb / ms / 1e9, "share": nb / ms / 1e9 / bw}
        torch.cuda.empty_cache()

    log(f"baselines: {time.time() - t0:.0f} s")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    summary = summarize(results, bw)
    (out / "summary.md").write_text(summary)
    log(summary)
    return 0


def summarize(results: dict, bw: float) -> str:
    lines = [
        f"copy {bw:.2f} TB/s; bf16 cuBLAS 8192^3 {results.get('cublas_8k_tflops', 0):.0f} TFLOP/s; "
        f"tests {results.get('gpu_tests', {}).get('summary', 'not run')}"
    ]
    lines.append(
        "| fmt | shape | n x k | M=1 us | M=1 TB/s (share of copy) | M=1 config | M=4/M=1 | M=8 us | M=16 us | "
        "M=1024 TFLOP/s (share of cuBLAS) | M=1024 config | M=1024 dequant + cuBLAS (what prefill runs) | torch int4 M=1 |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = results.get("baselines", {})
    for r in results.get("rows", []):
        if "error" in r:
            lines.append(f"| {r['fmt']} | {r['shape']} | error: {r['error'][:80]} |")
            continue
        t4 = base.get(f"torch_int4.{r['shape']}", {})
        t4s = f"{t4['us']:.1f} us ({t4['share']:.0%})" if "us" in t4 else "-"
        share = r.get("m1024_share_cublas")
        if "m1024_dispatch_tflops" in r:
            disp = f"{r['m1024_dispatch_tflops']:.0f} ({(r.get('m1024_dispatch_share_cublas') or 0):.0%})"
        else:
            disp = r.get("m1024_dispatch_error", "-")[:40]
        lines.append(
            f"| {r['fmt']} | {r['shape']} | {r['n']}x{r['k']} | {r['m1_us']:.1f} | {r['m1_tbps']:.2f} ({r['m1_share']:.0%}) | "
            f"{r['m1_cfg']} | {r['m4_us'] / r['m1_us']:.2f} | {r['m8_us']:.1f} | {r['m16_us']:.1f} | "
            f"{r['m1024_tflops']:.0f} ({(share or 0):.0%}) | {r['m1024_cfg']} | {disp} | {t4s} |"
        )
    # the 27B decode step's linears (one token): every linear once, by count
    for fmt in sorted({r["fmt"] for r in results.get("rows", []) if "error" not in r}):
        rs = [r for r in results["rows"] if r.get("fmt") == fmt and "error" not in r and r["shape"].startswith("27b")]
        if len(rs) == len([s for s in SHAPES if s.startswith("27b")]):
            t = sum(r["m1_us"] * r["count"] for r in rs)
            b = sum(r["weight_bytes"] * r["count"] for r in rs)
            lines.append(f"27B all linears once at M=1 in {fmt}: {t / 1e3:.2f} ms, {b / t / 1e6:.2f} TB/s ({b / t / 1e6 / bw:.0%} of copy)")
    for key, v in sorted(base.items()):
        if "us" in v:
            lines.append(f"baseline {key}: {v['us']:.1f} us, {v['tbps']:.2f} TB/s ({v['share']:.0%})")
        else:
            lines.append(f"baseline {key}: {v.get('error')}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
