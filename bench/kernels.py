"""Decode-kernel campaign for the lent GPU, in one call: the `-m gpu` tests of the Triton
kernels, then microbenchmarks at the Qwen3.6-27B decode shapes, each timed as CUDA-graph replays
(a whole step's worth of layers per replay, distinct buffers per layer so L2 cannot hold them).

    python3 bench/kernels.py [--skip-tests] [--budget-s 240]

Reports, per figure: ms per replay (median), bytes it must move, GB/s, and the share of the
device-to-device copy bandwidth measured at the start of the same run. Full results go to
$OUT/kernels.json (and $OUT/pytest.log); a short table is printed last.
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

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT", ROOT / "bench_out"))

# Qwen3.6-27B decode shapes (reference/qwen-hybrid-spec.md §1.1)
H, INTER = 5120, 17408
HQ, HKV, HEAD = 24, 4, 256
ATTN_LAYERS, GDN_LAYERS = 16, 48
GHK, GHV, GD = 16, 48, 128
CONV = 2 * GHK * GD + GHV * GD
PAGE = 64
DEV = "cuda"

RESULTS: list[dict] = []
T0 = time.time()


def graph_ms(fn, reps: int = 30) -> float:
    """Median ms of one replay of a CUDA graph holding fn()'s launches."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    del g
    return statistics.median(times)


def record(group: str, name: str, ms: float, nbytes: float, copy_bw: float, **extra) -> None:
    gbs = nbytes / ms / 1e6
    row = dict(group=group, name=name, ms=round(ms, 4), mbytes=round(nbytes / 1e6, 2), gbs=round(gbs, 1),
               share=round(gbs * 1e9 / copy_bw, 3) if copy_bw else None, **extra)
    RESULTS.append(row)
    print(f"  {group:10s} {name:58s} {ms:8.4f} ms {nbytes / 1e6:9.1f} MB {gbs:8.1f} GB/s "
          f"{(row['share'] or 0) * 100:5.1f}%", flush=True)


def copy_bandwidth() -> float:
    """The ceiling every share is taken of: ninfer.bench's device-to-device copy (read + written)."""
    from ninfer.bench import copy_bandwidth as measure

    bw = measure(torch.device(DEV))
    RESULTS.append(dict(group="ceiling", name="d2d copy (read+write)", gbs=round(bw / 1e9, 1)))
    print(f"  copy bandwidth: {bw / 1e12:.3f} TB/s", flush=True)
    return bw


def over_budget(args) -> bool:
    return time.time() - T0 > args.budget_s


# ------------------------------------------------------------------------------ attention


