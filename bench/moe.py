"""Sparse-MoE kernels of Qwen3.6-35B-A3B on one GPU, in one call of about five minutes: GPU tests,
kernel timings at the real shapes, then `ninfer bench` end to end; a short table last.

    python bench/moe.py [--out $OUT] [--budget-s 320]     # on the lent GPU (JSON and logs in OUT)
    python bench/moe.py --smoke                           # the whole script on the CPU, toy sizes
    python bench/moe.py --floor [--context 8192]          # the decode floor, arithmetic only

1. `pytest -m gpu` on tests/plugins/moe_triton (router at 256 experts, grouped GEMV at the real
   shapes in bf16 / q4 / q5 / q6 / q8, grouped GEMM at T = 1,024, a tiny checkpoint's GPU logits
   against the CPU reference, graph vs eager greedy tokens), in a subprocess with a timeout
   (`--test-timeout`); log in OUT/gpu_tests.log. Before them every MoE kernel variant is compiled
   for sm_90 in parallel processes (compile_sm90.py), so the tests and timings find them cached.
2. Copy bandwidth (read + write) in the same run: the roofline every share is of. Then, int4
   (q4 gate_up + q5 down + q8 shared; `--recipes` for int8 / bf16), 256 experts, H 2048, I 512,
   top 8: the router GEMV, route + plan, gate_up, down, combine and the whole layer at T = 1, 4,
   16, each the median of CUDA-graph replays of 40 layers with their own weights (17.6 GB, beyond
   the 60 MB L2), against the bytes of the experts the routing selected (each once); then one
   layer's prefill at T = 8,192 (TFLOP/s, and cuBLAS bf16 on the same FLOPs). `--sweep` adds a
   block-size sweep (several minutes more).
3. `ninfer bench --model qwen3.6-35b-a3b --random-weights --quant int4 --prompt-len 8192
   --gen-len 64` in a subprocess (JSON: OUT/bench_int4.json), then the same in bf16 when the
   budget has room; bytes per step count the routed experts a step reads, not all 256.
OUT/results.json is rewritten after every section (a call cut short still returns what ran).
Random-weight build of the 35B in int4 on the GPU: the family quantizes expert by expert (20,480
encoder calls of about 40 launches and 2 host syncs each), about 10-15 s; reported as build_s.
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
DECODE_T = (1, 4, 16)
PREFILL_T = (8192,)
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
    if moe.takes_pairs(T, layers[0].experts, layers[0].shared):
        # the pair kernels (pair_gemv.py) that `layer` runs at this T, each timed alone: they read
        # the chosen experts once per pair, and down writes the combined output
        from ninfer_plugins.moe_triton import pair_gemv as PG

        nbytes["route"] = nbytes["route + plan"] - pairs * 8
        nbytes["pair gate_up"] = used * gu_b + T * sgu_b + pairs * H * 2 + pairs * I * 2
        nbytes["pair down+combine"] = used * dn_b + T * sdn_b + pairs * I * 2 + T * H * 2
        calls["route"] = [lambda lg=lg, x=x, L=L: route(lg, TOP_K, x=x, shared_gate_weight=L.shared_gate)
                          for lg, x, L in zip(logits, xs, layers)]
        calls["pair gate_up"] = [lambda x=x, r=r, L=L: PG.gate_up(x, r.ids, L.experts.gate_up, L.shared.gate, L.shared.up, I, E)
                                 for x, r, L in zip(xs, plans, layers)]
        hp = [PG.gate_up(x, r.ids, L.experts.gate_up, L.shared.gate, L.shared.up, I, E) for x, r, L in zip(xs, plans, layers)]
        calls["pair down+combine"] = [
            lambda h=h, r=r, L=L: PG.down(h, r.ids, r.weights, L.experts.down, L.shared.down, H, E, torch.bfloat16)
            for h, r, L in zip(hp, plans, layers)]
        # the model's decode path at T <= 4: router GEMV and routing in one launch (route_gemv)
        from ninfer_plugins.moe_triton.router import route_gemv
        from ninfer_plugins.quant_int import kernels as QK

        ws = QK.Workspace.get(xs[0].device)
        scratch = lambda: (ws.partials, ws.counters)  # noqa: E731 (read at call time: the sweep may grow it)
        nbytes["route_gemv"] = nbytes["router gemv"] + nbytes["route"]
        calls["route_gemv"] = [lambda x=x, L=L: route_gemv(x, L.router, TOP_K, L.shared_gate, scratch()) for x, L in zip(xs, layers)]
        if T == 1:
            # the post-mixer residual add + norm: its own launch (what the model runs by default),
            # against folded into route_gemv (NINFER_MOE_NORM=1); one residual row per layer
            from ninfer.kernels.triton.norms import rmsnorm

            nw = torch.zeros(H, dtype=torch.bfloat16, device=DEV)
            res = [torch.randn(1, H, device=DEV).bfloat16() for _ in layers]
            hout = torch.empty(1, H, dtype=torch.bfloat16, device=DEV)
            nbytes["add+norm"] = 4 * H * 2
            calls["add+norm"] = [lambda x=x, r=r: rmsnorm(x, nw, 1e-6, residual=r) for x, r in zip(xs, res)]
            nbytes["route_gemv+add+norm"] = nbytes["route_gemv"] + nbytes["add+norm"]
            calls["route_gemv+add+norm"] = [
                lambda x=x, L=L, r=r: route_gemv(x, L.router, TOP_K, L.shared_gate, scratch(), add_norm=(r, nw, 1e-6, hout))
                for x, L, r in zip(xs, layers, res)]
        # `layer` last: its bytes are the pair kernels' then
        nbytes["layer"] = nbytes["route_gemv"] + nbytes["pair gate_up"] + nbytes["pair down+combine"] + (
            T * E * 2 if T > 1 else 0)  # past one token the logits round-trip memory
        calls.pop("layer")
        calls["layer"] = [lambda x=x, L=L: _pair_layer(x, L, scratch()) for x, L in zip(xs, layers)]
        # the same layer in one launch (moe_block.py, NINFER_MOE_BLOCK=1): its error against the
        # three launches first (eagerly, which also makes its scratch outside the graphs)
        from ninfer_plugins.moe_triton import moe_block as MB

        L0 = layers[0]
        if MB.supports(L0.experts.gate_up, L0.experts.down, (L0.shared.gate, L0.shared.up, L0.shared.down), H, I, I):
            blk = lambda x, L: MB.moe_block(x, L.router, L.shared_gate, TOP_K, L.experts.gate_up, L.shared.gate,  # noqa: E731
                                            L.shared.up, L.experts.down, L.shared.down, I, E)[0]
            try:
                ref, got = _pair_layer(xs[0], L0, scratch()).float(), blk(xs[0], L0).float()
                err = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
                log(f"  T={T} block against the three launches: relative error {err:.2e}")
                results.append({"T": T, "op": "block vs layer", "rel_err": err})
            except Exception as e:  # the timings below then report the same error, the others stand
                log(f"  T={T} block: {type(e).__name__}: {str(e)[:200]}")
            nbytes["block"] = nbytes["layer"]
            calls["block"] = [lambda x=x, L=L: blk(x, L) for x, L in zip(xs, layers)]
            # router rows an item (the router's part is the block's first critical path: fewer,
            # larger items take fewer tickets, more, smaller ones finish sooner)
            nbytes["block keys"] = nbytes["layer"]  # router.py's _top_k_keys in the routing item
            calls["block keys"] = [
                lambda x=x, L=L: MB.moe_block(x, L.router, L.shared_gate, TOP_K, L.experts.gate_up, L.shared.gate,
                                              L.shared.up, L.experts.down, L.shared.down, I, E, topk_keys=True)[0]
                for x, L in zip(xs, layers)]
            # other pair configs inside the block (pair_gemv's were tuned as launches of their own):
            # fewer, larger gate_up / down items take fewer tickets and partial sums
            from ninfer_plugins.moe_triton import pair_gemv as PG

            gu0, dn0 = PG.configs_for(H, I)
            for label, cfgs in (("gu KBS4", (PG.PairConfig(gu0.block_n, 2 * gu0.kbs, gu0.rows, gu0.num_warps), dn0)),
                                ("gu R64", (PG.PairConfig(gu0.block_n, gu0.kbs, 2 * gu0.rows, gu0.num_warps), dn0)),
                                ("dn R64", (gu0, PG.PairConfig(dn0.block_n, dn0.kbs, 2 * dn0.rows, dn0.num_warps))),
                                ("w4", (PG.PairConfig(gu0.block_n, gu0.kbs, gu0.rows, 4), PG.PairConfig(dn0.block_n, dn0.kbs, dn0.rows, 4)))):
                if H % (128 * cfgs[0].kbs) or I % cfgs[0].rows or H % cfgs[1].rows:
                    continue
                nbytes[f"block {label}"] = nbytes["layer"]
                calls[f"block {label}"] = [
                    lambda x=x, L=L, c=cfgs: MB.moe_block(x, L.router, L.shared_gate, TOP_K, L.experts.gate_up, L.shared.gate,
                                                          L.shared.up, L.experts.down, L.shared.down, I, E, configs=c)[0]
                    for x, L in zip(xs, layers)]
            for rb in (2, 8):
                nbytes[f"block rb{rb}"] = nbytes["layer"]
                calls[f"block rb{rb}"] = [
                    lambda x=x, L=L, rb=rb: MB.moe_block(x, L.router, L.shared_gate, TOP_K, L.experts.gate_up, L.shared.gate,
                                                         L.shared.up, L.experts.down, L.shared.down, I, E, rows_per_item=rb)[0]
                    for x, L in zip(xs, layers)]
            if T == 1:
                # with the post-mixer residual add and norm inside (NINFER_MOE_BLOCK_NORM=1), against
                # "add+norm" then "block" above
                xn1 = torch.empty(1, H, dtype=torch.bfloat16, device=DEV)
                nbytes["block+add+norm"] = nbytes["block"] + nbytes["add+norm"]
                calls["block+add+norm"] = [
                    lambda x=x, L=L, r=r: MB.moe_block(x, L.router, L.shared_gate, TOP_K, L.experts.gate_up, L.shared.gate,
                                                       L.shared.up, L.experts.down, L.shared.down, I, E,
                                                       add_norm=(r, nw, 1e-6, xn1))[0]
                    for x, L, r in zip(xs, layers, res)]
    block_traced = "block" in calls
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
    if block_traced:
        _trace_block(xs, layers, T, results)


def _trace_block(xs, layers, T, results) -> None:
    """Where the one-launch block's time goes: every item's start, end of its wait and end from
    the GPU's timer (moe_block's trace), in the same CUDA-graph replay of all layers as the
    timings; per phase the median over the layers, µs from the block's first item."""
    import statistics

    import torch

    from ninfer_plugins.moe_triton import moe_block as MB

    try:
        counts = MB.item_count(T, TOP_K, H, I, E)
        traces = [torch.zeros(sum(counts), 4, dtype=torch.int64, device=DEV) for _ in layers]
        graph_ms_per_call([
            lambda x=x, L=L, tr=tr: MB.moe_block(x, L.router, L.shared_gate, TOP_K, L.experts.gate_up, L.shared.gate,
                                                 L.shared.up, L.experts.down, L.shared.down, I, E, trace=tr)
            for x, L, tr in zip(xs, layers, traces)], reps=2)
        sums = [MB.summarize_trace(tr, counts, T, TOP_K) for tr in traces]
    except Exception as e:  # a measurement aid: its failure ends nothing
        log(f"  T={T} block trace: {type(e).__name__}: {str(e)[:200]}")
        return
    med = {k: statistics.median(s[k] for s in sums) for k in sums[0]}
    results.append({"T": T, "op": "block trace", "items": list(counts), "phases_us": med})
    log(f"  T={T} block trace (items {counts}; median over {len(sums)} layers, us from the first item):")
    for k, v in med.items():
        log(f"      {k:40s} {v:7.2f}")


