"""A lockstep simulation of gemv_mma (gemv_cu.cu) and its launcher, written by the reviewer of the
thirty-sixth session: every warp and lane of every CTA as the kernel walks them (the pointer
offsets as the kernel computes them, the U blocks a trip, the KS slices and their shared-memory
sum, the stores), the mma.sync m16n8k16 fragment layout taken from the PTX ISA's definition (not
from test_gemv_cu's emulation), flat arrays with bounds-checked loads, x rows >= M poisoned. With
KC > 1 (the fortieth session's reviewer) the CTAs run in a shuffled order, each chunk's sums go
through the workspace and its counter, and every counter must end at zero.

    python tests/plugins/quant_int/cu_mma_sim.py [N]   # every (format, U, KS, warps, shape, M) case (~3 min), or the first N

test_gemv_cu.py runs a few cases of it in CI."""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
import numpy as np
import torch
from ninfer_plugins.quant_int import formats as F
from ninfer_plugins.quant_int import gemv_cu as CU
from ninfer_plugins.quant_int import gemv_kw as KW
from ninfer_plugins.quant_int import kernels as QK
from ninfer_plugins.quant_int.linear import prepare_int


class Mem:
    def __init__(self, arr, name, valid=None):
        self.a, self.name, self.valid = arr, name, valid
        self.bad = 0

    def ld(self, i, width=1):
        assert 0 <= i and i + width <= self.a.size, (self.name, i, width, self.a.size)
        if self.valid is not None and not self.valid[i:i + width].all():
            self.bad += 1
        return self.a[i:i + width] if width > 1 else self.a[i]


def h2f(u32):
    return np.array([u32], dtype=np.uint32).view(np.float16).astype(np.float32)


def a_layout(g, t, i):  # PTX: m16n8k16 .f16 A element i (0..7) of lane (g, t)
    row = g if (i < 2 or 4 <= i < 6) else g + 8
    col = 2 * t + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def b_layout(g, t, i):  # B element i (0..3): row k, col n
    return 2 * t + (i & 1) + (8 if i >= 2 else 0), g


def d_layout(g, t, i):
    return g + 8 * (i >= 2), 2 * t + (i & 1)


