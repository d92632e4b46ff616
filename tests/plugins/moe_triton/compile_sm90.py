"""Compile every MoE kernel variant for sm_90 (H200) on a machine without a GPU.

The interpreter (CI) runs kernels as numpy and accepts things the GPU compiler rejects: a name
bound to an int32 in one branch of a runtime `if` and to an int64 in the other, a tile shape the
MMA cannot take, too much shared memory. This script swaps Triton's driver for one that answers
"CUDA, sm_90" and makes each launch compile without running, then drives the real host wrappers
(router.route, grouped_gemv.gate_up / down / combine) at the real 35B shapes with tensors that
are never read, in every format pair and decode / prefill config. Triton's bundled ptxas
assembles the result, so register or shared-memory overflows show here too.

    TRITON_INTERPRET=0 python tests/plugins/moe_triton/compile_sm90.py [--quick] [--shard I/N]

Exit status 1 when any variant fails. Run by test_moe_compile.py (slow) in a subprocess, since a
process that already imported the kernels under TRITON_INTERPRET=1 holds interpreted ones. On the
GPU machine bench/moe.py runs N shards at once before its tests: the compiled kernels land in
Triton's cache under the keys the real launches look up (same target, shapes and strides), so
the tests and timings start warm.
"""

from __future__ import annotations

import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.runtime.jit as jit  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402

# H200 (sm_90): 227 KiB of shared memory a block at most
MAX_SHARED = 232_448
E, H, I, TOP_K = 256, 2048, 512, 8


class _CompileOnlyDriver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True


compiled: list[tuple[str, object]] = []