def _pair_layer(x, L, scratch):
    """The model's decode layer at T <= 4 (TritonMoe.forward_layer): the routing, then the pairs."""
    import torch

    from ninfer_plugins.moe_triton import pair_gemv as PG
    from ninfer_plugins.moe_triton.router import route, route_gemv, route_gemv_tokens

    if x.shape[0] <= route_gemv_tokens():
        r = route_gemv(x, L.router, TOP_K, L.shared_gate, scratch)
    else:  # as the model does past one token: the router linear, then `route`
        r = route(torch.nn.functional.linear(x, L.router), TOP_K, x=x, shared_gate_weight=L.shared_gate)
    h = PG.gate_up(x, r.ids, L.experts.gate_up, L.shared.gate, L.shared.up, I, E)
    return PG.down(h, r.ids, r.weights, L.experts.down, L.shared.down, H, E, torch.bfloat16)


def pair_sweep(layers: list[Layer], bw: float, results: list, deadline: float) -> None:
    """Block sizes of the pair kernels (pair_gemv.PairConfig) at T = 1 and 4, int4 layers."""
    import torch

    from ninfer_plugins.moe_triton import pair_gemv as PG
    from ninfer_plugins.moe_triton.router import route

    gu_cfgs = [PG.PairConfig(bn, kbs, rows, w) for bn in (32,) for kbs in (1, 2, 4) for rows in (32, 64) for w in (2, 4)
               if kbs * 16 * bn >= 128 * w]
    # one K slice (kbs = H / 128): each chunk finished in its only CTA, no counter
    onek = PG.one_slice_candidates(H)
    dn_cfgs = [PG.PairConfig(bn, kbs, rows, w) for bn in (32,) for kbs in (1, 2, 4) for rows in (32, 64, 128) for w in (2, 4)
               if kbs * 16 * bn >= 128 * w]
    small = list(PG.SMALL_DOWN_CANDIDATES)  # down with fewer rows a chunk
    if os.environ.get("NINFER_SWEEP_ONEK") == "1":  # the defaults and these only
        gu_cfgs, dn_cfgs = [PG.SPLIT_GATE_UP, *onek], [PG.WIDE_DOWN, *small]
    else:
        gu_cfgs, dn_cfgs = gu_cfgs + onek, dn_cfgs + small
    for T in (1, 4):
        xs = [torch.randn(T, H, device=DEV).bfloat16() for _ in layers]
        rs = [route(torch.nn.functional.linear(x, L.router), TOP_K, x=x, shared_gate_weight=L.shared_gate)
              for x, L in zip(xs, layers)]
        hs = [PG.gate_up(x, r.ids, L.experts.gate_up, L.shared.gate, L.shared.up, I, E) for x, r, L in zip(xs, rs, layers)]
        for kind, cfgs in (("gate_up", gu_cfgs), ("down", dn_cfgs)):
            for cfg in cfgs:
                if time.time() > deadline:
                    return
                if kind == "gate_up":
                    fns = [lambda x=x, r=r, L=L, c=cfg: PG.gate_up(x, r.ids, L.experts.gate_up, L.shared.gate, L.shared.up, I, E, c)
                           for x, r, L in zip(xs, rs, layers)]
                else:
                    fns = [lambda h=h, r=r, L=L, c=cfg: PG.down(h, r.ids, r.weights, L.experts.down, L.shared.down, H, E,
                                                                torch.bfloat16, c) for h, r, L in zip(hs, rs, layers)]
                try:
                    us = graph_ms_per_call(fns) * 1e3
                except Exception as e:  # noqa: BLE001
                    log(f"  pair sweep T={T} {kind} {cfg.describe()}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                results.append({"T": T, "op": f"pair {kind}", "config": cfg.describe(), "us": us})
                log(f"  pair sweep T={T} {kind:7s} {cfg.describe():28s} {us:7.2f} us")


def _layer_step(moe, x, L):
    import torch

    from ninfer_plugins.moe_triton.router import route

    plan = not moe.takes_pairs(x.shape[0], L.experts, L.shared)
    r = route(torch.nn.functional.linear(x, L.router), TOP_K, x=x, shared_gate_weight=L.shared_gate, plan=plan)
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


# --- 1. GPU tests -------------------------------------------------------------------------------

# most telling first: a timeout cuts the tail
TEST_FILES = [
    "tests/plugins/moe_triton/test_moe_router.py",
    "tests/plugins/moe_triton/test_moe_gpu_model.py",
    "tests/plugins/moe_triton/test_moe_grouped.py",
    "tests/plugins/moe_triton/test_moe_parity.py",
]


def run_tests(out: Path, timeout: float) -> dict:
    import importlib.util

    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfE"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", str(int(max(30, timeout * 0.6)))]  # one stuck test must not eat the rest
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", "4"]  # the tests' time is mostly Triton compiling
    cmd += TEST_FILES
    log("$ " + " ".join(cmd[1:]))
    t0 = time.time()
    # tests not started 30 s before the timeout are skipped (tests/plugins/moe_triton/conftest.py):
    # pytest then ends by itself and prints which failed; the timeout is the backstop
    env = dict(os.environ, NINFER_TEST_DEADLINE=str(t0 + max(20.0, timeout - 30)))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        as_text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        text, rc = as_text(e.stdout) + as_text(e.stderr) + f"\n(timed out after {timeout:.0f} s)", -1
    (out / "gpu_tests.log").write_text(text)
    lines = [line for line in text.strip().splitlines() if line.strip()] or ["(no output)"]
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    res = {"rc": rc, "summary": lines[-1][:200], "seconds": round(time.time() - t0, 1), "failed": failed[:40]}
    log(f"gpu tests: rc={rc} {res['summary']} ({res['seconds']} s)")
    for line in failed[:20]:
        log("  " + line[:300])
    return res


