"""The family's layers: offset RMSNorm, partial RoPE, gated attention, Gated DeltaNet, SwiGLU, MoE.

Every projection is a `QLinear` made by the model's `LinearFactory` under its canonical name (the
HF name without the `model.language_model.` prefix and `.weight`), so a quantization recipe or a
tuned kernel applies without touching this file. Small parameters (norm weights, A_log, dt_bias,
the conv taps) are buffers: norms and the GDN gates are computed in fp32 whatever the model dtype.
The attention cores are backends chosen at startup (`ninfer_attention_backend`).

Two optional seams let a GPU backend take over more than the core (plugins/qwen_hybrid/README.md):
a backend whose `fused_dtypes` holds the model dtype runs a whole mixer step through
`gated_attention(...)` (full) or `gdn_decode(...)` (linear), and the full backend's `ops` (see
`TorchOps`) replaces the small ops between the projections: norms, the residual add, SwiGLU.
"""

from __future__ import annotations

import contextlib

import os

import torch
import torch.nn.functional as F
from torch import nn

from ninfer.device import ANYWHERE
from ninfer.linear import DENSE, LinearFactory, QLinear, live, merge_rows
from ninfer_plugins.qwen_hybrid.gdn import l2_normalize
from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape


def offset_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * (1 + w), in fp32, cast back (checkpoint norm weights are stored zero-centred)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + w.float())).to(x.dtype)


class TorchOps:
    """The small ops between projections, in plain torch: the reference every fused version
    (`ops` of a tuned full-attention backend) must match, taking the same arguments (rms_norm and
    add_rms_norm also `into`, the QLinear that reads their result first: a hint they may ignore)."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float, into=None) -> torch.Tensor:
        """into: the QLinear that reads the result first (a hint a fused version may use)."""
        return offset_rms_norm(x, w, eps)

    def add_rms_norm(self, delta: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float, into=None):
        """(residual + delta, its (1+w) norm): the pre-norm block's `x = x + f(h); h = norm(x)`.
        A fused version may update `residual` in place and return it. into: as rms_norm's."""
        x = residual + delta
        return x, offset_rms_norm(x, w, eps)

    def rms_norm_pair(self, a: torch.Tensor, wa: torch.Tensor, b: torch.Tensor, wb: torch.Tensor, eps: float):
        """cat((1+wa) norm(a), (1+wb) norm(b)) over the last dim, in a's dtype."""
        return torch.cat((offset_rms_norm(a, wa, eps), offset_rms_norm(b.to(a.dtype), wb, eps)), dim=-1)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


TORCH_OPS = TorchOps()


def fused_for(backend, x: torch.Tensor) -> bool:
    """Whether `backend` runs whole mixer steps for activations like `x` (GPU kernels are bf16/fp16;
    the fp32 parity path stays on the reference cores)."""
    return x.dtype in getattr(backend, "fused_dtypes", ())


def kv_parts(cache, index: int):
    """(K, V, K scales, V scales) of full-attention layer `index`; the scales are None for a 16-bit
    cache (and for caches that only know `kv`, such as the MTP layer's)."""
    k, v = cache.kv(index)
    scales = cache.kv_scales(index) if hasattr(cache, "kv_scales") else None
    return (k, v, *(scales or (None, None)))


def fuse_linears_below(root: nn.Module) -> None:
    """After a module's weights are in: let every layer under it (not `root` itself) merge the
    projections that share an input (`fuse_linears`: one GEMV launch instead of several; the parts
    become views, nothing is held twice). The model runs it on itself, the MTP layer on its own."""
    for module in list(root.modules()):
        if module is not root and hasattr(module, "fuse_linears"):
            module.fuse_linears()


def input_linear(module) -> QLinear | None:
    """The QLinear that reads a mixer's or MLP's normed input first (`input_linear`), or None
    (a MoE routes it first; the reference cores)."""
    return getattr(module, "input_linear", None)


class OffsetRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.zeros(dim, dtype=torch.float32, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return offset_rms_norm(x, self.weight, self.eps)


class Rotary:
    """Partial RoPE, rotate-half style within the first `rotary_dim` dims of each head.

    Text-only input gives the three MRoPE streams (t, h, w) the same position, so the interleaved
    MRoPE of the checkpoints is exactly this 1-D RoPE; images will need the 3-axis form.
    """

    def __init__(self, shape: QwenHybridShape, device) -> None:
        self.dim = shape.rotary_dim
        exps = torch.arange(0, self.dim, 2, dtype=torch.float32, device=device) / self.dim
        self.inv_freq = 1.0 / (shape.rope_theta**exps)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq  # [N, dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [N, heads, head_dim]; cos, sin [N, rotary_dim]."""
        rot, rest = x[..., : self.dim].float(), x[..., self.dim :]
        half = self.dim // 2
        rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
        out = rot * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)
        return torch.cat((out.to(x.dtype), rest), dim=-1)