def bench_attention(args, copy_bw: float, cases=((8192, 1), (131072, 1)), with_sdpa=True) -> None:
    from ninfer.kernels.triton import decode_attention, qk_norm_rope_append
    from ninfer.kernels.reference import rope_inv_freq

    bf16_configs = [
        dict(block_n=64, num_warps=4, num_stages=2),
        dict(block_n=64, num_warps=8, num_stages=2),
        dict(block_n=32, num_warps=4, num_stages=3),
    ]
    int8_configs = [
        dict(block_n=64, num_warps=4, num_stages=2, int8_dequant="asm"),
        dict(block_n=64, num_warps=4, num_stages=3, int8_dequant="asm"),
        dict(block_n=32, num_warps=4, num_stages=3, int8_dequant="asm"),
        dict(block_n=64, num_warps=8, num_stages=2, int8_dequant="asm"),
        dict(block_n=64, num_warps=4, num_stages=2, int8_dequant="cvt"),
    ]
    for ctx, B in cases:
        for quant in (True, False) if ctx > 8192 else (False, True):
            if over_budget(args):
                print("  (budget spent: attention sweep stopped)")
                return
            nblk = B * ctx // PAGE
            layers = []
            for _ in range(ATTN_LAYERS):
                if quant:
                    kc = torch.randint(-127, 128, (nblk, PAGE, HKV, HEAD), dtype=torch.int8, device=DEV)
                    vc = torch.randint(-127, 128, (nblk, PAGE, HKV, HEAD), dtype=torch.int8, device=DEV)
                    ks = (torch.rand(nblk, PAGE, HKV, HEAD // 64, device=DEV) * 0.02 + 0.001).half()
                    vs = (torch.rand(nblk, PAGE, HKV, HEAD // 64, device=DEV) * 0.02 + 0.001).half()
                else:
                    kc = torch.randn(nblk, PAGE, HKV, HEAD, dtype=torch.bfloat16, device=DEV)
                    vc = torch.randn(nblk, PAGE, HKV, HEAD, dtype=torch.bfloat16, device=DEV)
                    ks = vs = None
                layers.append((kc, vc, ks, vs))
            bt = torch.randperm(nblk, device=DEV).int().reshape(B, -1)
            lens = torch.full((B,), ctx, dtype=torch.int32, device=DEV)
            qg = torch.randn(B, 1, HQ, 2 * HEAD, dtype=torch.bfloat16, device=DEV)
            q, gate = qg[..., :HEAD], qg[..., HEAD:]
            out = torch.empty(B, 1, HQ, HEAD, dtype=torch.bfloat16, device=DEV)
            per_tok = HKV * (2 * HEAD + 2 * (HEAD // 64) * 2 if quant else 2 * HEAD * 2)
            nbytes = ATTN_LAYERS * B * ctx * per_tok
            kind = "int8" if quant else "bf16"
            configs = int8_configs if quant else bf16_configs
            if B > 1:
                configs = configs[:1]
            elif ctx == 8192:
                configs = configs + [dict(configs[0], num_splits=132)]
            for cfg in configs:
                def step(cfg=cfg):
                    for kc, vc, ks, vs in layers:
                        decode_attention(q, kc, vc, bt, lens, k_scale=ks, v_scale=vs, gate=gate, out=out, **cfg)
                try:
                    ms = graph_ms(step)
                except Exception as e:  # keep the campaign going; the table shows what failed
                    print(f"  attention {ctx} {kind} {cfg}: FAILED {type(e).__name__}: {e}"[:400], flush=True)
                    continue
                record("attention", f"ctx={ctx} B={B} {kind} x{ATTN_LAYERS} {cfg}", ms, nbytes, copy_bw,
                       ctx=ctx, batch=B, kv=kind, config=cfg, baseline_ms=0.38 if (ctx, B, quant) == (8192, 1, False) else None)
            if (ctx, B) == cases[0]:
                # the attention prep (q/k norm + RoPE + append) for the same 16 layers
                inv = rope_inv_freq(64, 1e7, DEV)
                kv_new = torch.randn(B, 2, HKV, HEAD, dtype=torch.bfloat16, device=DEV)
                qw = torch.randn(HEAD, dtype=torch.bfloat16, device=DEV) * 0.1
                pos = torch.full((B,), ctx - 1, device=DEV)
                slot = bt[:, -1].long() * PAGE + PAGE - 1

                def prep():
                    for kc, vc, ks, vs in layers:
                        qk_norm_rope_append(q[:, 0], kv_new[:, 0], kv_new[:, 1], qw, qw, pos, inv, kc, vc, slot,
                                            k_scale=ks, v_scale=vs, q_out=out[:, 0])
                record("attn-prep", f"qk_norm_rope_append {kind} x{ATTN_LAYERS}", graph_ms(prep),
                       ATTN_LAYERS * B * (HQ * HEAD * 4 + 4 * HKV * HEAD * 2), copy_bw)
                cfg0 = configs[0]

                def block():
                    for kc, vc, ks, vs in layers:
                        qk_norm_rope_append(q[:, 0], kv_new[:, 0], kv_new[:, 1], qw, qw, pos, inv, kc, vc, slot,
                                            k_scale=ks, v_scale=vs, q_out=out[:, 0])
                        decode_attention(out, kc, vc, bt, lens, k_scale=ks, v_scale=vs, gate=gate, out=out2, **cfg0)
                out2 = torch.empty_like(out)
                record("attn-total", f"prep + attention ctx={ctx} B={B} {kind} x{ATTN_LAYERS} {cfg0}", graph_ms(block),
                       nbytes, copy_bw)
            del layers
            torch.cuda.empty_cache()

    if not with_sdpa:
        return
    # same-run baseline: torch SDPA over a contiguous [B, Hkv, L, D] bf16 cache, GQA 6
    import torch.nn.functional as F

    ctx = 8192
    ks_ = [torch.randn(1, HKV, ctx, HEAD, dtype=torch.bfloat16, device=DEV) for _ in range(ATTN_LAYERS)]
    vs_ = [torch.randn(1, HKV, ctx, HEAD, dtype=torch.bfloat16, device=DEV) for _ in range(ATTN_LAYERS)]
    qq = torch.randn(1, HQ, 1, HEAD, dtype=torch.bfloat16, device=DEV)

    def sdpa():
        for k, v in zip(ks_, vs_):
            F.scaled_dot_product_attention(qq, k, v, enable_gqa=True)

    try:
        record("attention", f"torch SDPA ctx=8192 B=1 bf16 x{ATTN_LAYERS} (same run)", graph_ms(sdpa),
               ATTN_LAYERS * ctx * HKV * HEAD * 4, copy_bw)
    except Exception as e:
        print(f"  SDPA baseline FAILED: {e}"[:300])
    del ks_, vs_
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ GDN


def bench_gdn(args, copy_bw: float) -> None:
    from ninfer.kernels.triton import gdn_decode_step
    from ninfer.kernels.triton.gdn import default_block_v

    for B in (1, 4):
        if over_budget(args):
            print("  (budget spent: GDN sweep stopped)")
            return
        layers = []
        for _ in range(GDN_LAYERS):
            layers.append(dict(
                conv_weight=torch.randn(CONV, 4, dtype=torch.bfloat16, device=DEV) * 0.5,
                conv_state=torch.randn(B, CONV, 3, dtype=torch.bfloat16, device=DEV),
                A_log=torch.randn(GHV, device=DEV) * 0.5,
                dt_bias=torch.randn(GHV, device=DEV) * 0.5,
                ssm_state=torch.randn(B, GHV, GD, GD, device=DEV) * 0.1,
                mixed_qkv=torch.randn(B, CONV, dtype=torch.bfloat16, device=DEV),
                a=torch.randn(B, GHV, dtype=torch.bfloat16, device=DEV),
                b=torch.randn(B, GHV, dtype=torch.bfloat16, device=DEV),
                z=torch.randn(B, GHV * GD, dtype=torch.bfloat16, device=DEV),
            ))
        norm_w = torch.ones(GD, dtype=torch.bfloat16, device=DEV)
        out = torch.empty(B, GHV, GD, dtype=torch.bfloat16, device=DEV)
        state_bytes = GHV * GD * GD * 4 * 2
        core_bytes = B * (state_bytes + CONV * 3 * 2 * 2 + CONV * 2 + GHV * GD * 2)
        for bv, warps, with_z in ((None, None, True), (16, 4, True), (None, None, False), (16, 4, False),
                                  (32, 4, False), (64, 4, False), (16, 2, False)):
            def step(bv=bv, warps=warps, with_z=with_z):
                for L in layers:
                    gdn_decode_step(L["mixed_qkv"], L["a"], L["b"], L["conv_weight"], L["conv_state"], L["A_log"],
                                    L["dt_bias"], L["ssm_state"], num_k_heads=GHK, head_k_dim=GD, head_v_dim=GD, z=L["z"] if with_z else None,
                                    norm_weight=norm_w if with_z else None, out=out, block_v=bv, num_warps=warps)
            if bv is not None and bv > GD:
                continue
            # the op's own traffic (z read once), whether or not the norm runs as a second kernel
            nbytes = GDN_LAYERS * (core_bytes + (B * GHV * GD * 2 if with_z else 0))
            tag = ("fused norm" if bv is None else "+ gated-norm kernel") if with_z else "no norm"
            bv_name = bv if bv is not None else ("default" if with_z else f"default={default_block_v(B, GHV, GD, DEV)}")
            try:
                record("gdn", f"B={B} x{GDN_LAYERS} BV={bv_name} warps={warps} {tag}", graph_ms(step), nbytes, copy_bw,
                       batch=B, block_v=bv, warps=warps, norm=with_z, baseline_ms=0.22 if B == 1 and not with_z else None)
            except Exception as e:
                print(f"  gdn B={B} bv={bv_name}: FAILED {type(e).__name__}: {e}"[:400], flush=True)
        try:
            from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        except Exception as e:  # fla is optional
            print(f"  fla not importable: {e}"[:200])
            continue
        qf = torch.randn(B, 1, GHK, GD, dtype=torch.bfloat16, device=DEV)
        kf = torch.randn(B, 1, GHK, GD, dtype=torch.bfloat16, device=DEV)
        vf = torch.randn(B, 1, GHV, GD, dtype=torch.bfloat16, device=DEV)
        gf = -torch.rand(B, 1, GHV, device=DEV)
        bf = torch.rand(B, 1, GHV, device=DEV)

        def fla_step():
            for L in layers:
                fused_recurrent_gated_delta_rule(qf, kf, vf, g=gf, beta=bf, initial_state=L["ssm_state"],
                                                 output_final_state=True, use_qk_l2norm_in_kernel=True)
        try:
            record("gdn", f"fla 0.6 fused_recurrent B={B} x{GDN_LAYERS} (same run; no conv, new state out)",
                   graph_ms(fla_step), GDN_LAYERS * B * (state_bytes + 2 * GHV * GD * 2 + 2 * GHK * GD * 2), copy_bw,
                   batch=B)
        except Exception as e:
            print(f"  fla FAILED: {e}"[:300])
        del layers
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------- norms


def bench_small(args, copy_bw: float) -> None:
    from ninfer.kernels.triton import gated_rmsnorm, rmsnorm, sigmoid_gate, swiglu

    n_norm = 2 * (ATTN_LAYERS + GDN_LAYERS)
    xs = [torch.randn(1, H, dtype=torch.bfloat16, device=DEV) for _ in range(n_norm)]
    res = torch.randn(1, H, dtype=torch.bfloat16, device=DEV)
    w = torch.randn(H, dtype=torch.bfloat16, device=DEV) * 0.1
    out = torch.empty(1, H, dtype=torch.bfloat16, device=DEV)

    def norms():
        for x in xs:
            rmsnorm(x, w, residual=res, out=out)
    record("small", f"add+rmsnorm H={H} x{n_norm} (B=1)", graph_ms(norms), n_norm * H * 2 * 5, copy_bw,
           per_call_us=None)
    RESULTS[-1]["per_call_us"] = round(RESULTS[-1]["ms"] * 1e3 / n_norm, 2)

    nl = ATTN_LAYERS + GDN_LAYERS
    gus = [torch.randn(1, 2 * INTER, dtype=torch.bfloat16, device=DEV) for _ in range(nl)]
    act = torch.empty(1, INTER, dtype=torch.bfloat16, device=DEV)

    def sw():
        for gu in gus:
            swiglu(gu, out=act)
    record("small", f"swiglu I={INTER} x{nl} (B=1)", graph_ms(sw), nl * INTER * 2 * 3, copy_bw)

    o = torch.randn(1, GHV, GD, dtype=torch.bfloat16, device=DEV)
    z = torch.randn(1, GHV, GD, dtype=torch.bfloat16, device=DEV)
    gw = torch.ones(GD, dtype=torch.bfloat16, device=DEV)

    def gn():
        for _ in range(GDN_LAYERS):
            gated_rmsnorm(o, z, gw, out=o)
    record("small", f"gated_rmsnorm 48x128 x{GDN_LAYERS} (B=1)", graph_ms(gn), GDN_LAYERS * GHV * GD * 2 * 3, copy_bw)

    a = torch.randn(1, HQ, 2 * HEAD, dtype=torch.bfloat16, device=DEV)

    def sg():
        for _ in range(ATTN_LAYERS):
            sigmoid_gate(a[..., :HEAD], a[..., HEAD:], out=a[..., :HEAD])
    record("small", f"sigmoid_gate 24x256 x{ATTN_LAYERS} (B=1)", graph_ms(sg), ATTN_LAYERS * HQ * HEAD * 2 * 3, copy_bw)

    # prefill-sized rows: bandwidth, not launches
    T = 8192
    xp = torch.randn(T, H, dtype=torch.bfloat16, device=DEV)
    rp = torch.randn(T, H, dtype=torch.bfloat16, device=DEV)
    op = torch.empty_like(xp)
    record("small", f"add+rmsnorm [{T}, {H}] x1", graph_ms(lambda: rmsnorm(xp, w, residual=rp, out=op)),
           T * H * 2 * 4, copy_bw)
    gup = torch.randn(T, 2 * INTER, dtype=torch.bfloat16, device=DEV)
    actp = torch.empty(T, INTER, dtype=torch.bfloat16, device=DEV)
    record("small", f"swiglu [{T}, {2 * INTER}] x1", graph_ms(lambda: swiglu(gup, out=actp)), T * INTER * 2 * 3, copy_bw)


def run_tests(args) -> None:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests/core/kernels").glob("test_triton_*.py"))
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-n", str(args.workers), *files]
    print("$", " ".join(cmd), flush=True)
    t = time.time()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.test_timeout)
        log = r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        log = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        log += f"\nTIMEOUT after {args.test_timeout}s"
    (OUT / "pytest.log").write_text(log)
    tail = [ln for ln in log.splitlines() if ln.strip()][-25:]
    print("\n".join(tail))
    print(f"  tests took {time.time() - t:.0f} s", flush=True)
    RESULTS.append(dict(group="tests", name="pytest -m gpu", seconds=round(time.time() - t, 1), tail=tail[-3:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--test-timeout", type=int, default=130)
    ap.add_argument("--budget-s", type=float, default=210, help="stop starting new sweeps after this many seconds")
    ap.add_argument("--only", default="attention,gdn,small,attention-batch")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    import triton

    import ninfer.kernels.triton as kernels

    info = dict(gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d"), kernels=kernels.__file__)
    print(info, flush=True)
    if not args.skip_tests:
        run_tests(args)
    copy_bw = copy_bandwidth()
    for part in args.only.split(","):
        try:
            {"attention": bench_attention, "gdn": bench_gdn, "small": bench_small,
             "attention-batch": lambda a, c: bench_attention(a, c, cases=((8192, 8),), with_sdpa=False)}[part](args, copy_bw)
        except Exception as e:
            print(f"  {part} FAILED: {type(e).__name__}: {e}"[:500], flush=True)
        torch.cuda.empty_cache()
    (OUT / "kernels.json").write_text(json.dumps(dict(info=info, copy_bw=copy_bw, results=RESULTS), indent=1))
    print(f"\n== decode kernels ({info['gpu']}, torch {info['torch']}, triton {info['triton']}, "
          f"copy {copy_bw / 1e12:.2f} TB/s, {time.time() - T0:.0f} s) ==")
    best: dict[str, dict] = {}
    for r in RESULTS:
        if r.get("group") in ("attention", "gdn", "attn-prep", "small") and "ms" in r:
            key = r["name"].split(" {")[0].split(" BV=")[0] if r["group"] != "small" else r["name"]
            if r["group"] == "gdn" and "fla" not in r["name"]:
                key += " norm" if r.get("norm") else " core"
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
    for key, r in best.items():
        print(f"{key[:70]:70s} {r['ms']:8.4f} ms {r['gbs']:7.0f} GB/s {r['share'] * 100:5.1f}%"
              + (f"  base {r['baseline_ms']}" if r.get("baseline_ms") else ""))


if __name__ == "__main__":
    main()