def precompile(out: Path, timeout: float = 90.0) -> dict:
    """Compile every MoE kernel variant into Triton's cache before the tests, in parallel processes
    (tests/plugins/moe_triton/compile_sm90.py, sharded): one process compiles one at a time, and
    compiling is most of the tests' time. Nothing is lost if it fails: the launches compile."""
    n = max(1, min(8, (os.cpu_count() or 2) // 2))
    script = ROOT / "tests" / "plugins" / "moe_triton" / "compile_sm90.py"
    env = dict(os.environ, TRITON_INTERPRET="0")
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, str(script), "--shard", f"{i}/{n}"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(n)]  # fmt: skip
    texts, rcs = [], []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(1.0, timeout - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            text += "\n(timed out)"
        texts.append(text)
        rcs.append(p.returncode)
    (out / "precompile.log").write_text("\n".join(texts))
    lines = [line for t in texts for line in t.splitlines() if line.startswith(("ok", "FAIL"))]
    res = {"processes": n, "rc": rcs, "kernels_ok": sum(line.startswith("ok") for line in lines),
           "failed": [line[:300] for line in lines if line.startswith("FAIL")], "seconds": round(time.time() - t0, 1)}  # fmt: skip
    log(f"precompile: {res['kernels_ok']} kernels in {n} processes, {len(res['failed'])} failed ({res['seconds']} s)")
    for line in res["failed"][:10]:
        log("  " + line)
    return res


# --- 3. ninfer bench end to end --------------------------------------------------------------------

E2E_ARGS = ["--prompt-len", "8192", "--gen-len", "64"]


# --e2e name suffixes -> the environment switch each sets
E2E_SWITCHES = {
    "pdl": ("NINFER_PDL", "1"),
    "nopdl": ("NINFER_PDL", "0"),  # programmatic dependent launch: on by default on sm_90+
    "gdnab": ("NINFER_GDN_AB", "1"),  # in_proj_a / in_proj_b inside the GDN decode step (the default)
    "nogdnab": ("NINFER_GDN_AB", "0"),
    "lookahead": ("NINFER_LOOKAHEAD", "1"),  # each decode step launched before the previous one's tokens are read
    "moenorm": ("NINFER_MOE_NORM", "1"),  # the post-mixer residual add and norm inside route_gemv
    "gemvnorm": ("NINFER_GEMV_NORM", "1"),  # the residual add and norm inside the f16x2 GEMV before it
    "noh2": ("NINFER_H2", "0"),
    "block": ("NINFER_MOE_BLOCK", "1"),  # the decode MoE layer in one launch (moe_block.py)
    "blocknorm": ("NINFER_MOE_BLOCK_NORM", "1"),  # with the post-mixer residual add and norm in it (with +block)
    "kw": ("NINFER_KW", "1"),  # the K-walk GEMV at M <= 4 (gemv_kw.py)
}


def run_e2e(out: Path, name: str, timeout: float, model: str = "qwen3.6-35b-a3b", extra: list | None = None) -> dict:
    """`ninfer bench --model MODEL --random-weights --quant QUANT ...` in a subprocess (a crash or
    a hang costs this run only, and the GPU's memory is its own); its JSON, or why there is none.
    `name` is the recipe, then any of E2E_SWITCHES after "+" signs (int4+gdnab+moenorm: the same
    run with those switches set)."""
    quant, *flags = name.split("+")
    unknown = [f for f in flags if f not in E2E_SWITCHES]
    if unknown:
        raise ValueError(f"--e2e {name}: unknown switch {unknown[0]!r}; known: {', '.join(E2E_SWITCHES)}")
    env = dict(os.environ)
    env.update(E2E_SWITCHES[f] for f in flags)
    path = out / f"bench_{name.replace('+', '_')}.json"
    argv = ["bench", "--model", model, "--random-weights", "--quant", quant, *(extra or E2E_ARGS), "--json", str(path)]
    cmd = [sys.executable, "-c", "import sys; from ninfer.cli import main; sys.exit(main(sys.argv[1:]))", *argv]
    log(f"$ ninfer {' '.join(argv)}   (timeout {timeout:.0f} s)")
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        as_text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        text, rc = as_text(e.stdout) + as_text(e.stderr) + f"\n(timed out after {timeout:.0f} s)", -1
    (out / f"bench_{name.replace('+', '_')}.log").write_text(text)
    seconds = round(time.time() - t0, 1)
    if rc == 0 and path.is_file():
        result = json.loads(path.read_text())
        result["wall_s"] = seconds
        log(text.strip()[-2500:])
        return result
    tail = "\n".join(text.strip().splitlines()[-15:])
    log(f"  ninfer bench {quant} failed (rc {rc}, {seconds} s):\n{tail}")
    return {"error": f"rc {rc}: {tail[-600:]}", "wall_s": seconds, "config": {"quant": quant}}


# --- the report ------------------------------------------------------------------------------------


def summary(results: dict) -> str:
    """The short table printed last (results.json has everything)."""
    lines = ["=== MoE campaign (bench/moe.py) ==="]
    dev = results.get("device", {})
    lines.append(f"{dev.get('name')} ({dev.get('sms')} SMs), torch {dev.get('torch')}, Triton {dev.get('triton')}, "
                 f"copy {results.get('copy_tbps', 0):.2f} TB/s")  # fmt: skip
    pc = results.get("precompile")
    if pc:
        lines.append(f"precompile: {pc['kernels_ok']} kernels for sm_90, {len(pc['failed'])} failed ({pc['seconds']} s)")
    t = results.get("gpu_tests")
    lines.append("gpu tests: " + ("skipped" if t is None else f"rc {t['rc']}, {t['summary']} ({t['seconds']} s)"))
    for recipe, rows in results.get("decode", {}).items():
        lines.append(f"decode {recipe}, us per layer (share of copy bandwidth; {LAYERS} layers each replay):")
        by_t: dict[int, list[str]] = {}
        for r in rows:
            if "phases_us" in r:
                cell = f"{r['op']}: kernel {r['phases_us'].get('kernel: last end', 0):.1f} us"
            elif "rel_err" in r:
                cell = f"{r['op']} rel. error {r['rel_err']:.1e}"
            else:
                cell = f"{r['op']} err" if "error" in r else f"{r['op']} {r['us']:.1f} ({r['share']:.0%})"
            by_t.setdefault(r["T"], []).append(cell)
        for T, cells in by_t.items():
            lines.append(f"  T={T:<3d} " + ", ".join(cells))
    for r in results.get("prefill", []):
        if "error" in r:
            lines.append(f"prefill {r.get('recipe')} T={r['T']}: error {r['error'][:100]}")
        else:
            lines.append(f"prefill {r['recipe']} T={r['T']}: {r['ms']:.3f} ms a layer, {r['tflops']:.0f} TFLOP/s "
                         f"(cuBLAS same FLOPs {r['cublas_same_flops_ms']:.3f} ms); MoE alone, 40 layers: "
                         f"{r['moe_tok_s_40_layers']:,.0f} tok/s")  # fmt: skip
    e2e = results.get("e2e", {})
    if e2e:
        lines.append(f"{'ninfer bench':14s} {'build s':>7s} {'prefill':>9s} {'decode':>8s} {'ms/step':>8s} {'replay':>7s} "
                     f"{'GB/step':>8s} {'roof ms':>8s} {'share':>6s} {'experts':>8s} {'peak GiB':>8s}")  # fmt: skip
    for quant, r in e2e.items():
        if "error" in r:
            lines.append(f"{quant:14s} ERROR ({r['wall_s']} s) {r['error'][-160:]}")
            continue
        d, moe = r["decode"], r.get("moe") or {}
        graph = "" if r["config"].get("cuda_graph") else f"  EAGER: {r['config'].get('eager_reason')}"
        lines.append(
            f"{quant:14s} {r.get('build_s') or 0:7.1f} {r['prefill']['tok_s']:9.0f} {d['tok_s']:8.1f} {d['ms_per_step']:8.3f} "
            f"{d.get('graph_replay_ms') or 0:7.3f} {r['bytes_per_step']['total'] / 1e9:8.3f} {r['roofline_ms']:8.3f} "
            f"{100 * r['roofline_share']:5.1f}% {moe.get('experts_read_per_layer', '-')!s:>8s} "
            f"{r['memory']['peak_serving_gib']!s:>8s}{graph}"
        )
    lines.append("bars (issue 7, H200, int4, 8K context): decode >= 700 tok/s, prefill >= 40,000 tok/s")
    return "\n".join(lines)


def main() -> int:
    global DEV, E, H, I, TOP_K, LAYERS, DECODE_T, PREFILL_T
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    ap.add_argument("--budget-s", type=float, default=320.0, help="no new section starts after this")
    ap.add_argument("--test-timeout", type=float, default=120.0)
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--no-precompile", action="store_true", help="let the tests compile the kernels one by one")
    ap.add_argument("--no-e2e", action="store_true", help="skip `ninfer bench`")
    ap.add_argument("--recipes", default="int4", help="kernel timings for these of int4,int8,bf16")
    ap.add_argument("--sweep", action="store_true", help="also sweep block sizes (several minutes)")
    ap.add_argument("--pair-sweep", action="store_true", help="sweep the pair kernels' block sizes (T = 1, 4)")
    ap.add_argument("--sweep-only", action="store_true", help="with --sweep / --pair-sweep: no decode or prefill timings")
    ap.add_argument("--e2e", default="int4,bf16", help="`ninfer bench` runs: recipes, each optionally with +switch suffixes (E2E_SWITCHES: "
                    "pdl, nopdl, gdnab, moenorm, gemvnorm, noh2), e.g. int4,int4+gdnab+moenorm")
    ap.add_argument("--floor", action="store_true", help="print the decode floor (arithmetic, no GPU) and exit")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--bandwidth-tbps", type=float, default=H200_COPY_TBPS)
    ap.add_argument("--smoke", action="store_true", help="toy sizes on the CPU, interpreted: checks the script")
    ap.add_argument("--decode-t", default=None, help="token counts of the decode timings (default 1,4,16)")
    args = ap.parse_args()
    if args.decode_t:
        DECODE_T = tuple(int(t) for t in args.decode_t.split(","))
    for name in [n for n in args.e2e.split(",") if n]:
        bad = [f for f in name.split("+")[1:] if f not in E2E_SWITCHES]
        if bad:
            ap.error(f"--e2e {name}: unknown switch {bad[0]!r}; known: {', '.join(E2E_SWITCHES)}")
    if args.floor:
        for q in ("int4", "int8", "bf16"):
            print(floor_table(decode_floor(args.context, q, args.bandwidth_tbps)))
            print()
        return 0
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        DEV, E, H, I, TOP_K, LAYERS, DECODE_T, PREFILL_T = "cpu", 8, 128, 128, 3, 2, (1, 16), (40,)
        args.no_tests = True

    t_start = time.time()
    deadline = t_start + args.budget_s
    left = lambda: deadline - time.time()  # noqa: E731
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "argv": sys.argv[1:]}

    def save():
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))

    # 1. tests (after the kernels' compilation, spread over the CPU's cores)
    if not args.no_tests and not args.no_precompile:
        results["precompile"] = precompile(out)
        save()
    if not args.no_tests:
        results["gpu_tests"] = run_tests(out, min(args.test_timeout, max(60.0, 0.5 * left())))
        save()

    # 2. kernel timings
    import gc

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
    results["decode"], results["prefill"], results["sweep"] = {}, [], []
    # leave the end-to-end run of int4 (about 2 minutes) its time
    kernels_deadline = deadline - (0 if args.no_e2e else 140)
    for recipe in [r for r in args.recipes.split(",") if r]:
        if time.time() > kernels_deadline:
            break
        try:
            # bf16 experts are 1.6 GB a layer: 16 layers still dwarf the L2
            count = LAYERS if recipe != "bf16" else min(16, LAYERS)
            t0 = time.time()
            layers = build_layers(recipe, count)
            log(f"{recipe}: {count} layers built in {time.time() - t0:.0f} s")
            rows = results["decode"].setdefault(recipe, [])
            for T in () if args.sweep_only else DECODE_T:
                if time.time() > kernels_deadline:
                    break
                bench_decode(layers, T, bw, moe, rows)
                save()
            if recipe == "bf16" and time.time() < kernels_deadline:
                bench_reference_bf16(layers, bw, rows)
            # the tile kernels, then (int recipes) every expert decoded to bf16 + grouped GEMMs
            # (prefill_grouped.py, NINFER_MOE_PREFILL=grouped), at the longest prefill size
            for label, grouped in ((recipe, False), (f"{recipe}+grouped", True)):
                if time.time() >= kernels_deadline or (grouped and recipe == "bf16") or args.sweep_only:
                    continue
                old_env = os.environ.get("NINFER_MOE_PREFILL")
                os.environ["NINFER_MOE_PREFILL"] = "grouped" if grouped else ""
                try:
                    bench_prefill(layers[0], PREFILL_T[-1], moe, results["prefill"], label)
                except Exception as e:  # noqa: BLE001 - one failing section must not end the campaign
                    results["prefill"].append({"recipe": label, "T": PREFILL_T[-1], "error": f"{type(e).__name__}: {str(e)[:200]}"})
                    log(f"  prefill {label}: {type(e).__name__}: {str(e)[:300]}")
                finally:
                    if old_env is None:
                        os.environ.pop("NINFER_MOE_PREFILL", None)
                    else:
                        os.environ["NINFER_MOE_PREFILL"] = old_env
            if args.pair_sweep and recipe == "int4":
                pair_sweep(layers, bw, results["sweep"], kernels_deadline)
            if args.sweep and recipe == "int4":
                sweep(layers, bw, results["sweep"], kernels_deadline)
        except Exception as e:  # noqa: BLE001
            results.setdefault("errors", []).append(f"{recipe}: {type(e).__name__}: {str(e)[:300]}")
            log(f"{recipe} kernel timings failed: {type(e).__name__}: {str(e)[:300]}")
        save()
        layers = None
        gc.collect()
        if DEV == "cuda":
            torch.cuda.empty_cache()

    # 3. end to end, each in its own process
    if not args.no_e2e:
        results["e2e"] = {}
        if args.smoke:
            from ninfer.testing import make_tiny

            tiny = make_tiny("qwen3.6-35b-a3b", out / "tiny_35b", vocab=512, layers=2)
            runs = [("bf16", str(tiny), ["--device", "cpu", "--prompt-len", "16", "--gen-len", "5"])]
        else:
            runs = [(name, "qwen3.6-35b-a3b", None) for name in args.e2e.split(",") if name]
        for i, (name, model, extra) in enumerate(runs):
            # the first runs whatever the budget says: it is the figure this call is for
            if i and left() < 120:
                log(f"ninfer bench {name}: skipped, {left():.0f} s of the budget left")
                results["e2e"][name] = {"error": "skipped: out of budget", "wall_s": 0}
                continue
            results["e2e"][name] = run_e2e(out, name, max(left(), 240.0) if i == 0 else left(), model, extra)
            save()

    text = summary(results)
    (out / "summary.txt").write_text(text)
    if results.get("decode") or results.get("prefill"):
        (out / "kernels.md").write_text(kernel_tables(results))
    log("")
    log(text)
    log(f"total {time.time() - t_start:.0f} s; JSON and logs in {out}")
    return 0


