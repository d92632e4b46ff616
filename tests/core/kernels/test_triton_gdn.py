"""Fused Gated DeltaNet decode step against the torch oracle (and fla's recurrent kernel on the
GPU): conv state shifted exactly once, fp32 state updated in place, slots and padded rows,
the value split (BV) and the fused gated RMSNorm, several steps in a row. Every test runs with
the delta rule's four reductions a token, with the paired two (NINFER_GDN_PAIRED=1), and with those
and the verify's conv inputs loaded a token ahead (NINFER_GDN_AHEAD=1)."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import reference as R
from ninfer.kernels.triton import gdn_decode_step

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True, params=["4red", "paired", "ahead"])
def reductions(request, monkeypatch):
    """ahead: paired, and the verify columns' conv inputs loaded a token ahead (NINFER_GDN_AHEAD=1,
    an experiment that only the verify columns read: checked against the token-by-token steps, on
    the CPU and at the real shapes on the GPU)."""
    if request.param == "ahead" and not any(t in request.node.name for t in ("columns_equal", "columns_real", "replay_then")):
        pytest.skip("NINFER_GDN_AHEAD: checked by the verify columns' step-by-step tests")
    # the four reductions (NINFER_GDN_PAIRED=0, the off switch) on the CPU: the decode step's and the
    # verify's step-by-step tests; every test on the GPU
    if request.param == "4red" and "gpu" not in request.node.name and not any(
        t in request.node.name for t in ("test_small", "columns_equal", "slots_and_padded", "replay_then")
    ):
        pytest.skip("NINFER_GDN_PAIRED=0: checked by the step-by-step tests")
    monkeypatch.setenv("NINFER_GDN_PAIRED", "0" if request.param == "4red" else "1")
    monkeypatch.setenv("NINFER_GDN_AHEAD", "1" if request.param == "ahead" else "0")
    return request.param


class Layer:
    def __init__(self, HK, HV, DK, DV, slots, seed):
        self.gen = torch.Generator().manual_seed(seed)
        self.HK, self.HV, self.DK, self.DV = HK, HV, DK, DV
        self.C = 2 * HK * DK + HV * DV
        self.conv_weight = self.randn(self.C, 4, scale=0.5).bfloat16()
        self.conv_state = self.randn(slots, self.C, 3).bfloat16()
        self.ssm_state = self.randn(slots, HV, DK, DV, scale=0.1)
        self.A_log = self.randn(HV, scale=0.5)
        self.dt_bias = self.randn(HV, scale=0.5)
        self.norm_weight = (1 + self.randn(DV, scale=0.1)).bfloat16()

    def randn(self, *shape, scale=1.0):
        return (torch.randn(*shape, generator=self.gen) * scale).to(DEV)

    def inputs(self, B, fuse):
        x = self.randn(B, self.C).bfloat16()
        a = self.randn(B, self.HV, scale=3).bfloat16()
        b = self.randn(B, self.HV).bfloat16()
        z = self.randn(B, self.HV * self.DV).bfloat16() if fuse else None
        return x, a, b, z


def _run(HK, HV, DK, DV, B, steps, slots_of_rows=None, block_v=None, fuse=False, seed=0, state_early=False):
    L = Layer(HK, HV, DK, DV, slots=max([B, 4] + [s + 1 for s in slots_of_rows or []]), seed=seed)
    conv_ref, ssm_ref = L.conv_state.clone(), L.ssm_state.clone()
    idx = torch.tensor(slots_of_rows, dtype=torch.int32, device=DEV) if slots_of_rows is not None else None
    rows = slots_of_rows if slots_of_rows is not None else list(range(B))
    for _ in range(steps):
        x, a, b, z = L.inputs(B, fuse)
        o = gdn_decode_step(x, a, b, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state,
                            num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, state_indices=idx, z=z,
                            norm_weight=L.norm_weight if fuse else None, block_v=block_v, state_early=state_early)
        for i, s in enumerate(rows):
            if s < 0:
                assert bool((o[i] == 0).all())
                continue
            sl = slice(i, i + 1)
            o_ref, conv_new, ssm_new = R.gdn_decode_step(
                x[sl], a[sl], b[sl], L.conv_weight, conv_ref[s : s + 1], L.A_log, L.dt_bias, ssm_ref[s : s + 1],
                HK, DK, DV, z=z[sl] if fuse else None, norm_weight=L.norm_weight)
            conv_ref[s], ssm_ref[s] = conv_new[0], ssm_new[0]
            R.assert_close(o[sl], o_ref, "gdn_output_bf16")
        assert torch.equal(L.conv_state, conv_ref)  # raw bf16 inputs, shifted: exact
        R.assert_close(L.ssm_state, ssm_ref, "gdn_state_fp32")


@pytest.mark.parametrize("block_v,fuse", [(None, False), (16, False), (None, True), (16, True)])
def test_small(block_v, fuse):
    _run(HK=2, HV=6, DK=32, DV=32, B=2, steps=2, block_v=block_v, fuse=fuse, seed=1)


@pytest.mark.parametrize("state_early", [False, True])
def test_slots_and_padded_rows(state_early):
    # state_early (cuda_fast's NINFER_GDN_EARLY): the slot ids and state tile read before the PDL
    # wait, a padded row's masked off; the same results
    _run(HK=2, HV=4, DK=32, DV=32, B=3, steps=2, slots_of_rows=[3, -1, 0], block_v=16, fuse=True, seed=2,
         state_early=state_early)


@pytest.mark.parametrize("block_v,fuse", [(None, False), (None, True)])
def test_state_early_without_slots(block_v, fuse):
    _run(HK=2, HV=6, DK=32, DV=32, B=2, steps=2, block_v=block_v, fuse=fuse, seed=7, state_early=True)


def test_head_dim_128():
    _run(HK=1, HV=2, DK=128, DV=128, B=1, steps=1, fuse=True, seed=3)


def _fused_ab_against_given_gates(HK, HV, DK, DV, H, B, slots_of_rows, block_v, fuse, seed):
    """The step with in_proj_a / in_proj_b computed in the kernel (ab_input) against the same step
    given those gates computed in fp32 outside: same outputs and states up to summation order."""
    L = Layer(HK, HV, DK, DV, slots=4, seed=seed)
    twin = Layer(HK, HV, DK, DV, slots=4, seed=seed)  # the same initial state, for the other path
    idx = torch.tensor(slots_of_rows, dtype=torch.int32, device=DEV)
    w_ab = L.randn(2 * HV, H, scale=H**-0.5).bfloat16()
    for _ in range(2):
        x, _, _, z = L.inputs(B, fuse)
        h = L.randn(B, H).bfloat16()
        ab = h.float() @ w_ab.float().T
        kw = dict(num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, state_indices=idx, z=z,
                  norm_weight=L.norm_weight if fuse else None, block_v=block_v)
        o = gdn_decode_step(x, None, None, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state,
                            ab_input=(h, w_ab), **kw)
        ref = gdn_decode_step(x, ab[:, :HV], ab[:, HV:], twin.conv_weight, twin.conv_state, twin.A_log, twin.dt_bias,
                              twin.ssm_state, **kw)
        R.assert_close(o, ref, "gdn_output_bf16")
        assert torch.equal(L.conv_state, twin.conv_state)
        R.assert_close(L.ssm_state, twin.ssm_state, "gdn_state_fp32")


@pytest.mark.parametrize("block_v,fuse", [(None, True), (16, False)])
# 64: one row load before the PDL wait; 80 = 64 + 16: two (the 27B's 5120 = 4096 + 1024); 200: not
# such a sum, the rows load after the wait in a masked loop
@pytest.mark.parametrize("H", [64, 80, 200])
def test_gates_from_the_hidden_state_in_the_kernel(H, block_v, fuse):
    _fused_ab_against_given_gates(HK=2, HV=4, DK=32, DV=32, H=H, B=3, slots_of_rows=[2, -1, 0], block_v=block_v,
                                  fuse=fuse, seed=4)


def test_gates_from_the_hidden_state_refuses_bad_inputs():
    L = Layer(2, 4, 32, 32, slots=2, seed=5)
    x, a, b, _ = L.inputs(1, False)
    args = (L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state)
    with pytest.raises(ValueError, match="neither"):
        gdn_decode_step(x, None, b, *args, num_k_heads=2, head_k_dim=32, head_v_dim=32,
                        ab_input=(torch.zeros(1, 64, device=DEV), torch.zeros(8, 64, device=DEV)))
    with pytest.raises(ValueError, match="W \\[2 Hv, H\\]"):
        gdn_decode_step(x, None, None, *args, num_k_heads=2, head_k_dim=32, head_v_dim=32,
                        ab_input=(torch.zeros(1, 64, device=DEV), torch.zeros(8, 32, device=DEV)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("HV,H", [(48, 5120), (32, 2048)])
def test_gates_from_the_hidden_state_real_shapes_gpu(HV, H):
    _fused_ab_against_given_gates(HK=16, HV=HV, DK=128, DV=128, H=H, B=1, slots_of_rows=[1], block_v=None,
                                  fuse=True, seed=6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("HV", [48, 32])
@pytest.mark.parametrize("block_v,fuse", [(None, False), (16, False), (32, False), (64, False), (None, True), (32, True)])
def test_real_shapes_gpu(HV, block_v, fuse):
    _run(HK=16, HV=HV, DK=128, DV=128, B=4, steps=3, slots_of_rows=[5, 0, -1, 2], block_v=block_v, fuse=fuse, seed=HV)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("HV", [48, 32])
@pytest.mark.parametrize("block_v,fuse", [(None, True), (32, False)])
def test_real_shapes_state_early_gpu(HV, block_v, fuse):
    # the state read before the PDL wait: safe here, the launch before each step is a torch op
    # (no PDL), and the state was written a step earlier
    _run(HK=16, HV=HV, DK=128, DV=128, B=4, steps=3, slots_of_rows=[5, 0, -1, 2], block_v=block_v, fuse=fuse, seed=HV,
         state_early=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_matches_fla_gpu():
    fla = pytest.importorskip("fla.ops.gated_delta_rule")
    HK, HV, D, B = 16, 48, 128, 2
    L = Layer(HK, HV, D, D, slots=B, seed=5)
    x, a, b, _ = L.inputs(B, False)
    # fla takes post-conv q, k, v: build them with the oracle's conv (its output is not used)
    window = torch.cat([L.conv_state.float(), x.float()[:, :, None]], dim=2)
    qkv = torch.nn.functional.silu((window * L.conv_weight.float()[None]).sum(-1)).bfloat16()
    q = qkv[:, : HK * D].reshape(B, 1, HK, D).contiguous()
    k = qkv[:, HK * D : 2 * HK * D].reshape(B, 1, HK, D).contiguous()
    v = qkv[:, 2 * HK * D :].reshape(B, 1, HV, D).contiguous()
    g, beta = R.gdn_gating(a, b, L.A_log, L.dt_bias)
    o_fla, s_fla = fla.fused_recurrent_gated_delta_rule(
        q, k, v, g=g[:, None], beta=beta[:, None], scale=D**-0.5, initial_state=L.ssm_state.clone(),
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    o = gdn_decode_step(x, a, b, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state, num_k_heads=HK)
    # fla reads bf16-rounded conv outputs, we keep them fp32: compare at the bf16 output bound
    R.assert_close(o, o_fla[:, 0].float(), "gdn_output_bf16")
    R.assert_close(L.ssm_state, s_fla, "gdn_output_bf16")


def _columns_vs_steps(HK, HV, DK, DV, m, slots_list, fuse, block_v, seed, state_early=False):
    """M tokens of B sequences in one launch leave in the columns (and return) what M decode steps
    on copied columns do, never touch the slots' own state, and give the same result again (no
    counter left behind by a split head's norm)."""
    from ninfer.kernels.triton import gdn_verify_columns

    n_slots = max(slots_list) + 1
    L = Layer(HK, HV, DK, DV, slots=n_slots, seed=seed)
    slots = torch.tensor(slots_list, dtype=torch.int32, device=DEV)
    B = len(slots)
    x, a, b, z = L.inputs(B * m, fuse)
    conv0, ssm0 = L.conv_state.clone(), L.ssm_state.clone()
    col_conv = torch.zeros(n_slots * m, L.C, 3, dtype=L.conv_state.dtype, device=DEV)
    col_rec = torch.zeros(n_slots * m, HV, DK, DV, device=DEV)

    def run():
        return gdn_verify_columns(x, a, b, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state, col_conv,
                                  col_rec, slots, m=m, num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, z=z,
                                  norm_weight=L.norm_weight if fuse else None, block_v=block_v, state_early=state_early)

    o = run()
    assert torch.equal(L.conv_state, conv0) and torch.equal(L.ssm_state, ssm0)
    assert torch.equal(run(), o)
    # the oracle: decode steps, token by token, on copies of each slot's state
    conv, ssm = conv0.clone(), ssm0.clone()
    for t in range(m):
        rows = slice(t, None, m)
        ot = gdn_decode_step(x[rows], a[rows], b[rows], L.conv_weight, conv, L.A_log, L.dt_bias, ssm,
                             num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, state_indices=slots,
                             z=z[rows] if fuse else None, norm_weight=L.norm_weight if fuse else None, block_v=block_v)
        R.assert_close(o[rows], ot, "gdn_output_bf16")
        for s in slots.tolist():
            assert torch.equal(col_conv[s * m + t], conv[s])
            R.assert_close(col_rec[s * m + t], ssm[s], "gdn_state_fp32")


