"""Issue 3's bar table, timed on what the engine dispatches (GPU; one call).

    python3 bench/quant_bars.py [--out DIR] [--budget-s 420] [--formats int4,nvfp4] [--models 27b,35b]

bench/quant_linear.py times the tile kernel's candidate configs. Passing a config there bypasses
`kernels.pick_gemv`, so its M <= 16 figures are not the f16x2, K-walk or tensor-core GEMVs the
engine runs at decode. This script times `LinearKernel.apply`'s own path for every linear shape
of the 27B (the merged shapes the engine runs, plus the unmerged ones) and of the 35B-A3B:
- M = 1, 4, 8, 16: `kernels.launch(x, p)` with no config, the decode dispatch.
  Copies of the weight are replayed back to back in one CUDA graph, so the L2 cannot hold them.
- M = 1024: `dequant.matmul` (the weight decoded to bf16 in row chunks, then cuBLAS), which is
  what a prefill chunk runs from dequant.DEQUANT_MIN_M rows.
Against the same run's device copy bandwidth, the bf16 cuBLAS time of the same GEMM, and torch's
own int4 GEMV (`_weight_int4pack_mm`, group 128) at M = 1.

int4 times each shape in the scheme `--quant int4` gives it (recipes.py: the peer's profile;
test_quant_bars checks the table here against it). nvfp4 is every shape in NVFP4. int8 (q8_g32)
is available through --formats.

The bars (issue 3, H200): int4 and nvfp4 at M = 1 move the 27B's big matrices at >= 85% of the
copy bandwidth and >= 2x torch's int4; M = 4 costs <= 1.15x M = 1; M = 1024 reaches >= 60% of
bf16 cuBLAS. The summary prints each with the rows that meet it. Results go to
$OUT/quant_bars.json, written after every row, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

# (label, n, k, the int4 recipe's scheme, big: one of the 27B's big matrices the M = 1 bar names,
# a canonical tensor name of the row's first part, for the recipe check in test_quant_bars)
# The 27B's rows merge as the engine merges them at load (linear.merge_rows: same scheme, same
# input): gate+up, q+v (k_proj is q4), in_proj_qkv+z. The 35B's experts are one pair's matrices.
ROWS = (
    ("27b.gate_up_merged", 34816, 5120, "q4_g64", True, "layers.0.mlp.gate_proj"),
    ("27b.down_proj", 5120, 17408, "q5_g64", True, "layers.0.mlp.down_proj"),
    ("27b.in_proj_qkvz", 16384, 5120, "q5_g64", True, "layers.0.linear_attn.in_proj_qkv"),
    ("27b.q_v_merged", 13312, 5120, "q5_g64", True, "layers.3.self_attn.q_proj"),
    ("27b.o_proj|out_proj", 5120, 6144, "q5_g64", False, "layers.3.self_attn.o_proj"),
    ("27b.k_proj", 1024, 5120, "q4_g64", False, "layers.3.self_attn.k_proj"),
    ("27b.lm_head", 248320, 5120, "q6_g64", True, "lm_head"),
    ("27b.gate_proj|up_proj", 17408, 5120, "q4_g64", False, "layers.0.mlp.up_proj"),
    ("27b.q_proj", 12288, 5120, "q5_g64", False, "layers.3.self_attn.q_proj"),
    ("27b.in_proj_qkv", 10240, 5120, "q5_g64", False, "layers.0.linear_attn.in_proj_qkv"),
    ("35b.in_proj_qkvz", 12288, 2048, "q8_g32", False, "layers.0.linear_attn.in_proj_qkv"),
    ("35b.qkv_merged", 9216, 2048, "q8_g32", False, "layers.3.self_attn.q_proj"),
    ("35b.o_proj|out_proj", 2048, 4096, "q8_g32", False, "layers.3.self_attn.o_proj"),
    ("35b.expert.gate_up", 1024, 2048, "q4_g64", False, "layers.0.mlp.experts.0.gate_up_proj"),
    ("35b.expert.down", 2048, 512, "q5_g64", False, "layers.0.mlp.experts.0.down_proj"),
    ("35b.lm_head", 248320, 2048, "q6_g64", False, "lm_head"),
)
DECODE_M = (1, 4, 8, 16)
PREFILL_M = 1024
BARS = {"m1_share": 0.85, "vs_torch_int4": 2.0, "m4_over_m1": 1.15, "m1024_share_cublas": 0.60}


def scheme(fmt_arg: str, row_fmt: str) -> str:
    """The scheme a row is timed in: the recipe's for int4, else the format named."""
    return {"int4": row_fmt, "int8": "q8_g32"}.get(fmt_arg, fmt_arg)