class GatedAttention(nn.Module):
    """q_proj rows hold [q_h | gate_h] per head; o_proj(attn * sigmoid(gate))."""

    def __init__(
        self, shape: QwenHybridShape, name: str, factory: LinearFactory, backend, rotary: Rotary, device
    ) -> None:
        super().__init__()
        s = shape
        self.heads, self.kv_heads, self.head_dim = s.num_attention_heads, s.num_key_value_heads, s.head_dim
        self.scale = s.head_dim**-0.5
        self.q_proj = factory.make(f"{name}.q_proj", 2 * s.q_width, s.hidden_size)
        self.k_proj = factory.make(f"{name}.k_proj", s.kv_width, s.hidden_size)
        self.v_proj = factory.make(f"{name}.v_proj", s.kv_width, s.hidden_size)
        self.o_proj = factory.make(f"{name}.o_proj", s.hidden_size, s.q_width)
        self.q_norm = OffsetRMSNorm(s.head_dim, s.rms_norm_eps, device)
        self.k_norm = OffsetRMSNorm(s.head_dim, s.rms_norm_eps, device)
        self.eps = s.rms_norm_eps
        self.backend = backend
        self.rotary = rotary
        # the index of this layer's K/V in the cache
        self.kv_index = -1
        self.proj_name = name
        # q|gate, k and v as one GEMV when all are dense (set after loading, see fuse_linears)
        self.qkv_proj: QLinear | None = None
        self.qv_proj: QLinear | None = None

    def fuse_linears(self) -> None:
        # out of the module tree, as SwiGLU's: the parts keep owning (views of) the weights
        self.__dict__["qkv_proj"] = merge_rows([self.q_proj, self.k_proj, self.v_proj], f"{self.proj_name}.qkv_proj")
        # a recipe that gives k another scheme (int4: q and v q5, k q4) still merges q and v
        self.__dict__["qv_proj"] = None
        if self.qkv_proj is None:
            self.__dict__["qv_proj"] = merge_rows([self.q_proj, self.v_proj], f"{self.proj_name}.qv_proj")

    @property
    def input_linear(self) -> QLinear:
        """The projection that reads the layer's normed input first on the fused path (a hint
        for the norm before it: ops.add_rms_norm's `into`)."""
        return live(self.qkv_proj) or live(self.qv_proj) or self.q_proj

    def _project(self, x: torch.Tensor, positions: torch.Tensor):
        n = x.shape[0]
        qg = self.q_proj(x).view(n, self.heads, 2 * self.head_dim)
        q, gate = qg[..., : self.head_dim], qg[..., self.head_dim :]
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(n, self.kv_heads, self.head_dim))
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        cos, sin = self.rotary.cos_sin(positions)
        return self.rotary.apply(q, cos, sin), self.rotary.apply(k, cos, sin), v, gate.reshape(n, -1)

    def _gated(self, attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        attn = attn.reshape(attn.shape[0], -1).to(gate.dtype)
        return attn * torch.sigmoid(gate)

    def _output(self, attn: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self._gated(attn, gate))

    def _fused(self, x, cache, slots, positions, prefill: tuple[int, int] | None, meta=None, add_norm=None) -> torch.Tensor:
        """The backend's whole step from the raw projections: q/k norm, RoPE, KV append,
        attention and the sigmoid gate -> o_proj. `prefill` is (slot, start_pos) for a chunk of
        one sequence, None for a decode step of one token per row; `add_norm` goes to o_proj
        (ninfer.linear.AddNorm)."""
        attn = self._fused_attention(x, cache, slots, positions, prefill, meta)
        return self.o_proj(attn) if add_norm is None else self.o_proj(attn, add_norm=add_norm)

    def _fused_attention(self, x, cache, slots, positions, prefill: tuple[int, int] | None, meta=None) -> torch.Tensor:
        """`_fused` up to o_proj's input: the gated attention output [n, q_width]."""
        n = x.shape[0]
        merged, qv = live(self.qkv_proj), live(self.qv_proj)
        if merged is not None:
            # one GEMV; the prep kernel reads q|gate, k and v at their row strides
            qg, k, v = merged(x).split(merged.splits, dim=-1)
        elif qv is not None:
            qg, v = qv(x).split(qv.splits, dim=-1)
            k = self.k_proj(x)
        else:
            qg, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        qg = qg.view(n, self.heads, 2 * self.head_dim)
        k = k.view(n, self.kv_heads, self.head_dim)
        v = v.view(n, self.kv_heads, self.head_dim)
        kv = kv_parts(cache, self.kv_index)
        return self.backend.gated_attention(qg, k, v, self, kv, slots, positions, prefill=prefill, meta=meta)

    def prefill(self, x, cache, slot: int, start_pos: int) -> torch.Tensor:
        t_len = x.shape[0]
        positions = torch.arange(start_pos, start_pos + t_len, device=x.device)
        slots = torch.full_like(positions, slot)
        if fused_for(self.backend, x):
            return self._fused(x, cache, slots, positions, (slot, start_pos))
        q, k, v, gate = self._project(x, positions)
        k_cache, v_cache, k_scale, v_scale = kv_parts(cache, self.kv_index)
        scales = {} if k_scale is None else {"k_scale": k_scale, "v_scale": v_scale}
        self.backend.write(k_cache, v_cache, slots, positions, k, v, **scales)
        return self._output(self.backend.prefill(q, k_cache, v_cache, slot, start_pos, self.scale, **scales), gate)

    def decode(self, x, cache, slots: torch.Tensor, positions: torch.Tensor, max_len: int | None = None, meta=None,
               add_norm=None):
        """`meta`: what a fused backend derived once per step from (slots, positions) for every
        layer (its `decode_meta`), or None. `add_norm` (ninfer.linear.AddNorm): the block's
        residual add and norm, which o_proj's kernel may fold into its launch (fused path only)."""
        if fused_for(self.backend, x):
            return self._fused(x, cache, slots, positions, None, meta, add_norm)
        return self.o_proj(self.decode_attention(x, cache, slots, positions, max_len))

    def decode_attention(self, x, cache, slots: torch.Tensor, positions: torch.Tensor, max_len: int | None = None,
                         meta=None) -> torch.Tensor:
        """`decode` up to o_proj's input: every row's K/V appended, the gated attention output
        [n, q_width]. The MTP alignment takes o_proj and the MLP on to only the rows it keeps."""
        if fused_for(self.backend, x):
            return self._fused_attention(x, cache, slots, positions, None, meta)
        q, k, v, gate = self._project(x, positions)
        k_cache, v_cache, k_scale, v_scale = kv_parts(cache, self.kv_index)
        scales = {} if k_scale is None else {"k_scale": k_scale, "v_scale": v_scale}
        self.backend.write(k_cache, v_cache, slots, positions, k, v, **scales)
        attn = self.backend.decode(q, k_cache, v_cache, slots, positions, self.scale, max_len=max_len, **scales)
        return self._gated(attn, gate)


class GatedDeltaNet(nn.Module):
    """Linear attention: conv(4) + SiLU on [q|k|v], L2-normed q/k, gated delta rule, gated norm."""

    def __init__(self, shape: QwenHybridShape, name: str, factory: LinearFactory, backend, device, dtype) -> None:
        super().__init__()
        s = shape
        h = s.hidden_size
        self.hk, self.hv = s.linear_num_key_heads, s.linear_num_value_heads
        self.dk, self.dv = s.linear_key_head_dim, s.linear_value_head_dim
        self.key_dim, self.value_dim = s.linear_key_dim, s.linear_value_dim
        self.kernel = s.linear_conv_kernel_dim
        self.eps = s.rms_norm_eps
        self.in_proj_qkv = factory.make(f"{name}.in_proj_qkv", s.conv_dim, h)
        self.in_proj_z = factory.make(f"{name}.in_proj_z", self.value_dim, h)
        self.in_proj_b = factory.make(f"{name}.in_proj_b", self.hv, h)
        self.in_proj_a = factory.make(f"{name}.in_proj_a", self.hv, h)
        self.out_proj = factory.make(f"{name}.out_proj", h, self.value_dim)
        # the input projections merged for the fused decode step (see fuse_linears)
        self.proj_name = name
        self.in_proj_all: QLinear | None = None
        self.in_proj_qkvz: QLinear | None = None
        self.in_proj_ab: QLinear | None = None
        # conv taps [C, kernel] (the checkpoint's [C, 1, kernel] without the group axis)
        self.register_buffer("conv_weight", torch.zeros(s.conv_dim, self.kernel, dtype=dtype, device=device))
        self.register_buffer("A_log", torch.zeros(self.hv, dtype=torch.float32, device=device))
        self.register_buffer("dt_bias", torch.zeros(self.hv, dtype=torch.float32, device=device))
        # plain RMSNorm over each value head (not zero-centred)
        self.register_buffer("norm_weight", torch.ones(self.dv, dtype=torch.float32, device=device))
        self.backend = backend
        self.state_index = -1

    def _conv(self, x: torch.Tensor, conv_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, C] pre-conv inputs, conv_state [B, C, k-1] the previous k-1 inputs ->
        (silu(conv) [B, T, C] fp32, new state [B, C, k-1])."""
        b, t_len, c = x.shape
        seq = torch.cat((conv_state.to(x.dtype), x.transpose(1, 2)), dim=-1)  # [B, C, k-1+T]
        taps = self.conv_weight.float().repeat(b, 1).unsqueeze(1)  # [B*C, 1, k]: one group per channel
        out = F.conv1d(seq.float().reshape(1, b * c, -1), taps, groups=b * c)
        out = F.silu(out.reshape(b, c, t_len)).transpose(1, 2)
        return out, seq[..., -(self.kernel - 1) :]

    def fuse_linears(self) -> None:
        """After loading: qkv, z, a and b as one GEMV when all four are dense (bf16), else a and b
        (always dense in the recipes: 48 rows each, a launch of mostly latency apiece)."""
        parts = [self.in_proj_qkv, self.in_proj_z, self.in_proj_a, self.in_proj_b]
        # out of the module tree, as SwiGLU's: the parts keep owning (views of) the weights
        self.__dict__["in_proj_all"] = merge_rows(parts, f"{self.proj_name}.in_proj_qkvzab")
        if self.in_proj_all is None:
            # quantized qkv and z (one scheme in every recipe) and dense a, b: two launches
            self.__dict__["in_proj_qkvz"] = merge_rows([self.in_proj_qkv, self.in_proj_z], f"{self.proj_name}.in_proj_qkvz")
            self.__dict__["in_proj_ab"] = merge_rows([self.in_proj_a, self.in_proj_b], f"{self.proj_name}.in_proj_ab")

    @property
    def input_linear(self) -> QLinear:
        """The projection that reads the layer's normed input first (see GatedAttention's)."""
        return live(self.in_proj_all) or live(self.in_proj_qkvz) or self.in_proj_qkv

    def _projections_qkvz(self, x: torch.Tensor):
        merged_qkvz = live(self.in_proj_qkvz)
        if merged_qkvz is not None:
            return merged_qkvz(x).split(merged_qkvz.splits, dim=-1)
        return self.in_proj_qkv(x), self.in_proj_z(x)

    def _ab_in_step(self, x: torch.Tensor) -> torch.Tensor | None:
        """The merged dense [a; b] weight [2 Hv, H] when the decode step should compute the gates
        itself: by default (NINFER_GDN_AB=0 turns it off; 4-6 us a layer less than the bf16
        matmul + step on the H200, BENCHMARKS.md), a backend that can (`fuses_ab`), a and b merged apart from qkv/z (quantized recipes; a fully
        dense layer has them in its one in_proj launch already), weight and x alike."""
        if os.environ.get("NINFER_GDN_AB", "1") == "0" or not getattr(self.backend, "fuses_ab", False):
            return None
        merged_ab = live(self.in_proj_ab)
        if live(self.in_proj_all) is not None or merged_ab is None or merged_ab.scheme != DENSE:
            return None
        w = merged_ab.prepared
        if not isinstance(w, torch.Tensor) or w.dtype != x.dtype or w.device != x.device or w.stride(-1) != 1:
            return None
        return w

    def projections(self, x: torch.Tensor):
        """x [N, H] -> the raw in_proj outputs (qkv, z, a, b) through the merged launches where
        fuse_linears made them (slices of one output: the fused kernels take any row stride)."""
        merged_all, merged_ab = live(self.in_proj_all), live(self.in_proj_ab)
        if merged_all is not None:
            return merged_all(x).split(merged_all.splits, dim=-1)
        qkv, z = self._projections_qkvz(x)
        if merged_ab is not None:
            a, b = merged_ab(x).split(merged_ab.splits, dim=-1)
        else:
            a, b = self.in_proj_a(x), self.in_proj_b(x)
        return qkv, z, a, b

    def _gates(self, x: torch.Tensor):
        a, b = self.in_proj_a(x).float(), self.in_proj_b(x).float()
        g = -self.A_log.exp() * F.softplus(a + self.dt_bias)  # log-decay, <= 0
        return g, torch.sigmoid(b)

    def _split(self, mixed: torch.Tensor):
        lead = mixed.shape[:-1]
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2_normalize(q.reshape(*lead, self.hk, self.dk))
        k = l2_normalize(k.reshape(*lead, self.hk, self.dk))
        return q, k, v.reshape(*lead, self.hv, self.dv)

    def _output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o [N, Hv, Dv] fp32, z [N, Hv*Dv] -> out_proj(rmsnorm(o) * w * silu(z))."""
        o = o.float()
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_weight
        o = o * F.silu(z.float().view_as(o))
        return self.out_proj(o.reshape(o.shape[0], -1).to(z.dtype))

    def prefill(self, x, cache, slot: int, start_pos: int) -> torch.Tensor:
        conv_state, rec_state = cache.gdn(self.state_index)
        if fused_for(self.backend, x) and cache.columns(slot, self.state_index) is None:
            out = self._fused_prefill(x, conv_state, rec_state, slot)
            if out is not None:
                return out
        qkv = self.in_proj_qkv(x)
        mixed, new_conv = self._conv(qkv.unsqueeze(0), conv_state[slot : slot + 1])
        q, k, v = self._split(mixed[0])
        g, beta = self._gates(x)
        columns = cache.columns(slot, self.state_index)
        if columns is None:
            if fused_for(self.backend, x):
                # a GPU core (fla's chunked kernels) takes 16-bit q/k/v; fp32 inputs mean "reference"
                q, k, v = q.to(x.dtype), k.to(x.dtype), v.to(x.dtype)
            o, new_rec = self.backend.prefill(q, k, v, g, beta, rec_state[slot], self.dk**-0.5)
        else:
            o, new_rec = self._verify(qkv, q, k, v, g, beta, conv_state[slot], rec_state[slot], *columns)
        conv_state[slot] = new_conv[0]
        rec_state[slot] = new_rec
        return self._output(o, self.in_proj_z(x))

    def _fused_prefill(self, x, conv_state, rec_state, slot: int) -> torch.Tensor | None:
        """The GPU prefill chunk: merged projections, conv + SiLU + L2 norms in one kernel, the
        chunked core, the gated norm in one pass (the torch form's transposed copy and fp32
        elementwise passes over [T, conv_dim] and [T, Hv*Dv] cost more than the core at 8K
        tokens). None: the backend has no such kernels for this layer."""
        prepare = getattr(self.backend, "prefill_inputs", None)
        norm = getattr(self.backend, "gated_norm", None)
        if prepare is None or norm is None:
            return None
        qkv, z, a, b = self.projections(x)
        parts = prepare(qkv, conv_state[slot], self)
        if parts is None:
            return None
        q, k, v, new_conv = parts
        g = -self.A_log.exp() * F.softplus(a.float() + self.dt_bias)
        o, new_rec = self.backend.prefill(q, k, v, g, torch.sigmoid(b.float()), rec_state[slot], self.dk**-0.5)
        conv_state[slot] = new_conv
        rec_state[slot] = new_rec
        o = norm(o.to(x.dtype).reshape(x.shape[0], self.hv, self.dv), z, self)
        return self.out_proj(o.reshape(x.shape[0], -1))

    def _verify(self, qkv, q, k, v, g, beta, conv, rec, col_conv, col_rec):
        """A speculative verify (T = K+1 <= 6 tokens): the decode recurrence token by token, keeping
        the conv window and recurrent state after each token in the cache's columns (spec 3.2)."""
        t_len = qkv.shape[0]
        seq = torch.cat((conv.to(qkv.dtype), qkv.transpose(0, 1)), dim=-1)  # [C, k-1+T]
        col_conv[:t_len] = seq.unfold(-1, self.kernel - 1, 1)[:, 1:].transpose(0, 1)
        outs, s = [], rec.unsqueeze(0)
        for t in range(t_len):
            o, s = self.backend.decode(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], s, self.dk**-0.5)
            outs.append(o)
            col_rec[t] = s[0]
        return torch.cat(outs), s[0]

    def decode(self, x, cache, slots: torch.Tensor, positions: torch.Tensor, max_len: int | None = None, meta=None,
               add_norm=None):
        """`add_norm` (ninfer.linear.AddNorm): the block's residual add and norm, which out_proj's
        kernel may fold into its launch (fused path only)."""
        conv_state, rec_state = cache.gdn(self.state_index)
        if fused_for(self.backend, x):
            # conv step, L2 norms, gates, state update in place and the gated norm: one launch
            w_ab = self._ab_in_step(x)
            # the projections' launches in the backend's scope: it may then let the step read its
            # state before its PDL wait (cuda_fast's NINFER_GDN_EARLY)
            scope = getattr(self.backend, "decode_inputs_scope", None)
            with scope() if scope is not None else contextlib.nullcontext(False) as early:
                if w_ab is not None:
                    # in_proj_a / in_proj_b inside the step too (the default; NINFER_GDN_AB=0: apart)
                    qkv, z = self._projections_qkvz(x)
                    a = b = None
                else:
                    qkv, z, a, b = self.projections(x)
            extra = {"state_early": True} if early else {}
            # out_proj's prepared input written by the step itself (unless NINFER_NORM_PAIRS=0; one
            # value head is one K block of 128 of out_proj's input)
            pairs = None
            if getattr(self.backend, "takes_out_pairs", False) and self.dv == 128 and add_norm is None:
                pairs = self.out_proj.input_pairs(x.shape[0], x.device)
            if pairs is not None:
                extra["out_pairs"] = pairs
            if w_ab is not None:
                o = self.backend.gdn_decode(qkv, None, None, z, self, conv_state, rec_state, slots, ab_input=(x, w_ab), **extra)
            else:
                o = self.backend.gdn_decode(qkv, a, b, z, self, conv_state, rec_state, slots, **extra)
            o = o.reshape(o.shape[0], -1)
            if pairs is not None:
                self.out_proj.inputs_made(o)
            return self.out_proj(o) if add_norm is None else self.out_proj(o, add_norm=add_norm)
        mixed, new_conv = self._conv(self.in_proj_qkv(x).unsqueeze(1), conv_state[slots])
        q, k, v = self._split(mixed[:, 0])
        g, beta = self._gates(x)
        o, new_rec = self.backend.decode(q, k, v, g, beta, rec_state[slots], self.dk**-0.5)
        conv_state[slots] = new_conv.to(conv_state.dtype)
        rec_state[slots] = new_rec
        return self._output(o, self.in_proj_z(x))


