"""Gated DeltaNet decode: one token of B sequences through the mixer core in one launch
(spec §2.4): causal conv1d step + SiLU, per-head L2 norm of q and k, the gates g and beta, the
delta-rule update of the fp32 state in place, the readout, and optionally the gated RMSNorm and
the gate projections themselves (`ab_input`: in_proj_a / in_proj_b as two dot products a
program, instead of a GEMM launch of their own).

Program (b, j, vb) owns value head j of batch row b and the value columns vb*BV..(vb+1)*BV of
its state S[Dk, Dv] (the [N, Hv, Dk, Dv] layout of fla's state_v_first=False): the update is
independent per value column, so splitting Dv multiplies the programs for one sequence (48 value
heads alone would leave most of an H200's 132 SMs idle).

The conv state of the q/k channels of one q/k head is read by all R*NVB programs of its value
heads (R = Hv/Hk) and must be shifted exactly once, after all of them have read it: each program
counts itself in on a per-(row, head) counter after its reads, and the last one in writes the
shifted q/k state and re-arms the counter to 0 for the next launch. The value channels belong to
exactly one program and are shifted by it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ninfer.kernels.triton import sync as SY
from ninfer.kernels.triton.launch import lasting, pdl_early_trigger, pdl_kwargs, pdl_prologue, pdl_wait, sm_count
from ninfer.kernels.triton.norms import gated_rmsnorm


@dataclass(frozen=True)
class OutPairs:
    """What gdn_decode_step's programs do with their output block for the GEMV that reads o next
    (made by that GEMV's kernel, e.g. quant_int's QLinear.input_pairs): `fn`, a Triton function
    called as fn(O, xp, inv, invm, rows, kw, nkb, row stride, 0, row, [[block]], fmt, head, asm,
    False) after the block is stored, and its scratch and constants."""

    fn: object
    xp: torch.Tensor
    inv: torch.Tensor
    invm: torch.Tensor
    kw: int
    nkb: int
    fmt: int
    head: int
    asm: bool


@triton.jit
def _load_window(CS, ch, slot, scs_n, scs_c, scs_t):
    """The conv state of channels ch of `slot`: its last three inputs, oldest first."""
    cs = CS + slot * scs_n + ch * scs_c
    return tl.load(cs), tl.load(cs + scs_t), tl.load(cs + 2 * scs_t)


@triton.jit
def _conv_taps(CW, ch, scw_c, scw_t):
    """The four conv1d taps of channels ch, oldest input's first, in fp32."""
    w = CW + ch * scw_c
    return (tl.load(w).to(tl.float32), tl.load(w + scw_t).to(tl.float32), tl.load(w + 2 * scw_t).to(tl.float32),
            tl.load(w + 3 * scw_t).to(tl.float32))


@triton.jit
def _conv_of(xt, w0, w1, w2, w3, p0, p1, p2):
    """One conv1d + SiLU output from this row's input xt, the three previous inputs p0 (oldest),
    p1, p2 and the taps."""
    y = w0 * p0.to(tl.float32) + w1 * p1.to(tl.float32) + w2 * p2.to(tl.float32) + w3 * xt.to(tl.float32)
    return y * tl.sigmoid(y)


@triton.jit
def _conv_col(X, CW, ch, row, sx_b, scw_c, scw_t, p0, p1, p2):
    """`_conv_of` for input row `row` of X, taps loaded here -> (y, this row's input)."""
    xt = tl.load(X + row * sx_b + ch)
    w0, w1, w2, w3 = _conv_taps(CW, ch, scw_c, scw_t)
    return _conv_of(xt, w0, w1, w2, w3, p0, p1, p2), xt


@triton.jit
def _conv_step(X, CS, CW, ch, b, slot, sx_b, scs_n, scs_c, scs_t, scw_c, scw_t):
    s0, s1, s2 = _load_window(CS, ch, slot, scs_n, scs_c, scs_t)
    y, xt = _conv_col(X, CW, ch, b, sx_b, scw_c, scw_t, s0, s1, s2)
    return y, s1, s2, xt


@triton.jit
def _add3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


# Triton's interpreter runs a reduction of a tuple element by element in Python (tens of ms for a
# [Dk, Dv] tile, most of the CPU suite's end-to-end time): there the paired sums are taken one
# by one with numpy's sum, the same values up to the order of the additions
_TUPLE_REDUCE = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))


@triton.jit
def _sum3(a, b, c):
    if _TUPLE_REDUCE:
        return tl.reduce((a, b, c), 0, _add3)
    else:
        return tl.sum(a, 0), tl.sum(b, 0), tl.sum(c, 0)


@triton.jit
def _sum2(a, b):
    if _TUPLE_REDUCE:
        return tl.reduce((a, b), 0, _add2)
    else:
        return tl.sum(a, 0), tl.sum(b, 0)


@triton.jit
def _softplus(u):
    """log(1 + e^u) in fp32, u itself past 20 (where the sum rounds to it)."""
    return tl.where(u > 20.0, u, tl.log(1.0 + tl.exp(tl.minimum(u, 20.0))))


@triton.jit
def _delta_rule_token(st, q, k, v, u, b_raw, A_neg, q_scale, PAIRED: tl.constexpr = False):
    """`_delta_rule_parts` -> (new state [Dk, BV], readout [BV])."""
    st, o, g, k, delta = _delta_rule_parts(st, q, k, v, u, b_raw, A_neg, q_scale, PAIRED)
    return st, o


@triton.jit
def _replay_update(st, g, k, delta):
    """The state update a token's (decay g, L2-normed k [Dk], delta [BV]) make: S' = g S + k delta^T,
    as `_delta_rule_parts` writes it (a commit that replays stored tokens gives the verify's state)."""
    return st * g + k[:, None] * delta[None, :]


@triton.jit
def _delta_rule_parts(st, q, k, v, u, b_raw, A_neg, q_scale, PAIRED: tl.constexpr = False):
    """One token through the gated delta rule: L2-normed q (scaled) and k, decay g = A_neg *
    softplus(u) (u = a + dt_bias), beta = sigmoid(b); the error uses the decayed state.
    -> (new state [Dk, BV], readout [BV], g, normed k [Dk], delta [BV]): S' = g S + k delta^T.

    PAIRED: the same in two reductions across the program's threads instead of four, each a pass
    through shared memory with barriers that the token's chain waits on: (q.q, k.k, q.k) in one,
    (S^T k, S^T q) of the state before the token in the other; then, with g the decay,
    delta = beta (v - g S^T k), S' = g S + k delta^T, o = S'^T q = g S^T q + (q.k) delta."""
    if PAIRED:
        qq, kk, qk = _sum3(q * q, k * k, q * k)
        rq = tl.rsqrt(qq + 1e-6) * q_scale
        rk = tl.rsqrt(kk + 1e-6)
        q = q * rq
        k = k * rk
        softplus = _softplus(u)
        g = tl.exp(A_neg * softplus)
        sk, sq = _sum2(st * k[:, None], st * q[:, None])
        delta = tl.sigmoid(b_raw) * (v - g * sk)
        st = _replay_update(st, g, k, delta)
        return st, g * sq + (qk * rq * rk) * delta, g, k, delta
    q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * q_scale
    k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
    softplus = _softplus(u)
    beta = tl.sigmoid(b_raw)
    g = tl.exp(A_neg * softplus)
    delta = beta * (v - tl.sum((st * g) * k[:, None], 0))
    st = _replay_update(st, g, k, delta)
    return st, tl.sum(st * q[:, None], 0), g, k, delta


@triton.jit
def _gated_norm(o, Z, NW, row, sz_b, j, bv, eps, DV: tl.constexpr):
    """RMSNorm(o) * w * silu(z) over a whole value head (BV == DV)."""
    z = tl.load(Z + row * sz_b + j * DV + bv).to(tl.float32)
    return o * tl.rsqrt(tl.sum(o * o, 0) / DV + eps) * tl.load(NW + bv).to(tl.float32) * (z * tl.sigmoid(z))


@triton.jit
def _shift_state(CS, ch, slot, scs_n, scs_c, scs_t, s1, s2, xt):
    cs = CS + slot * scs_n + ch * scs_c
    tl.store(cs, s1)
    tl.store(cs + scs_t, s2)
    tl.store(cs + 2 * scs_t, xt.to(CS.dtype.element_ty))


def ab_split(hid: int) -> tuple[int, int]:
    """The gate rows' hidden size as a power of two plus a smaller power of two or 0 (5120 =
    4096 + 1024), the two loads the decode step issues before its PDL wait; (0, 0) when it is
    not such a sum (the step then loads the rows after the wait, in blocks of 1024)."""
    hp = 1 << (hid.bit_length() - 1) if hid > 0 else 0
    hr = hid - hp
    return (hp, hr) if hp >= 16 and (hr == 0 or (hr >= 16 and hr & (hr - 1) == 0)) else (0, 0)


