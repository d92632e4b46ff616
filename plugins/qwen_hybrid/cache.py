"""Per-slot state of the hybrid model: KV for the full-attention layers, conv and recurrent state
for the Gated DeltaNet layers. Follows `ninfer.model.ModelCache`.

KV is a contiguous stripe per slot, [slots, max_context, kv_heads, head_dim], in the model dtype;
positions beyond a sequence's length are stale and never read, so a rollback only moves the
position. The GDN state has no sequence axis: speculative rollback snapshots and restores it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.errors import UserError
from ninfer_plugins.qwen_hybrid.shape import QwenHybridShape


@dataclass
class StateSnapshot:
    conv: list[torch.Tensor]
    recurrent: list[torch.Tensor]


class HybridCache:
    def __init__(
        self,
        shape: QwenHybridShape,
        num_slots: int,
        max_context: int,
        kv_dtype: str,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if kv_dtype != "bf16":
            raise UserError(
                f"--kv-dtype {kv_dtype} is not yet on the reference path; use --kv-dtype bf16.", param="kv_dtype"
            )
        if num_slots < 1 or max_context < 1:
            raise UserError(f"cache needs at least one slot and one position, got {num_slots} x {max_context}.")
        self.shape = shape
        self.num_slots = num_slots
        self.max_context = max_context
        self.kv_dtype = kv_dtype
        s = shape
        kv_shape = (num_slots, max_context, s.num_key_value_heads, s.head_dim)
        # "bf16" names the 16-bit format on the GPU; on the fp32 parity path KV stays in fp32
        self.k = [torch.zeros(kv_shape, dtype=dtype, device=device) for _ in s.full_layers]
        self.v = [torch.zeros(kv_shape, dtype=dtype, device=device) for _ in s.full_layers]
        conv_shape = (num_slots, s.conv_dim, s.linear_conv_kernel_dim - 1)
        rec_shape = (num_slots, s.linear_num_value_heads, s.linear_key_head_dim, s.linear_value_head_dim)
        self.conv = [torch.zeros(conv_shape, dtype=dtype, device=device) for _ in s.linear_layers]
        self.recurrent = [torch.zeros(rec_shape, dtype=torch.float32, device=device) for _ in s.linear_layers]
        # per-token state of a speculative verify (keep_columns); None until a speculator asks
        self.col_conv: list[torch.Tensor] | None = None
        self.col_recurrent: list[torch.Tensor] = []
        self._keeping: set[int] = set()

    def kv(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    def gdn(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv[index], self.recurrent[index]

    def reset(self, slot: int) -> None:
        for t in self.conv + self.recurrent:
            t[slot].zero_()

    def snapshot(self, slot: int) -> StateSnapshot:
        return StateSnapshot([c[slot].clone() for c in self.conv], [r[slot].clone() for r in self.recurrent])

    def restore(self, slot: int, snap: StateSnapshot) -> None:
        for dst, src in zip(self.conv, snap.conv):
            dst[slot].copy_(src)
        for dst, src in zip(self.recurrent, snap.recurrent):
            dst[slot].copy_(src)

    # --- speculative verification: the GDN state after each verified token (spec 3.2) -----------

    def keep_columns(self, slot: int, count: int) -> None:
        """Until `stop_keeping(slot)`, a `forward` of up to `count` tokens in `slot` also keeps the
        conv window and recurrent state after each token, so `use_column` can roll the slot back to
        any accepted length. The buffers ([slots, count, ...] per GDN layer) are made on first use."""
        if self.col_conv is None or any(c.shape[1] < count for c in self.col_conv):
            self.col_conv = [c.new_zeros(c.shape[0], count, *c.shape[1:]) for c in self.conv]
            self.col_recurrent = [r.new_zeros(r.shape[0], count, *r.shape[1:]) for r in self.recurrent]
        self._keeping.add(slot)

    def stop_keeping(self, slot: int) -> None:
        self._keeping.discard(slot)

    def columns(self, slot: int, index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """GDN layer `index`'s per-token buffers ([count, C, k-1], [count, Hv, Dk, Dv]) while `slot`
        keeps columns, else None."""
        if slot not in self._keeping:
            return None
        return self.col_conv[index][slot], self.col_recurrent[index][slot]

    def use_column(self, slot: int, column: int | torch.Tensor) -> None:
        """Make the state after verified token `column` (0-based) the slot's state. `column` may be
        a device tensor: no host sync."""
        for dst, src in zip(self.conv + self.recurrent, self.col_conv + self.col_recurrent):
            dst[slot].copy_(src[slot].index_select(0, torch.as_tensor(column, device=src.device).reshape(1))[0])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v + self.conv + self.recurrent)