class SwiGLU(nn.Module):
    def __init__(self, name: str, hidden: int, inner: int, factory: LinearFactory) -> None:
        super().__init__()
        self.name = name
        self.gate_proj = factory.make(f"{name}.gate_proj", inner, hidden)
        self.up_proj = factory.make(f"{name}.up_proj", inner, hidden)
        self.down_proj = factory.make(f"{name}.down_proj", hidden, inner)
        self.ops = TORCH_OPS
        # gate and up as one GEMV when both are dense (set after loading, see fuse_linears)
        self.gate_up: QLinear | None = None

    def fuse_linears(self) -> None:
        # kept out of the module tree (plain __dict__ entry): its weight is the parts' weights, which
        # byte counts, converters and the weight map already see once
        self.__dict__["gate_up"] = merge_rows([self.gate_proj, self.up_proj], f"{self.name}.gate_up_proj")

    # forward takes add_norm (ninfer.linear.AddNorm) for down_proj's kernel to fold
    folds_add_norm = True

    @property
    def input_linear(self) -> QLinear:
        """The projection that reads the block's normed input first (see GatedAttention's)."""
        return live(self.gate_up) or self.gate_proj

    def forward(self, x: torch.Tensor, add_norm=None) -> torch.Tensor:
        gate_up = live(self.gate_up)
        if gate_up is not None:
            gu = gate_up(x)
            # down_proj's kernel may take silu(gate) * up into its own launch (decode, f16x2 GEMV)
            y = self.down_proj.forward_gated(gu) if gate_up.splits == [self.down_proj.k] * 2 else None
            if y is not None:
                return y  # add_norm.out stays None: the caller adds and normalises
            gate, up = gu.split(gate_up.splits, dim=-1)
            act = self.ops.silu_mul(gate, up)
        else:
            act = self.ops.silu_mul(self.gate_proj(x), self.up_proj(x))
        return self.down_proj(act) if add_norm is None else self.down_proj(act, add_norm=add_norm)


