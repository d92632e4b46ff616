"""MoE prefill as dequantize-then-grouped-GEMM (prefill_grouped.py, NINFER_MOE_PREFILL=grouped)
against the fp32 oracle of the decoded weights and the tile kernels it replaces.

CPU (CI): bf16 activations, E 8, H 256, I 128, top 3, the dequant kernel interpreted and
torch._grouped_mm on the CPU. GPU (`-m gpu`): the real shapes at T = 2,048 and 8,192."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from moe_cases import DEV, expert_bank, logits_hitting, shared_expert

from ninfer.errors import UserError
from ninfer.kernels import reference as R
from ninfer.kernels.triton.launch import interpreting
from ninfer_plugins.moe_triton import prefill_grouped as PF
from ninfer_plugins.moe_triton.grouped_gemv import experts_reference
from ninfer_plugins.moe_triton.router import route

CUDA = torch.cuda.is_available()
interp = pytest.mark.skipif(not interpreting(), reason="interpreter tests run where there is no GPU (CI)")
needs_cuda = pytest.mark.skipif(not CUDA or interpreting(), reason="needs a CUDA device")
ATOL, RTOL = R.TOLERANCES["bf16_reduction"]


def _case(T, E, H, I, top_k, gu, dn, sh, seed):
    (w, dgu, ddn), (sw, sdec, sg) = expert_bank(E, H, I, gu, dn, seed=seed), shared_expert(H, I, sh, seed=seed + 1)
    x = torch.randn(T, H, generator=torch.Generator(device=DEV).manual_seed(seed), device=DEV).to(torch.bfloat16)
    r = route(logits_hitting(T, E, seed=seed), top_k, x=x, shared_gate_weight=sg.to(torch.bfloat16))
    out = PF.run(x, r.ids, r.weights, top_k, w.gate_up, w.down, E, I, sw)
    ref = experts_reference(x, r.ids[:, :top_k].long(), r.weights[:, :top_k], dgu, ddn, sdec, r.weights[:, top_k])
    return out, ref, (w, sw, r, x)


def _close(out, ref):
    err = (out.double() - ref.double()).abs()
    normwise = float(err.norm() / ref.double().norm())
    # two more bf16 roundings than the tile kernels (gate / up and each pair's down output)
    assert bool(torch.isfinite(out).all()) and normwise <= 2 * RTOL, normwise


@interp
@pytest.mark.parametrize("gu,dn,sh", [("q4_g64", "q5_g64", "q8_g32"), ("q8_g32", "q6_g64", "q4_g64")])
def test_interpreted_grouped_prefill_equals_the_oracle(gu, dn, sh):
    out, ref, _ = _case(40, 8, 256, 128, 3, gu, dn, sh, seed=3)
    assert out.dtype == torch.bfloat16 and out.shape == (40, 256)
    _close(out, ref)


@interp
def test_dispatch_takes_it_only_when_switched_on_and_long(monkeypatch):
    from ninfer_plugins.moe_triton.moe import TritonMoe

    monkeypatch.delenv("NINFER_MOE_PREFILL", raising=False)  # the default: on from GROUPED_MIN_T
    out, ref, (w, sw, r, x) = _case(40, 8, 256, 128, 3, "q4_g64", "q5_g64", "q8_g32", seed=5)
    moe = TritonMoe(fused_dtypes=(torch.bfloat16,), pairs=False)
    calls = []
    real = PF.run
    monkeypatch.setattr(PF, "run", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    smats = (sw.gate, sw.up, sw.down)
    assert not PF.takes(40, w.gate_up, w.down, smats)  # below GROUPED_MIN_T
    monkeypatch.setenv("NINFER_MOE_PREFILL_MIN_T", "41")
    assert not PF.takes(40, w.gate_up, w.down, smats)
    monkeypatch.setenv("NINFER_MOE_PREFILL_MIN_T", "x")
    with pytest.raises(UserError, match="NINFER_MOE_PREFILL_MIN_T"):
        PF.takes(40, w.gate_up, w.down, smats)
    monkeypatch.delenv("NINFER_MOE_PREFILL_MIN_T")
    monkeypatch.setattr(PF, "GROUPED_MIN_T", 32)
    assert PF.takes(40, w.gate_up, w.down, smats)
    monkeypatch.setenv("NINFER_MOE_PREFILL", "tiles")
    assert not PF.takes(40, w.gate_up, w.down, smats)  # switched off
    monkeypatch.setenv("NINFER_MOE_PREFILL", "bogus")
    with pytest.raises(UserError, match="NINFER_MOE_PREFILL"):
        PF.takes(40, w.gate_up, w.down, smats)
    monkeypatch.setenv("NINFER_MOE_PREFILL", "grouped")
    assert PF.takes(40, w.gate_up, w.down, smats)
    y = moe.run(x, r, w, sw)
    assert calls == [40]
    _close(y, ref)
    assert not PF.supports(w.gate_up, w.down, (sw.gate, sw.up, dataclasses.replace(sw.down, fmt=0)))  # a dense part


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("T", [2048, 8192])
def test_gpu_grouped_prefill_real_shapes(T):
    out, ref, _ = _case(T, 256, 2048, 512, 8, "q4_g64", "q5_g64", "q8_g32", seed=T)
    _close(out, ref)