# (True, 8): the gated norm given but the heads split, so the norm runs as a second launch
@pytest.mark.parametrize("fuse,block_v", [(True, None), (False, 8), (True, 8)])
@pytest.mark.parametrize("m", [1, 4])
def test_verify_columns_equal_token_by_token_steps(m, fuse, block_v):
    _columns_vs_steps(2, 4, 16, 16, m, [3, 1], fuse, block_v, seed=m)


@pytest.mark.parametrize("fuse,block_v", [(False, 8), (True, 8), (True, None)])
@pytest.mark.parametrize("m", [1, 4])
def test_verify_columns_with_the_state_read_early(m, fuse, block_v):
    # state_early (NINFER_GDN_EARLY): the slot ids and state read before the PDL wait where the
    # heads are split (whole heads keep the order: their tile would not fit beside the gate rows)
    _columns_vs_steps(2, 4, 16, 16, m, [3, 1], fuse, block_v, seed=m + 5, state_early=True)


def _replay_vs_columns(HK, HV, DK, DV, m, slots_list, fuse, block_v, seed, layers=2):
    """The verify with replay buffers (what each token's update was) gives the columns verify's
    outputs and conv columns, writes no state column, and `commit_replay` then leaves in each
    slot, for every layer at once, the state of the column accepted: token 0..column[b] replayed
    on the slot's own state. Slots not in the batch keep theirs."""
    from ninfer.kernels.triton import commit_replay, gdn_verify_columns

    n_slots = max(slots_list) + 2
    slots = torch.tensor(slots_list, dtype=torch.int32, device=DEV)
    B = len(slots)
    column = torch.tensor([(seed + i) % m for i in range(B)], dtype=torch.int64, device=DEV)
    state_all = torch.empty(layers, n_slots, HV, DK, DV, device=DEV)
    rg = torch.zeros(layers, n_slots * m, HV, device=DEV)
    rk = torch.zeros(layers, n_slots * m, HK, DK, device=DEV)
    rd = torch.zeros(layers, n_slots * m, HV, DV, device=DEV)
    want = []
    for layer in range(layers):
        L = Layer(HK, HV, DK, DV, slots=n_slots, seed=seed + 10 * layer)
        state_all[layer] = L.ssm_state
        x, a, b, z = L.inputs(B * m, fuse)
        kw = dict(m=m, num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, z=z, norm_weight=L.norm_weight if fuse else None,
                  block_v=block_v)
        cc = torch.zeros(n_slots * m, L.C, 3, dtype=L.conv_state.dtype, device=DEV)
        cr = torch.zeros(n_slots * m, HV, DK, DV, device=DEV)
        o = gdn_verify_columns(x, a, b, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state, cc, cr, slots, **kw)
        cc2 = torch.zeros_like(cc)
        o2 = gdn_verify_columns(x, a, b, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, state_all[layer], cc2, None,
                                slots, replay=(rg[layer], rk[layer], rd[layer]), **kw)
        assert torch.equal(o2, o) and torch.equal(cc2, cc)
        expect = state_all[layer].clone()
        for i, s in enumerate(slots_list):
            expect[s] = cr[s * m + int(column[i])]
        want.append(expect)
    commit_replay(state_all, rg, rk, rd, slots, column)
    for layer in range(layers):
        R.assert_close(state_all[layer], want[layer], "gdn_state_fp32")