def mma(dregs, aregs, bregs):
    """dregs [32][4] f32, aregs [32][4] u32, bregs [32][2] u32 -> D += A @ B, per the PTX layout."""
    A = np.full((16, 16), np.nan, np.float32)
    B = np.full((16, 8), np.nan, np.float32)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for r in range(4):
            v = h2f(aregs[lane][r])
            for h in range(2):
                A[a_layout(g, t, 2 * r + h)] = v[h]
        for r in range(2):
            v = h2f(bregs[lane][r])
            for h in range(2):
                B[b_layout(g, t, 2 * r + h)] = v[h]
    assert not np.isnan(A).any() and not np.isnan(B).any()
    D = A.astype(np.float64) @ B.astype(np.float64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            dregs[lane][i] += D[d_layout(g, t, i)]


def run_kernel(BITS, U, KS, warps, m, mem, n, V, late=False, KC=1, order_seed=0):
    nkb = V >> 2
    per_cta = 16 * (warps // KS)
    grid = (n + per_cta - 1) // per_cta
    y = np.full((m * n,), np.nan, np.float32)
    stores = np.zeros(m * n, np.int32)
    qw, qh, sc, xp, invm = mem["qw"], mem["qh"], mem["sc"], mem["xp"], mem["invm"]
    nv = BITS == 16  # NVFP4: sc holds 16-bit scale pairs, one a vector; gsc the rows' global scales
    waits = 0
    groups = grid * (warps // KS)
    ws = np.full((KC, groups, 32, 4), np.nan, np.float64)
    cnt = np.zeros(groups, np.int64)
    ctas = [(bx, by) for by in range(KC) for bx in range(grid)]
    np.random.default_rng(order_seed).shuffle(ctas)
    for bx, chunk in ctas:
        part_sums = np.full((8, 32, 4), np.nan, np.float32)
        state = {}
        for warp in range(warps):
            slice_ = warp % KS if KS > 1 else 0
            group = warp // KS if KS > 1 else warp
            row0 = (bx * (warps // KS) + group) * 16
            if KS == 1 and row0 >= n:
                waits += 32
                state[warp] = None
                continue
            kend = (chunk + 1) * nkb // KC
            kb_start = chunk * nkb // KC + U * slice_
            kb_end = kend if row0 < n else 0
            lanes = []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                q_g = (row0 + g) * V + t
                q_g8 = q_g + 8 * V
                s_g = (row0 + g) * V + t if nv else (row0 + g) * (V >> 2)
                s_g8 = s_g + 8 * V if nv else s_g + 8 * (V >> 2)
                s_step = 4 if nv else 1  # f_g, f_g8 in the kernel: a vector's pair, 4 vectors a K block
                h_g = (row0 + g) * (V << 1) + t
                h_g8 = h_g + 8 * (V << 1)
                xq = (g * 4) * V + t
                n0, n1 = 2 * t, 2 * t + 1
                L = dict(g=g, t=t, x_row=g < m, n0=n0, n1=n1,
                         qp0=q_g + 4 * kb_start, qp1=q_g8 + 4 * kb_start, sp0=s_g + s_step * kb_start, sp1=s_g8 + s_step * kb_start, s_step=s_step,
                         hp0=h_g + 8 * kb_start, hp1=h_g8 + 8 * kb_start, xq0=xq + 4 * kb_start,
                         ip0=(n0 if n0 < m else 0) * nkb + kb_start, ip1=(n1 if n1 < m else 0) * nkb + kb_start,
                         acc=[0.0] * 4)
                lanes.append(L)
            if kb_start >= kb_end:
                waits += 32
            first = True
            kb0 = kb_start
            while kb0 < kb_end:
                loads = []
                for L in lanes:
                    d = {}
                    for u in range(U):
                        if u == 0 or kb0 + u < kend:
                            d[u] = (qw.ld(4 * (L["qp0"] + 4 * u), 4).copy(), qw.ld(4 * (L["qp1"] + 4 * u), 4).copy(),
                                    sc.ld(L["sp0"] + L["s_step"] * u), sc.ld(L["sp1"] + L["s_step"] * u),
                                    (int(qh.ld(L["hp0"] + 8 * u)) | (int(qh.ld(L["hp0"] + 8 * u + 4)) << 16)) if BITS == 5 else 0,
                                    (int(qh.ld(L["hp1"] + 8 * u)) | (int(qh.ld(L["hp1"] + 8 * u + 4)) << 16)) if BITS == 5 else 0)
                    loads.append(d)
                if first:
                    waits += 32
                    first = False
                for u in range(U):
                    if u == 0 or kb0 + u < kend:
                        xv, i0s, i1s, decs = [], [], [], []
                        for L, d in zip(lanes, loads):
                            xv.append([xp.ld(4 * (L["xq0"] + p * V + 4 * u), 4).copy() if L["x_row"] else np.zeros(4, np.uint32)
                                       for p in range(4)])
                            i0s.append(float(invm.ld(L["ip0"] + u)) if L["n0"] < m else 0.0)
                            i1s.append(float(invm.ld(L["ip1"] + u)) if L["n1"] < m else 0.0)
                            q0, q1, s0, s1, hb0, hb1 = d[u]
                            dec0 = CU.decode_words(BITS, q0[None], np.array([hb0], np.uint32) if BITS == 5 else None)[0]
                            dec1 = CU.decode_words(BITS, q1[None], np.array([hb1], np.uint32) if BITS == 5 else None)[0]
                            if nv:
                                # each pair times its row's block scale in fp16 (words 0, 1: block 2v; 2, 3: 2v + 1)
                                for dec, sb in ((dec0, s0), (dec1, s1)):
                                    e = CU.fp4_scales(np.array([sb], np.uint16))[0].astype(np.float32) * 256.0
                                    for j in range(4):
                                        dec[j] = (dec[j].astype(np.float32) * e[j // 2]).astype(np.float16)
                            decs.append((dec0.view(np.uint32).reshape(4, 4), dec1.view(np.uint32).reshape(4, 4)))
                        dlo = [[0.0] * 4 for _ in range(32)]
                        dhi = [[0.0] * 4 for _ in range(32)]
                        for j in range(4):
                            # kernel: mma(dlo, a0, a1, c0, c1, xv[0][j], xv[2][j]); mma(dhi, b0, b1, d0, d1, xv[1][j], xv[3][j])
                            A_lo = [[decs[l][0][j][0], decs[l][1][j][0], decs[l][0][j][2], decs[l][1][j][2]] for l in range(32)]
                            B_lo = [[xv[l][0][j], xv[l][2][j]] for l in range(32)]
                            A_hi = [[decs[l][0][j][1], decs[l][1][j][1], decs[l][0][j][3], decs[l][1][j][3]] for l in range(32)]
                            B_hi = [[xv[l][1][j], xv[l][3][j]] for l in range(32)]
                            mma(dlo, A_lo, B_lo)
                            mma(dhi, A_hi, B_hi)
                        for l, (L, d) in enumerate(zip(lanes, loads)):
                            q0, q1, s0, s1, hb0, hb1 = d[u]
                            sg, sg8 = (np.ones(2, np.float32),) * 2 if nv else (h2f(s0), h2f(s1))
                            if nv:
                                dlo[l] = [dlo[l][c] + dhi[l][c] for c in range(4)]
                                dhi[l] = [0.0] * 4
                            a = L["acc"]
                            a[0] += (dlo[l][0] * sg[0] + dhi[l][0] * sg[1]) * i0s[l]
                            a[1] += (dlo[l][1] * sg[0] + dhi[l][1] * sg[1]) * i1s[l]
                            a[2] += (dlo[l][2] * sg8[0] + dhi[l][2] * sg8[1]) * i0s[l]
                            a[3] += (dlo[l][3] * sg8[0] + dhi[l][3] * sg8[1]) * i1s[l]
                for L in lanes:
                    for key, step in (("qp0", 4), ("qp1", 4), ("sp0", L["s_step"]), ("sp1", L["s_step"]), ("hp0", 8), ("hp1", 8),
                                      ("xq0", 4), ("ip0", 1), ("ip1", 1)):
                        L[key] += step * U * KS
                kb0 += U * KS
            state[warp] = (row0, slice_, lanes)
        # phase 2 (after the barrier for KS > 1)
        if KS > 1:
            for warp in range(warps):
                row0, slice_, lanes = state[warp]
                if slice_ > 0:
                    for lane, L in enumerate(lanes):
                        part_sums[warp, lane] = L["acc"]
        for warp in range(warps):
            if state[warp] is None:
                continue
            row0, slice_, lanes = state[warp]
            if KS > 1:
                if slice_ > 0 or row0 >= n:
                    continue
                for j in range(1, KS):
                    for lane, L in enumerate(lanes):
                        for c in range(4):
                            v = part_sums[warp + j, lane, c]
                            assert not np.isnan(v)
                            L["acc"][c] += v
            if KC > 1:
                if row0 >= n:
                    continue
                gi = row0 >> 4
                assert gi < groups
                for lane, L in enumerate(lanes):
                    ws[chunk, gi, lane] = L["acc"]
                before = cnt[gi]; cnt[gi] += 1
                if before != KC - 1:
                    continue
                for lane, L in enumerate(lanes):
                    sm = [0.0] * 4
                    for c2 in range(KC):
                        p = L["acc"] if c2 == chunk else ws[c2, gi, lane]
                        assert not np.isnan(p).any()
                        for c in range(4):
                            sm[c] += p[c]
                    L["acc"] = sm
                cnt[gi] = 0
            for lane, L in enumerate(lanes):
                for c in range(4):
                    row = row0 + L["g"] + 8 * (c >> 1)
                    col = 2 * L["t"] + (c & 1)
                    if col < m and row < n:
                        y[col * n + row] = L["acc"][c] * (float(mem["gsc"].ld(row)) * 2.0**14 if nv else 1.0)
                        stores[col * n + row] += 1
    assert (cnt == 0).all(), cnt
    return y.reshape(m, n), stores.reshape(m, n), waits


def main(scheme, n, k, m, U, KS, warps, seed=0, KC=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    if scheme == "nvfp4":
        from ninfer_plugins.quant_nvfp4 import formats as NF
        from ninfer_plugins.quant_nvfp4.kernels import (
            dequantize_prepared,
            prepare_nvfp4,
        )

        p = prepare_nvfp4(NF.quantize(w))
        deq = dequantize_prepared(p).float()
    else:
        packed = F.quantize(w, scheme)
        p = prepare_int(packed)
        deq = F.dequantize(packed).float()
    x = (torch.randn(m, k, generator=g) * torch.tensor([1.0, 300.0, 1e-3, 5.0][:m])[:, None]).to(torch.bfloat16)
    cfg = CU.CUConfig(16, U, warps, KS, True, kc=KC)
    assert CU.supports(p, cfg, m), cfg
    # poison the persistent scratch first (stale rows from an earlier launch)
    xp0, _inv0, invm0 = KW.x_scratch(x.device, p.fmt, k)
    xp0.fill_(0x7E007E00)  # f16 NaN pairs
    invm0.fill_(float("nan"))
    block_m = QK.block_rows(m)
    xp, _inv, invm = KW.xpairs(x, p.fmt, k, block_m, False)
    V = p.qweight.shape[1] // 16
    nkb = V // 4
    xpw = xp.numpy().view(np.uint32).copy()
    xvalid = np.zeros(xpw.size, bool)
    xvalid[: m * 4 * 4 * V] = True  # rows < m
    ivalid = np.zeros(invm.numel(), bool)
    ivalid[: m * nkb] = True
    mem = dict(qw=Mem(p.qweight.numpy().view(np.uint32).reshape(-1).copy(), "qw"),
               qh=Mem(p.qhigh.numpy().view(np.uint16).reshape(-1).copy() if p.qhigh is not None else np.zeros(0, np.uint16), "qh"),
               sc=Mem(p.scales.numpy().view(np.uint16 if p.fmt == 16 else np.uint32).reshape(-1).copy(), "sc"),
               gsc=Mem(p.gscale.numpy().reshape(-1).copy() if p.fmt == 16 else np.zeros(0, np.float32), "gsc"),
               xp=Mem(xpw, "xp", xvalid), invm=Mem(invm.numpy().reshape(-1).copy(), "invm", ivalid))
    y, stores, waits = run_kernel(p.fmt, U, KS, warps, m, mem, p.n, V, KC=KC, order_seed=seed)
    ref = (x.float() @ deq.T).numpy()
    assert (stores == 1).all(), ("stores", np.argwhere(stores != 1)[:5])
    assert mem["xp"].bad == 0 and mem["invm"].bad == 0, (mem["xp"].bad, mem["invm"].bad)
    grid = -(-p.n // (16 * (warps // KS)))
    assert waits == KC * grid * warps * 32, (waits, grid * warps * 32)
    rels = [float(np.linalg.norm(y[r] - ref[r]) / np.linalg.norm(ref[r])) for r in range(m)]
    assert max(rels) < 6e-3, rels
    return rels


if __name__ == "__main__":
    cases = []
    for scheme in ("q4_g64", "q5_g64", "nvfp4"):
        for c in (c for c in CU.built_configs(1) if c.mma):
            for (n, k) in ((40, 640), (300, 1152)):
                for m in (1, 2, 3, 4):
                    cases.append((scheme, n, k, m, c.unroll, c.ksplit, c.num_warps, 0, c.kc))
    if len(sys.argv) > 1:
        cases = cases[: int(sys.argv[1])]
    for c in cases:
        rels = main(*c)
        print(c, "ok", [f"{r:.1e}" for r in rels], flush=True)