def kernel_name(p, m: int) -> str:
    """What the decode dispatch runs for m rows (its config's describe()), or the tile kernel."""
    from ninfer_plugins.quant_int import kernels as K

    g = K.pick_gemv(p.fmt, m, p.n, p.k, p.sm_count)
    if g is not None:
        return g.describe() if hasattr(g, "describe") else type(g).__name__
    return "tile " + K.pick_config(p.fmt, m, p.n, p.k, p.sm_count).describe()


def measure(label: str, n: int, k: int, fmt: str, bw: float, cublas_tf: float, decode_only: bool = False) -> dict:
    import torch
    from quant_linear import L2_DEFEAT_BYTES, clone_prepared, cuda_ms, graph_ms_per_call, make_prepared, prepared_bytes

    from ninfer_plugins.quant_int import dequant as D
    from ninfer_plugins.quant_int import kernels as K

    p = make_prepared(fmt, n, k)
    K.reserve_workspace(p)
    nb = prepared_bytes(p)
    copies = [p] + [clone_prepared(p) for _ in range(max(1, min(64, math.ceil(L2_DEFEAT_BYTES / nb))) - 1)]
    row: dict = {"shape": label, "fmt": fmt, "n": n, "k": k, "weight_bytes": nb, "copies": len(copies)}
    for m in DECODE_M:
        if decode_only and m > 4:
            row[f"m{m}_us"] = row[f"m{m}_share"] = math.nan
            continue
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ms = graph_ms_per_call([lambda c=c: K.launch(x, c) for c in copies])
        moved = nb + 2 * m * (n + k)
        row[f"m{m}_us"] = ms * 1e3
        row[f"m{m}_share"] = moved / ms / 1e9 / bw
        row[f"m{m}_kernel"] = kernel_name(p, m)
    row["m4_over_m1"] = row["m4_us"] / row["m1_us"]
    copies.clear()
    if decode_only:
        row["m1024_us"] = row["m1024_tflops"] = row["m1024_share_cublas"] = math.nan
        return row
    D.reserve(p)
    x = torch.randn(PREFILL_M, k, device="cuda", dtype=torch.bfloat16)
    ms = cuda_ms(lambda: D.matmul(x, p), reps=10)
    tf = 2 * PREFILL_M * n * k / ms / 1e9
    row["m1024_us"] = ms * 1e3
    row["m1024_tflops"] = tf
    row["m1024_share_cublas"] = tf / cublas_tf
    return row


def _list(items) -> str:
    return ", ".join(items) or "none"


def verdicts(rows: list[dict], torch_int4: dict) -> list[str]:
    """One line a bar and format: how many rows meet it, and the figures."""
    big_rows = {label for label, _, _, _, big, _ in ROWS if big}
    out = []
    for fmt in sorted({r["fmt"] for r in rows if "error" not in r}):
        rs = [r for r in rows if r.get("fmt") == fmt and "error" not in r]
        big = [r for r in rs if r["shape"] in big_rows]
        ok = [r for r in big if r["m1_share"] >= BARS["m1_share"]]
        figs = _list(f"{r['shape']} {r['m1_share']:.0%}" for r in big)
        out.append(f"{fmt}: M = 1 >= {BARS['m1_share']:.0%} of copy, the 27B's big matrices: {len(ok)} of {len(big)} ({figs})")
        t4 = [(r["shape"], torch_int4[r["shape"]]["us"] / r["m1_us"]) for r in big if "us" in torch_int4.get(r["shape"], {})]
        if t4:
            out.append(f"{fmt}: M = 1 against torch int4 (bar {BARS['vs_torch_int4']:.0f}x): "
                       + _list(f"{s} {x:.2f}x" for s, x in t4))
        over = [r for r in rs if r["m4_over_m1"] > BARS["m4_over_m1"]]
        out.append(f"{fmt}: M = 4 <= {BARS['m4_over_m1']}x M = 1: {len(rs) - len(over)} of {len(rs)}; over: "
                   + _list(f"{r['shape']} {r['m4_over_m1']:.2f}x" for r in over))
        under = [r for r in rs if r["m1024_share_cublas"] < BARS["m1024_share_cublas"]]
        out.append(f"{fmt}: M = 1024 >= {BARS['m1024_share_cublas']:.0%} of bf16 cuBLAS: {len(rs) - len(under)} of "
                   f"{len(rs)}; under: " + _list(f"{r['shape']} {r['m1024_share_cublas']:.0%}" for r in under))
    return out