@pytest.mark.parametrize("fuse,block_v", [(True, None), (False, 8)])
@pytest.mark.parametrize("m", [1, 4])
def test_verify_replay_then_commit_gives_the_accepted_column(m, fuse, block_v):
    _replay_vs_columns(2, 4, 16, 16, m, [3, 0], fuse, block_v, seed=m)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("slots_list", [[1], [4, 0]])
def test_verify_replay_real_shapes_gpu(slots_list):
    _replay_vs_columns(16, 48, 128, 128, 4, slots_list, True, None, seed=len(slots_list), layers=3)


def test_commit_replay_refuses_bad_shapes():
    from ninfer.kernels.triton import commit_replay

    st = torch.zeros(2, 3, 4, 16, 16, device=DEV)
    g, k, d = torch.zeros(2, 12, 4, device=DEV), torch.zeros(2, 12, 2, 16, device=DEV), torch.zeros(2, 12, 4, 16, device=DEV)
    one = torch.zeros(1, dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match="g"):
        commit_replay(st, g[:, :11], k, d, one, one)
    with pytest.raises(ValueError, match="delta"):
        commit_replay(st, g, k, d[:, :, :3], one, one)
    with pytest.raises(ValueError, match="fp32"):
        commit_replay(st, g, k.double(), d, one, one)
    with pytest.raises(ValueError, match="slots"):
        commit_replay(st, g, k, d, one, torch.zeros(2, dtype=torch.int64, device=DEV))


