"""Torch reference ops: the oracles the Triton kernels are tested against, and a CPU path.

Each op is written the plain way, from the spec's math (reference/qwen-hybrid-spec.md §2, §5),
computes in float32 (float64 when handed float64) and returns float32 unless it says otherwise:
the tests compare a kernel's bf16 output against these unrounded values with the named tolerances
of spec §11 (`TOLERANCES`, `assert_close`). Nothing here is fast, and nothing here is a kernel's
output: an oracle is built only from the represented inputs (for INT8 KV, the decoded codes).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# INT8 KV: one fp16 scale per 64 consecutive elements of a head vector (spec §5, INT8-G64).
KV_GROUP = 64
KV_QMAX = 127


def _acc(x: torch.Tensor) -> torch.Tensor:
    return x.double() if x.dtype == torch.float64 else x.float()


# ----------------------------------------------------------------------------------- norms


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: bool = True) -> torch.Tensor:
    """RMSNorm over the last dim. offset=True is Qwen's zero-centred norm, `x̂ * (1 + w)`;
    offset=False is the plain `x̂ * w` of the GDN output norm and the DFlash drafters."""
    xf = _acc(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    w = _acc(weight)
    return y * (1.0 + w) if offset else y * w


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(new residual, normed): the residual stream keeps its storage dtype (bf16), so the sum is
    rounded once before the norm reads it, exactly as `residual + x` in bf16 does."""
    new_residual = (_acc(x) + _acc(residual)).to(residual.dtype)
    return new_residual, rmsnorm(new_residual, weight, eps, offset)


def gated_rmsnorm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GDN output norm: plain RMSNorm per head (last dim) times silu(z); z has x's shape."""
    return rmsnorm(x, weight, eps, offset=False) * F.silu(_acc(z))


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up on a fused [..., gate | up] input."""
    gate, up = _acc(gate_up).chunk(2, dim=-1)
    return F.silu(gate) * up


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The gated-attention output gate: x * sigmoid(gate) (gate neither normed nor rotated)."""
    return _acc(x) * torch.sigmoid(_acc(gate))


# ------------------------------------------------------------------------------------ RoPE


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """inv_freq_i = theta^(-2i/rotary_dim), float32, computed as transformers computes it so a
    kernel that multiplies positions by this table gets bit-identical angles."""
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float() / rotary_dim
    return 1.0 / (theta**exponent)


def rope_angles(
    positions: torch.Tensor, inv_freq: torch.Tensor, mrope_section: tuple[int, int, int] | None = None
) -> torch.Tensor:
    """Angles [N, rotary_dim/2] in float32. positions: [N] (text) or [3, N] (interleaved MRoPE:
    pair i takes the height stream if i%3==1 and i < 3*section[1], width if i%3==2 and
    i < 3*section[2], else the temporal stream)."""
    if positions.dim() == 1:
        return positions.float()[:, None] * inv_freq[None, :]
    per_axis = positions.float()[:, :, None] * inv_freq[None, None, :]  # [3, N, half]
    angles = per_axis[0].clone()
    if mrope_section is None:
        raise ValueError("3-axis positions need mrope_section")
    half = inv_freq.numel()
    for axis in (1, 2):
        idx = torch.arange(axis, min(half, 3 * mrope_section[axis]), 3, device=positions.device)
        angles[:, idx] = per_axis[axis][:, idx]
    return angles