@triton.jit
def _ab_dots(XH, WAB, b, j, sxh_b, swab_r, HID: tl.constexpr, HV: tl.constexpr, BH: tl.constexpr):
    """The raw gates of value head j for row b, in fp32: (x_b . W[j], x_b . W[HV + j]) over the
    hidden size, W = in_proj_a's rows then in_proj_b's [2 HV, HID]. Unrolled (HID is a
    constexpr) so that every load can be in flight at once: a runtime loop waited one memory
    round trip per BH columns, ten of them at the 27B's 5120."""
    hh = tl.arange(0, BH)
    acc_a = tl.zeros([BH], tl.float32)
    acc_b = tl.zeros([BH], tl.float32)
    for h0 in tl.static_range(0, HID, BH):
        m = h0 + hh < HID
        xv = tl.load(XH + b * sxh_b + h0 + hh, mask=m, other=0.0).to(tl.float32)
        acc_a += xv * tl.load(WAB + j * swab_r + h0 + hh, mask=m, other=0.0).to(tl.float32)
        acc_b += xv * tl.load(WAB + (HV + j) * swab_r + h0 + hh, mask=m, other=0.0).to(tl.float32)
    return tl.sum(acc_a, 0), tl.sum(acc_b, 0)


@triton.jit
def _ab_part(XH, b, sxh_b, h0: tl.constexpr, n: tl.constexpr, wa, wb):
    xv = tl.load(XH + b * sxh_b + h0 + tl.arange(0, n)).to(tl.float32)
    return tl.sum(xv * wa.to(tl.float32), 0), tl.sum(xv * wb.to(tl.float32), 0)


@triton.jit
def _row_gates(XH, WAB, row, j, sxh_b, swab_r, HID: tl.constexpr, HV: tl.constexpr, BH: tl.constexpr,
               HP: tl.constexpr, HR: tl.constexpr, wa0, wb0, wa1, wb1):
    """Row `row`'s raw gates for value head j (fp32): from the rows loaded before the PDL wait
    (HP > 0: wa0/wb0 [HP], and wa1/wb1 [HR] where HR > 0) or, HP = 0, read here (`_ab_dots`)."""
    if HP > 0:
        a_raw, b_raw = _ab_part(XH, row, sxh_b, 0, HP, wa0, wb0)
        if HR > 0:
            a1, b1 = _ab_part(XH, row, sxh_b, HP, HR, wa1, wb1)
            a_raw += a1
            b_raw += b1
    else:
        a_raw, b_raw = _ab_dots(XH, WAB, row, j, sxh_b, swab_r, HID, HV, BH)
    return a_raw, b_raw


@triton.jit
def _gate_rows(XH, WAB, b, j, sxh_b, swab_r, M: tl.constexpr, MP: tl.constexpr, HID: tl.constexpr,
               HV: tl.constexpr, BH: tl.constexpr, HP: tl.constexpr, HR: tl.constexpr, wa0, wb0, wa1, wb1):
    """The raw gates of rows b*M .. b*M + M - 1 for value head j -> (a [MP], b [MP]), zeros past M."""
    tm = tl.arange(0, MP)
    ga = tl.zeros([MP], tl.float32)
    gb = tl.zeros([MP], tl.float32)
    for t in tl.static_range(M):
        a_t, b_t = _row_gates(XH, WAB, b * M + t, j, sxh_b, swab_r, HID, HV, BH, HP, HR, wa0, wb0, wa1, wb1)
        ga = tl.where(tm == t, a_t, ga)
        gb = tl.where(tm == t, b_t, gb)
    return ga, gb


@triton.jit
def _gate_row_loads(WAB, j, swab_r, HV: tl.constexpr, HP: tl.constexpr, HR: tl.constexpr):
    """The gate rows requested before the PDL wait (HID = HP + HR, powers of two; see ab_split):
    (wa0, wb0 [HP], wa1, wb1 [HR]); placeholders, never read, where HP or HR is 0."""
    if HP > 0:
        wa0 = tl.load(WAB + j * swab_r + tl.arange(0, HP))
        wb0 = tl.load(WAB + (HV + j) * swab_r + tl.arange(0, HP))
    else:
        wa0 = tl.zeros([16], tl.float32)
        wb0 = wa0
    if HR > 0:
        wa1 = tl.load(WAB + j * swab_r + HP + tl.arange(0, HR))
        wb1 = tl.load(WAB + (HV + j) * swab_r + HP + tl.arange(0, HR))
    else:
        wa1 = wa0
        wb1 = wb0
    return wa0, wb0, wa1, wb1


@triton.jit
def _gdn_decode_kernel(
    X, A, Bg, CW, CS, ALOG, DTB, S, O, Z, NW, IDX, CNT, XH, WAB,
    sx_b, sa_b, sb_b, scw_c, scw_t, scs_n, scs_c, scs_t, ss_n, ss_h, so_b, so_h, sz_b, sxh_b, swab_r,
    q_scale, eps,
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    HAS_IDX: tl.constexpr, FUSE_NORM: tl.constexpr, FUSE_AB: tl.constexpr = False, HID: tl.constexpr = 0,
    BH: tl.constexpr = 1024, HP: tl.constexpr = 0, HR: tl.constexpr = 0, PDL: tl.constexpr = False,
    PAIRED: tl.constexpr = False, STATE_EARLY: tl.constexpr = False, GATES_EARLY: tl.constexpr = False,
    XP=None, XINV=None, XINVM=None, XKW=0, XNKB=0, EPI: tl.constexpr = None, EPI_FMT: tl.constexpr = 0,
    EPI_HEAD: tl.constexpr = 0, EPI_ASM: tl.constexpr = False,
):
    R: tl.constexpr = HV // HK
    NVB: tl.constexpr = DV // BV
    pid = tl.program_id(0)
    vb = tl.program_id(1)
    b = pid // HV
    j = pid % HV
    if FUSE_AB:
        # the gate rows are weights, which no kernel writes: requested before the PDL wait, they
        # load while the previous kernel (the qkv/z GEMV) finishes. HID = HP + HR, powers of two.
        wa0, wb0, wa1, wb1 = _gate_row_loads(WAB, j, swab_r, HV, HP, HR)
    h = j // R
    bv = tl.arange(0, BV)
    dk = tl.arange(0, DK)
    if STATE_EARLY:
        # the launch before this one was made inside launch.late_dependents, so this program runs
        # only once every kernel before that launch has completed: the slot ids and the state
        # (written by the last step's launch of this layer) are final, and the state tile, the
        # bulk of the bytes, streams while the qkv/z projection finishes
        pdl_early_trigger(PDL)
        if HAS_IDX:
            slot = tl.load(IDX + b, cache_modifier=".cg").to(tl.int64)
        else:
            slot = b.to(tl.int64)
        sp = S + tl.maximum(slot, 0) * ss_n + j * ss_h + dk[:, None] * DV + (vb * BV + bv)[None, :]
        st = tl.load(sp, mask=(dk[:, None] * 0 + slot) >= 0, other=0.0, cache_modifier=".cg")
        if FUSE_AB and GATES_EARLY:
            # x (the layer's normed input) was written before the projection's launch too: the
            # gates' dot products run while the projection does, not after it
            ea, eb = _row_gates(XH, WAB, b, j, sxh_b, swab_r, HID, HV, BH, HP, HR, wa0, wb0, wa1, wb1)
        pdl_wait(PDL)
    else:
        pdl_prologue(PDL)
        if HAS_IDX:
            slot = tl.load(IDX + b).to(tl.int64)
        else:
            slot = b.to(tl.int64)
    if slot < 0:  # a padded batch row: no state to touch
        tl.store(O + b * so_b + j * so_h + vb * BV + bv, tl.zeros([BV], tl.float32).to(O.dtype.element_ty))
    else:
        if not STATE_EARLY:
            # the state tile is the bulk of the bytes: issue its load before the conv arithmetic
            sp = S + slot * ss_n + j * ss_h + dk[:, None] * DV + (vb * BV + bv)[None, :]
            st = tl.load(sp)
        q_ch = h * DK + dk
        k_ch = HK * DK + h * DK + dk
        v_ch = 2 * HK * DK + j * DV + vb * BV + bv
        q, q1, q2, qx = _conv_step(X, CS, CW, q_ch, b, slot, sx_b, scs_n, scs_c, scs_t, scw_c, scw_t)
        k, k1, k2, kx = _conv_step(X, CS, CW, k_ch, b, slot, sx_b, scs_n, scs_c, scs_t, scw_c, scw_t)
        v, v1, v2, vx = _conv_step(X, CS, CW, v_ch, b, slot, sx_b, scs_n, scs_c, scs_t, scw_c, scw_t)

        if FUSE_AB and STATE_EARLY and GATES_EARLY:
            a_raw, b_raw = ea, eb
        elif FUSE_AB:
            # in_proj_a / in_proj_b in this program: two rows of HID against x_b (a separate GEMM
            # launch of 2 HV rows is mostly launch and latency at one token). Here, after the
            # state and conv loads, it measured 0.4 us a layer faster than before them (H200).
            a_raw, b_raw = _row_gates(XH, WAB, b, j, sxh_b, swab_r, HID, HV, BH, HP, HR, wa0, wb0, wa1, wb1)
        else:
            a_raw = tl.load(A + b * sa_b + j).to(tl.float32)
            b_raw = tl.load(Bg + b * sb_b + j).to(tl.float32)
        u = a_raw + tl.load(DTB + j).to(tl.float32)
        A_neg = -tl.exp(tl.load(ALOG + j).to(tl.float32))
        st, o = _delta_rule_token(st, q, k, v, u, b_raw, A_neg, q_scale, PAIRED)
        tl.store(sp, st)
        if FUSE_NORM:
            o = _gated_norm(o, Z, NW, b, sz_b, j, bv, eps, DV)
        tl.store(O + b * so_b + j * so_h + vb * BV + bv, o.to(O.dtype.element_ty))

        # Every thread's conv-state reads fed the results stored above, so after this barrier no
        # warp of this program still needs the old state. A tensor smaller than the program is
        # held by several warps at once: shifting the v state before the barrier let one warp
        # overwrite a column another had not read yet (seen on the H200 with BV=32, 4 warps).
        tl.debug_barrier()
        _shift_state(CS, v_ch, slot, scs_n, scs_c, scs_t, v1, v2, vx)
        arrived = SY.arrive(CNT + b * HK + h)
        if arrived == R * NVB - 1:
            SY.acquire_all(arrived)
            _shift_state(CS, q_ch, slot, scs_n, scs_c, scs_t, q1, q2, qx)
            _shift_state(CS, k_ch, slot, scs_n, scs_c, scs_t, k1, k2, kx)
            SY.rearm(CNT + b * HK + h)
    if EPI is not None:
        # the next GEMV's prepared input from this program's output (its K block j of row b, the
        # whole head: BV = DV = 128), read back after a barrier (this CTA's own stores)
        tl.debug_barrier()
        EPI(O, XP, XINV, XINVM, tl.num_programs(0) // HV, XKW, XNKB, so_b, 0, b, j + tl.zeros([1, 1], tl.int32),
            EPI_FMT, EPI_HEAD, EPI_ASM, False)