# whole: one program a head, the norm inside (what runs once B x Hv >= SMs); split: heads over
# several programs, the norm as a second launch (the default below that); split_norm: the norm
# inside the same launch by each head's last program (NINFER_GDN_SPLIT_NORM=1), racing for real here
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["whole", "split", "split_norm", "split_early"])
@pytest.mark.parametrize("slots_list", [[1], [4, 0]])
def test_verify_columns_real_shapes_gpu(mode, slots_list, monkeypatch):
    monkeypatch.setenv("NINFER_GDN_SPLIT", "0" if mode == "whole" else "1")
    monkeypatch.setenv("NINFER_GDN_SPLIT_NORM", "1" if mode == "split_norm" else "0")
    _columns_vs_steps(16, 48, 128, 128, 4, slots_list, True, None, seed=len(slots_list), state_early=mode == "split_early")


# H = 80 = 64 + 16: the rows load before the PDL wait in two parts; 200: after it, in a masked loop;
# state_early: the state tile with them before the wait (split heads)
@pytest.mark.parametrize("H", [80, 200])
@pytest.mark.parametrize("fuse,block_v,state_early", [(True, None, False), (False, 8, False), (False, 8, True)])
def test_verify_columns_with_the_gates_in_the_kernel(H, fuse, block_v, state_early):
    """The verify with in_proj_a / in_proj_b inside its launch (ab_input, the rows reused for the
    M tokens) against M decode steps that also compute them inside (ab_input): the same fp32
    gates, so decode and verify agree; and against the verify given those gates from outside."""
    from ninfer.kernels.triton import gdn_verify_columns

    HK, HV, DK, DV, m = 2, 4, 16, 16, 3
    L = Layer(HK, HV, DK, DV, slots=5, seed=H + m)
    slots = torch.tensor([4, 0], dtype=torch.int32, device=DEV)
    B = len(slots)
    x, _, _, z = L.inputs(B * m, fuse)
    h = L.randn(B * m, H).bfloat16()
    w_ab = L.randn(2 * HV, H, scale=H**-0.5).bfloat16()
    conv0, ssm0 = L.conv_state.clone(), L.ssm_state.clone()
    kw = dict(m=m, num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, z=z, norm_weight=L.norm_weight if fuse else None,
              block_v=block_v)

    def columns():
        return (torch.zeros(5 * m, L.C, 3, dtype=L.conv_state.dtype, device=DEV),
                torch.zeros(5 * m, HV, DK, DV, device=DEV))

    cc, cr = columns()
    o = gdn_verify_columns(x, None, None, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state, cc, cr, slots,
                           ab_input=(h, w_ab), state_early=state_early, **kw)
    assert torch.equal(L.conv_state, conv0) and torch.equal(L.ssm_state, ssm0)
    ab = h.float() @ w_ab.float().T
    cc2, cr2 = columns()
    given = gdn_verify_columns(x, ab[:, :HV], ab[:, HV:], L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state,
                               cc2, cr2, slots, **kw)
    R.assert_close(o, given, "gdn_output_bf16")
    assert torch.equal(cc, cc2)
    R.assert_close(cr, cr2, "gdn_state_fp32")
    conv, ssm = conv0.clone(), ssm0.clone()
    for t in range(m):
        rows = slice(t, None, m)
        ot = gdn_decode_step(x[rows], None, None, L.conv_weight, conv, L.A_log, L.dt_bias, ssm, num_k_heads=HK,
                             head_k_dim=DK, head_v_dim=DV, state_indices=slots, z=z[rows] if fuse else None,
                             norm_weight=L.norm_weight if fuse else None, block_v=block_v, ab_input=(h[rows], w_ab))
        R.assert_close(o[rows], ot, "gdn_output_bf16")
        for s in slots.tolist():
            assert torch.equal(cc[s * m + t], conv[s])
            R.assert_close(cr[s * m + t], ssm[s], "gdn_state_fp32")


