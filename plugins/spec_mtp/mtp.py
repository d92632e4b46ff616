"""The checkpoint's MTP layer (spec 3.3) and the drafter built on it.

    u = fc(cat(offset_rmsnorm(embed(x_{t+1}), pre_fc_norm_embedding),
               offset_rmsnorm(h_t, pre_fc_norm_hidden)))          # fc: [H, 2H], embedding half first
    y = mtp.norm(DecoderLayer(u))                                # one gated-attention layer, own KV
    draft = argmax(lm_head(y))                                   # the target's head (or the shortlist)

`h_t` is the target's final-normed hidden at position t (the tensor its head reads) and `x_{t+1}`
the token after it: MTP column t sees the token shifted left by one but the hidden and the
position of t, and predicts x_{t+2}. Further drafts feed the previous draft and the MTP's own
output `y` (after mtp.norm) back in, one position later each.

The layer reuses the family's modules (GatedAttention, SwiGLU / SparseMoe, OffsetRMSNorm), its
rotary tables, its attention backend and its LinearFactory, so `--quant` recipes (the `mtp.*`
names) and tuned kernels apply to it unchanged.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from ninfer.errors import UserError
from ninfer.linear import QLinear
from ninfer_plugins.qwen_hybrid.layers import (
    TORCH_OPS, DecoderLayer, ExpertBank, GatedAttention, OffsetRMSNorm, SparseMoe, SwiGLU, fuse_linears_below,
)
from ninfer_plugins.qwen_hybrid.weights import init_tensor, mtp_tensors


class MtpCache:
    """The MTP layer's own KV: one attention layer, a [slots, positions, kv_heads, head_dim] stripe
    per slot, like the target's. It never needs a rollback: a column past the accepted length is
    rewritten by the next alignment before any query can see it."""

    def __init__(self, shape: Any, num_slots: int, max_context: int, dtype: torch.dtype, device: torch.device) -> None:
        self.num_slots = num_slots
        self.max_context = max_context
        kv_shape = (num_slots, max_context, shape.num_key_value_heads, shape.head_dim)
        self.k = torch.zeros(kv_shape, dtype=dtype, device=device)
        self.v = torch.zeros(kv_shape, dtype=dtype, device=device)

    def kv(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k, self.v

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class MtpLayer(nn.Module):
    """fc + one gated-attention decoder layer + mtp.norm; embedding and head are the target's."""

    PREFIX = "mtp."

    def __init__(self, model: Any) -> None:
        super().__init__()
        s = model.shape
        if s.mtp_num_hidden_layers != 1:
            raise UserError(
                f"this checkpoint has {s.mtp_num_hidden_layers} MTP layers; --spec mtp runs checkpoints with exactly one."
            )
        h, dev, f = s.hidden_size, model.device, model.factory
        self.fc = f.make("mtp.fc", h, 2 * h)
        self.pre_fc_norm_embedding = OffsetRMSNorm(h, s.rms_norm_eps, dev)
        self.pre_fc_norm_hidden = OffsetRMSNorm(h, s.rms_norm_eps, dev)
        attn = GatedAttention(s, "mtp.layers.0.self_attn", f, model.full_backend, model.rotary, dev)
        attn.kv_index = 0
        mlp = SparseMoe(s, "mtp.layers.0.mlp", f) if s.is_moe else SwiGLU("mtp.layers.0.mlp", h, s.intermediate_size, f)
        self.layers = nn.ModuleList([DecoderLayer(attn, mlp, s, dev)])
        self.norm = OffsetRMSNorm(h, s.rms_norm_eps, dev)
        # the target's small ops (its fused norms and SwiGLU where its backend has them): built
        # after the model, this layer would otherwise keep the torch ones, ~8 launches a norm
        self.ops = getattr(model, "ops", None) or TORCH_OPS
        self.eps = s.rms_norm_eps
        for module in self.modules():
            if isinstance(module, (DecoderLayer, SwiGLU)):
                module.ops = self.ops

    def weight_targets(self) -> dict[str, Any]:
        """Published `mtp.*` name -> a QLinear, an ExpertBank half or (module, buffer name): the
        map `QwenHybridModel.assign` takes. Module paths are the published names (the decoder
        layer's `mixer` is published as `self_attn`)."""
        targets: dict[str, Any] = {}
        for path, module in self.named_modules(prefix="mtp"):
            path = path.replace(".mixer", ".self_attn")
            for attr, _ in module.named_buffers(recurse=False):
                targets[f"{path}.{attr}"] = (module, attr)
            if isinstance(module, ExpertBank):
                targets[f"{path}.gate_up_proj"] = (module, "gate_up")
                targets[f"{path}.down_proj"] = (module, "down")
            elif isinstance(module, QLinear) and ".experts." not in module.name:
                targets[module.name + ".weight"] = module
        return targets

    @torch.no_grad()
    def load(self, model: Any, seed: int = 0) -> None:
        """The checkpoint's `mtp.*` tensors, or deterministic random ones when the model itself has
        random weights (`--random-weights` benchmarks: timing does not depend on values)."""
        targets = self.weight_targets()
        if model.weight_source is None:
            gen = torch.Generator(device=model.device).manual_seed(seed)
            tensors = {n: init_tensor(n, shp, gen, model.device) for n, shp in mtp_tensors(model.shape).items()}
        else:
            tensors = model.load_mtp_weights()
        missing = sorted(set(targets) - set(tensors))
        if missing:
            raise UserError(f"the checkpoint's MTP layer lacks {missing[0]}; use --spec none.")
        for name, t in tensors.items():
            model.assign(name, t, targets)
        # as the model does after its own weights: q|gate, k, v as one linear and gate | up as one,
        # so one GEMV launch each and SwiGLU inside down's (the K-walk entries of the drafter's
        # merged q8 shapes were tuned for these; until the thirty-second session the layer never
        # merged, so they never ran). NINFER_MTP_FUSE=0 keeps the parts apart (read per engine)
        if os.environ.get("NINFER_MTP_FUSE", "1") != "0":
            fuse_linears_below(self)
        # the packed copies now live in the QLinears; the model's read cache would double the memory
        if tensors is getattr(model, "mtp_weights", None):
            tensors.clear()

    def _stem(self, model: Any, token_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        # the two input norms and their concatenation (one launch with the fused ops; an ops
        # without rms_norm_pair takes the torch form)
        pair = getattr(self.ops, "rms_norm_pair", TORCH_OPS.rms_norm_pair)
        return self.fc(pair(model.embed(token_ids), self.pre_fc_norm_embedding.weight, hidden,
                            self.pre_fc_norm_hidden.weight, self.eps))

    @torch.no_grad()
    def forward(self, model: Any, token_ids, hidden, cache: MtpCache, slot: int, start_pos: int) -> torch.Tensor:
        """T columns of one slot at positions start_pos..: token_ids [T] (each hidden's NEXT token),
        hidden [T, H] -> MTP output [T, H] after mtp.norm. Writes the slot's MTP KV."""
        return self.layers[0].prefill(self._stem(model, token_ids, hidden), cache, slot, start_pos, self.norm.weight)

    @torch.no_grad()
    def decode(self, model: Any, token_ids, hidden, cache: MtpCache, slots, positions, max_len: int | None) -> torch.Tensor:
        """One column for each of B slots: token_ids [B], hidden [B, H], positions [B] -> [B, H]."""
        return self.layers[0].decode(self._stem(model, token_ids, hidden), cache, slots, positions, max_len,
                                     final_norm=self.norm.weight)

    @torch.no_grad()
    def decode_kept(
        self, model: Any, token_ids, hidden, cache: MtpCache, slots, positions, max_len: int | None, keep: torch.Tensor,
        columns: int | None = None,
    ) -> torch.Tensor:
        """`decode` over N columns, every column's K/V written, but o_proj, the MLP and mtp.norm
        only for the rows `keep` [B] (indices into N, on the device): -> [B, H]. What the other
        rows would output is never read (a round drafts from one column a sequence), and at
        M = B instead of M = N the q8 o_proj / gate_up / down cost about M = 1's.

        columns: the rows are N / columns sequences of `columns` consecutive positions each,
        sequence-major (a round's verify columns); a fused attention backend then takes each
        sequence's queries in one program (its `decode_meta(..., columns)`, as the target's verify
        does)."""
        meta = None
        backend = self.layers[0].mixer.backend
        if columns and columns > 1 and model.dtype in getattr(backend, "fused_dtypes", ()):
            meta = backend.decode_meta(cache, slots, positions, columns=columns)
        return self.layers[0].decode(self._stem(model, token_ids, hidden), cache, slots, positions, max_len, keep=keep,
                                     final_norm=self.norm.weight, meta=meta)


class MtpDrafter:
    """Proposes K point-mass drafts per sequence from the MTP layer (spec 3.3).

    The speculative round (ninfer.speculative) calls `align` with the target's hidden states of
    a prompt chunk, `align_rows` with each round's verify columns (all sequences of the batch at
    once) and `draft` with the MTP output row of the last kept column. Shapes are fixed per K:
    `align_rows` always runs the round's K+1 columns and `draft` K-1 single-column steps, both
    without a host sync, so a whole round can be captured in a CUDA graph per batch size.

    `verifier` (given the target's cache) is the target's batched verify pass with per-token GDN
    state columns (verify.py), which the round runs before drafting.
    """

    name = "mtp"

    def __init__(
        self, model: Any, num_slots: int, max_context: int, k: int, head: Any = None, target_cache: Any = None
    ) -> None:
        self.model = model
        self.k = k
        self.layer = MtpLayer(model)
        self.layer.load(model)
        # a round aligns K+1 columns from its start and drafts K-1 more past the accepted one:
        # at most 2K positions beyond the target's last verified column
        self.cache = MtpCache(model.shape, num_slots, max_context + 2 * k, model.dtype, model.device)
        # the shortlist proposal head (--lm-head-draft); None: the target's full head
        self.head = head
        # argmax (+ the shortlist's id map) as one Triton launch where the model runs fused kernels
        self._fused_argmax = model.dtype in getattr(getattr(model, "full_backend", None), "fused_dtypes", ())
        self.verifier = None
        if target_cache is not None:
            from ninfer_plugins.spec_mtp.verify import HybridVerifier

            self.verifier = HybridVerifier(model, target_cache, k + 1)

    def graph_reason(self) -> str | None:
        """Why a round cannot be captured beyond what stops the target's decode step (None: it can):
        the MTP layer's own MoE kernel (the 35B's) must be graph-safe too."""
        from types import SimpleNamespace

        from ninfer.graphs import graphs_supported

        dtype = self.model.dtype
        for moe in (m for m in self.layer.modules() if isinstance(m, SparseMoe)):
            if dtype not in getattr(moe.experts.kernel, "fused_dtypes", ()):
                return f"the MTP layer's MoE kernel {moe.experts.kernel.name} routes on the host"
        probe = SimpleNamespace(device=self.model.device, dtype=dtype, modules=self.layer.modules, graph_decode=True)
        return graphs_supported(probe, cuda_graph=True)

    def propose(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Draft ids [B] from MTP outputs [B, H]: argmax over the head (or shortlist) rows, into
        `out` [B] int64 when given. With the fused kernels the argmax and the shortlist's id map
        are one launch (`argmax_rows`) on the head's own logits (no fp32 copy of them)."""
        if self._fused_argmax:
            from ninfer.kernels.triton.sample import argmax_rows

            if self.head is not None:
                return argmax_rows(self.head.logits(hidden), self.head.ids, out)
            return argmax_rows(self.model.head_logits(hidden), None, out)
        d = self.head.propose(hidden) if self.head is not None else self.model.compute_logits(hidden).argmax(-1)
        return d if out is None else out.copy_(d)

    def align(self, slot: int, next_ids: torch.Tensor, hidden: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Run the MTP over target columns start_pos.. of `slot`: next_ids [T] are the tokens one
        position after each hidden [T, H]. Returns the MTP outputs [T, H]."""
        return self.layer(self.model, next_ids, hidden, self.cache, slot, start_pos)

    def align_rows(
        self, slots: torch.Tensor, next_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, max_len: int | None
    ) -> torch.Tensor:
        """The MTP over N columns of any slots at once: slots, next_ids, positions [N], hidden
        [N, H] -> MTP outputs [N, H]. All K/V is written before any column attends, so columns of
        one slot see each other; `max_len` bounds every position (None on the fused path)."""
        return self.layer.decode(self.model, next_ids, hidden, self.cache, slots, positions, max_len)

    def align_seeds(
        self, slots: torch.Tensor, next_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
        max_len: int | None, keep: torch.Tensor, columns: int | None = None,
    ) -> torch.Tensor:
        """`align_rows`, returning only the rows `keep` [B] (indices into N, on the device: each
        sequence's last kept column, the seed of its drafts); every column's K/V is still
        written. The layer after attention runs on B rows instead of N (`MtpLayer.decode_kept`).
        columns: the rows are sequences of that many consecutive positions, sequence-major (the
        round's), so attention may take each sequence's queries together."""
        return self.layer.decode_kept(self.model, next_ids, hidden, self.cache, slots, positions, max_len, keep, columns)

    def draft(self, slots: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, max_len: int | None) -> torch.Tensor:
        """K drafts [B, K] for B sequences: seeds [B, H] are the MTP outputs of each sequence's last
        kept column, at `positions` [B]; `max_len` bounds every position the K-1 extra steps write."""
        drafts = torch.empty(seeds.shape[0], self.k, dtype=torch.int64, device=seeds.device)
        d, h = self.propose(seeds, drafts[:, 0]), seeds
        for j in range(1, self.k):
            h = self.layer.decode(self.model, d, h, self.cache, slots, positions + j, max_len)
            d = self.propose(h, drafts[:, j])
        return drafts
