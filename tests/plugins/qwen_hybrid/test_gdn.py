"""The chunked gated delta rule equals the per-token recurrence, whatever the length."""

from __future__ import annotations

import pytest
import torch

from ninfer_plugins.qwen_hybrid.gdn import CHUNK, chunked_gated_delta_rule, l2_normalize, recurrent_sequence


def _inputs(t_len, hk=2, hv=6, dk=16, dv=8, decay=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k = l2_normalize(r(t_len, hk, dk)), l2_normalize(r(t_len, hk, dk))
    g = -decay * torch.rand(t_len, hv, generator=gen)
    beta = torch.rand(t_len, hv, generator=gen)
    return q, k, r(t_len, hv, dv), g, beta, r(hv, dk, dv)


@pytest.mark.parametrize("t_len", [1, 2, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 13])
def test_chunked_equals_recurrent(t_len):
    q, k, v, g, beta, s0 = _inputs(t_len)
    o1, s1 = chunked_gated_delta_rule(q, k, v, g, beta, s0, 16**-0.5)
    o2, s2 = recurrent_sequence(q, k, v, g, beta, s0, 16**-0.5)
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("decay", [0.0, 30.0])
def test_extreme_decays_stay_finite_and_exact(decay):
    # decay 0: the state only accumulates; 30: exp(-30) per step, so intra-chunk products underflow
    q, k, v, g, beta, s0 = _inputs(100, decay=decay, seed=1)
    o1, s1 = chunked_gated_delta_rule(q, k, v, g, beta, s0, 0.25)
    o2, s2 = recurrent_sequence(q, k, v, g, beta, s0, 0.25)
    assert torch.isfinite(o1).all() and torch.isfinite(s1).all()
    torch.testing.assert_close(o1, o2, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s1, s2, atol=1e-4, rtol=1e-4)


def test_split_sequence_carries_state():
    q, k, v, g, beta, s0 = _inputs(150, hk=1, hv=2, seed=2)
    whole, s_whole = chunked_gated_delta_rule(q, k, v, g, beta, s0, 0.25)
    a, s_mid = chunked_gated_delta_rule(q[:70], k[:70], v[:70], g[:70], beta[:70], s0, 0.25)
    b, s_end = chunked_gated_delta_rule(q[70:], k[70:], v[70:], g[70:], beta[70:], s_mid, 0.25)
    torch.testing.assert_close(torch.cat([a, b]), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s_end, s_whole, atol=1e-5, rtol=1e-5)


def test_value_head_reads_key_head_j_div_r():
    # with 3 value heads per key head, value heads 0-2 must see key head 0 only
    q, k, v, g, beta, s0 = _inputs(5, hk=2, hv=6, seed=3)
    o, _ = recurrent_sequence(q, k, v, g, beta, s0, 0.25)
    k2 = k.clone()
    k2[:, 1] = l2_normalize(torch.randn(5, 16))
    o2, _ = recurrent_sequence(q, k2, v, g, beta, s0, 0.25)
    torch.testing.assert_close(o[:, :3], o2[:, :3])
    assert not torch.allclose(o[:, 3:], o2[:, 3:])