@pytest.mark.parametrize("norm_in_launch", ["0", "1"])
def test_verify_columns_split_heads_when_the_grid_is_small(norm_in_launch, monkeypatch):
    """With more SMs than B * Hv programs the verify splits each head (default_block_v) and runs
    the norm apart (or, NINFER_GDN_SPLIT_NORM=1, in the same launch: the last program of a head
    normalizes it): the same outputs and columns as whole heads, within bf16 rounding of o;
    NINFER_GDN_SPLIT=0 keeps heads whole. Two sequences, run twice: the counters are left at 0."""
    from ninfer.kernels.triton import gdn as G

    monkeypatch.setenv("NINFER_GDN_SPLIT_NORM", norm_in_launch)
    apart = []
    monkeypatch.setattr(G, "gated_rmsnorm", lambda *a, _f=G.gated_rmsnorm, **k: apart.append(1) or _f(*a, **k))
    HK, HV, DK, DV, m = 2, 4, 32, 32, 3
    L = Layer(HK, HV, DK, DV, slots=3, seed=11)
    slots = torch.tensor([2, 0], dtype=torch.int32, device=DEV)
    x, a, b, z = L.inputs(2 * m, True)
    outs = {}
    for many in (False, True, True):
        monkeypatch.setattr(G, "sm_count", lambda device, many=many: 1000 if many else 1)
        assert G.split_heads(2, HV, torch.device(DEV)) is many
        cc = torch.zeros(3 * m, L.C, 3, dtype=L.conv_state.dtype, device=DEV)
        cr = torch.zeros(3 * m, HV, DK, DV, device=DEV)
        o = G.gdn_verify_columns(x, a, b, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state, cc, cr, slots,
                                 m=m, num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, z=z, norm_weight=L.norm_weight)
        if many in outs:  # the second split run: the same result (no counter left behind)
            assert torch.equal(o, outs[True][0])
        outs[many] = (o, cc, cr)
    R.assert_close(outs[True][0], outs[False][0], "gdn_output_bf16")
    if norm_in_launch == "1":  # o stays fp32 up to the norm, as with whole heads
        assert (outs[True][0].float() - outs[False][0].float()).abs().max() <= 1e-2
    assert torch.equal(outs[True][1], outs[False][1])
    R.assert_close(outs[True][2], outs[False][2], "gdn_state_fp32")
    assert not G._counters(torch.device(DEV), 2 * m * HV).any()
    assert len(apart) == (0 if norm_in_launch == "1" else 2)  # the norm's second launch, per split run
    monkeypatch.setenv("NINFER_GDN_SPLIT", "0")
    assert not G.split_heads(1, HV, torch.device(DEV))