def install() -> None:
    driver.set_active(_CompileOnlyDriver())
    original = jit.JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = original(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    jit.JITFunction.run = compile_only


def _matrix(GV, fmt: int, rows: int, k: int):
    kp = -(-k // 128) * 128
    u8 = torch.uint8
    if fmt == 0:
        return GV.Matrix(0, torch.empty(rows, k, dtype=torch.bfloat16), k)
    if fmt == 8:
        return GV.Matrix(8, torch.empty(rows, kp, dtype=u8), k, torch.empty(rows, kp // 32, dtype=torch.float16))
    if fmt == 16:  # NVFP4, g16-split8-f16: codes, e4m3 block scales, fp32 global scale per row
        return GV.Matrix(16, torch.empty(rows, kp // 2, dtype=u8), k, torch.empty(rows, kp // 16, dtype=u8), None,
                         torch.empty(rows, dtype=torch.float32))
    high = None if fmt == 4 else torch.empty(rows, kp * (fmt - 4) // 8, dtype=u8)
    return GV.Matrix(fmt, torch.empty(rows, kp // 2, dtype=u8), k, torch.empty(rows, kp // 64, dtype=torch.float16), high)


def variants(quick: bool):
    from ninfer_plugins.moe_triton import grouped_gemm as GM
    from ninfer_plugins.moe_triton import grouped_gemv as GV

    # (routed gate_up, routed down, shared): the int4 recipe (q5 and q6 down), int8, bf16, and
    # the wider codes on the gate_up side with a dense shared expert
    pairs = [(4, 5, 8), (4, 6, 8), (8, 8, 8), (0, 0, 0), (6, 5, 0), (16, 16, 16)]
    if quick:
        pairs = pairs[:1] + pairs[3:4]
    for gu, dn, sh in pairs:
        for name, cu, cd, T in (("decode", GV.DECODE_GATE_UP, GV.DECODE_DOWN, 16),
                                ("prefill", GM.PREFILL_GATE_UP, GM.PREFILL_DOWN, 1024)):  # fmt: skip
            for fast in (True, False) if name == "decode" and not quick else (True,):
                yield f"{name} {gu}/{dn}/{sh}{'' if fast else ' plain'}", (GV, gu, dn, sh, cu, cd, T, fast)


def run_variant(GV, gu, dn, sh, cu, cd, T, fast) -> None:
    from ninfer_plugins.moe_triton.router import Routing

    slots = TOP_K + 1
    r = Routing(torch.zeros(T, slots, dtype=torch.int32), torch.zeros(T, slots), TOP_K, slots,
                torch.zeros(4, dtype=torch.int32), torch.zeros(4, cu.block_m, dtype=torch.int32), cu.block_m)  # fmt: skip
    x = torch.empty(T, H, dtype=torch.bfloat16)
    shared = (_matrix(GV, sh, I, H), _matrix(GV, sh, I, H))
    h = GV.gate_up(x, r, _matrix(GV, gu, E * 2 * I, H), I, E, cu, shared, I, fast=fast)
    y = GV.down(h, r, _matrix(GV, dn, E * H, I), H, I, E, cd, _matrix(GV, sh, H, I), I, fast=fast)
    GV.combine(y, T, slots, torch.bfloat16)


def pair_variants(quick: bool):
    """The pair kernels of decode at T <= 4 (pair_gemv.py): int formats only."""
    for gu, dn, sh in ((4, 5, 8), (4, 6, 8), (8, 8, 8), (16, 16, 16), (16, 16, 8))[: 1 if quick else None]:
        for fast in (True, False) if not quick else (True,):
            yield f"pairs {gu}/{dn}/{sh}{'' if fast else ' plain'}", (lambda a=(gu, dn, sh, fast): run_pairs(*a))
    yield "pairs 4/5/8 down + residual add and norm", lambda: run_pairs(4, 5, 8, True, add_norm=True)
    # NINFER_MOE_EARLY under PDL: gate_up with the trigger after its wait, down loading its ids and
    # tile before its own (and the same with the add+norm)
    yield "pairs 4/5/8 early, PDL", lambda: run_pairs(4, 5, 8, True, early=True)
    yield "pairs 4/6/8 early, PDL, down + add and norm", lambda: run_pairs(4, 6, 8, True, add_norm=True, early=True)


def run_pairs(gu, dn, sh, fast, add_norm: bool = False, early: bool = False) -> None:
    import ninfer.kernels.triton.launch as L
    from ninfer_plugins.moe_triton import grouped_gemv as GV
    from ninfer_plugins.moe_triton import pair_gemv as PG

    if early:
        enabled = L.pdl_enabled
        L.pdl_enabled = lambda device: True
        try:
            return _pairs(GV, PG, gu, dn, sh, fast, add_norm, True)
        finally:
            L.pdl_enabled = enabled
    return _pairs(GV, PG, gu, dn, sh, fast, add_norm, False)


def _pairs(GV, PG, gu, dn, sh, fast, add_norm, early) -> None:
    T, slots = 4, TOP_K + 1
    ids = torch.zeros(T, slots, dtype=torch.int32)
    x = torch.empty(T, H, dtype=torch.bfloat16)
    h = PG.gate_up(x, ids, _matrix(GV, gu, E * 2 * I, H), _matrix(GV, sh, I, H), _matrix(GV, sh, I, H), I, E, fast=fast,
                   early_down=early)
    an = (torch.empty(T, H, dtype=torch.bfloat16), torch.empty(H, dtype=torch.bfloat16), 1e-6,
          torch.empty(T, H, dtype=torch.bfloat16)) if add_norm else None
    PG.down(h, ids, torch.zeros(T, slots), _matrix(GV, dn, E * H, I), _matrix(GV, sh, H, I), H, E, torch.bfloat16,
            fast=fast, add_norm=an, early_down=early)


def block_variants(quick: bool):
    """The one-launch decode MoE layer (moe_block.py) at T = 1 and 4."""
    for gu, dn, sh in ((4, 5, 8), (4, 6, 8), (16, 16, 8))[: 1 if quick else None]:
        for T in (1, 4):
            yield f"block {gu}/{dn}/{sh} T={T}", (lambda a=(gu, dn, sh, T): run_block(*a))
    if not quick:
        yield "block 4/5/8 T=1 plain", lambda: run_block(4, 5, 8, 1, fast=False)
    yield "block 4/5/8 T=1 + residual add and norm", lambda: run_block(4, 5, 8, 1, add_norm=True)
    yield "block 4/5/8 T=1 key top-k", lambda: run_block(4, 5, 8, 1, topk_keys=True)
    yield "block 4/5/8 T=1 traced", lambda: run_block(4, 5, 8, 1, traced=True)


def run_block(gu, dn, sh, T, fast=True, add_norm=False, topk_keys=False, traced=False) -> None:
    from ninfer_plugins.moe_triton import grouped_gemv as GV
    from ninfer_plugins.moe_triton import moe_block as MB

    bf = dict(dtype=torch.bfloat16)
    an = (torch.empty(T, H, **bf), torch.empty(H, **bf), 1e-6, torch.empty(T, H, **bf)) if add_norm else None
    MB.moe_block(torch.empty(T, H, **bf), torch.empty(E, H, **bf), torch.empty(1, H, **bf), TOP_K,
                 _matrix(GV, gu, E * 2 * I, H), _matrix(GV, sh, I, H), _matrix(GV, sh, I, H),
                 _matrix(GV, dn, E * H, I), _matrix(GV, sh, H, I), I, E, fast=fast, add_norm=an, topk_keys=topk_keys,
                 trace=torch.empty(sum(MB.item_count(T, TOP_K, H, I, E)), 4, dtype=torch.int64) if traced else None)


def route_variants():
    from ninfer_plugins.moe_triton.router import route, route_gemv

    for T in (1, 4):
        yield f"route_gemv T={T}", (lambda t=T: route_gemv(
            torch.empty(t, H, dtype=torch.bfloat16), torch.empty(E, H, dtype=torch.bfloat16), TOP_K,
            torch.empty(1, H, dtype=torch.bfloat16), (torch.empty(4 * (E + 1)), torch.zeros(1, dtype=torch.int32))))
    yield "route_gemv T=1 + residual add and norm", lambda: route_gemv(
        torch.empty(1, H, dtype=torch.bfloat16), torch.empty(E, H, dtype=torch.bfloat16), TOP_K,
        torch.empty(1, H, dtype=torch.bfloat16), (torch.empty(4 * (E + 1)), torch.zeros(1, dtype=torch.int32)),
        add_norm=(torch.empty(1, H, dtype=torch.bfloat16), torch.empty(H, dtype=torch.bfloat16), 1e-6,
                  torch.empty(1, H, dtype=torch.bfloat16)))

    for T, plan in ((1, True), (16, True), (64, False), (1, False), (4, False)):
        for mode in ("dot", "logit", None):
            logits = torch.empty(T, E, dtype=torch.bfloat16)
            kw = {}
            if mode == "dot":
                kw = dict(x=torch.empty(T, H, dtype=torch.bfloat16), shared_gate_weight=torch.empty(1, H, dtype=torch.bfloat16))
            elif mode == "logit":
                kw = dict(shared_gate_logit=torch.empty(T, 1, dtype=torch.bfloat16))
            yield f"route T={T} {'plan' if plan else 'no plan'} shared={mode}", (lambda lg=logits, p=plan, k=kw: route(lg, TOP_K, plan=p, **k))


def main() -> int:
    quick = "--quick" in sys.argv
    install()
    jobs = [(name, lambda a=args: run_variant(*a)) for name, args in variants(quick)]
    jobs += list(pair_variants(quick))
    jobs += list(block_variants(quick))
    jobs += list(route_variants())[: 2 if quick else None]
    if "--shard" in sys.argv:
        i, n = (int(v) for v in sys.argv[sys.argv.index("--shard") + 1].split("/"))
        jobs = jobs[i::n]
    failed = 0
    for name, job in jobs:
        compiled.clear()
        t0 = time.time()
        try:
            job()
        except Exception as exc:  # noqa: BLE001 - every variant is reported
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc)[-1200:]}", flush=True)
            continue
        for kname, k in compiled:
            smem = k.metadata.shared
            over = smem > MAX_SHARED
            failed += over
            print(f"{'FAIL' if over else 'ok  '} {name:28s} {kname:16s} warps {k.metadata.num_warps} "
                  f"stages {k.metadata.num_stages} smem {smem:>6d}{' (over the H200 limit)' if over else ''} "
                  f"[{time.time() - t0:.1f} s]", flush=True)  # fmt: skip
    print(f"{len(jobs) - failed} of {len(jobs)} variants compiled for sm_90 with Triton {triton.__version__}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
