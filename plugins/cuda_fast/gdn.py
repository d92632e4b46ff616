"""Gated DeltaNet for the fast path: fla's chunked kernels for prefill, one fused Triton launch
per layer for decode.

Prefill takes the reference's inputs (L2-normed q, k; v; log-decay g; beta; the fp32 state
[Hv, Dk, Dv]) and returns the same (o, final state): fla-core's `chunk_gated_delta_rule` reads the
q/k head of value head j as j // (Hv / Hk) (its GVA), our convention, and the state in the same
[Hv, Dk, Dv] layout, so nothing is repeated or transposed. fla is an optional dependency (the
`gpu` extra): without it, or if its one-time check against the torch chunked form fails, the
torch form serves. Chunks shorter than `FLA_MIN_TOKENS` (a 64-token fla chunk would be mostly
padding) and fp32 inputs (the parity path) take the reference.

Decode is `gdn_decode_step`: conv step + SiLU, L2 norms, g and beta, the delta-rule update of
the fp32 state in place, the readout and the gated RMSNorm; a row with slot -1 is padding.
"""

from __future__ import annotations

import contextlib
import os

import structlog
import torch

from ninfer_plugins.cuda_fast.plugin import GPU
from ninfer_plugins.qwen_hybrid.gdn import ReferenceLinearAttention, chunked_gated_delta_rule

log = structlog.get_logger("ninfer.cuda_fast")

FLA_MIN_TOKENS = 64


def _fla_kernel():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception:  # noqa: BLE001 - not installed, or built for another torch: the torch form serves
        return None
    return chunk_gated_delta_rule