def kernel_tables(results: dict) -> str:
    """The per-op decode tables (markdown) for BENCHMARKS.md."""
    lines = []
    for recipe, rows in results.get("decode", {}).items():
        lines += ["", f"## Decode, {recipe} (per layer; median of CUDA-graph replays of {LAYERS} layers)", "",
                  "| T | op | us | MB | GB/s | share | experts read |", "|---:|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['T']} | {r['op']} | error: {r['error'][:80]} | | | | |")
            elif "rel_err" in r:
                lines.append(f"| {r['T']} | {r['op']} | relative error {r['rel_err']:.1e} | | | | |")
            elif "phases_us" in r:
                phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases_us"].items())
                lines.append(f"| {r['T']} | {r['op']} | {phases} | | | | |")
            else:
                lines.append(f"| {r['T']} | {r['op']} | {r['us']:.2f} | {r['bytes'] / 1e6:.2f} | {r['gbps']:.0f} | "
                             f"{r['share']:.1%} | {r.get('experts_used', '')} |")  # fmt: skip
    if results.get("sweep"):
        lines += ["", "## Sweep (int4)", ""]
        best: dict = {}
        for r in results["sweep"]:
            if "error" in r:
                continue
            # the tile sweep's rows name "which" / "cfg"; the pair sweep's "op" / "config" / "us"
            key = (r["T"], r.get("which", r.get("op")))
            val = r.get("layer_us", r.get("layer_ms", r.get("us")))
            if key not in best or val < best[key][0]:
                best[key] = (val, r.get("cfg", r.get("config")))
        for (T, which), (val, cfg) in sorted(best.items()):
            lines.append(f"- T={T} {which}: best {cfg} ({val:.3f} {'us' if T <= 16 else 'ms'})")
    return "\n".join(lines).strip() + "\n"


if __name__ == "__main__":
    sys.exit(main())