def _counters(device: torch.device, n: int) -> torch.Tensor:
    return lasting("gdn_counters", device, (n,), lambda: torch.zeros(n, dtype=torch.int32, device=device))


def default_block_v(batch: int, num_v_heads: int, head_v_dim: int, device: torch.device) -> int:
    """Value columns per program when the norm is not fused: about one program per SM, 16 to
    64 columns. Measured on the H200 (BENCHMARKS.md, 48 layers of the 27B, no norm): one
    sequence 0.32 ms at BV 16, 32 or 64 alike; four sequences 0.55 ms at BV 64, 0.65 at 32."""
    parts = triton.next_power_of_2(triton.cdiv(sm_count(str(device)), batch * num_v_heads))
    return max(16, min(64, head_v_dim, head_v_dim // parts))


def split_heads(batch: int, num_v_heads: int, device: torch.device) -> bool:
    """Whether the verify columns split each value head over several programs (block_v from
    default_block_v) and run the gated norm as a second launch, rather than one program a head
    with the norm inside: yes while batch * Hv programs would leave SMs idle. H200, the 27B's 48
    GDN layers at M = 4, one sequence (bench/gdn_columns.py): 27.5 us a layer whole (48 programs)
    against 20.4 split to BV 32 with the norm apart. NINFER_GDN_SPLIT=0 keeps heads whole."""
    return os.environ.get("NINFER_GDN_SPLIT", "1") != "0" and batch * num_v_heads < sm_count(str(device))


def gdn_decode_step(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    *,
    num_k_heads: int,
    head_k_dim: int = 128,
    head_v_dim: int = 128,
    state_indices: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
    ab_input: tuple[torch.Tensor, torch.Tensor] | None = None,
    state_early: bool = False,
    out_pairs: OutPairs | None = None,
) -> torch.Tensor:
    """One decode token for B sequences; updates conv_state and ssm_state in place.

    mixed_qkv [B, conv_dim] (pre-conv, channels [Q | K | V]), a and b [B, Hv] (any row stride),
    or a = b = None and ab_input = (x [B, H], W [2 Hv, H]): the raw gates x @ W.T computed in the
    kernel, in fp32 (W = in_proj_a's rows, then in_proj_b's; unit last strides);
    conv_weight [conv_dim, 4] (any strides: a tap-major [4, conv_dim] tensor passes as .t());
    conv_state [slots, conv_dim, 3] (last three inputs, oldest first); A_log, dt_bias [Hv] fp32;
    ssm_state [slots, Hv, Dk, Dv] fp32 contiguous in (Dk, Dv). Row b uses slot
    state_indices[b] (default b; negative: a padded row, output zeros, no state touched).
    With z [B, Hv*Dv] and norm_weight [Dv] the output is RMSNorm(o) * w * silu(z), fused into
    the step (one program per value head) unless block_v asks for a split.
    Returns o [B, Hv, Dv] in mixed_qkv's dtype.

    state_early: the slot ids and the recurrent-state tile are read before the PDL wait. The
    caller's promise: the launch just before this one was made inside `launch.late_dependents()`
    (or without PDL), and nothing from that launch on writes them (see late_dependents).

    out_pairs (OutPairs; with the fused norm, DV = 128 and `out` contiguous): each program also
    hands its stored head, one K block of 128 of o's row [B, Hv*Dv], to out_pairs.fn, which
    prepares it for the GEMV that reads o next (quant_int's x pairs), so that GEMV needs no
    preparation launch of its own.
    """
    B = mixed_qkv.shape[0]
    fuse_ab = a is None
    if fuse_ab:
        if b is not None or ab_input is None:
            raise ValueError("gdn_decode_step: give a and b, or neither and ab_input = (x, W_ab)")
        xh, wab = ab_input
        if wab.shape[0] % 2 or xh.shape != (B, wab.shape[1]) or xh.stride(1) != 1 or wab.stride(1) != 1:
            raise ValueError(f"gdn_decode_step: ab_input x {tuple(xh.shape)} and W {tuple(wab.shape)} need x [B, H], "
                             "W [2 Hv, H], unit last strides")
        HV = wab.shape[0] // 2
        a = b = xh  # never read
    else:
        xh = wab = mixed_qkv  # never read
        HV = a.shape[1]
    HK, DK, DV = num_k_heads, head_k_dim, head_v_dim
    if HV % HK or mixed_qkv.shape[1] != 2 * HK * DK + HV * DV:
        raise ValueError(f"gdn_decode_step: conv_dim {mixed_qkv.shape[1]} != 2*{HK}*{DK} + {HV}*{DV}")
    if ssm_state.stride(3) != 1 or ssm_state.stride(2) != DV or mixed_qkv.stride(1) != 1:
        raise ValueError("gdn_decode_step: ssm_state needs contiguous [Dk, Dv] per head, mixed_qkv a unit last stride")
    fuse = z is not None and (block_v is None or block_v == DV)
    bv = DV if fuse else (block_v or default_block_v(B, HV, DV, mixed_qkv.device))
    if out is None:
        out = torch.empty(B, HV, DV, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    counters = _counters(mixed_qkv.device, B * HK)
    idx = state_indices if state_indices is not None else counters
    zz = z if fuse else mixed_qkv
    hid = wab.shape[1] if fuse_ab else 0
    # NINFER_GDN_AB_EARLY=0: the gate rows after the PDL wait (A/B; 0.04 ms a 27B step slower, H200)
    hp, hr = ab_split(hid) if os.environ.get("NINFER_GDN_AB_EARLY", "1") != "0" else (0, 0)
    epi = {}
    if out_pairs is not None:
        if not fuse or DV != 128 or out.stride(1) != DV or out.stride(2) != 1 or out.stride(0) != HV * DV:
            raise ValueError("gdn_decode_step: out_pairs needs the fused norm, head_v_dim 128 and a contiguous out")
        op = out_pairs
        epi = {"XP": op.xp, "XINV": op.inv, "XINVM": op.invm, "XKW": op.kw, "XNKB": op.nkb, "EPI": op.fn,
               "EPI_FMT": op.fmt, "EPI_HEAD": op.head, "EPI_ASM": op.asm}
    _gdn_decode_kernel[(B * HV, DV // bv)](
        mixed_qkv, a, b, conv_weight, conv_state, A_log, dt_bias, ssm_state, out, zz,
        norm_weight if fuse else A_log, idx, counters, xh, wab,
        mixed_qkv.stride(0), a.stride(0), b.stride(0), conv_weight.stride(0), conv_weight.stride(1),
        conv_state.stride(0), conv_state.stride(1), conv_state.stride(2), ssm_state.stride(0), ssm_state.stride(1),
        out.stride(0), out.stride(1), zz.stride(0), xh.stride(0), wab.stride(0),
        DK**-0.5, eps,
        HK=HK, HV=HV, DK=DK, DV=DV, BV=bv, HAS_IDX=state_indices is not None, FUSE_NORM=fuse,
        FUSE_AB=fuse_ab, HID=hid, BH=min(1024, triton.next_power_of_2(max(hid, 16))), HP=hp, HR=hr,
        num_warps=num_warps or 4, PAIRED=paired_reductions(), STATE_EARLY=state_early,
        GATES_EARLY=state_early and fuse_ab and gates_early(), **epi, **pdl_kwargs(mixed_qkv.device),
    )
    if z is not None and not fuse:
        gated_rmsnorm(out, z.view(B, HV, DV), norm_weight, eps, out=out)
    return out


@triton.jit
def _column_ids(HV: tl.constexpr, R: tl.constexpr):
    """A verify program's (batch row b, value head j, value block vb, its q/k head h): grid (B*HV, DV/BV)."""
    pid = tl.program_id(0)
    j = pid % HV
    return pid // HV, j, tl.program_id(1), j // R


@triton.jit
def _gdn_columns_kernel(
    X, A, Bg, CW, CS, ALOG, DTB, S, CC, CR, O, Z, NW, IDX, XH, WAB,
    sx_b, sa_b, sb_b, scw_c, scw_t, scs_n, scs_c, scs_t, ss_n, ss_h,
    scc_n, scc_c, scc_t, scr_n, scr_h, so_b, so_h, sz_b, sxh_b, swab_r,
    q_scale, eps,
    M: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    FUSE_NORM: tl.constexpr, FUSE_AB: tl.constexpr = False, HID: tl.constexpr = 0, BH: tl.constexpr = 1024,
    HP: tl.constexpr = 0, HR: tl.constexpr = 0, MP: tl.constexpr = 2,
    PDL: tl.constexpr = False, SPLIT_NORM: tl.constexpr = False, OS=None, NCNT=None, PAIRED: tl.constexpr = False,
    AHEAD: tl.constexpr = False, REPLAY: tl.constexpr = False, RG=None, RK=None, RD=None,
    STATE_EARLY: tl.constexpr = False, GATES_EARLY: tl.constexpr = False,
):
    R: tl.constexpr = HV // HK
    NVB: tl.constexpr = DV // BV
    b, j, vb, h = _column_ids(HV, R)
    if FUSE_AB:
        # as in the decode step: the gate rows (weights) load before the PDL wait, once for all M
        # tokens of the sequence
        wa0, wb0, wa1, wb1 = _gate_row_loads(WAB, j, swab_r, HV, HP, HR)
    tm = tl.arange(0, MP)
    bv = tl.arange(0, BV)
    dk = tl.arange(0, DK)
    if STATE_EARLY:
        # as the decode step's (gdn_decode_step's state_early): the slot ids and the slot's state
        # (the last round's commit wrote it) read before the wait, streaming while the projection runs
        pdl_early_trigger(PDL)
        slot = tl.load(IDX + b, cache_modifier=".cg").to(tl.int64)
        st = tl.load(S + slot * ss_n + j * ss_h + dk[:, None] * DV + (vb * BV + bv)[None, :], cache_modifier=".cg")
        if FUSE_AB and GATES_EARLY:
            # the M tokens' x rows were written before the projection's launch too (the decode
            # step's GATES_EARLY): the gates' dot products run while the projection does
            ga, gb = _gate_rows(XH, WAB, b, j, sxh_b, swab_r, M, MP, HID, HV, BH, HP, HR, wa0, wb0, wa1, wb1)
        pdl_wait(PDL)
    else:
        pdl_prologue(PDL)
    if FUSE_AB and not (STATE_EARLY and GATES_EARLY):
        # all M tokens' gates first, so that the rows' registers are free before the state tile
        # loads (held through the token loop they spilled: 255 registers + 288 bytes, sm_90)
        ga, gb = _gate_rows(XH, WAB, b, j, sxh_b, swab_r, M, MP, HID, HV, BH, HP, HR, wa0, wb0, wa1, wb1)
    if not STATE_EARLY:
        slot = tl.load(IDX + b).to(tl.int64)
    q_ch = h * DK + dk
    k_ch = HK * DK + h * DK + dk
    v_ch = 2 * HK * DK + j * DV + vb * BV + bv
    if not STATE_EARLY:
        # the slot's state is only read: token t's state and conv window go to column slot * M + t
        st = tl.load(S + slot * ss_n + j * ss_h + dk[:, None] * DV + (vb * BV + bv)[None, :])
    q0, q1, q2 = _load_window(CS, q_ch, slot, scs_n, scs_c, scs_t)
    k0, k1, k2 = _load_window(CS, k_ch, slot, scs_n, scs_c, scs_t)
    v0, v1, v2 = _load_window(CS, v_ch, slot, scs_n, scs_c, scs_t)
    A_neg = -tl.exp(tl.load(ALOG + j).to(tl.float32))
    dtb = tl.load(DTB + j).to(tl.float32)
    # the q/k channels of head h are the same for its R value heads: the first of them writes them
    lead = (j % R == 0) & (vb == 0)
    if AHEAD:
        # the taps once, and each token's conv inputs loaded one token ahead: the loads of token
        # t + 1 are in flight while token t's reductions wait at their barriers (otherwise every
        # token starts with a round trip to L2 for its row of X)
        wq0, wq1, wq2, wq3 = _conv_taps(CW, q_ch, scw_c, scw_t)
        wk0, wk1, wk2, wk3 = _conv_taps(CW, k_ch, scw_c, scw_t)
        wv0, wv1, wv2, wv3 = _conv_taps(CW, v_ch, scw_c, scw_t)
        nq = tl.load(X + b * M * sx_b + q_ch)
        nk = tl.load(X + b * M * sx_b + k_ch)
        nv = tl.load(X + b * M * sx_b + v_ch)
    for t in tl.static_range(M):
        row = b * M + t
        col = slot * M + t
        if AHEAD:
            qx, kx, vx = nq, nk, nv
            if t + 1 < M:
                nq = tl.load(X + (row + 1) * sx_b + q_ch)
                nk = tl.load(X + (row + 1) * sx_b + k_ch)
                nv = tl.load(X + (row + 1) * sx_b + v_ch)
            q = _conv_of(qx, wq0, wq1, wq2, wq3, q0, q1, q2)
            k = _conv_of(kx, wk0, wk1, wk2, wk3, k0, k1, k2)
            v = _conv_of(vx, wv0, wv1, wv2, wv3, v0, v1, v2)
        else:
            q, qx = _conv_col(X, CW, q_ch, row, sx_b, scw_c, scw_t, q0, q1, q2)
            k, kx = _conv_col(X, CW, k_ch, row, sx_b, scw_c, scw_t, k0, k1, k2)
            v, vx = _conv_col(X, CW, v_ch, row, sx_b, scw_c, scw_t, v0, v1, v2)
        q0, q1, q2 = q1, q2, qx.to(q0.dtype)
        k0, k1, k2 = k1, k2, kx.to(k0.dtype)
        v0, v1, v2 = v1, v2, vx.to(v0.dtype)
        if FUSE_AB:
            a_raw = tl.sum(tl.where(tm == t, ga, 0.0), 0)
            b_raw = tl.sum(tl.where(tm == t, gb, 0.0), 0)
        else:
            a_raw = tl.load(A + row * sa_b + j).to(tl.float32)
            b_raw = tl.load(Bg + row * sb_b + j).to(tl.float32)
        if REPLAY:
            # what the token's update needs, not the state it leaves: the commit replays the
            # accepted tokens on the slot's state (`commit_replay`): g [Hv], k [Hk, Dk] and delta
            # [Hv, Dv] a column (fp32, contiguous) instead of a whole [Hv, Dk, Dv] state
            st, o, g, kn, delta = _delta_rule_parts(st, q, k, v, a_raw + dtb, b_raw, A_neg, q_scale, PAIRED)
            tl.store(RD + (col * HV + j) * DV + vb * BV + bv, delta)
            if vb == 0:
                tl.store(RG + col * HV + j, g)
            if lead:
                tl.store(RK + (col * HK + h) * DK + dk, kn)
        else:
            st, o = _delta_rule_token(st, q, k, v, a_raw + dtb, b_raw, A_neg, q_scale, PAIRED)
            tl.store(CR + col * scr_n + j * scr_h + dk[:, None] * DV + (vb * BV + bv)[None, :], st)
        _shift_state(CC, v_ch, col, scc_n, scc_c, scc_t, v0, v1, v2)
        if lead:
            _shift_state(CC, q_ch, col, scc_n, scc_c, scc_t, q0, q1, q2)
            _shift_state(CC, k_ch, col, scc_n, scc_c, scc_t, k0, k1, k2)
        if SPLIT_NORM:
            # the head is split over NVB programs: each leaves its fp32 columns in OS, and the
            # last of them to arrive (counter per row and head) normalizes the whole head
            _split_gated_norm(o, OS, NCNT, O, Z, NW, row, j, vb, bv, so_b, so_h, sz_b, eps, HV, DV, BV, NVB)
        else:
            if FUSE_NORM:
                o = _gated_norm(o, Z, NW, row, sz_b, j, bv, eps, DV)
            tl.store(O + row * so_b + j * so_h + vb * BV + bv, o.to(O.dtype.element_ty))


@triton.jit
def _split_gated_norm(o, OS, NCNT, O, Z, NW, row, j, vb, bv, so_b, so_h, sz_b, eps,
                      HV: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, NVB: tl.constexpr):
    """The gated norm of a value head whose columns NVB programs hold, without a second launch:
    o [BV] goes to OS[row, j] (fp32); the program that arrives last (acq_rel counter, as the
    decode step's conv shift) reads the whole head back, normalizes it into O and resets the
    counter. The same arithmetic as `_gated_norm` on the whole head, in a fixed order."""
    base = (row * HV + j) * DV
    tl.store(OS + base + vb * BV + bv, o)
    tl.debug_barrier()  # every thread's columns are stored before this program counts itself
    arrived = SY.arrive(NCNT + row * HV + j)
    if arrived == NVB - 1:
        SY.acquire_all(arrived)
        dv = tl.arange(0, DV)
        full = tl.load(OS + base + dv, cache_modifier=".cg")
        full = _gated_norm(full, Z, NW, row, sz_b, j, dv, eps, DV)
        tl.store(O + row * so_b + j * so_h + dv, full.to(O.dtype.element_ty))
        SY.rearm(NCNT + row * HV + j)


@triton.jit
def _conv_tile(X, CS, CW, CC, tok, chan, valid, b, slot, col0, sx_b, scs_n, scs_c, scs_t, scw_c, scw_t,
               scc_n, scc_c, scc_t, M: tl.constexpr, WRITE):
    """Conv1d + SiLU of a tile whose row r is token tok[r] of row block b and whose element (r, c)
    is channel chan[r, c] -> fp32, zero where not valid[r]. Token t's tap i reads input t - 3 + i:
    row b*M + t - 3 + i of X or, before the block's first token, the slot's conv state (column
    t + i). An input older than the token itself is rounded to the conv state's dtype first, as the
    token-by-token kernel's window keeps it. WRITE (a program's runtime flag, or a constant): the
    window after token t (taps 1..3) goes to conv column col0 + t of CC."""
    for i in tl.static_range(4):
        p = tok - 3 + i
        xin = tl.load(X + (b * M + p).to(tl.int64)[:, None] * sx_b + chan, mask=(valid & (p >= 0))[:, None], other=0.0)
        if i < 3:
            xin = xin.to(CS.dtype.element_ty)
        sin = tl.load(CS + slot * scs_n + chan * scs_c + (3 + p)[:, None] * scs_t, mask=(valid & (p < 0))[:, None],
                      other=0.0)
        tap = xin.to(tl.float32) + sin.to(tl.float32)  # one of the two is zero
        if i > 0:
            if WRITE:
                tl.store(CC + (col0 + tok).to(tl.int64)[:, None] * scc_n + chan * scc_c + (i - 1) * scc_t,
                         tap.to(CC.dtype.element_ty), mask=valid[:, None])
        w = tl.load(CW + chan * scw_c + i * scw_t).to(tl.float32)
        if i == 0:
            acc = tap * w
        else:
            acc += tap * w
    return acc * tl.sigmoid(acc)


@triton.jit
def _mm(a, b):
    """a @ b in fp32, every product and sum in fp32 (no tf32)."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _gdn_columns_chunk_kernel(
    X, A, Bg, CW, CS, ALOG, DTB, S, CC, O, Z, NW, IDX, XH, WAB, RG, RK, RD,
    sx_b, sa_b, sb_b, scw_c, scw_t, scs_n, scs_c, scs_t, ss_n, ss_h,
    scc_n, scc_c, scc_t, so_b, so_h, sz_b, sxh_b, swab_r,
    q_scale, eps,
    M: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
    FUSE_NORM: tl.constexpr, FUSE_AB: tl.constexpr = False, HID: tl.constexpr = 0, BH: tl.constexpr = 1024,
    HP: tl.constexpr = 0, HR: tl.constexpr = 0, LOGM: tl.constexpr = 2, KC: tl.constexpr = 16,
    PDL: tl.constexpr = False, STATE_EARLY: tl.constexpr = False, GATES_EARLY: tl.constexpr = False,
):
    """The replay-form verify (`_gdn_columns_kernel` with REPLAY) with its M <= 8 tokens taken
    together instead of one after another. The token-by-token kernel waits on two reductions
    across the program per token, each behind the last (2M in all). Here, with S the slot's state
    tile, decays g_t, Gam_t = g_1 ... g_t, beta_t and L2-normed k_t, q_t:
        delta_t = beta_t (v_t - Gam_t S^T k_t - sum_{s<t} (Gam_t / Gam_s) (k_s . k_t) delta_s)
        o_t     = Gam_t S^T q_t + sum_{s<=t} (Gam_t / Gam_s) (k_s . q_t) delta_s
    (the recurrence S_t = g_t S_{t-1} + k_t delta_t^T unrolled). The k and q rows of every token
    form one [16, Dk] tile (k_t in row t, q_t in row 8 + t); it meets the state and itself in
    products over Dk in slices of KC (a whole-Dk product holds too many registers a thread): [16,
    KC] x [KC, BV] for S^T k and S^T q, [16, KC] x [KC, 16] for the k.k and q.k products, the state
    read a slice at a time. The triangular system is solved as (I + N)^-1 = (I - N)(I + N^2)(I +
    N^4)... (N strictly lower triangular, so the series ends): LOGM products of [16, 16]. Rows of
    tokens past M are zeros that take no part. The outputs are the token-by-token kernel's up to the
    order of fp32 operations; the conv columns are the same bits; the replay buffers (g, normed k,
    delta) agree within rounding."""
    MP: tl.constexpr = 16  # tl.dot's smallest M: tokens 0..7 as k rows, then as q rows
    R: tl.constexpr = HV // HK
    b, j, vb, h = _column_ids(HV, R)
    if FUSE_AB:
        wa0, wb0, wa1, wb1 = _gate_row_loads(WAB, j, swab_r, HV, HP, HR)
    tm = tl.arange(0, MP)
    live = tm < M
    bv = tl.arange(0, BV)
    dk = tl.arange(0, DK)
    kc = tl.arange(0, KC)
    # the [16, Dk] tile's rows: k of token r (r < 8), q of token r - 8
    tok = tm % 8
    kq_live = tok < M
    kq_base = tl.where(tm < 8, HK * DK + h * DK, h * DK)
    if STATE_EARLY:
        pdl_early_trigger(PDL)
        slot = tl.load(IDX + b, cache_modifier=".cg").to(tl.int64)
        if FUSE_AB and GATES_EARLY:
            ga, gb = _gate_rows(XH, WAB, b, j, sxh_b, swab_r, M, MP, HID, HV, BH, HP, HR, wa0, wb0, wa1, wb1)
        pdl_wait(PDL)
    else:
        pdl_prologue(PDL)
        slot = tl.load(IDX + b).to(tl.int64)
    if FUSE_AB and not (STATE_EARLY and GATES_EARLY):
        ga, gb = _gate_rows(XH, WAB, b, j, sxh_b, swab_r, M, MP, HID, HV, BH, HP, HR, wa0, wb0, wa1, wb1)
    if not FUSE_AB:
        ga = tl.load(A + (b * M + tm) * sa_b + j, mask=live, other=0.0).to(tl.float32)
        gb = tl.load(Bg + (b * M + tm) * sb_b + j, mask=live, other=0.0).to(tl.float32)
    col0 = slot * M
    lead = (j % R == 0) & (vb == 0)
    # k and q of every token, their norms (q's scaled), the normed k to the replay buffer
    kq = _conv_tile(X, CS, CW, CC, tok, kq_base[:, None] + dk[None, :], kq_live, b, slot, col0, sx_b, scs_n, scs_c,
                    scs_t, scw_c, scw_t, scc_n, scc_c, scc_t, M, lead)
    rn = tl.rsqrt(tl.sum(kq * kq, 1) + 1e-6) * tl.where(tm < 8, 1.0, q_scale)
    cols = (col0 + tm).to(tl.int64)
    if lead:
        tl.store(RK + (cols * HK + h)[:, None] * DK + dk[None, :], kq * rn[:, None], mask=(tm < M)[:, None])
    v = _conv_tile(X, CS, CW, CC, tm, (2 * HK * DK + j * DV + vb * BV + bv)[None, :] + 0 * tm[:, None], live, b, slot,
                   col0, sx_b, scs_n, scs_c, scs_t, scw_c, scw_t, scc_n, scc_c, scc_t, M, True)
    # S^T k, S^T q and the k.k, q.k products, a KC slice of Dk at a time (the slice's k and q again
    # from the conv: the tile above cannot be sliced)
    s_kq = tl.zeros([MP, BV], tl.float32)
    gram = tl.zeros([MP, MP], tl.float32)
    for c0 in tl.static_range(0, DK, KC):
        part = _conv_tile(X, CS, CW, CC, tok, kq_base[:, None] + (c0 + kc)[None, :], kq_live, b, slot, col0, sx_b,
                          scs_n, scs_c, scs_t, scw_c, scw_t, scc_n, scc_c, scc_t, M, False) * rn[:, None]
        st = tl.load(S + slot * ss_n + j * ss_h + (c0 + kc)[:, None] * DV + (vb * BV + bv)[None, :])
        s_kq += _mm(part, st)
        gram += _mm(part, tl.trans(part))
    # rows out: token t's k row (t) and q row (8 + t) picked by two [16, 16] selections
    pick_k = tl.where((tm[None, :] == tm[:, None]) & live[:, None], 1.0, 0.0)
    pick_q = tl.where((tm[None, :] == tm[:, None] + 8) & live[:, None], 1.0, 0.0)
    s_k = _mm(pick_k, s_kq)
    s_q = _mm(pick_q, s_kq)
    kk = _mm(_mm(pick_k, gram), tl.trans(pick_k))
    qk = _mm(_mm(pick_q, gram), tl.trans(pick_k))
    # gates: log-decay, its running sum over the tokens, beta (zero past M: those rows drop out)
    u = ga + tl.load(DTB + j).to(tl.float32)
    softplus = _softplus(u)
    lg = tl.where(live, -tl.exp(tl.load(ALOG + j).to(tl.float32)) * softplus, 0.0)
    cum = tl.cumsum(lg, 0)
    beta = tl.where(live, tl.sigmoid(gb), 0.0)
    causal = tm[None, :] <= tm[:, None]  # s <= t
    decay = tl.exp(tl.where(causal, cum[:, None] - cum[None, :], -float("inf")))
    # (I + N)^-1 as the product of (I + P^(2^i)), P = -N
    eye = tl.where(tm[:, None] == tm[None, :], 1.0, 0.0)
    p = tl.where(tm[None, :] < tm[:, None], -beta[:, None] * decay * kk, 0.0)
    inv = eye + p
    for _ in tl.static_range(LOGM - 1):
        p = _mm(p, p)
        inv = _mm(inv, eye + p)
    gam = tl.exp(cum)
    delta = _mm(inv, beta[:, None] * (v - gam[:, None] * s_k))
    o = gam[:, None] * s_q + _mm(tl.where(causal, decay * qk, 0.0), delta)
    # the replay buffers: what each token's update was (commit_replay makes the accepted state)
    tl.store(RD + (cols * HV + j)[:, None] * DV + (vb * BV + bv)[None, :], delta, mask=live[:, None])
    if vb == 0:
        tl.store(RG + cols * HV + j, tl.exp(lg), mask=live)
    rows = (b * M + tm).to(tl.int64)
    if FUSE_NORM:
        z = tl.load(Z + rows[:, None] * sz_b + j * DV + bv[None, :], mask=live[:, None], other=0.0).to(tl.float32)
        o = o * tl.rsqrt(tl.sum(o * o, 1) / DV + eps)[:, None] * tl.load(NW + bv).to(tl.float32)[None, :] \
            * (z * tl.sigmoid(z))
    tl.store(O + rows[:, None] * so_b + j * so_h + (vb * BV + bv)[None, :], o.to(O.dtype.element_ty), mask=live[:, None])


def paired_reductions() -> bool:
    """The delta rule's token in two reductions across the program instead of four
    (`_delta_rule_token`), in the decode step and the verify; NINFER_GDN_PAIRED=0 takes the four.
    H200, 27B shapes (bench/gdn_columns.py, BENCHMARKS.md "Twelfth run"): decode step 9.01 -> 8.50
    us a layer, verify columns (BV 32) 19.90 -> 19.21; the MTP round 12.61 -> 12.57 ms."""
    return os.environ.get("NINFER_GDN_PAIRED", "1") != "0"


def conv_inputs_ahead() -> bool:
    """NINFER_GDN_AHEAD=1 (an experiment, off): the verify columns' conv taps loaded once and each
    token's conv inputs one token ahead. Same outputs bit for bit. H200 (BENCHMARKS.md "Twelfth
    run"): alone slower at BV 32 (19.25 -> 21.12 us a layer) and faster at BV 16, 2 warps (20.10 ->
    18.11); in the MTP round with BV 32, 12.587 against 12.555 / 12.549 ms, within the noise."""
    return os.environ.get("NINFER_GDN_AHEAD", "0") == "1"


def gates_early() -> bool:
    """With state_early, the gates' dot products (ab_input) before the PDL wait too, in the decode
    step and the verify (NINFER_GDN_GATES_EARLY=0 turns it off). The caller's promise for
    state_early covers x: it is the layer's input, written before the projection's launch. The
    gates come out bit for bit the same either way. Timed on an H100 (BENCHMARKS.md, twenty-sixth
    run), alternated twice: the 35B round -0.05 ms (4.71 against 4.76), the 27B plain step -0.04
    ms (7.98 against 8.02), the 27B round and the 35B plain step unchanged."""
    return os.environ.get("NINFER_GDN_GATES_EARLY", "1") == "1"


def chunked_verify() -> bool:
    """NINFER_GDN_CHUNK=1 (an experiment, off until timed on a GPU): the replay-form verify's M
    tokens taken together (`_gdn_columns_chunk_kernel`: a handful of small matrix products in
    place of 2M reductions waited on one after another). Taken where the replay buffers are given,
    M <= 8, the value columns a program are 16 or more, and the gated norm is not split in the
    launch; elsewhere the token-by-token kernel runs."""
    return os.environ.get("NINFER_GDN_CHUNK", "0") == "1"


def split_norm_in_launch() -> bool:
    """NINFER_GDN_SPLIT_NORM=1 (an experiment, off until timed): with the verify's heads split,
    the gated norm runs in the same launch (`_split_gated_norm`) instead of a second one."""
    return os.environ.get("NINFER_GDN_SPLIT_NORM", "0") == "1"


def gdn_verify_columns(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    col_conv: torch.Tensor,
    col_state: torch.Tensor,
    state_indices: torch.Tensor,
    *,
    m: int,
    num_k_heads: int,
    head_k_dim: int = 128,
    head_v_dim: int = 128,
    z: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    block_v: int | None = None,
    num_warps: int | None = None,
    ab_input: tuple[torch.Tensor, torch.Tensor] | None = None,
    replay: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    state_early: bool = False,
) -> torch.Tensor:
    """M tokens of each of B sequences through the GDN core in one launch, for a speculative
    verify: rows are sequence-major (row b*M + t is token t of sequence b, whose state is slot
    state_indices[b]). The slot's conv and recurrent state are only read; the conv window and
    state after token t are written to column slot*M + t of col_conv [slots*M, conv_dim, 3] and
    col_state [slots*M, Hv, Dk, Dv] (what M calls of gdn_decode_step on copied columns would
    leave there). a = b = None with ab_input = (x [B*M, H], W [2 Hv, H]): the raw gates computed
    in the kernel in fp32, as gdn_decode_step does (the rows of W loaded once for the M tokens).
    block_v = None with z: whole heads with the norm inside, unless `split_heads` says the grid
    would be too small. Other arguments as gdn_decode_step. Returns o [B*M, Hv, Dv].

    replay = (g [slots*M, Hv], k [slots*M, Hk, Dk], delta [slots*M, Hv, Dv]), fp32 and contiguous:
    instead of the state after each token (col_state, then unused: None), what each token's update
    was (`commit_replay` then makes the accepted column's state from the slot's): 33 KB a token
    and layer for the 27B against a 3.1 MB state.

    state_early: as gdn_decode_step's (the slot ids and the slot's state read before the PDL wait;
    the caller's promise that the launch before was made inside launch.late_dependents). Taken
    only where the state tile is a split head's (BV < Dv): a whole head's 128 registers a thread
    held with the gate rows through the gates' dot products would not fit."""
    BM = mixed_qkv.shape[0]
    fuse_ab = a is None
    if fuse_ab:
        if b is not None or ab_input is None:
            raise ValueError("gdn_verify_columns: give a and b, or neither and ab_input = (x, W_ab)")
        xh, wab = ab_input
        if wab.shape[0] % 2 or xh.shape != (BM, wab.shape[1]) or xh.stride(1) != 1 or wab.stride(1) != 1:
            raise ValueError(f"gdn_verify_columns: ab_input x {tuple(xh.shape)} and W {tuple(wab.shape)} need "
                             "x [B*M, H], W [2 Hv, H], unit last strides")
        HV = wab.shape[0] // 2
        a = b = xh  # never read
    else:
        xh = wab = mixed_qkv  # never read
        HV = a.shape[1]
    HK, DK, DV = num_k_heads, head_k_dim, head_v_dim
    B = state_indices.shape[0]
    if BM != B * m:
        raise ValueError(f"gdn_verify_columns: {BM} rows for {B} sequences of {m} tokens")
    if HV % HK or mixed_qkv.shape[1] != 2 * HK * DK + HV * DV:
        raise ValueError(f"gdn_verify_columns: conv_dim {mixed_qkv.shape[1]} != 2*{HK}*{DK} + {HV}*{DV}")
    if replay is not None:
        rg, rk, rd = replay
        n_col = col_conv.shape[0]
        want = ((n_col, HV), (n_col, HK, DK), (n_col, HV, DV))
        if any(t.shape != w or t.dtype != torch.float32 or not t.is_contiguous() for t, w in zip(replay, want)):
            raise ValueError(f"gdn_verify_columns: replay needs fp32 contiguous g {want[0]}, k {want[1]}, delta {want[2]}")
        col_state = ssm_state  # never written
    else:
        rg = rk = rd = None
    for name, s in (("ssm_state", ssm_state), ("col_state", col_state)):
        if s.stride(3) != 1 or s.stride(2) != DV:
            raise ValueError(f"gdn_verify_columns: {name} needs contiguous [Dk, Dv] per head")
    if mixed_qkv.stride(1) != 1:
        raise ValueError("gdn_verify_columns: mixed_qkv needs a unit last stride")
    if block_v is None and z is not None and split_heads(B, HV, mixed_qkv.device):
        block_v = default_block_v(B, HV, DV, mixed_qkv.device)
        # NINFER_GDN_VERIFY_BV=BV:warps (an A/B switch): the split's value columns a program and warps
        forced = os.environ.get("NINFER_GDN_VERIFY_BV")
        if forced:
            try:
                bv_s, w_s = forced.split(":")
                block_v, num_warps = int(bv_s), num_warps or int(w_s)
            except ValueError:
                raise ValueError(f"NINFER_GDN_VERIFY_BV={forced!r}: give BV:warps, e.g. 16:2") from None
            if block_v < 16 or DV % block_v or block_v & (block_v - 1):
                raise ValueError(f"NINFER_GDN_VERIFY_BV={forced!r}: BV must be a power of two >= 16 dividing {DV}")
    fuse = z is not None and (block_v is None or block_v == DV)
    bv = DV if fuse else (block_v or default_block_v(B, HV, DV, mixed_qkv.device))
    out = torch.empty(BM, HV, DV, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    split_norm = z is not None and not fuse and split_norm_in_launch()
    zz = z if (fuse or split_norm) else mixed_qkv
    extra = {}
    if split_norm:
        extra = dict(SPLIT_NORM=True, OS=torch.empty(BM, HV, DV, dtype=torch.float32, device=out.device),
                     NCNT=_counters(out.device, BM * HV))
    hid = wab.shape[1] if fuse_ab else 0
    hp, hr = ab_split(hid) if os.environ.get("NINFER_GDN_AB_EARLY", "1") != "0" else (0, 0)
    # what both verify kernels take alike
    common = dict(
        M=m, HK=HK, HV=HV, DK=DK, DV=DV, BV=bv, FUSE_NORM=fuse,
        FUSE_AB=fuse_ab, HID=hid, BH=min(1024, triton.next_power_of_2(max(hid, 16))), HP=hp, HR=hr,
        STATE_EARLY=state_early and bv < DV, GATES_EARLY=state_early and bv < DV and fuse_ab and gates_early(),
        **pdl_kwargs(mixed_qkv.device),
    )
    if replay is not None and chunked_verify() and m <= 8 and bv >= 16 and DK % 16 == 0 and not split_norm:
        _gdn_columns_chunk_kernel[(B * HV, DV // bv)](
            mixed_qkv, a, b, conv_weight, conv_state, A_log, dt_bias, ssm_state, col_conv, out, zz,
            norm_weight if fuse else A_log, state_indices, xh, wab, rg, rk, rd,
            mixed_qkv.stride(0), a.stride(0), b.stride(0), conv_weight.stride(0), conv_weight.stride(1),
            conv_state.stride(0), conv_state.stride(1), conv_state.stride(2), ssm_state.stride(0), ssm_state.stride(1),
            col_conv.stride(0), col_conv.stride(1), col_conv.stride(2),
            out.stride(0), out.stride(1), zz.stride(0), xh.stride(0), wab.stride(0),
            DK**-0.5, eps,
            # 8 warps by default: at 4 the split head's tile (BV 32) compiled to 255 registers and
            # spilled 40 B a thread (sm_90, Triton 3.6); at 8, 128 registers and none
            LOGM=max(1, (m - 1).bit_length()), num_warps=num_warps or 8, **common,
        )
    else:
        _gdn_columns_kernel[(B * HV, DV // bv)](
            mixed_qkv, a, b, conv_weight, conv_state, A_log, dt_bias, ssm_state, col_conv, col_state, out, zz,
            norm_weight if (fuse or split_norm) else A_log, state_indices, xh, wab,
            mixed_qkv.stride(0), a.stride(0), b.stride(0), conv_weight.stride(0), conv_weight.stride(1),
            conv_state.stride(0), conv_state.stride(1), conv_state.stride(2), ssm_state.stride(0), ssm_state.stride(1),
            col_conv.stride(0), col_conv.stride(1), col_conv.stride(2), col_state.stride(0), col_state.stride(1),
            out.stride(0), out.stride(1), zz.stride(0), xh.stride(0), wab.stride(0),
            DK**-0.5, eps,
            MP=max(2, triton.next_power_of_2(m)), num_warps=num_warps or 4, PAIRED=paired_reductions(),
            AHEAD=conv_inputs_ahead(), REPLAY=replay is not None, RG=rg, RK=rk, RD=rd, **common, **extra,
        )
    if z is not None and not fuse and not split_norm:
        gated_rmsnorm(out, z.view(BM, HV, DV), norm_weight, eps, out=out)
    return out


@triton.jit
def _prefill_conv_kernel(
    X, CS, CW, OUT, NS, T, sx_t, scs_c, scs_t, scw_c, scw_t,
    HK: tl.constexpr, HV: tl.constexpr, D: tl.constexpr, BT: tl.constexpr,
):
    """Program (tile, head block): tokens tile*BT.. of one head's D channels (q heads, then k, then
    v): causal conv1d (kernel 4) + SiLU, the L2 norm per token for q and k, written to that part's
    own contiguous [T, heads, D] segment of OUT; the last tile also writes the new conv state."""
    tile = tl.program_id(0)
    hb = tl.program_id(1)
    t = tile * BT + tl.arange(0, BT)
    c = hb * D + tl.arange(0, D)
    t_ok = t < T
    acc = tl.zeros((BT, D), dtype=tl.float32)
    for i in tl.static_range(4):
        tt = t - 3 + i  # input position feeding tap i; < 0: the conv state's column 3 + tt
        xv = tl.load(X + tt[:, None].to(tl.int64) * sx_t + c[None, :], mask=(t_ok & (tt >= 0))[:, None], other=0.0)
        sv = tl.load(CS + c[None, :] * scs_c + (3 + tt)[:, None] * scs_t, mask=(t_ok & (tt < 0))[:, None], other=0.0)
        w = tl.load(CW + c * scw_c + i * scw_t).to(tl.float32)
        acc += (xv.to(tl.float32) + sv.to(tl.float32)) * w[None, :]
    y = acc * tl.sigmoid(acc)
    if hb < 2 * HK:
        y = y * tl.rsqrt(tl.sum(y * y, 1) + 1e-6)[:, None]
    seg = (hb >= HK).to(tl.int32) + (hb >= 2 * HK).to(tl.int32)  # 0: q, 1: k, 2: v
    base = seg.to(tl.int64) * T * (HK * D)
    width = tl.where(seg == 2, HV * D, HK * D)
    col = (hb - seg * HK) * D
    dst = OUT + base + t[:, None].to(tl.int64) * width + col + tl.arange(0, D)[None, :]
    tl.store(dst, y.to(OUT.dtype.element_ty), mask=t_ok[:, None])
    if tile == tl.num_programs(0) - 1:
        # new state: the last three inputs (positions T-3..T-1; before 0: the old state's columns)
        # (names of their own: Triton wants a name's type fixed across the branch)
        j = tl.arange(0, 4)
        tn = T - 3 + j
        j_ok = j < 3
        xn = tl.load(X + tn[:, None].to(tl.int64) * sx_t + c[None, :], mask=(j_ok & (tn >= 0))[:, None], other=0.0)
        sn = tl.load(CS + c[None, :] * scs_c + (3 + tn)[:, None] * scs_t, mask=(j_ok & (tn < 0))[:, None], other=0.0)
        new = xn.to(tl.float32) + sn.to(tl.float32)
        tl.store(NS + c[None, :] * 3 + j[:, None], new.to(NS.dtype.element_ty), mask=j_ok[:, None])


def gdn_prefill_conv(
    mixed_qkv: torch.Tensor,
    conv_state: torch.Tensor,
    conv_weight: torch.Tensor,
    *,
    num_k_heads: int,
    num_v_heads: int,
    head_dim: int,
    block_t: int = 32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GDN prefill chunk's inputs to the chunked core in one launch: mixed_qkv [T, conv_dim]
    (pre-conv, channels [Q | K | V]), conv_state [conv_dim, 3] (last three inputs before the
    chunk, oldest first), conv_weight [conv_dim, 4] -> (q [T, Hk, D] and k L2-normalized, v
    [T, Hv, D], all in mixed_qkv's dtype, contiguous; new conv state [conv_dim, 3]). The torch
    form: cat(state, x) -> depthwise conv1d in fp32 -> SiLU -> split -> L2 norm; here the same in
    fp32 registers, without the transposed copy. Needs head_k_dim == head_v_dim (Qwen: 128)."""
    T, C = mixed_qkv.shape
    HK, HV, D = num_k_heads, num_v_heads, head_dim
    if C != (2 * HK + HV) * D:
        raise ValueError(f"gdn_prefill_conv: conv_dim {C} != (2*{HK} + {HV}) * {D}")
    if mixed_qkv.stride(1) != 1 or conv_weight.shape[-1] != 4:
        raise ValueError("gdn_prefill_conv: mixed_qkv needs a unit last stride and the conv kernel size 4")
    out = torch.empty(T * C, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    new_state = torch.empty(C, 3, dtype=conv_state.dtype, device=conv_state.device)
    if T > 0:
        _prefill_conv_kernel[(triton.cdiv(T, block_t), 2 * HK + HV)](
            mixed_qkv, conv_state, conv_weight, out, new_state, T,
            mixed_qkv.stride(0), conv_state.stride(0), conv_state.stride(1), conv_weight.stride(0), conv_weight.stride(1),
            HK=HK, HV=HV, D=D, BT=block_t, num_warps=4,
        )  # fmt: skip
    q = out[: T * HK * D].view(T, HK, D)
    k = out[T * HK * D : 2 * T * HK * D].view(T, HK, D)
    v = out[2 * T * HK * D :].view(T, HV, D)
    return q, k, v, new_state


@triton.jit
def _commit_columns_kernel(DST, SRC, SLOTS, COL, E, S, M: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    b = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)
    pdl_prologue(PDL)  # the accepted columns come from the launch before (the round's judge)
    slot = tl.load(SLOTS + b).to(tl.int64)
    col = tl.load(COL + b).to(tl.int64)
    mask = e < E
    row = layer * S + slot
    tl.store(DST + row * E + e, tl.load(SRC + (row * M + col) * E + e, mask=mask), mask=mask)


def commit_columns(dst: torch.Tensor, src: torch.Tensor, slots: torch.Tensor, column: torch.Tensor,
                   block: int = 4096) -> None:
    """dst[l, slots[b]] = src[l, slots[b], column[b]] for every layer l and sequence b, in one
    launch that reads each kept column once and writes it once: dst [L, S, ...], src [L, S, M, ...]
    (both contiguous, same dtype), slots and column [B] integer tensors on the device (the round's
    accepted counts, never read on the host). The torch form (`dst.index_copy_(1, slots,
    src[:, slots, column])`) gathers into a temporary first: twice the bytes, and on the H200 the
    gather alone of the 27B's recurrent state (151 MB) took ~0.2 ms a round."""
    L, S, M = src.shape[:3]
    if dst.shape[:2] != (L, S) or dst.shape[2:] != src.shape[3:] or dst.dtype != src.dtype:
        raise ValueError(f"commit_columns: dst {tuple(dst.shape)} {dst.dtype} and src {tuple(src.shape)} {src.dtype} "
                         "need [L, S, ...] and [L, S, M, ...] of one dtype")
    if not (dst.is_contiguous() and src.is_contiguous()):
        raise ValueError("commit_columns: dst and src must be contiguous")
    if slots.shape != column.shape or slots.dim() != 1:
        raise ValueError(f"commit_columns: slots {tuple(slots.shape)} and column {tuple(column.shape)} must be [B]")
    E = dst[0, 0].numel()
    B = slots.shape[0]
    if B == 0 or L == 0:
        return
    _commit_columns_kernel[(triton.cdiv(E, block), B, L)](
        dst, src, slots, column, E, S, M=M, BLOCK=block, num_warps=4, **pdl_kwargs(dst.device))


@triton.jit
def _commit_replay_kernel(ST, RG, RK, RD, SLOTS, COL, S, HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr,
                          DV: tl.constexpr, BV: tl.constexpr, M: tl.constexpr, PDL: tl.constexpr = False):
    pid = tl.program_id(0)
    b = tl.program_id(1)
    layer = tl.program_id(2).to(tl.int64)
    j = pid // (DV // BV)
    vb = pid % (DV // BV)
    h = j // (HV // HK)
    dk = tl.arange(0, DK)
    cv = vb * BV + tl.arange(0, BV)
    pdl_prologue(PDL)  # the accepted columns come from the launch before (the round's judge)
    slot = tl.load(SLOTS + b).to(tl.int64)
    col = tl.load(COL + b).to(tl.int32)
    ptr = ST + ((layer * S + slot) * HV + j) * (DK * DV) + dk[:, None] * DV + cv[None, :]
    st = tl.load(ptr)
    base = (layer * S + slot) * M
    for t in range(0, col + 1):
        c = base + t
        g = tl.load(RG + c * HV + j)
        k = tl.load(RK + (c * HK + h) * DK + dk)
        delta = tl.load(RD + (c * HV + j) * DV + cv)
        st = _replay_update(st, g, k, delta)
    tl.store(ptr, st)


def commit_replay(state: torch.Tensor, g: torch.Tensor, k: torch.Tensor, delta: torch.Tensor, slots: torch.Tensor,
                  column: torch.Tensor, block_v: int = 32) -> None:
    """A speculative round's recurrent-state rollback by replay, for every GDN layer in one
    launch: state[l, slots[b]] (the state before the verify, [L, S, Hv, Dk, Dv] fp32, contiguous)
    goes through the updates of tokens 0..column[b] that the verify stored
    (`gdn_verify_columns(..., replay=...)`: g [L, S*M, Hv], k [L, S*M, Hk, Dk], delta [L, S*M,
    Hv, Dv]), in place. Reads and writes the state once, as `commit_columns` does, but the verify
    then writes 33 KB a token and layer instead of a 3.1 MB state (27B)."""
    L, S, HV, DK, DV = state.shape
    if g.dim() != 3 or g.shape[0] != L or g.shape[1] % S or g.shape[2] != HV:
        raise ValueError(f"commit_replay: g {tuple(g.shape)} does not fit state {tuple(state.shape)}")
    M = g.shape[1] // S
    HK = k.shape[2]
    if k.shape != (L, S * M, HK, DK) or delta.shape != (L, S * M, HV, DV) or HV % HK:
        raise ValueError(f"commit_replay: k {tuple(k.shape)} / delta {tuple(delta.shape)} do not fit g {tuple(g.shape)}")
    if not all(t.is_contiguous() and t.dtype == torch.float32 for t in (state, g, k, delta)):
        raise ValueError("commit_replay: state, g, k and delta must be fp32 and contiguous")
    if slots.shape != column.shape or slots.dim() != 1:
        raise ValueError(f"commit_replay: slots {tuple(slots.shape)} and column {tuple(column.shape)} must be [B]")
    bv = min(block_v, DV)
    B = slots.shape[0]
    if B == 0 or L == 0:
        return
    _commit_replay_kernel[(HV * (DV // bv), B, L)](
        state, g, k, delta, slots, column, S, HV=HV, HK=HK, DK=DK, DV=DV, BV=bv, M=M, num_warps=4,
        **pdl_kwargs(state.device))