class TritonLinearAttention(ReferenceLinearAttention):
    name = "cuda_fast.fla+triton"
    requirements = GPU
    fused_dtypes = (torch.bfloat16, torch.float16)
    graph_decode = True

    def __init__(self) -> None:
        self._fla = None
        self._checked = False

    def prefill(self, q, k, v, g, beta, state, scale):
        if q.dtype == torch.float32 or v.shape[0] < FLA_MIN_TOKENS:
            return super().prefill(q, k, v, g, beta, state, scale)
        fla = self._fla_checked(q)
        if fla is None:
            return chunked_gated_delta_rule(q, k, v, g, beta, state, scale)
        return self._run_fla(fla, q, k, v, g, beta, state, scale)

    @staticmethod
    def _run_fla(fla, q, k, v, g, beta, state, scale):
        o, s = fla(
            q[None], k[None], v[None].to(q.dtype), g[None].float(), beta[None].float(),
            scale=scale, initial_state=state[None].float().contiguous(), output_final_state=True,
        )  # fmt: skip
        return o[0], s[0]

    def _fla_checked(self, like: torch.Tensor):
        """fla's kernel, once it has matched the torch chunked form on a small random problem of
        this layer's head counts on this device; None when absent or off."""
        if self._checked:
            return self._fla
        self._checked = True
        fla = _fla_kernel() if like.is_cuda else None
        if fla is None:
            return None
        hk, dk = like.shape[1], like.shape[2]
        gen = torch.Generator(device=like.device).manual_seed(0)
        t_len, hv, dv = 100, hk * 3, dk  # any GVA ratio exercises the head mapping

        def rand(*s):
            return torch.randn(s, generator=gen, device=like.device)

        q = torch.nn.functional.normalize(rand(t_len, hk, dk), dim=-1).to(like.dtype)
        k = torch.nn.functional.normalize(rand(t_len, hk, dk), dim=-1).to(like.dtype)
        v = rand(t_len, hv, dv).to(like.dtype)
        g = -torch.rand(t_len, hv, generator=gen, device=like.device)
        beta = torch.rand(t_len, hv, generator=gen, device=like.device)
        s0 = rand(hv, dk, dv) * 0.1
        try:
            o, s = self._run_fla(fla, q, k, v, g, beta, s0, dk**-0.5)
            o_ref, s_ref = chunked_gated_delta_rule(q, k, v, g, beta, s0, dk**-0.5)
            err = max(float((o.float() - o_ref).norm() / o_ref.norm()), float((s - s_ref).norm() / s_ref.norm()))
        except Exception as exc:  # noqa: BLE001 - fla broken on this device/torch: keep serving
            log.warning("fla chunk_gated_delta_rule failed its check; GDN prefill uses the torch form", error=str(exc))
            return None
        if err > 2e-2:
            log.warning("fla chunk_gated_delta_rule disagrees with the torch form; GDN prefill uses the torch form", err=err)
            return None
        self._fla = fla
        return fla

    def prefill_inputs(self, mixed_qkv, conv_state, layer):
        """A prefill chunk's q, k (L2-normed), v and new conv state from its raw in_proj_qkv
        output [T, conv_dim] in one launch, or None where the kernel does not apply (q/k and v
        head dims differ, conv kernel not 4): the layer then takes its torch form."""
        from ninfer.kernels.triton import gdn_prefill_conv

        if layer.kernel != 4 or layer.dk != layer.dv:
            return None
        return gdn_prefill_conv(mixed_qkv, conv_state, layer.conv_weight, num_k_heads=layer.hk,
                                num_v_heads=layer.hv, head_dim=layer.dk)

    def gated_norm(self, o, z, layer):
        """o [T, Hv, Dv], z [T, Hv*Dv] -> RMSNorm(o) * w * silu(z) [T, Hv, Dv] in one pass."""
        from ninfer.kernels.triton import gated_rmsnorm

        return gated_rmsnorm(o, z.view(o.shape), layer.norm_weight, layer.eps)

    def gdn_verify(self, mixed_qkv, a, b, z, layer, conv_state, rec_state, col_conv, col_rec, slots, m,
                   ab_input=None, replay=None, state_early: bool = False) -> torch.Tensor:
        """A speculative verify's M tokens of each sequence in one launch (rows sequence-major):
        the slots' state is read, the state after each token goes to column slot * M + t of
        col_conv / col_rec -> gated-normed o [B * M, Hv, Dv]. a = b = None with ab_input as
        gdn_decode's: the gates computed in the launch. replay = (g, k, delta) buffers: each
        token's update goes there instead of its state (col_rec unused; `gdn_commit_replay`).
        state_early: as gdn_decode's (the inputs made inside `decode_inputs_scope()`)."""
        from ninfer.kernels.triton import gdn_verify_columns

        if layer.kernel != 4:
            raise ValueError(f"the fused GDN step keeps 3 conv columns (kernel 4), this layer has kernel {layer.kernel}")
        return gdn_verify_columns(
            mixed_qkv, a, b, layer.conv_weight, conv_state, layer.A_log, layer.dt_bias, rec_state, col_conv, col_rec,
            slots, m=m, num_k_heads=layer.hk, head_k_dim=layer.dk, head_v_dim=layer.dv, z=z,
            norm_weight=layer.norm_weight, eps=layer.eps, ab_input=ab_input, replay=replay, state_early=state_early,
        )  # fmt: skip

    def gdn_commit_replay(self, state, g, k, delta, slots, column) -> None:
        """The rollback after a verify with replay buffers: state[l, slots[b]] through tokens
        0..column[b]'s stored updates, every GDN layer in one launch (`commit_replay`)."""
        from ninfer.kernels.triton import commit_replay

        commit_replay(state, g, k, delta, slots, column)

    def gdn_commit(self, dst, src, slots, column) -> None:
        """A speculative round's rollback: dst[l, slots[b]] = src[l, slots[b], column[b]] for all
        GDN layers at once (the cache's conv_all / recurrent_all and the verify's columns), one
        launch, each kept column read once."""
        from ninfer.kernels.triton import commit_columns

        commit_columns(dst, src, slots, column)

    # gdn_decode and gdn_verify take a = b = None with ab_input = (x, W_ab): in_proj_a / in_proj_b
    # inside the step
    fuses_ab = True
    # gdn_decode takes out_pairs (the next GEMV's x pairs written by the step: QLinear.input_pairs)
    takes_out_pairs = True

    @staticmethod
    def decode_inputs_scope():
        """A context for the launches that make gdn_decode's inputs (the layer's projections); it
        yields whether gdn_decode may then read its state before its PDL wait (`state_early`).
        On by default (NINFER_GDN_EARLY=0 turns it off): those launches go through
        launch.late_dependents, so the step's recurrent state streams while the projection runs.
        H100 (BENCHMARKS.md twenty-third run): the 27B int4 step 121.7 / 121.6 tok/s against
        119.8 / 120.2, the 35B-A3B 397.7 against 391.6 / 387.5."""
        if os.environ.get("NINFER_GDN_EARLY", "1") == "0":
            return contextlib.nullcontext(False)
        from ninfer.kernels.triton.launch import late_dependents

        @contextlib.contextmanager
        def scope():
            with late_dependents():
                yield True

        return scope()

    def gdn_decode(self, mixed_qkv, a, b, z, layer, conv_state, rec_state, slots, ab_input=None,
                   state_early: bool = False, out_pairs=None) -> torch.Tensor:
        """mixed_qkv [B, conv_dim] (pre-conv), a, b [B, Hv], z [B, Hv*Dv] raw projections (or a =
        b = None and ab_input = (x [B, H], W [2 Hv, H]): the gates computed in the step); the
        layer's conv taps, A_log, dt_bias, norm weight and dims; the cache's conv and recurrent
        state, updated in place for rows slots[b] -> gated-normed o [B, Hv, Dv]. state_early: the
        inputs were made inside `decode_inputs_scope()`, which said so. out_pairs: see
        gdn_decode_step."""
        from ninfer.kernels.triton import gdn_decode_step

        if layer.kernel != 4:
            raise ValueError(f"the fused GDN step keeps 3 conv columns (kernel 4), this layer has kernel {layer.kernel}")
        return gdn_decode_step(
            mixed_qkv, a, b, layer.conv_weight, conv_state, layer.A_log, layer.dt_bias, rec_state,
            num_k_heads=layer.hk, head_k_dim=layer.dk, head_v_dim=layer.dv, state_indices=slots,
            z=z, norm_weight=layer.norm_weight, eps=layer.eps, ab_input=ab_input, state_early=state_early,
            out_pairs=out_pairs,
        )  # fmt: skip