class ReferenceMoe:
    """The default `ninfer_moe_kernel`: the experts' own torch code below (ExpertBank, SparseMoe),
    for every scheme and device. It fuses nothing, so those modules run their reference path."""

    name = "torch.moe"
    requirements = ANYWHERE
    fused_dtypes: tuple[torch.dtype, ...] = ()

    def prepare(self, bank, gate_up, down) -> None:
        return None


def moe_kernel_for(factory: LinearFactory, gate_up: list, down: list, num_experts: int, hidden: int, inner: int):
    """The MoE kernel chosen once per (schemes, shape), kept with the factory's linear choices."""
    schemes_gu, schemes_dn = {lin.scheme for lin in gate_up}, {lin.scheme for lin in down}
    if len(schemes_gu) != 1 or len(schemes_dn) != 1:
        return ReferenceMoe()  # experts quantized differently within a layer: no grouped kernel
    gu, dn = schemes_gu.pop(), schemes_dn.pop()
    key = (f"moe[{gu}/{dn} x{num_experts}]", hidden, inner)
    if key not in factory.choices:
        factory.choices[key] = factory.plugins.choose(
            "ninfer_moe_kernel", factory.device, slot=f"moe[{gu}/{dn} {num_experts}x{hidden}x{inner}]",
            scheme_gate_up=gu, scheme_down=dn, num_experts=num_experts, hidden=hidden, inner=inner,
        )
    return factory.choices[key].impl


