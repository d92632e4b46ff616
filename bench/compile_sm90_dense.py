"""Compile the dense decode/verify/prefill Triton kernels for sm_90 on a machine without a GPU.

    /tmp/t36/bin/python bench/compile_sm90_dense.py [--regs] [--only TEXT]

Catches what the CPU interpreter accepts and the GPU compiler rejects (a name retyped inside a
runtime branch failed every dense GPU test on the H200 once) before device time is spent. Uses
bench/skinny_sass.py's compile-only driver; launches at the 27B's real shapes with tensors that are
never read, with programmatic dependent launch off and on. Run it under the H200's Triton (3.6):
`python -m venv /tmp/t36 && /tmp/t36/bin/pip install torch==2.13.0 numpy triton==3.6.0 &&
/tmp/t36/bin/pip install --no-deps -e .` (torch's CPU build and Triton's wheel come from local disk).
Exit status 1 when a kernel fails to compile.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import traceback
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
# the f16x2 GEMV's own dispatch for its cases (the K-walks' tables would pick their kernels: those
# compile in bench/h2_sass.py --kw and bench/tc_sass.py --tkw)
os.environ["NINFER_KW"] = "0"
os.environ["NINFER_TKW"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import skinny_sass as S  # noqa: E402

S.install()

import torch  # noqa: E402

import ninfer.kernels.triton.launch as L  # noqa: E402
from ninfer.kernels.triton import attention as A  # noqa: E402
from ninfer.kernels.triton import gdn as G  # noqa: E402
from ninfer.kernels.triton import norms as N  # noqa: E402
from ninfer.kernels.triton import rope as RP  # noqa: E402

BF = torch.bfloat16
HK, HV, D = 16, 48, 128  # 27B GDN
C = (2 * HK + HV) * D
HQ, HKV, HD = 24, 4, 256  # 27B attention


def cases():
    e = torch.empty
    cw, cs, st = e(C, 4, dtype=BF), e(4, C, 3, dtype=BF), e(4, HV, D, D)
    al, nw, idx = e(HV), e(D, dtype=BF), torch.zeros(1, dtype=torch.int32)
    yield "gdn_decode_step", lambda: G.gdn_decode_step(
        e(1, C, dtype=BF), e(1, HV, dtype=BF), e(1, HV, dtype=BF), cw, cs, al, al, st, num_k_heads=HK, head_k_dim=D,
        head_v_dim=D, state_indices=idx, z=e(1, HV * D, dtype=BF), norm_weight=nw)
    yield "gdn_decode_step (gates in the step)", lambda: G.gdn_decode_step(
        e(1, C, dtype=BF), None, None, cw, cs, al, al, st, num_k_heads=HK, head_k_dim=D,
        head_v_dim=D, state_indices=idx, z=e(1, HV * D, dtype=BF), norm_weight=nw,
        ab_input=(e(1, 5120, dtype=BF), e(2 * HV, 5120, dtype=BF)))
    yield "gdn_decode_step (gates in the step, state before the wait)", lambda: G.gdn_decode_step(
        e(1, C, dtype=BF), None, None, cw, cs, al, al, st, num_k_heads=HK, head_k_dim=D,
        head_v_dim=D, state_indices=idx, z=e(1, HV * D, dtype=BF), norm_weight=nw,
        ab_input=(e(1, 5120, dtype=BF), e(2 * HV, 5120, dtype=BF)), state_early=True)
    yield "gdn_verify_columns", lambda: G.gdn_verify_columns(
        e(4, C, dtype=BF), e(4, HV, dtype=BF), e(4, HV, dtype=BF), cw, cs, al, al, st, e(16, C, 3, dtype=BF),
        e(16, HV, D, D), idx.long(), m=4, num_k_heads=HK, head_k_dim=D, head_v_dim=D, z=e(4, HV * D, dtype=BF),
        norm_weight=nw)
    yield "gdn_verify_columns (gates in the launch)", lambda: G.gdn_verify_columns(
        e(4, C, dtype=BF), None, None, cw, cs, al, al, st, e(16, C, 3, dtype=BF),
        e(16, HV, D, D), idx.long(), m=4, num_k_heads=HK, head_k_dim=D, head_v_dim=D, z=e(4, HV * D, dtype=BF),
        norm_weight=nw, ab_input=(e(4, 5120, dtype=BF), e(2 * HV, 5120, dtype=BF)))
    def split_verify(norm_in_launch: str, replay: bool = False, state_early: bool = False):
        os.environ["NINFER_GDN_SPLIT_NORM"] = norm_in_launch
        try:
            return G.gdn_verify_columns(
                e(4, C, dtype=BF), None, None, cw, cs, al, al, st, e(16, C, 3, dtype=BF),
                None if replay else e(16, HV, D, D), idx.long(), m=4, num_k_heads=HK, head_k_dim=D, head_v_dim=D,
                z=e(4, HV * D, dtype=BF), norm_weight=nw, ab_input=(e(4, 5120, dtype=BF), e(2 * HV, 5120, dtype=BF)),
                block_v=32, replay=(e(16, HV), e(16, HK, D), e(16, HV, D)) if replay else None, state_early=state_early)
        finally:
            os.environ.pop("NINFER_GDN_SPLIT_NORM")

    yield "gdn_verify_columns (heads split, BV 32, norm apart)", lambda: split_verify("0")
    yield "gdn_verify_columns (heads split, BV 32, norm in the launch)", lambda: split_verify("1")
    yield "gdn_verify_columns (heads split, BV 32, norm apart, replay buffers)", lambda: split_verify("0", True)
    yield "gdn_verify_columns (heads split, BV 32, state before the wait)", lambda: split_verify("0", state_early=True)
    yield "gdn_verify_columns (heads split, BV 32, replay, state before the wait)", lambda: split_verify("0", True, True)
    yield "gdn_verify_columns (gates in the launch, replay buffers)", lambda: G.gdn_verify_columns(
        e(4, C, dtype=BF), None, None, cw, cs, al, al, st, e(16, C, 3, dtype=BF),
        None, idx.long(), m=4, num_k_heads=HK, head_k_dim=D, head_v_dim=D, z=e(4, HV * D, dtype=BF),
        norm_weight=nw, ab_input=(e(4, 5120, dtype=BF), e(2 * HV, 5120, dtype=BF)),
        replay=(e(16, HV), e(16, HK, D), e(16, HV, D)))
    def chunk_verify(block_v: int | None, state_early: bool = False):
        os.environ["NINFER_GDN_CHUNK"] = "1"
        try:
            return G.gdn_verify_columns(
                e(4, C, dtype=BF), None, None, cw, cs, al, al, st, e(16, C, 3, dtype=BF), None, idx.long(), m=4,
                num_k_heads=HK, head_k_dim=D, head_v_dim=D, z=e(4, HV * D, dtype=BF), norm_weight=nw,
                ab_input=(e(4, 5120, dtype=BF), e(2 * HV, 5120, dtype=BF)), block_v=block_v,
                replay=(e(16, HV), e(16, HK, D), e(16, HV, D)), state_early=state_early)
        finally:
            os.environ.pop("NINFER_GDN_CHUNK")

    yield "gdn_verify_columns chunked (whole heads, norm in the launch, replay)", lambda: chunk_verify(None)
    yield "gdn_verify_columns chunked (heads split, BV 32, replay, state before the wait)", lambda: chunk_verify(32, True)
    yield "gdn_verify_columns chunked (heads split, BV 64, replay, state before the wait)", lambda: chunk_verify(64, True)
    sl2 = torch.zeros(2, dtype=torch.long)
    yield "commit_replay (recurrent state, fp32)", lambda: G.commit_replay(
        e(48, 2, HV, D, D), e(48, 8, HV), e(48, 8, HK, D), e(48, 8, HV, D), sl2, sl2)
    yield "commit_columns (recurrent state, fp32)", lambda: G.commit_columns(
        e(48, 2, HV, D, D), e(48, 2, 4, HV, D, D), sl2, sl2)
    yield "commit_columns (conv state, bf16)", lambda: G.commit_columns(
        e(48, 2, C, 3, dtype=BF), e(48, 2, 4, C, 3, dtype=BF), sl2, sl2)
    yield "gdn_prefill_conv", lambda: G.gdn_prefill_conv(e(8192, C, dtype=BF), cs[0], cw, num_k_heads=HK, num_v_heads=HV, head_dim=D)
    yield "rmsnorm", lambda: N.rmsnorm(e(1, 5120, dtype=BF), e(5120, dtype=BF), 1e-6)
    from ninfer_plugins.quant_int import gemv_kw as KW

    for fmt, k, n in ((4, 5120, 1), (5, 5120, 1), (6, 5120, 1), (8, 2048, 1), (16, 5120, 1), (5, 5120, 4)):
        # the norm that writes the K-walk GEMV's x pairs (NINFER_KW_XREUSE=1), with the residual add
        yield f"norm_pairs q{fmt} K={k} M={n}", lambda fmt=fmt, k=k, n=n: KW.norm_pairs(
            e(n, k, dtype=BF), e(k, dtype=BF), 1e-6, fmt, residual=e(n, k, dtype=BF))
        yield f"xpairs q{fmt} K={k} M={n}", lambda fmt=fmt, k=k, n=n: KW.xpairs(e(n, k, dtype=BF), fmt, k, n, True)
    from ninfer_plugins.quant_int import gemv_tkw as TKW

    for fmt, k, n in ((4, 5120, 4), (5, 5120, 4), (5, 17408, 1)):
        # the norm that writes the tensor-core K-walk's x (the MTP verify's M = 4), and xq itself
        yield f"norm_xq q{fmt} K={k} M={n}", lambda fmt=fmt, k=k, n=n: TKW.norm_xq(
            e(n, k, dtype=BF), e(k, dtype=BF), 1e-6, fmt, residual=e(n, k, dtype=BF))
        yield f"xq q{fmt} K={k} M={n}", lambda fmt=fmt, k=k, n=n: TKW.xq(e(n, k, dtype=BF), fmt, k)
    from ninfer_plugins.cuda_fast import attention as FA

    yield "decode_meta", lambda: FA.decode_meta(8192, torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    yield "rmsnorm_pair (the MTP's input norms)", lambda: N.rmsnorm_pair(
        e(1, 5120, dtype=BF), e(5120, dtype=BF), e(1, 5120, dtype=BF), e(5120, dtype=BF))
    from ninfer.kernels.triton import sample as SA

    yield "argmax_rows (shortlist head + id map)", lambda: SA.argmax_rows(
        e(1, 131072, dtype=BF), torch.zeros(131072, dtype=torch.long), torch.empty(3, dtype=torch.long)[:1])
    L64 = torch.long
    yield "fused_sample, parameters per sequence (group 4)", lambda: SA.fused_sample(
        e(4, 248320, dtype=BF), e(1), torch.zeros(1, dtype=L64), e(1), e(1), e(1), e(1), None, None, 0,
        counts=e(2, 248320), count_rows=torch.zeros(1, dtype=L64), extra_ids=torch.zeros(1, 3, dtype=L64),
        extra_len=torch.zeros(4, dtype=L64), group=4)
    yield "fused_sample, the decode step's tail (pad row, record, tokens out)", lambda: SA.fused_sample(
        e(2, 248320, dtype=BF), e(2), torch.zeros(2, dtype=L64), e(2), e(2), e(2), e(2), torch.zeros(2, dtype=L64),
        torch.zeros(2, dtype=L64), 1, counts=e(3, 248320), count_rows=torch.zeros(2, dtype=L64), pad_row=2,
        record=True, token_out=torch.zeros(2, dtype=L64))
    from ninfer.kernels.triton import spec_round as SR

    z = torch.zeros(1, dtype=L64)
    yield "round_inputs", lambda: SR.round_inputs(torch.zeros(4, 3, dtype=L64), z, z, z)
    yield "round_outputs", lambda: SR.round_outputs(torch.zeros(1, 4, dtype=L64), z, torch.zeros(1, 3, dtype=L64), z, z,
                                                   torch.zeros(4, 3, dtype=L64), torch.zeros(4, 5, dtype=L64),
                                                   torch.zeros(2, 4, dtype=L64))
    yield "gated_rmsnorm", lambda: N.gated_rmsnorm(e(1, HV, D, dtype=BF), e(1, HV, D, dtype=BF), nw)
    kc, bt, sl = e(64, 128, HKV, HD, dtype=BF), torch.zeros(1, 64, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    q = e(1, 1, HQ, HD, dtype=BF)
    yield "decode_attention bf16", lambda: A.decode_attention(q, kc, kc, bt, sl, num_splits=8)
    k8, sc = e(64, 128, HKV, HD, dtype=torch.int8), e(64, 128, HKV, HD // 64, dtype=torch.float16)
    yield "decode_attention int8", lambda: A.decode_attention(q, k8, k8, bt, sl, k_scale=sc, v_scale=sc, num_splits=8)
    yield "qk_norm_rope_append", lambda: RP.qk_norm_rope_append(
        e(1, HQ, HD, dtype=BF), e(1, HKV, HD, dtype=BF), e(1, HKV, HD, dtype=BF), e(HD, dtype=BF), e(HD, dtype=BF),
        torch.zeros(1, dtype=torch.long), e(32), kc, kc, torch.zeros(1, dtype=torch.long))
    from ninfer_plugins.cuda_fast import ops as O

    gu = e(1, 2 * 17408, dtype=BF)
    yield "silu_mul", lambda: O.silu_mul(gu[:, :17408], gu[:, 17408:])
    from ninfer_plugins.quant_int import gemv as GV
    from ninfer_plugins.quant_int import kernels as K

    for fmt, n, k in ((4, 34816, 5120), (5, 16384, 5120), (6, 248320, 5120), (8, 10240, 5120)):
        p = S.empty_prepared(fmt, n, k)
        K.reserve_workspace(p)
        yield f"dispatch q{fmt} {n}x{k} M=1", lambda p=p, k=k: K.launch(e(1, k, dtype=BF), p)
        yield f"dispatch q{fmt} {n}x{k} M=2", lambda p=p, k=k: K.launch(e(2, k, dtype=BF), p)
        cfg = GV.default_config(fmt, n, k, 132)
        yield f"gemv q{fmt} {n}x{k}", lambda p=p, cfg=cfg, k=k: GV.launch(e(1, k, dtype=BF), p, cfg)
        yield f"mma q{fmt} {n}x{k} M=4", lambda p=p, k=k: K.launch(e(4, k, dtype=BF), p)
    from ninfer_plugins.quant_int import gemv_h2 as H2

    for n, k in ((34816, 5120), (12288, 2048)):  # NVFP4 through the f16x2 GEMV
        p = K.Prepared(fmt=16, n=n, k=k, qweight=e(n, k // 2, dtype=torch.uint8), scales=e(n, k // 16, dtype=torch.uint8),
                       gscale=e(n))
        cfg = H2.default_config(16, n, k)
        K.Workspace.get(p.device).reserve(*cfg.workspace(p))
        for m in (1, 4):
            yield f"h2 nvfp4 {n}x{k} M={m}", lambda p=p, k=k, cfg=cfg, m=m: H2.launch(e(m, k, dtype=BF), p, cfg)
    for fmt, n, k in ((5, 5120, 6144), (5, 5120, 17408), (8, 2048, 4096)):  # o/out/down_proj with the add+norm
        p = S.empty_prepared(fmt, n, k)
        cfg = K.pick_gemv(fmt, 1, n, k, 132)
        K.Workspace.get(p.device).reserve(*cfg.workspace(p))
        yield f"h2 q{fmt} {n}x{k} M=1 + residual add and norm", lambda p=p, n=n, k=k, cfg=cfg: H2.launch(
            e(1, k, dtype=BF), p, cfg, add_norm=(e(1, n, dtype=BF), e(n, dtype=BF), 1e-6, e(1, n, dtype=BF)))
    for fmt, n, k in ((5, 5120, 17408), (4, 5120, 17408), (8, 2048, 6144)):  # down_proj with silu(gate) * up inside
        p = S.empty_prepared(fmt, n, k)
        cfg = K.pick_gemv(fmt, 1, n, k, 132)
        K.Workspace.get(p.device).reserve(*cfg.workspace(p))
        yield f"h2 q{fmt} {n}x{k} M=1 gated", lambda p=p, k=k, cfg=cfg: H2.launch(e(1, 2 * k, dtype=BF), p, cfg, gated=True)
        yield f"h2 q{fmt} {n}x{k} M=1 plain", lambda p=p, k=k, cfg=cfg: H2.launch(e(1, k, dtype=BF), p, cfg)
        # bench/h2_ablate.py's measurement variant (no decode, no FMA)
        yield f"h2 q{fmt} {n}x{k} M=1 ablated", lambda p=p, k=k, cfg=cfg: H2.launch(e(1, k, dtype=BF), p, cfg, ablate=1)
    from ninfer_plugins.quant_int import gemv_tc as TC

    # the Gluon kernels launched on CPU tensors; "pdl": with the PDL constexpr (main sets it per pass)
    for fmt, n, k in ((4, 34816, 5120), (5, 5120, 17408)):
        p = S.empty_prepared(fmt, n, k)
        for cfg in (TC.TCConfig(), TC.TCConfig(4, 4, 1, 8), TC.TCConfig(8, 2, 4, 2), TC.TCConfig(8, 2, 4, 4, direct=2)):
            K.Workspace.get(p.device).reserve(*cfg.workspace(p))
            yield f"tc q{fmt} {n}x{k} {cfg.describe()}", lambda p=p, k=k, cfg=cfg: TC.launch(e(1, k, dtype=BF), p, cfg)
    p = S.empty_prepared(5, 16384, 5120)
    for cfg in (TKW.TKWConfig(4, 3, 4, 1, pin=True), TKW.TKWConfig(2, 1, 4, 2), TKW.TKWConfig(2, 1, 4, 1, ring=3)):
        K.Workspace.get(p.device).reserve(*TKW.workspace_need(p, cfg))
        yield f"tkw q5 16384x5120 M=4 {cfg.describe()}", lambda cfg=cfg: TKW.launch(e(4, 5120, dtype=BF), p, cfg)
    from ninfer_plugins.cuda_fast import dense_gemv as DG

    # the one-token bf16 GEMV: the gated down projection and o_proj, at the bench's configs
    for n, k, gated in ((5120, 17408, True), (5120, 6144, False)):
        for cfg in (DG.DEFAULT_CFG, (4, 1024, 4), (16, 256, 4), (8, 1024, 8), (2, 1024, 2)):
            yield f"dense gemv {n}x{k}{' gated' if gated else ''} BN{cfg[0]} BK{cfg[1]} w{cfg[2]}", (
                lambda n=n, k=k, gated=gated, cfg=cfg: DG.gemv(e(1, 2 * k if gated else k, dtype=BF), e(n, k, dtype=BF),
                                                            gated=gated, cfg=cfg))


# launches that ask pdl_kwargs(..., scoped=False): x's preparation, never the last launch before a
# kernel that reads early (launch.late_dependents)
UNSCOPED = {"_xpairs_kernel", "_xq_kernel"}


def late_lint(k) -> None:
    """A kernel compiled inside late_dependents: PDL = 2 and its PTX waits before any trigger,
    or one of UNSCOPED."""
    names = list(k.src.fn.arg_names)
    pdl = k.src.constants.get((names.index("PDL"),)) if "PDL" in names else None
    ops = re.findall(r"griddepcontrol\.(\w+)", k.asm["ptx"])
    if k.name in UNSCOPED or pdl is None and not ops:
        return
    if pdl != 2 or (ops and ops[0] != "wait"):
        raise AssertionError(f"{k.name}: inside late_dependents it has PDL = {pdl} and its PTX starts {ops[:3]}")


def main() -> int:
    # --regs: each compiled kernel's registers, local (spilled) and shared bytes after its "ok" line
    regs = "--regs" in sys.argv[1:]
    # --only TEXT: the cases whose name holds TEXT
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv[1:] else ""
    failed = 0
    # "late": every launch inside launch.late_dependents (PDL = 2: the trigger after the wait); each
    # kernel's PTX must then wait before any trigger (else a kernel after it could read early what
    # the kernels before it still write)
    from ninfer_plugins.quant_int import gemv_tc as TC
    from ninfer_plugins.quant_int import gemv_tkw as TKW

    for pdl in (False, True, "late"):
        L.pdl_enabled = (lambda device: True) if pdl else (lambda device: False)
        TC.COMPILE_ONLY = TKW.COMPILE_ONLY = "pdl" if pdl else True
        for name, run in cases():
            if only not in name:
                continue
            try:
                before = len(S._compiled)
                with L.late_dependents() if pdl == "late" else contextlib.nullcontext():
                    run()
                if pdl == "late":
                    for k in S._compiled[before:]:
                        late_lint(k)
                usage = ""
                if regs:
                    usage = "  " + ", ".join(
                        f"{k.name}: {r} regs{f', {lo} B local' if lo else ''}, {sm} B shared"
                        for k in S._compiled[before:] for r, lo, sm in [S.resources(k)])
                print(f"ok    {name} (PDL {pdl if pdl == 'late' else 'on' if pdl else 'off'}){usage}", flush=True)
            except Exception:  # noqa: BLE001 - report every failure, then fail
                failed += 1
                print(f"FAIL  {name} (PDL {pdl if pdl == 'late' else 'on' if pdl else 'off'})\n{traceback.format_exc(limit=3)}", flush=True)
    print(f"{len(S._compiled)} kernels compiled, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