def test_verify_columns_forced_split(monkeypatch):
    """NINFER_GDN_VERIFY_BV=BV:warps picks the split's value columns a program (an A/B switch):
    the same outputs and columns as the default split; a bad value is a clear error."""
    from ninfer.kernels.triton import gdn as G

    monkeypatch.setattr(G, "sm_count", lambda device: 1000)
    HK, HV, DK, DV, m = 2, 4, 32, 32, 2
    L = Layer(HK, HV, DK, DV, slots=2, seed=5)
    slots = torch.tensor([1], dtype=torch.int32, device=DEV)
    x, a, b, z = L.inputs(m, True)
    res = []
    for forced in ("", "16:2"):
        monkeypatch.setenv("NINFER_GDN_VERIFY_BV", forced)
        cc = torch.zeros(2 * m, L.C, 3, dtype=L.conv_state.dtype, device=DEV)
        cr = torch.zeros(2 * m, HV, DK, DV, device=DEV)
        o = G.gdn_verify_columns(x, a, b, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state, cc, cr, slots,
                                 m=m, num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, z=z, norm_weight=L.norm_weight)
        res.append((o, cc, cr))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
    R.assert_close(res[0][2], res[1][2], "gdn_state_fp32")
    for bad in ("24:2", "16", "x:y"):
        monkeypatch.setenv("NINFER_GDN_VERIFY_BV", bad)
        with pytest.raises(ValueError, match="NINFER_GDN_VERIFY_BV"):
            G.gdn_verify_columns(x, a, b, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state, cc, cr, slots,
                                 m=m, num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, z=z, norm_weight=L.norm_weight)


def _gates_early_same_bits(HK, HV, DK, DV, H, m, slots_list, monkeypatch, seed, replay):
    """NINFER_GDN_GATES_EARLY=1 (the gates' dot products before the PDL wait, under state_early)
    against =0: the decode step (whole heads, norm inside) and the verify (split heads, which is
    where state_early applies) give the same bits, outputs and states alike."""
    from ninfer.kernels.triton import gdn_verify_columns

    L = Layer(HK, HV, DK, DV, slots=5, seed=seed)
    slots = torch.tensor(slots_list, dtype=torch.int32, device=DEV)
    B = len(slots_list)
    x, _, _, z = L.inputs(B * m, True)
    h = L.randn(B * m, H).bfloat16()
    w_ab = L.randn(2 * HV, H, scale=H**-0.5).bfloat16()
    res = {}
    for early in ("0", "1"):
        monkeypatch.setenv("NINFER_GDN_GATES_EARLY", early)
        conv, ssm = L.conv_state.clone(), L.ssm_state.clone()
        od = gdn_decode_step(x[:B], None, None, L.conv_weight, conv, L.A_log, L.dt_bias, ssm, num_k_heads=HK,
                             head_k_dim=DK, head_v_dim=DV, state_indices=slots, z=z[:B], norm_weight=L.norm_weight,
                             ab_input=(h[:B], w_ab), state_early=True)
        cc = torch.zeros(5 * m, L.C, 3, dtype=L.conv_state.dtype, device=DEV)
        cr = torch.zeros(5 * m, HV, DK, DV, device=DEV)
        bufs = (torch.zeros(5 * m, HV, device=DEV), torch.zeros(5 * m, HK, DK, device=DEV),
                torch.zeros(5 * m, HV, DV, device=DEV)) if replay else None
        ov = gdn_verify_columns(x, None, None, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state, cc, cr,
                                slots, m=m, num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, z=z,
                                norm_weight=L.norm_weight, block_v=DV // 2, ab_input=(h, w_ab), state_early=True,
                                replay=bufs)
        res[early] = (od, conv, ssm, ov, cc, cr, *(bufs or ()))
    for a, b in zip(res["0"], res["1"]):
        assert torch.equal(a, b)


