"""Gated DeltaNet core, torch reference: the chunked form for prefill and the recurrence for decode.

Per value head, with state S [Dk, Dv] (fp32), decay gamma_t = exp(g_t) and step size beta_t:

    S_t = gamma_t * S_{t-1} + k_t (beta_t * (v_t - gamma_t * S_{t-1}^T k_t))^T,    o_t = S_t^T q_t

The chunked form solves a whole chunk of C tokens at once. Inside a chunk with start state S0 and
cumulative log-decay G_t = g_1 + ... + g_t, the per-token corrections u_t = beta_t (v_t - gamma_t
S_{t-1}^T k_t) satisfy a unit lower-triangular system

    (I + A) U = beta V - diag(beta e^G) K S0,      A[t, s] = beta_t e^{G_t - G_s} (k_t . k_s), s < t

so with T = (I + A)^{-1} (the UT transform) U = T beta V - (T diag(beta e^G) K) S0: two matmuls
per chunk once T is known, and T is independent of the state so every chunk's T is computed in
parallel. Then o_t = e^{G_t} S0^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) u_s and the state
leaves the chunk as e^{G_C} S0 + sum_s e^{G_C - G_s} k_s u_s^T. Every exponent is a difference
G_t - G_s with s <= t, hence <= 0: nothing overflows however strong the decay.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.device import ANYWHERE

# fla and transformers use 64; a power of two that fills the tensor cores and keeps T's solve cheap.
CHUNK = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, in fp32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _expand_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    # value head j reads query/key head j // r (transformers' repeat_interleave on the head axis)
    r = num_v_heads // x.shape[-2]
    return x if r == 1 else x.repeat_interleave(r, dim=-2)


def chunked_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q, k [T, Hk, Dk] (L2-normalised), v [T, Hv, Dv], g, beta [T, Hv], state
    [Hv, Dk, Dv] fp32 -> (o [T, Hv, Dv] fp32, final state [Hv, Dk, Dv] fp32)."""
    t_len, hv = v.shape[0], v.shape[1]
    q = _expand_heads(q.float(), hv).transpose(0, 1) * scale  # [Hv, T, Dk]
    k = _expand_heads(k.float(), hv).transpose(0, 1)
    v = v.float().transpose(0, 1)  # [Hv, T, Dv]
    g = g.float().transpose(0, 1)  # [Hv, T]
    beta = beta.float().transpose(0, 1)
    pad = (-t_len) % chunk
    if pad:
        # zero k, v, beta and g on the padding: no correction, no decay, the state passes unchanged
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t_len + pad) // chunk
    q, k, v = (x.reshape(hv, n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(hv, n, chunk), beta.reshape(hv, n, chunk)

    cum = g.cumsum(-1)  # G_t within each chunk
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # e^{G_t - G_s} on and below the diagonal, 0 above (masked before exp: no inf * 0)
    decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    kk = k @ k.transpose(-1, -2)
    strict = torch.tril(beta.unsqueeze(-1) * kk * decay, diagonal=-1)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    ut = torch.linalg.solve_triangular(eye + strict, eye.expand_as(strict), upper=False, unitriangular=True)
    u_base = ut @ (beta.unsqueeze(-1) * v)  # T beta V
    w = ut @ ((beta * cum.exp()).unsqueeze(-1) * k)  # T diag(beta e^G) K
    attn = (q @ k.transpose(-1, -2)) * decay  # (q_t . k_s) e^{G_t - G_s}, s <= t
    q_decayed = q * cum.exp().unsqueeze(-1)
    k_to_end = k * (cum[..., -1:] - cum).exp().unsqueeze(-1)
    chunk_decay = cum[..., -1].exp()  # [Hv, n]

    s = state.float()
    out = torch.empty_like(v)
    for i in range(n):
        u = u_base[:, i] - w[:, i] @ s
        out[:, i] = q_decayed[:, i] @ s + attn[:, i] @ u
        s = s * chunk_decay[:, i, None, None] + k_to_end[:, i].transpose(-1, -2) @ u
    out = out.reshape(hv, n * chunk, -1)[:, :t_len].transpose(0, 1)
    return out, s


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each of B sequences: q, k [B, Hk, Dk], v [B, Hv, Dv], g, beta [B, Hv],
    state [B, Hv, Dk, Dv] fp32 -> (o [B, Hv, Dv] fp32, new state)."""
    hv = v.shape[1]
    q = _expand_heads(q.float(), hv) * scale
    k = _expand_heads(k.float(), hv)
    v, g, beta = v.float(), g.float(), beta.float()
    s = state.float() * g.exp()[..., None, None]
    predicted = torch.einsum("bhkv,bhk->bhv", s, k)
    u = beta.unsqueeze(-1) * (v - predicted)
    s = s + k.unsqueeze(-1) * u.unsqueeze(-2)
    return torch.einsum("bhkv,bhk->bhv", s, q), s


def recurrent_sequence(q, k, v, g, beta, state, scale):
    """The per-token recurrence over a whole sequence [T, ...]: the oracle for the chunked form."""
    outs = []
    s = state.float().unsqueeze(0)
    for t in range(v.shape[0]):
        step = slice(t, t + 1)
        o, s = recurrent_gated_delta_rule(q[step], k[step], v[step], g[step], beta[step], s, scale)
        outs.append(o)
    return torch.cat(outs), s[0]


class ReferenceLinearAttention:
    """The `linear` attention backend every device can run: the two functions above.

    A tuned backend (Triton/fla) offers the same two methods with stricter requirements:
    `prefill(q, k, v, g, beta, state, scale)` for one sequence and `decode(...)` for a batch.
    """

    name = "torch.gated_delta_rule"
    requirements = ANYWHERE

    def prefill(self, q, k, v, g, beta, state, scale):
        if v.shape[0] == 1:
            o, s = recurrent_gated_delta_rule(q, k, v, g, beta, state.unsqueeze(0), scale)
            return o, s[0]
        return chunked_gated_delta_rule(q, k, v, g, beta, state, scale)

    def decode(self, q, k, v, g, beta, state, scale):
        return recurrent_gated_delta_rule(q, k, v, g, beta, state, scale)