class ExpertBank(nn.Module):
    """The routed experts, one QLinear pair per expert so each can be quantized on its own:
    `{name}.{e}.gate_up_proj` [2I, H] (rows 0..I-1 gate, I..2I-1 up) and `{name}.{e}.down_proj`
    [H, I]. Dense weights are views into the stacked [E, 2I, H] / [E, H, I] tensors.

    `forward` is the seam for a grouped-GEMM MoE kernel: same inputs, same result. The kernel is
    chosen through `ninfer_moe_kernel` (`self.kernel`); activations of a dtype it fuses go to it,
    others run the code below.
    """

    # Up to this many (token, expert) pairs, dense experts run by gathering their weights: no
    # host sync, so a decode step can be captured in a CUDA graph. The gather copies each chosen
    # expert once per token, which beats a per-expert loop only while batches are small.
    GATHER_MAX_PAIRS = 64

    def __init__(self, name: str, num_experts: int, hidden: int, inner: int, factory: LinearFactory) -> None:
        super().__init__()
        self.num_experts, self.inner = num_experts, inner
        experts = range(num_experts)
        self.gate_up = nn.ModuleList(factory.make(f"{name}.{e}.gate_up_proj", 2 * inner, hidden) for e in experts)
        self.down = nn.ModuleList(factory.make(f"{name}.{e}.down_proj", hidden, inner) for e in experts)
        # the stacked [E, 2I, H] / [E, H, I] weights when every expert is dense (set by the loader)
        self.stacked: dict[str, torch.Tensor] = {}
        self.kernel = moe_kernel_for(factory, list(self.gate_up), list(self.down), num_experts, hidden, inner)
        self.moe_prepared = None
        self._packed: dict[str, list] = {}

    def load(self, attr: str, stacked: torch.Tensor, pack, pack_all=None) -> None:
        """One half ("gate_up" or "down") of every expert: [E, n, k] in the model's dtype, or one
        PackedWeight per expert; `pack(linear, stacked[e])` gives an expert's QLinear its weight
        and returns the PackedWeight; `pack_all(linears, stacked)`, when given, may do all of them
        at once (or return None). Once both halves are in, the MoE kernel prepares its own form
        of them."""
        linears = getattr(self, attr)
        packed = pack_all(list(linears), stacked) if pack_all is not None and isinstance(stacked, torch.Tensor) else None
        self._packed[attr] = packed if packed is not None else [pack(linear, stacked[e]) for e, linear in enumerate(linears)]
        if all(linear.scheme == DENSE for linear in linears):
            self.stacked[attr] = stacked  # the QLinears hold views of it: no extra memory
        if len(self._packed) == 2:
            self.moe_prepared = self.kernel.prepare(self, self._packed.pop("gate_up"), self._packed.pop("down"))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [N, H], ids/weights [N, top_k] -> sum_k weights * expert_ids(x)."""
        if fused_for(self.kernel, x):
            return self.kernel.experts(self, x, ids, weights)
        if len(self.stacked) == 2 and ids.numel() <= self.GATHER_MAX_PAIRS:
            return self._gathered(x, ids, weights)
        out = torch.zeros_like(x, dtype=torch.float32)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        token_of = order // ids.shape[1]
        w_of = weights.reshape(-1)[order]
        start = 0
        for e, count in enumerate(counts):
            if count == 0:
                continue
            rows = token_of[start : start + count]
            gate, up = self.gate_up[e](x[rows]).split(self.inner, dim=-1)
            y = self.down[e](F.silu(gate) * up)
            out.index_add_(0, rows, y.float() * w_of[start : start + count, None])
            start += count
        return out.to(x.dtype)

    def _gathered(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        n, k = ids.shape
        flat = ids.reshape(-1)
        xs = x.repeat_interleave(k, dim=0).unsqueeze(-1)  # [N*k, H, 1]
        gate, up = torch.bmm(self.stacked["gate_up"][flat], xs).squeeze(-1).split(self.inner, dim=-1)
        y = torch.bmm(self.stacked["down"][flat], (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)
        return (y.float().view(n, k, -1) * weights.unsqueeze(-1)).sum(1).to(x.dtype)


class SparseMoe(nn.Module):
    """softmax over all experts (fp32), top-k, renormalise; plus sigmoid-gated shared expert."""

    def __init__(self, shape: QwenHybridShape, name: str, factory: LinearFactory) -> None:
        super().__init__()
        s = shape
        self.top_k = s.num_experts_per_tok
        self.gate = factory.make(f"{name}.gate", s.num_experts, s.hidden_size)
        self.experts = ExpertBank(f"{name}.experts", s.num_experts, s.hidden_size, s.moe_intermediate_size, factory)
        self.shared_expert = SwiGLU(f"{name}.shared_expert", s.hidden_size, s.shared_expert_intermediate_size, factory)
        self.shared_expert_gate = factory.make(f"{name}.shared_expert_gate", 1, s.hidden_size)

    def forward_add_norm(self, delta, residual, norm_weight, eps: float) -> torch.Tensor | None:
        """residual += delta, x = norm(residual), forward(x), with the first two inside the experts
        kernel's first launch where it can (`forward_layer_add_norm`); None where it cannot (the
        caller then runs them apart)."""
        fused = getattr(self.experts.kernel, "forward_layer_add_norm", None)
        if fused is None or not fused_for(self.experts.kernel, delta):
            return None
        return fused(self, delta, residual, norm_weight, eps)

    # forward takes add_norm (ninfer.linear.AddNorm) for the experts kernel to fold
    folds_add_norm = True

    def forward(self, x: torch.Tensor, add_norm=None) -> torch.Tensor:
        if fused_for(self.experts.kernel, x):
            if add_norm is None:
                return self.experts.kernel.forward_layer(self, x)
            return self.experts.kernel.forward_layer(self, x, add_norm=add_norm)
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        top_w, top_ids = torch.topk(probs, self.top_k, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        routed = self.experts(x, top_ids, top_w)
        shared = torch.sigmoid(self.shared_expert_gate(x).float()) * self.shared_expert(x).float()
        return (routed.float() + shared).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, mixer: nn.Module, mlp: nn.Module, shape: QwenHybridShape, device) -> None:
        super().__init__()
        self.mixer = mixer
        self.mlp = mlp
        self.input_layernorm = OffsetRMSNorm(shape.hidden_size, shape.rms_norm_eps, device)
        self.post_attention_layernorm = OffsetRMSNorm(shape.hidden_size, shape.rms_norm_eps, device)
        self.eps = shape.rms_norm_eps
        self.ops = TORCH_OPS

    def _block(self, x, mix, keep: torch.Tensor | None = None, final_norm: torch.Tensor | None = None) -> torch.Tensor:
        """x is the caller's to give up: the fused ops add into it in place (no copy a call).
        keep [B] (row indices, on the device): mix returns only those rows, and the residual
        add, the norm and the MLP run on them alone. final_norm: the weight of a (1+w) norm after
        the layer (the MTP's mtp.norm), returned instead of the residual stream, with the MLP's
        residual add in the same pass."""
        h = self.ops.rms_norm(x, self.input_layernorm.weight, self.eps, into=input_linear(self.mixer))
        residual = x if keep is None else x.index_select(0, keep)
        x, h = self.ops.add_rms_norm(mix(h), residual, self.post_attention_layernorm.weight, self.eps,
                                     into=input_linear(self.mlp))
        if final_norm is not None:
            return self.ops.add_rms_norm(self.mlp(h), x, final_norm, self.eps)[1]
        return x + self.mlp(h)

    def prefill(self, x, cache, slot: int, start_pos: int, final_norm: torch.Tensor | None = None) -> torch.Tensor:
        return self._block(x, lambda h: self.mixer.prefill(h, cache, slot, start_pos), final_norm=final_norm)

    def decode(self, x, cache, slots, positions, max_len: int | None = None, keep: torch.Tensor | None = None,
               final_norm: torch.Tensor | None = None, meta=None) -> torch.Tensor:
        """keep [B]: every row's K/V is appended, but only rows `keep` go on past attention (an
        attention mixer's `decode_attention`, then o_proj) and are returned. meta: what an
        attention mixer's fused backend derived from (slots, positions) (its `decode_meta`), or
        None (it derives its own)."""
        extra = {} if meta is None else {"meta": meta}
        if keep is None:
            return self._block(x, lambda h: self.mixer.decode(h, cache, slots, positions, max_len, **extra),
                               final_norm=final_norm)
        mixer = self.mixer
        return self._block(
            x, lambda h: mixer.o_proj(mixer.decode_attention(h, cache, slots, positions, max_len, **extra).index_select(0, keep)),
            keep, final_norm,
        )