# H = 80 = 64 + 16: rows before the wait in two parts; 200: read after it in a masked loop
@pytest.mark.parametrize("H", [80, 200])
@pytest.mark.parametrize("replay", [False, True])
def test_gates_early_same_bits(H, replay, monkeypatch):
    _gates_early_same_bits(2, 4, 16, 16, H, 3, [4, 0], monkeypatch, seed=H, replay=replay)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("HV,H", [(48, 5120), (32, 2048)])
def test_gates_early_same_bits_real_shapes_gpu(HV, H, monkeypatch):
    _gates_early_same_bits(16, HV, 128, 128, H, 4, [1], monkeypatch, seed=HV, replay=True)


def test_verify_columns_refuse_bad_gate_inputs():
    from ninfer.kernels.triton import gdn_verify_columns

    L = Layer(2, 4, 16, 16, slots=2, seed=7)
    x, _, b, _ = L.inputs(2, False)
    cc = torch.zeros(2, L.C, 3, dtype=L.conv_state.dtype, device=DEV)
    cr = torch.zeros(2, 4, 16, 16, device=DEV)
    args = (L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state, cc, cr,
            torch.tensor([0], dtype=torch.int32, device=DEV))
    kw = dict(m=2, num_k_heads=2, head_k_dim=16, head_v_dim=16)
    with pytest.raises(ValueError, match="neither"):
        gdn_verify_columns(x, None, b, *args, ab_input=(torch.zeros(2, 64, device=DEV), torch.zeros(8, 64, device=DEV)), **kw)
    with pytest.raises(ValueError, match="x \\[B\\*M, H\\]"):
        gdn_verify_columns(x, None, None, *args, ab_input=(torch.zeros(1, 64, device=DEV), torch.zeros(8, 64, device=DEV)),
                           **kw)


@pytest.mark.parametrize("t_len", [1, 2, 37, 64])
def test_prefill_conv_matches_the_torch_form(t_len):
    """conv1d + SiLU + split + L2 norm of a prefill chunk in one launch, against the layer's torch
    form: state columns feed the first positions, chunks shorter than the kernel keep part of the
    old state in the new one."""
    from ninfer.kernels.triton import gdn_prefill_conv
    from ninfer_plugins.qwen_hybrid.gdn import l2_normalize

    HK, HV, D = 2, 6, 16
    L = Layer(HK, HV, D, D, slots=1, seed=t_len)
    x = L.randn(t_len, L.C).bfloat16()
    state = L.conv_state[0]
    q, k, v, new_state = gdn_prefill_conv(x, state, L.conv_weight, num_k_heads=HK, num_v_heads=HV, head_dim=D, block_t=16)
    seq = torch.cat((state.float(), x.float().t()), dim=-1)  # [C, 3 + T]
    y = torch.nn.functional.conv1d(seq[None], L.conv_weight.float()[:, None, :], groups=L.C)[0].t()  # [T, C]
    y = torch.nn.functional.silu(y)
    q_ref, k_ref, v_ref = torch.split(y, [HK * D, HK * D, HV * D], dim=-1)
    R.assert_close(q, l2_normalize(q_ref.reshape(t_len, HK, D)).bfloat16(), "gdn_output_bf16")
    R.assert_close(k, l2_normalize(k_ref.reshape(t_len, HK, D)).bfloat16(), "gdn_output_bf16")
    R.assert_close(v, v_ref.reshape(t_len, HV, D).bfloat16(), "gdn_output_bf16")
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    assert torch.equal(new_state, seq[:, -3:].to(new_state.dtype))


