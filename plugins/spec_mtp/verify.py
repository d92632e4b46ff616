"""The target's verify pass of a speculative round, for B sequences at once and fit for a CUDA graph.

Each sequence b runs M = K+1 tokens (its anchor and K drafts) at positions starts[b] + 0..K; rows
are sequence-major (row b*M + t). Everything but the Gated DeltaNet layers is the model's decode
step over the B*M rows: projections and MLPs read each weight once for all rows, and full
attention writes every row's K/V before any row attends, so row t of a sequence sees its own
earlier rows through the cache (the fused kernels and the reference alike), with no host sync.

A GDN layer is a recurrence: its projections still run once over all rows, then its core runs
token by token on per-token state COLUMNS ([slots, M, ...] per layer, spec 3.2): column t of a
slot starts as a copy of column t-1 (column 0: of the slot's state) and the decode step (the
fused kernel, or the layer's own reference decode) advances it in place by token t. The slot's
own state is untouched until `commit(slots, accepted)` copies column `accepted` into it: the
rollback to the kept length is one indexed copy (the backend's `gdn_commit` where it has one), with
the accepted counts as a device tensor. On the fused GPU path the default is a REPLAY instead
(NINFER_GDN_REPLAY; =0 keeps the columns): the verify stores each token's rank-1 update (g, k,
delta) and its conv state, and the commit replays the kept tokens on the slot's state in place,
so the M whole-state columns (0.6 GB a slot on the 27B) are never made.

This reads the qwen_hybrid model's parts (its layer stack `_run`, the GDN layer's projections and
backend): the MTP speculator is the family's own.
"""

from __future__ import annotations

import contextlib

import os
from typing import Any

import torch

from ninfer_plugins.qwen_hybrid.layers import GatedDeltaNet, fused_for


