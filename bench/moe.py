"""Sparse-MoE kernels of Qwen3.6-35B-A3B on one GPU, in one call: GPU tests, then per-kernel
timings against the bytes each must move, then a table.

    python bench/moe.py --out $OUT [--no-tests] [--quick] [--budget-s 540]   # on the lent GPU
    python bench/moe.py --floor [--context 8192] [--bandwidth-tbps 4.28]    # arithmetic only

1. `pytest -m gpu tests/plugins/moe_triton` (log in OUT/gpu_tests.log; pytest-xdist if installed).
2. Copy bandwidth (read + write) measured in the same run: the roofline every share is of.
3. Decode (T = 1, 2, 4, 8, 16 tokens) per recipe (int4: q4 gate_up + q5 down + q8 shared; int8;
   bf16), real shapes (256 experts, H 2048, I 512, top 8): the router GEMV, the fused route +
   plan, gate_up, down, combine and the whole layer, each as the median of CUDA-graph replays of
   40 layers with their own weights (17.6 GB at int4: the 60 MB L2 holds none of it). Bytes: the
   weights of the experts the routing actually selected (each once) + shared expert + router +
   activations in and out.
4. Prefill (T = 1024, 4096, 8192): the whole layer, TFLOP/s, and bf16 cuBLAS on the same FLOPs
   (one [T*8, 2048] x [2048, 1024] and one [T*8, 512] x [512, 2048] GEMM) as a ceiling.
5. A sweep of block sizes for gate_up and down at T = 1 and 16 (int4) and prefill T = 8192.
6. The decode floor of the whole 35B step (`--floor`), for the share of it the MoE part takes.

Writes OUT/results.json after every section and OUT/summary.md at the end; prints the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

E, H, I, TOP_K = 256, 2048, 512, 8
LAYERS = 40
DECODE_T = (1, 2, 4, 8, 16)
PREFILL_T = (1024, 4096, 8192)
# `--smoke` runs every section at toy sizes on the CPU, interpreted, untimed: it checks the script
DEV = "cuda"
RECIPES = {
    # name: (routed gate_up, routed down, shared expert) -- spec 4.4's int4 profile, q8, bf16
    "int4": ("q4_g64", "q5_g64", "q8_g32"),
    "int8": ("q8_g32", "q8_g32", "q8_g32"),
    "bf16": ("bf16", "bf16", "bf16"),
}
H200_COPY_TBPS = 4.28


def log(*a):
    print(*a, flush=True)


# --- the decode floor (arithmetic) -----------------------------------------------------------------


def packed_bytes(scheme: str, n: int, k: int) -> int:
    """Bytes of an [n, k] weight as the model holds it (quant_int's layout, or bf16)."""
    if scheme == "bf16":
        return 2 * n * k
    from ninfer_plugins.quant_int.formats import expected_parts

    total = 0
    for dtype, shape in expected_parts(scheme, n, k).values():
        count = 1
        for d in shape:
            count *= d
        total += count * dtype.itemsize
    return total


def decode_floor(context: int = 8192, quant: str = "int4", bandwidth_tbps: float = H200_COPY_TBPS) -> dict:
    """Bytes one decode token must read (weights the step touches, once) and move (state, KV) for
    Qwen3.6-35B-A3B under `quant`, batch 1, `context` tokens in the KV cache; and tok/s at the
    copy bandwidth. Arithmetic, not a measurement."""
    from ninfer_plugins.quant_int.recipes import recipe
    from ninfer_plugins.qwen36_35b_a3b.plugin import SHAPE
    from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape
    from ninfer_plugins.qwen_hybrid.weights import text_tensors

    s = QwenHybridShape(family="qwen_hybrid", **SHAPE)
    rec = recipe(quant, s, None) if quant != "bf16" else None
    rows: dict[str, float] = {}

    def add(key: str, b: float) -> None:
        rows[key] = rows.get(key, 0) + b

    for name, n, k in s.linear_shapes():
        scheme = rec.scheme_for(name, n, k) if rec else "bf16"
        b = packed_bytes(scheme, n, k)
        if ".experts." in name:
            add("routed experts (8 of 256 per layer)", b * s.num_experts_per_tok / s.num_experts)
        elif ".shared_expert." in name:
            add("shared expert", b)
        elif name.endswith(("mlp.gate", "shared_expert_gate")):
            add("router + shared-expert gate (bf16)", b)
        elif ".self_attn." in name:
            add("attention projections (10 layers)", b)
        elif ".linear_attn." in name:
            add("Gated DeltaNet projections (30 layers)", b)
        elif name == "lm_head":
            add("lm_head", b)
        else:
            add("other linears", b)
    small = 0
    for name, shp in text_tensors(s).items():
        if len(shp) == 1:
            small += 4 * shp[0]  # norms, A_log, dt_bias: fp32 buffers
        elif name.endswith("conv1d.weight"):
            small += 2 * shp[0] * shp[1] * shp[2]
    add("norms, conv taps, gates (small buffers)", small)
    add("embedding row (bf16)", 2 * s.hidden_size)
    weights = sum(rows.values())
    state = 2 * s.state_bytes_per_sequence(conv_bytes=2)  # read and written
    kv = s.kv_bytes_per_token("bf16") * (context + 1)  # read every position, write the new one
    moe = sum(v for k, v in rows.items() if k.startswith(("routed", "shared", "router")))
    bw = bandwidth_tbps * 1e12
    return {
        "quant": quant,
        "context": context,
        "bandwidth_tbps": bandwidth_tbps,
        "rows": rows,
        "weights": weights,
        "moe_weights": moe,
        "gdn_state_rw": state,
        "kv_read": kv,
        "total": weights + state + kv,
        "tok_s_weights": bw / weights,
        "tok_s_total": bw / (weights + state + kv),
        "ms_total": (weights + state + kv) / bw * 1e3,
    }


def floor_table(f: dict) -> str:
    mb = lambda b: f"{b / 1e6:,.1f}"  # noqa: E731
    out = [f"Decode floor, Qwen3.6-35B-A3B --quant {f['quant']}, batch 1, {f['context']:,}-token context "
           f"(arithmetic: bytes / {f['bandwidth_tbps']} TB/s)", "", "| what is read per token | MB |", "|---|---:|"]
    for k, v in sorted(f["rows"].items(), key=lambda kv: -kv[1]):
        out.append(f"| {k} | {mb(v)} |")
    out += [
        f"| **weights** | **{mb(f['weights'])}** |",
        f"| GDN state, fp32 recurrent + bf16 conv, read and written (30 layers) | {mb(f['gdn_state_rw'])} |",
        f"| KV cache, bf16, {f['context']:,} positions read (10 layers) | {mb(f['kv_read'])} |",
        f"| **total** | **{mb(f['total'])}** |",
        "",
        f"weights only: {f['tok_s_weights']:,.0f} tok/s; with state and KV: {f['tok_s_total']:,.0f} tok/s "
        f"({f['ms_total']:.3f} ms a token); the MoE (routed + shared + router) is {mb(f['moe_weights'])} MB "
        f"of the weights ({f['moe_weights'] / f['weights']:.1%}).",
    ]
    return "\n".join(out)


# --- timing helpers (bench/quant_linear.py's, with a wall-clock stand-in for --smoke) -------------


def cuda_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    if DEV != "cuda":
        t0 = time.time()
        fn()
        return (time.time() - t0) * 1e3
    from bench.quant_linear import cuda_ms as timed

    return timed(fn, reps=reps, warmup=warmup)


def graph_ms_per_call(calls: list, reps: int = 10) -> float:
    """Median time of one call, the calls captured back to back in one CUDA graph."""
    if DEV != "cuda":
        t0 = time.time()
        for c in calls:
            c()
        return (time.time() - t0) * 1e3 / len(calls)
    from bench.quant_linear import graph_ms_per_call as timed

    return timed(calls, reps=reps)


def copy_bandwidth() -> float:
    """TB/s of a device-to-device copy, bytes read + written (the core's `ninfer bench` figure)."""
    if DEV != "cuda":
        return H200_COPY_TBPS
    import torch

    from ninfer.bench import copy_bandwidth as measured

    return measured(torch.device(DEV)) / 1e12


# --- layers with their own weights -----------------------------------------------------------------


class Layer:
    """One MoE layer's weights at the real shape, in a recipe, plus its inputs."""

    def __init__(self, recipe: str, seed: int, base: Layer | None = None) -> None:
        import torch

        from ninfer_plugins.moe_triton import grouped_gemv as GV
        from ninfer_plugins.moe_triton.moe import ExpertWeights, SharedWeights

        gu_s, dn_s, sh_s = RECIPES[recipe]
        g = torch.Generator(device=DEV).manual_seed(seed)
        if base is None:
            self.experts = ExpertWeights(self._matrix(gu_s, E * 2 * I, H, g), self._matrix(dn_s, E * H, I, g), E, H, I)
            mats = [self._matrix(sh_s, n, k, g) for n, k in ((I, H), (I, H), (H, I))]
        else:
            # a copy of the base layer's weights (values do not change the timing; routing does)
            self.experts = ExpertWeights(self._clone(base.experts.gate_up), self._clone(base.experts.down), E, H, I)
            mats = [self._clone(m) for m in (base.shared.gate, base.shared.up, base.shared.down)]
        self.shared_gate = (torch.randn(1, H, generator=g, device=DEV) / H**0.5).bfloat16()
        self.shared = SharedWeights(*mats, I, self.shared_gate)
        # logits of a few units: a spread of experts, as a trained router gives
        self.router = (torch.randn(E, H, generator=g, device=DEV) * 2 / H**0.5).bfloat16()
        self.GV = GV

    @staticmethod
    def _matrix(scheme: str, n: int, k: int, g):
        import torch

        from ninfer_plugins.moe_triton import grouped_gemv as GV
        from ninfer_plugins.quant_int import formats as QF

        w = torch.randn(n, k, generator=g, device=DEV) / k**0.5
        if scheme == "bf16":
            return GV.Matrix(GV.DENSE_FMT, w.bfloat16(), k)
        p = QF.quantize(w, scheme)
        del w
        q = p.tensors["qweight"]
        return GV.Matrix(QF.FORMATS[scheme].bits, q.view(torch.uint8), k, p.tensors["scales"], p.tensors.get("qhigh"))

    @staticmethod
    def _clone(m):
        from dataclasses import replace

        return replace(m, q=m.q.clone(), s=None if m.s is None else m.s.clone(), h=None if m.h is None else m.h.clone())

    def expert_bytes(self) -> tuple[int, int]:
        """(gate_up, down) bytes of one routed expert."""
        return 2 * I * self.experts.gate_up.nbytes_per_row, H * self.experts.down.nbytes_per_row

    def shared_bytes(self) -> tuple[int, int]:
        s = self.shared
        return I * (s.gate.nbytes_per_row + s.up.nbytes_per_row), H * s.down.nbytes_per_row


def build_layers(recipe: str, count: int) -> list[Layer]:
    import torch

    base = Layer(recipe, seed=0)
    layers = [base] + [Layer(recipe, seed=i, base=base) for i in range(1, count)]
    if DEV == "cuda":
        torch.cuda.synchronize()
    return layers


# --- decode ----------------------------------------------------------------------------------------


def bench_decode(layers: list[Layer], T: int, bw: float, moe, results: list) -> None:
    import torch

    from ninfer_plugins.moe_triton import grouped_gemv as GV
    from ninfer_plugins.moe_triton.router import route

    xs = [torch.randn(T, H, device=DEV).bfloat16() for _ in layers]
    logits = [torch.nn.functional.linear(x, L.router) for x, L in zip(xs, layers)]
    plans = [route(lg, TOP_K, x=x, shared_gate_weight=L.shared_gate, plan=True) for lg, x, L in zip(logits, xs, layers)]
    cu, cd = moe.configs["decode_gate_up"], moe.configs["decode_down"]
    hs = [GV.gate_up(x, r, L.experts.gate_up, I, E, cu, (L.shared.gate, L.shared.up), I) for x, r, L in zip(xs, plans, layers)]
    ys = [GV.down(h, r, L.experts.down, H, I, E, cd, L.shared.down, I) for h, r, L in zip(hs, plans, layers)]
    # bytes from the routing each layer actually has (host side, outside the timed graphs)
    gu_b, dn_b = layers[0].expert_bytes()
    sgu_b, sdn_b = layers[0].shared_bytes()
    used = statistics.mean(int((r.tile_expert >= 0).sum()) - 1 for r in plans)  # minus the shared tile
    pairs = T * (TOP_K + 1)
    nbytes = {
        "router gemv": E * H * 2 + T * H * 2 + T * E * 2,
        "route + plan": T * E * 2 + T * H * 2 + H * 2 + pairs * 8,
        "gate_up": used * gu_b + sgu_b + T * H * 2 + pairs * I * 2,
        "down": used * dn_b + sdn_b + pairs * I * 2 + pairs * H * 4,
        "combine": pairs * H * 4 + T * H * 2,
    }
    nbytes["layer"] = sum(nbytes.values())
    calls = {
        "router gemv": [lambda x=x, L=L: torch.nn.functional.linear(x, L.router) for x, L in zip(xs, layers)],
        "route + plan": [lambda lg=lg, x=x, L=L: route(lg, TOP_K, x=x, shared_gate_weight=L.shared_gate, plan=True)
                         for lg, x, L in zip(logits, xs, layers)],
        "gate_up": [lambda x=x, r=r, L=L: GV.gate_up(x, r, L.experts.gate_up, I, E, cu, (L.shared.gate, L.shared.up), I)
                    for x, r, L in zip(xs, plans, layers)],
        "down": [lambda h=h, r=r, L=L: GV.down(h, r, L.experts.down, H, I, E, cd, L.shared.down, I)
                 for h, r, L in zip(hs, plans, layers)],
        "combine": [lambda y=y: GV.combine(y, T, TOP_K + 1, torch.bfloat16) for y in ys],
        "layer": [lambda x=x, L=L: _layer_step(moe, x, L) for x, L in zip(xs, layers)],
    }
    for name, fns in calls.items():
        try:
            ms = graph_ms_per_call(fns)
        except Exception as e:  # one failing piece must not end the campaign
            results.append({"T": T, "op": name, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            log(f"  T={T} {name}: {type(e).__name__}: {str(e)[:200]}")
            continue
        gbs = nbytes[name] / ms / 1e6
        results.append({"T": T, "op": name, "us": ms * 1e3, "bytes": nbytes[name], "gbps": gbs, "share": gbs / 1e3 / bw,
                        "experts_used": used})
        log(f"  T={T:2d} {name:13s} {ms * 1e3:8.2f} us  {nbytes[name] / 1e6:8.2f} MB  {gbs:8.0f} GB/s  {gbs / 1e3 / bw:6.1%}")


def _layer_step(moe, x, L):
    import torch

    from ninfer_plugins.moe_triton.router import route

    r = route(torch.nn.functional.linear(x, L.router), TOP_K, x=x, shared_gate_weight=L.shared_gate, plan=True)
    return moe.run(x, r, L.experts, L.shared)


def bench_reference_bf16(layers: list[Layer], bw: float, results: list) -> None:
    """The family's reference decode (gathered bmm of the chosen dense experts) at T = 1."""
    import torch
    import torch.nn.functional as F

    stacks = [(L.experts.gate_up.q.view(E, 2 * I, H), L.experts.down.q.view(E, H, I)) for L in layers]
    xs = [torch.randn(1, H, device=DEV).bfloat16() for _ in layers]

    def step(x, L, gu, dn):
        probs = torch.softmax(F.linear(x, L.router).float(), -1)
        w, ids = torch.topk(probs, TOP_K, -1)
        w = w / w.sum(-1, keepdim=True)
        flat = ids.reshape(-1)
        a = torch.bmm(gu[flat], x.repeat_interleave(TOP_K, 0).unsqueeze(-1)).squeeze(-1)
        h = F.silu(a[:, :I]) * a[:, I:]
        y = torch.bmm(dn[flat], h.unsqueeze(-1)).squeeze(-1)
        return (y.float().view(1, TOP_K, -1) * w.unsqueeze(-1)).sum(1)

    ms = graph_ms_per_call([lambda x=x, L=L, s=s: step(x, L, *s) for x, L, s in zip(xs, layers, stacks)])
    gu_b, dn_b = layers[0].expert_bytes()
    nb = TOP_K * (gu_b + dn_b) + E * H * 2
    results.append({"T": 1, "op": "reference (torch gather + bmm, routed only)", "us": ms * 1e3, "bytes": nb,
                    "gbps": nb / ms / 1e6, "share": nb / ms / 1e9 / bw})
    log(f"  reference torch gather+bmm T=1: {ms * 1e3:.2f} us ({nb / ms / 1e9 / bw:.1%})")


# --- prefill ---------------------------------------------------------------------------------------


def bench_prefill(layer: Layer, T: int, moe, results: list, recipe: str) -> None:
    import torch

    x = torch.randn(T, H, device=DEV).bfloat16()
    ms = cuda_ms(lambda: _prefill_step(moe, x, layer), reps=10)
    flops = 2 * T * (TOP_K * 3 * H * I + 3 * H * I)
    # the same FLOPs as two dense bf16 GEMMs, cuBLAS: a ceiling for the grouped kernels
    a = torch.randn(T * (TOP_K + 1), H, device=DEV).bfloat16()
    b = torch.randn(T * (TOP_K + 1), I, device=DEV).bfloat16()
    w1 = torch.randn(2 * I, H, device=DEV).bfloat16()
    w2 = torch.randn(H, I, device=DEV).bfloat16()
    cub = cuda_ms(lambda: (torch.nn.functional.linear(a, w1), torch.nn.functional.linear(b, w2)), reps=10)
    row = {"recipe": recipe, "T": T, "ms": ms, "tflops": flops / ms / 1e9, "cublas_same_flops_ms": cub,
           "moe_tok_s_40_layers": T / (ms * LAYERS / 1e3)}
    results.append(row)
    log(f"  prefill {recipe} T={T}: {ms:.3f} ms/layer, {row['tflops']:.0f} TFLOP/s, cuBLAS same FLOPs {cub:.3f} ms, "
        f"MoE alone over 40 layers: {row['moe_tok_s_40_layers']:,.0f} tok/s")
    del a, b, w1, w2


def _prefill_step(moe, x, L):
    import torch

    from ninfer_plugins.moe_triton import grouped_gemm as GM
    from ninfer_plugins.moe_triton.router import route

    r = route(torch.nn.functional.linear(x, L.router), TOP_K, x=x, shared_gate_weight=L.shared_gate)
    GM.plan(r, E, moe.configs["prefill_gate_up"].block_m)
    return moe.run(x, r, L.experts, L.shared)


# --- sweep -----------------------------------------------------------------------------------------


def sweep(layers: list[Layer], bw: float, results: list, deadline: float) -> None:
    import torch

    from ninfer_plugins.moe_triton import grouped_gemv as GV
    from ninfer_plugins.moe_triton.moe import TritonMoe

    decode = [
        ("decode_gate_up", GV.TileConfig(bn, 16, w, s))
        for bn in (16, 32, 64) for w in (2, 4, 8) for s in (2, 3, 4)
    ] + [
        ("decode_down", GV.TileConfig(bn, 16, w, s))
        for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)
    ]
    if DEV != "cuda":
        decode = decode[:1] + decode[-1:]
    for T in (1, 16):
        for key, cfg in decode:
            if time.time() > deadline:
                log("  sweep: out of budget")
                return
            moe = TritonMoe(configs={key: cfg})
            xs = [torch.randn(T, H, device=DEV).bfloat16() for _ in layers]
            try:
                ms = graph_ms_per_call([lambda x=x, L=L: _layer_step(moe, x, L) for x, L in zip(xs, layers)])
            except Exception as e:
                results.append({"T": T, key: cfg.describe(), "error": f"{type(e).__name__}: {str(e)[:150]}"})
                continue
            results.append({"T": T, "which": key, "cfg": cfg.describe(), "layer_us": ms * 1e3})
            log(f"  sweep T={T} {key} {cfg.describe()}: layer {ms * 1e3:.2f} us")
    prefill = [
        ("prefill_gate_up", GV.TileConfig(bn, bm, w, s, 64, sw))
        for bn, bm in ((64, 64), (128, 64), (64, 128), (128, 128)) for w in (4, 8) for s in (3, 4) for sw in (True, False)
    ] + [
        ("prefill_down", GV.TileConfig(bn, bm, w, s, 64, sw))
        for bn, bm in ((128, 64), (64, 64), (128, 128)) for w in (4, 8) for s in (3,) for sw in (True, False)
    ]
    if DEV != "cuda":
        prefill = prefill[:1] + prefill[-1:]
    for key, cfg in prefill:
        if time.time() > deadline:
            log("  sweep: out of budget")
            return
        other = "prefill_down" if key == "prefill_gate_up" else "prefill_gate_up"
        base = TritonMoe().configs[other]
        if base.block_m != cfg.block_m:
            from dataclasses import replace

            base = replace(base, block_m=cfg.block_m)
        moe = TritonMoe(configs={key: cfg, other: base})
        x = torch.randn(PREFILL_T[-1], H, device=DEV).bfloat16()
        try:
            ms = cuda_ms(lambda: _prefill_step(moe, x, layers[0]), reps=5)
        except Exception as e:
            results.append({"T": 8192, key: cfg.describe(), "error": f"{type(e).__name__}: {str(e)[:150]}"})
            continue
        results.append({"T": 8192, "which": key, "cfg": cfg.describe(), "layer_ms": ms})
        log(f"  sweep prefill {key} {cfg.describe()}: {ms:.3f} ms")


# --- main ------------------------------------------------------------------------------------------


def summary(results: dict) -> str:
    lines = ["# MoE kernels (bench/moe.py)", ""]
    dev = results.get("device", {})
    lines.append(f"- {dev.get('name')} ({dev.get('sms')} SMs), torch {dev.get('torch')}, Triton {dev.get('triton')}")
    if "copy_tbps" in results:
        lines.append(f"- copy bandwidth (read + write) in the same run: {results['copy_tbps']:.2f} TB/s")
    if "gpu_tests" in results:
        t = results["gpu_tests"]
        lines.append(f"- GPU tests: rc {t['rc']}, {t['summary']} ({t['seconds']} s)")
    for recipe, rows in results.get("decode", {}).items():
        lines += ["", f"## Decode, {recipe} (per layer; median of CUDA-graph replays of {LAYERS} layers)", "",
                  "| T | op | us | MB | GB/s | share |", "|---:|---|---:|---:|---:|---:|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['T']} | {r['op']} | error: {r['error'][:80]} | | | |")
            else:
                lines.append(f"| {r['T']} | {r['op']} | {r['us']:.2f} | {r['bytes'] / 1e6:.2f} | {r['gbps']:.0f} | {r['share']:.1%} |")
    if results.get("prefill"):
        lines += ["", "## Prefill (one layer)", "", "| recipe | T | ms | TFLOP/s | cuBLAS same FLOPs, ms | MoE-only tok/s over 40 layers |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in results["prefill"]:
            if "error" in r:
                lines.append(f"| {r.get('recipe')} | {r['T']} | error: {r['error'][:80]} | | | |")
            else:
                lines.append(f"| {r['recipe']} | {r['T']} | {r['ms']:.3f} | {r['tflops']:.0f} | {r['cublas_same_flops_ms']:.3f} | {r['moe_tok_s_40_layers']:,.0f} |")
    if results.get("sweep"):
        lines += ["", "## Sweep (int4)", ""]
        best: dict = {}
        for r in results["sweep"]:
            if "error" in r:
                continue
            key = (r["T"], r["which"])
            val = r.get("layer_us", r.get("layer_ms"))
            if key not in best or val < best[key][0]:
                best[key] = (val, r["cfg"])
        for (T, which), (val, cfg) in sorted(best.items()):
            lines.append(f"- T={T} {which}: best {cfg} ({val:.3f} {'us' if T <= 16 else 'ms'})")
    if "floor" in results:
        lines += ["", floor_table(results["floor"])]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--floor", action="store_true", help="print the decode floor (arithmetic, no GPU) and exit")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--bandwidth-tbps", type=float, default=H200_COPY_TBPS)
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--quick", action="store_true", help="int4 only, T = 1 and 16, no sweep")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting new sections after this")
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU, interpreted: checks the script")
    args = ap.parse_args()
    if args.smoke:
        global DEV, E, H, I, TOP_K, LAYERS, DECODE_T, PREFILL_T
        os.environ["TRITON_INTERPRET"] = "1"
        DEV, E, H, I, TOP_K, LAYERS, DECODE_T, PREFILL_T = "cpu", 8, 128, 64, 3, 2, (1, 16), (40,)
        args.no_tests = True
    if args.floor:
        for q in ("int4", "int8", "bf16"):
            print(floor_table(decode_floor(args.context, q, args.bandwidth_tbps)))
            print()
        return 0

    t_start = time.time()
    deadline = t_start + args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}

    def save():
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))

    if not args.no_tests:
        t0 = time.time()
        try:
            import xdist  # noqa: F401

            par = ["-n", "8"]
        except ImportError:
            par = []
        cmd = [sys.executable, "-m", "pytest", "-q", *par, "-m", "gpu", "-p", "no:cacheprovider", "tests/plugins/moe_triton"]
        # the tests compile most of the kernels' variants; leave the timings at least 200 s
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(60, deadline - time.time() - 200))
            stdout, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
            stdout, rc = text(e.stdout) + text(e.stderr) + "\n(timed out)", -1
        (out / "gpu_tests.log").write_text(stdout)
        tail = (stdout.strip().splitlines() or ["(no output)"])[-1]
        results["gpu_tests"] = {"rc": rc, "summary": tail, "seconds": round(time.time() - t0, 1)}
        log(f"gpu tests: rc={rc} {tail} ({time.time() - t0:.0f} s)")
        if rc != 0:
            log("\n".join(line for line in stdout.splitlines() if "FAILED" in line or "Error" in line)[-3000:])
        save()

    import torch
    import triton

    from ninfer_plugins.moe_triton.moe import TritonMoe

    if DEV == "cuda":
        props = torch.cuda.get_device_properties(0)
        results["device"] = {"name": props.name, "sms": props.multi_processor_count, "torch": torch.__version__, "triton": triton.__version__}
    else:
        results["device"] = {"name": "cpu (smoke, interpreted)", "sms": 0, "torch": torch.__version__, "triton": triton.__version__}
    bw = copy_bandwidth()
    results["copy_tbps"] = bw
    results["floor"] = decode_floor(args.context, "int4", bw)
    log(f"device: {results['device']['name']}, copy bandwidth {bw:.2f} TB/s")
    save()

    moe = TritonMoe()
    recipes = ["int4"] if args.quick else list(RECIPES)
    decode_t = (1, 16) if args.quick else DECODE_T
    results["decode"], results["prefill"], results["sweep"] = {}, [], []
    for recipe in recipes:
        if time.time() > deadline:
            break
        # bf16 experts are 1.6 GB a layer: 16 layers still dwarf the L2
        count = LAYERS if recipe != "bf16" else min(16, LAYERS)
        t0 = time.time()
        layers = build_layers(recipe, count)
        log(f"{recipe}: {count} layers built in {time.time() - t0:.0f} s")
        rows = results["decode"].setdefault(recipe, [])
        for T in decode_t:
            if time.time() > deadline:
                break
            bench_decode(layers, T, bw, moe, rows)
            save()
        if recipe == "bf16" and time.time() < deadline:
            bench_reference_bf16(layers, bw, rows)
        for T in PREFILL_T if not args.quick else (8192,):
            if time.time() > deadline:
                break
            try:
                bench_prefill(layers[0], T, moe, results["prefill"], recipe)
            except Exception as e:
                results["prefill"].append({"recipe": recipe, "T": T, "error": f"{type(e).__name__}: {str(e)[:200]}"})
            save()
        if recipe == "int4" and not args.quick:
            sweep(layers, bw, results["sweep"], deadline)
            save()
        del layers
        if DEV == "cuda":
            torch.cuda.empty_cache()
    text = summary(results)
    (out / "summary.md").write_text(text)
    log("")
    log(text)
    log(f"\ntotal {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