def _chunk_vs_tokens(HK, HV, DK, DV, m, slots_list, fuse, block_v, seed, monkeypatch, gates_in_kernel=False,
                     state_early=False):
    """NINFER_GDN_CHUNK=1: the replay-form verify with the M tokens taken together gives the
    token-by-token kernel's outputs and replay buffers within fp32 rounding, the same conv columns
    bit for bit, reads the slots' state only, and repeats itself exactly."""
    from ninfer.kernels.triton import gdn_verify_columns

    n_slots = max(slots_list) + 1
    L = Layer(HK, HV, DK, DV, slots=n_slots, seed=seed)
    slots = torch.tensor(slots_list, dtype=torch.int32, device=DEV)
    B = len(slots)
    x, a, b, z = L.inputs(B * m, fuse)
    kw = dict(m=m, num_k_heads=HK, head_k_dim=DK, head_v_dim=DV, z=z, norm_weight=L.norm_weight if fuse else None,
              block_v=block_v, state_early=state_early)
    if gates_in_kernel:
        H = 48
        xh = L.randn(B * m, H).bfloat16()
        wab = L.randn(2 * HV, H, scale=0.2).bfloat16()
        a = b = None
        kw["ab_input"] = (xh, wab)
    conv0, ssm0 = L.conv_state.clone(), L.ssm_state.clone()

    def run(chunk):
        monkeypatch.setenv("NINFER_GDN_CHUNK", "1" if chunk else "0")
        cc = torch.zeros(n_slots * m, L.C, 3, dtype=L.conv_state.dtype, device=DEV)
        bufs = (torch.zeros(n_slots * m, HV, device=DEV), torch.zeros(n_slots * m, HK, DK, device=DEV),
                torch.zeros(n_slots * m, HV, DV, device=DEV))
        o = gdn_verify_columns(x, a, b, L.conv_weight, L.conv_state, L.A_log, L.dt_bias, L.ssm_state, cc, None, slots,
                               replay=bufs, **kw)
        return o, cc, bufs

    o0, cc0, (g0, k0, d0) = run(False)
    o1, cc1, (g1, k1, d1) = run(True)
    assert torch.equal(L.conv_state, conv0) and torch.equal(L.ssm_state, ssm0)
    assert torch.equal(cc1, cc0)
    R.assert_close(o1, o0, "gdn_output_bf16")
    R.assert_close(d1, d0, "gdn_state_fp32")
    R.assert_close(k1, k0, "gdn_state_fp32")
    R.assert_close(g1, g0, "gdn_state_fp32")
    o2, cc2, (g2, k2, d2) = run(True)
    assert torch.equal(o2, o1) and torch.equal(d2, d1) and torch.equal(cc2, cc1)


@pytest.mark.parametrize("fuse,block_v", [(True, None), (False, 16), (True, 16)])
@pytest.mark.parametrize("m", [1, 2, 4, 5])
def test_chunked_verify_equals_the_token_by_token_verify(m, fuse, block_v, reductions, monkeypatch):
    if reductions != "paired":
        pytest.skip("the chunked verify has no per-token reductions: run once")
    _chunk_vs_tokens(2, 4, 16, 32, m, [3, 1], fuse, block_v, seed=m, monkeypatch=monkeypatch)


@pytest.mark.parametrize("dk,fuse,block_v", [(64, True, None), (32, False, 16)])
def test_chunked_verify_walks_dk_in_slices(dk, fuse, block_v, reductions, monkeypatch):
    # Dk over several slices of 16 (the state and the k/q products are taken a slice at a time)
    if reductions != "paired":
        pytest.skip("the chunked verify has no per-token reductions: run once")
    _chunk_vs_tokens(2, 6, dk, 32, 3, [0, 2], fuse, block_v, seed=dk, monkeypatch=monkeypatch)


@pytest.mark.parametrize("state_early", [False, True])
def test_chunked_verify_with_the_gates_in_the_kernel(state_early, reductions, monkeypatch):
    if reductions != "paired":
        pytest.skip("the chunked verify has no per-token reductions: run once")
    _chunk_vs_tokens(2, 4, 16, 32, 4, [2, 0], True, 16, seed=11, monkeypatch=monkeypatch, gates_in_kernel=True,
                     state_early=state_early)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("block_v", [None, 32, 64])
@pytest.mark.parametrize("m", [2, 4, 6])
def test_chunked_verify_real_shapes_gpu(m, block_v, reductions, monkeypatch):
    if reductions != "paired":
        pytest.skip("the chunked verify has no per-token reductions: run once")
    _chunk_vs_tokens(16, 48, 128, 128, m, [1, 0], True, block_v, seed=m, monkeypatch=monkeypatch,
                     gates_in_kernel=True, state_early=True)