def table(rows: list[dict], torch_int4: dict) -> str:
    lines = ["| fmt | shape | n x k | M=1 µs | M=1 share of copy | M=1 kernel | M=4/M=1 | M=8 µs | M=16 µs | "
             "M=1024 TFLOP/s (share of cuBLAS) | torch int4 M=1 µs (share) |",
             "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['fmt']} | {r['shape']} | error: {r['error'][:90]} |")
            continue
        t4 = torch_int4.get(r["shape"], {})
        t4s = f"{t4['us']:.1f} ({t4['share']:.0%})" if "us" in t4 else "-"
        lines.append(
            f"| {r['fmt']} | {r['shape']} | {r['n']}x{r['k']} | {r['m1_us']:.1f} | {r['m1_share']:.0%} | {r['m1_kernel']} | "
            f"{r['m4_over_m1']:.2f} | {r['m8_us']:.1f} | {r['m16_us']:.1f} | {r['m1024_tflops']:.0f} "
            f"({r['m1024_share_cublas']:.0%}) | {t4s} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting rows after this many seconds")
    ap.add_argument("--formats", default="int4,nvfp4", help="int4 (the recipe's scheme a shape), nvfp4, int8, or a scheme")
    ap.add_argument("--models", default="27b,35b")
    ap.add_argument("--decode-only", action="store_true", help="M = 1 and 4 only (an A/B of a decode switch)")
    args = ap.parse_args()
    import torch
    from quant_linear import copy_bandwidth, cublas_prefill_tflops, torch_int4_ms

    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    res: dict = {"device": props.name, "sms": props.multi_processor_count, "copy_tbps": bw, "rows": [], "torch_int4": {}}
    print(f"{props.name}, {props.multi_processor_count} SMs; copy {bw:.2f} TB/s (read + write)", flush=True)
    models = {m.strip() for m in args.models.split(",")}
    rows = [r for r in ROWS if r[0].split(".")[0] in models]
    cublas: dict = {}
    for fmt_arg in [f.strip() for f in args.formats.split(",") if f.strip()]:
        for label, n, k, row_fmt, _, _ in rows:
            if time.time() - t0 > args.budget_s:
                print(f"budget: stopped before {fmt_arg} {label}", flush=True)
                break
            fmt = scheme(fmt_arg, row_fmt)
            try:
                if (n, k) not in cublas:
                    cublas[(n, k)] = math.nan if args.decode_only else cublas_prefill_tflops(n, k, PREFILL_M)
                r = measure(label, n, k, fmt, bw, cublas[(n, k)], args.decode_only)
                r["format_arg"] = fmt_arg
            except Exception as e:  # one shape's failure must not cost the rest
                r = {"shape": label, "fmt": fmt, "format_arg": fmt_arg, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            torch.cuda.empty_cache()  # the row's weight and its copies
            res["rows"].append(r)
            if "error" in r:
                print(f"{fmt:7s} {label:22s} ERROR {r['error']}", flush=True)
            else:
                print(f"{fmt:7s} {label:22s} M=1 {r['m1_us']:7.1f} us {r['m1_share']:4.0%} [{r['m1_kernel']}] "
                      f"M=4/M=1 {r['m4_over_m1']:.2f} M=16 {r['m16_us']:6.1f} us "
                      f"M=1024 {r['m1024_tflops']:4.0f} TFLOP/s ({r['m1024_share_cublas']:.0%} of cuBLAS)", flush=True)
            (out / "quant_bars.json").write_text(json.dumps(res, indent=1))
    for label, n, k, _, big, _ in rows:
        if big and not args.decode_only and time.time() - t0 < args.budget_s + 60:
            t = torch_int4_ms(n, k)
            res["torch_int4"][label] = {"error": t} if isinstance(t, str) else {
                "us": t[0] * 1e3, "share": t[1] / t[0] / 1e9 / bw}
            torch.cuda.empty_cache()
    (out / "quant_bars.json").write_text(json.dumps(res, indent=1))
    print(table(res["rows"], res["torch_int4"]))
    for line in verdicts(res["rows"], res["torch_int4"]):
        print(line)
    print(f"{time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