def apply_partial_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate-half (NeoX) RoPE on the first 2*angles.shape[-1] dims of x [N, H, D]; pairs (i,
    i+half). The remaining dims pass through. angles: [N, half]."""
    xf = _acc(x)
    half = angles.shape[-1]
    rot = 2 * half
    cos = torch.cos(angles.to(xf.dtype))[:, None, :]
    sin = torch.sin(angles.to(xf.dtype))[:, None, :]
    x1, x2, rest = xf[..., :half], xf[..., half:rot], xf[..., rot:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def qk_norm_rope(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    eps: float = 1e-6,
    mrope_section: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """Attention q or k of N tokens [N, H, D]: per-head offset RMSNorm, then partial RoPE."""
    return apply_partial_rope(rmsnorm(x, norm_weight, eps, offset=True), rope_angles(positions, inv_freq, mrope_section))


# ---------------------------------------------------------------------------- INT8-G64 KV


def quantize_kv_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., D] -> (codes int8 [..., D], scales fp16 [..., D/64]). scale = fp16_rne(amax/127),
    code = clamp(rne(x * (1/scale)), ±127); an all-zero group gets scale 0 and codes 0."""
    d = x.shape[-1]
    if d % KV_GROUP:
        raise ValueError(f"head dim {d} is not a multiple of the INT8 KV group {KV_GROUP}")
    g = x.float().reshape(*x.shape[:-1], d // KV_GROUP, KV_GROUP)
    amax = g.abs().amax(-1)
    scale = (amax / KV_QMAX).to(torch.float16)
    s32 = scale.float()
    inv = torch.where(s32 > 0, 1.0 / s32, torch.zeros_like(s32))
    codes = torch.round(torch.clamp(g * inv[..., None], -KV_QMAX, KV_QMAX)).to(torch.int8)
    return codes.reshape(x.shape), scale


def dequantize_kv_int8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    d = codes.shape[-1]
    g = codes.float().reshape(*codes.shape[:-1], d // KV_GROUP, KV_GROUP)
    return (g * scales.float()[..., None]).reshape(codes.shape)


# ------------------------------------------------------------------------------- attention


def gather_kv(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, scales: torch.Tensor | None = None
) -> torch.Tensor:
    """One sequence's cached K or V [seq_len, Hkv, D] (float32) from a [num_blocks, block_size,
    Hkv, D] cache through its block-table row; INT8 caches are decoded with their scales."""
    bs = cache.shape[1]
    pos = torch.arange(seq_len, device=cache.device)
    blocks = block_table[pos // bs].long()
    vals = cache[blocks, pos % bs]
    if scales is not None:
        return dequantize_kv_int8(vals, scales[blocks, pos % bs])
    return vals.float()


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """GQA attention of q [B, T, Hq, D] over each sequence's cache. Sequence b holds seq_lens[b]
    tokens, the last T of which are the queries' own (positions len-T .. len-1, causal among
    themselves). Returns float32 [B, T, Hq, D]; a sequence of length 0 gives zeros."""
    B, T, Hq, D = q.shape
    hkv = k_cache.shape[2]
    scale = D**-0.5 if scale is None else scale
    dev = q.device
    out = torch.zeros(B, T, Hq, D, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32, device=dev)
    for b in range(B):
        n = int(seq_lens[b])
        if n == 0:
            continue
        k = gather_kv(k_cache, block_table[b], n, k_scale).to(out.dtype)
        v = gather_kv(v_cache, block_table[b], n, v_scale).to(out.dtype)
        k = k.repeat_interleave(Hq // hkv, dim=1)  # query head h reads kv head h // (Hq/Hkv)
        v = v.repeat_interleave(Hq // hkv, dim=1)
        qb = q[b].to(out.dtype)  # [T, Hq, D]
        s = torch.einsum("thd,nhd->htn", qb, k) * scale
        qpos = torch.arange(n - T, n, device=dev)[:, None]
        s = s.masked_fill(torch.arange(n, device=dev)[None, :] > qpos, float("-inf"))
        out[b] = torch.einsum("htn,nhd->thd", torch.softmax(s, dim=-1), v)
    return out


# -------------------------------------------------------------------------- Gated DeltaNet


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) in float32: g = -exp(A_log) * softplus(a + dt_bias) (softplus(u) = u for u > 20),
    beta = sigmoid(b)."""
    u = a.float() + dt_bias.float()
    g = -torch.exp(A_log.float()) * F.softplus(u, beta=1.0, threshold=20.0)
    return g, torch.sigmoid(b.float())


def gdn_decode_step(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    conv_state: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    num_k_heads: int,
    head_k_dim: int = 128,
    head_v_dim: int = 128,
    z: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token of B sequences through a Gated DeltaNet layer's mixer core (spec §2.4).

    mixed_qkv [B, conv_dim] (pre-conv, channels [Q | K | V]); a, b [B, Hv]; conv_weight
    [conv_dim, 4]; conv_state [B, conv_dim, 3] (last 3 inputs, oldest first); ssm_state
    [B, Hv, Dk, Dv] float32. Returns (o [B, Hv, Dv] float32, new conv_state (input dtype),
    new ssm_state float32); with z [B, Hv*Dv] and norm_weight [Dv], o is gated-RMSNormed.
    Inputs are not modified.
    """
    B = mixed_qkv.shape[0]
    hk, dk, dv = num_k_heads, head_k_dim, head_v_dim
    hv = a.shape[1]
    window = torch.cat([conv_state.float(), mixed_qkv.float()[:, :, None]], dim=2)  # [B, C, 4]
    x = F.silu((window * conv_weight.float()[None]).sum(-1))
    q = x[:, : hk * dk].reshape(B, hk, dk)
    k = x[:, hk * dk : 2 * hk * dk].reshape(B, hk, dk)
    v = x[:, 2 * hk * dk :].reshape(B, hv, dv)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk**-0.5
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q.repeat_interleave(hv // hk, dim=1)  # value head j reads q/k head j // (Hv/Hk)
    k = k.repeat_interleave(hv // hk, dim=1)
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    S = ssm_state.float() * torch.exp(g)[:, :, None, None]
    u = beta[:, :, None] * (v - torch.einsum("bhkv,bhk->bhv", S, k))
    S = S + k[:, :, :, None] * u[:, :, None, :]
    o = torch.einsum("bhkv,bhk->bhv", S, q)
    if z is not None:
        o = gated_rmsnorm(o, z.reshape(B, hv, dv), norm_weight, eps)
    new_conv = window[:, :, 1:].to(conv_state.dtype)
    return o, new_conv, S


# ------------------------------------------------------------------------------ tolerances

# Spec §11 (U:tests/ops/op_check.h): name -> (atol, rtol). A check passes when no value is
# NaN/Inf, the normwise error ||a-e||/||e|| is within rtol, at most TAIL_FRACTION of the values
# exceed atol + rtol*|e|, and none exceeds GROSS_CAP times that bound.
TOLERANCES: dict[str, tuple[float, float]] = {
    "bf16_elementwise": (1e-3, 8e-3),
    "bf16_reduction": (2e-3, 1.6e-2),
    "attention_bf16": (2e-3, 1.6e-2),
    "attention_int8": (4e-3, 1.6e-2),
    "gdn_state_fp32": (5e-4, 5e-3),
    "gdn_output_bf16": (1e-3, 1e-2),
}
TAIL_FRACTION = 1e-3
GROSS_CAP = 4.0


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tolerance: str) -> None:
    """Raise AssertionError with the figures when `actual` misses `expected` under a named
    tolerance of spec §11."""
    atol, rtol = TOLERANCES[tolerance]
    a = actual.detach().double().cpu()
    e = expected.detach().double().cpu()
    if a.shape != e.shape:
        raise AssertionError(f"{tolerance}: shape {tuple(a.shape)} != {tuple(e.shape)}")
    if not torch.isfinite(a).all():
        raise AssertionError(f"{tolerance}: {int((~torch.isfinite(a)).sum())} non-finite values")
    err = (a - e).abs()
    bound = atol + rtol * e.abs()
    norm_e = float(e.norm())
    normwise = float((a - e).norm()) / norm_e if norm_e > 0 else float(err.max() if err.numel() else 0.0)
    over = int((err > bound).sum())
    worst = float((err / bound).max()) if err.numel() else 0.0
    allowed = math.floor(TAIL_FRACTION * err.numel())
    if normwise > rtol or over > allowed or worst > GROSS_CAP:
        raise AssertionError(
            f"{tolerance}: normwise {normwise:.3g} (<= {rtol}), {over}/{err.numel()} beyond "
            f"atol+rtol*|e| (<= {allowed}), worst {worst:.3g}x bound (<= {GROSS_CAP}), "
            f"max abs err {float(err.max()):.3g}"
        )