class _Columns:
    """What a GDN layer's reference decode reads through `cache.gdn(index)`: the column buffers
    flattened to [slots * M, ...], so that a row's "slot" is slot * M + t."""

    def __init__(self, conv: torch.Tensor, rec: torch.Tensor) -> None:
        self.conv, self.rec = conv, rec

    def gdn(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv, self.rec


class HybridVerifier:
    def __init__(self, model: Any, cache: Any, m: int) -> None:
        self.model, self.cache, self.m = model, cache, m
        self.gdn = [layer.mixer for layer in model.layers if isinstance(layer.mixer, GatedDeltaNet)]
        # the conv state after each verified token, per slot and GDN layer: one tensor for all
        # layers (views per layer), as the cache's own state when it has `conv_all`, so that the
        # commit is one gather + one scatter for all layers
        self.col_conv_all = self.col_rec_all = None
        self.col_conv, self.col_rec = [], []
        if cache.conv:
            conv0 = cache.conv[0]
            self.col_conv_all = conv0.new_zeros(len(cache.conv), conv0.shape[0], m, *conv0.shape[1:])
            self.col_conv = list(self.col_conv_all.unbind(0))
        # the recurrent state: by default (NINFER_GDN_REPLAY, read at each verify; =0 turns it
        # off) the fused verify stores what each token's update was (g, normed k, delta: 33 KB a
        # token and layer for the 27B) and the commit replays the accepted tokens on the slot's
        # state. Where that cannot run (the reference path, a backend without the replay, or
        # =0) the verify writes the state after each token into M columns a slot (3.1 MB a token
        # and layer: 0.6 GB a slot for the 27B), made on the first verify that needs them. Both
        # kinds of buffer are made outside any capture (a capture's warm-up runs first).
        self.replay: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._replayed = False

    def _rec_columns(self) -> list[torch.Tensor]:
        """The recurrent-state columns [slots, M, ...] per layer, made on first use."""
        if self.col_rec_all is None and self.cache.recurrent:
            rec0 = self.cache.recurrent[0]
            if rec0.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("the GDN verify's state columns are made inside a CUDA graph capture: "
                                   "the capture's warm-up should have made them")
            self.col_rec_all = rec0.new_zeros(len(self.cache.recurrent), rec0.shape[0], self.m, *rec0.shape[1:])
            self.col_rec = list(self.col_rec_all.unbind(0))
        return self.col_rec

    @property
    def replayed(self) -> bool:
        """Whether the last verify stored token updates and its commit replays them on the slots'
        state in place: the state from before the verify is then gone, so that commit cannot be
        redone with another column (`SpeculativeRound.truncate`)."""
        return self._replayed

    def _replay_buffers(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        if self.replay is not None:
            return self.replay
        cache, backend = self.cache, (self.gdn[0].backend if self.gdn else None)
        rec_all = getattr(cache, "recurrent_all", None)
        if (self.col_conv_all is None or rec_all is None or rec_all.dtype != torch.float32 or not rec_all.is_contiguous()
                or getattr(cache, "conv_all", None) is None or not hasattr(backend, "gdn_commit_replay")
                or (rec_all.is_cuda and torch.cuda.is_current_stream_capturing())):
            return None
        lay, n_l, slots_n, m = self.gdn[0], rec_all.shape[0], rec_all.shape[1], self.m
        dev = rec_all.device
        self.replay = (torch.zeros(n_l, slots_n * m, lay.hv, device=dev),
                       torch.zeros(n_l, slots_n * m, lay.hk, lay.dk, device=dev),
                       torch.zeros(n_l, slots_n * m, lay.hv, lay.dv, device=dev))
        return self.replay

    def forward(
        self, ids: torch.Tensor, row_slots: torch.Tensor, row_pos: torch.Tensor, slots: torch.Tensor, max_len: int | None
    ) -> torch.Tensor:
        """ids, row_slots, row_pos [B*M] (sequence-major), slots [B] -> final-normed hidden [B*M, H].
        Writes K/V at every row's position and the GDN columns; `max_len` (> every position, or None
        on the fused path) bounds the reference attention's reads without a host sync."""
        model, cache = self.model, self.cache
        # every GDN layer must take the replay (the commit replays all of them or none)
        fused = all(hasattr(g.backend, "gdn_verify") and model.dtype in getattr(g.backend, "fused_dtypes", ())
                    for g in self.gdn)
        self._replayed = (os.environ.get("NINFER_GDN_REPLAY", "1") != "0" and fused
                          and self._replay_buffers() is not None)
        x = model.embed(ids)
        meta = None
        if model.dtype in getattr(model.full_backend, "fused_dtypes", ()):
            meta = model.full_backend.decode_meta(cache, row_slots, row_pos, columns=self.m)

        def mix(layer: Any, h: torch.Tensor) -> torch.Tensor:
            if isinstance(layer.mixer, GatedDeltaNet):
                return self._gdn(layer.mixer, h, slots)
            return layer.mixer.decode(h, cache, row_slots, row_pos, max_len, meta=meta)

        return model._run(x, mix)

    def _gdn(self, layer: GatedDeltaNet, x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        m, b = self.m, slots.shape[0]
        conv, rec = self.cache.gdn(layer.state_index)
        cc = self.col_conv[layer.state_index].view(-1, *conv.shape[1:])
        fused = fused_for(layer.backend, x)
        verify = getattr(layer.backend, "gdn_verify", None) if fused else None
        if self._replayed and verify is None:
            raise RuntimeError(f"GDN layer {layer.state_index}: the verify replays, but this layer's backend has "
                               "no fused verify for its activations")
        if self._replayed:
            cr = None
        else:
            cr = self._rec_columns()[layer.state_index].view(-1, *rec.shape[1:])
        if fused:
            w_ab = layer._ab_in_step(x) if verify is not None else None
            extra = {}
            if self._replayed:
                i = layer.state_index
                extra = {"replay": tuple(t[i] for t in self.replay)}
            # the projections in the backend's scope: the verify may then read the slots' state
            # before its PDL wait (cuda_fast's NINFER_GDN_EARLY), as the decode step does
            scope = getattr(layer.backend, "decode_inputs_scope", None) if verify is not None else None
            with scope() if scope is not None else contextlib.nullcontext(False) as early:
                if w_ab is not None:
                    qkv, z = layer._projections_qkvz(x)
                else:
                    qkv, z, a, beta = layer.projections(x)
            if early:
                extra["state_early"] = True
            if w_ab is not None:
                # in_proj_a / in_proj_b inside the verify launch, as in the decode step (the gates
                # come out alike: fp32 dot products in both)
                out = verify(qkv, None, None, z, layer, conv, rec, cc, cr, slots, m, ab_input=(x, w_ab), **extra)
                return layer.out_proj(out.reshape(b * m, -1))
            if verify is not None:
                # all M tokens in one launch: 1 kernel a layer instead of 4 copies + 1 step per token
                out = verify(qkv, a, beta, z, layer, conv, rec, cc, cr, slots, m, **extra)
                return layer.out_proj(out.reshape(b * m, -1))
        outs = []
        for t in range(m):
            idx = slots * m + t
            cc.index_copy_(0, idx, conv.index_select(0, slots) if t == 0 else cc.index_select(0, idx - 1))
            cr.index_copy_(0, idx, rec.index_select(0, slots) if t == 0 else cr.index_select(0, idx - 1))
            rows = slice(t, None, m)  # token t of every sequence (strided rows; the kernel takes row strides)
            if fused:
                outs.append(layer.backend.gdn_decode(qkv[rows], a[rows], beta[rows], z[rows], layer, cc, cr, idx))
            else:
                outs.append(layer.decode(x[rows], _Columns(cc, cr), idx, None))
        out = torch.stack(outs, 1)  # [B, M, ...]
        if fused:
            return layer.out_proj(out.reshape(b * m, -1))
        return out.reshape(b * m, -1)

    def commit(self, slots: torch.Tensor, column: torch.Tensor) -> None:
        """Make the state after verified token column[b] (0-based, a device tensor) the state of
        slot slots[b]."""
        conv_all, rec_all = getattr(self.cache, "conv_all", None), getattr(self.cache, "recurrent_all", None)
        if not self.col_conv:
            return
        if conv_all is not None and rec_all is not None:
            backend = self.gdn[0].backend if self.gdn else None
            # NINFER_GDN_COMMIT=0: the torch form below (an A/B switch)
            commit = getattr(backend, "gdn_commit", None) if os.environ.get("NINFER_GDN_COMMIT", "1") != "0" else None
            if self._replayed:
                # the verify stored each token's update, not its state: replay the accepted ones
                backend.gdn_commit(conv_all, self.col_conv_all, slots, column)
                backend.gdn_commit_replay(rec_all, *self.replay, slots, column)
                return
            if commit is not None and self.model.dtype in getattr(backend, "fused_dtypes", ()):
                # one launch a tensor, each kept column read once (the torch form below gathers
                # into a temporary first: twice the bytes)
                commit(conv_all, self.col_conv_all, slots, column)
                commit(rec_all, self.col_rec_all, slots, column)
                return
            conv_all.index_copy_(1, slots, self.col_conv_all[:, slots, column])
            rec_all.index_copy_(1, slots, self.col_rec_all[:, slots, column])
            return
        idx = slots * self.m + column
        if len(self.col_rec) != len(self.col_conv):
            raise RuntimeError("a GDN commit without the state columns its verify should have written")
        for conv, rec, cc, cr in zip(self.cache.conv, self.cache.recurrent, self.col_conv, self.col_rec):
            conv.index_copy_(0, slots, cc.view(-1, *conv.shape[1:]).index_select(0, idx))
            rec.index_copy_(0, slots, cr.view(-1, *rec.shape[1:]).index_select(0, idx))

    def snapshot(self, slots: torch.Tensor) -> list[torch.Tensor]:
        """Copies of the slots' GDN state (a capture's warm-up runs real rounds, then puts it back)."""
        return [t.index_select(0, slots) for t in self.cache.conv + self.cache.recurrent]

    def restore(self, slots: torch.Tensor, saved: list[torch.Tensor]) -> None:
        for t, s in zip(self.cache.conv + self.cache.recurrent, saved):
            t.index_copy_(0, slots, s)
