"""Per-slot state of the hybrid model: KV for the full-attention layers, conv and recurrent state
for the Gated DeltaNet layers. Follows `ninfer.model.ModelCache`.

KV is a contiguous stripe per slot, [slots, max_context, kv_heads, head_dim], in the model dtype
(`--kv-dtype bf16`) or as INT8-G64 codes with one fp16 scale per 64 elements, [slots, max_context,
kv_heads, head_dim / 64] (`--kv-dtype int8`, spec section 5: the layout the Triton kernels read);
positions beyond a sequence's length are stale and never read, so a rollback only moves the
position. The GDN state has no sequence axis: speculative rollback snapshots and restores it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.errors import UserError
from ninfer.kernels.reference import KV_GROUP
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
        if kv_dtype not in ("bf16", "int8"):
            raise UserError(f"--kv-dtype {kv_dtype} is not built yet; use --kv-dtype bf16 or int8.", param="kv_dtype")
        if kv_dtype == "int8" and shape.head_dim % KV_GROUP:
            raise UserError(
                f"--kv-dtype int8 needs a head dim that is a multiple of {KV_GROUP}, this model has "
                f"{shape.head_dim}; use --kv-dtype bf16.",
                param="kv_dtype",
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
        kv_type = torch.int8 if kv_dtype == "int8" else dtype
        self.k = [torch.zeros(kv_shape, dtype=kv_type, device=device) for _ in s.full_layers]
        self.v = [torch.zeros(kv_shape, dtype=kv_type, device=device) for _ in s.full_layers]
        self.k_scale: list[torch.Tensor] = []
        self.v_scale: list[torch.Tensor] = []
        if kv_dtype == "int8":
            sc_shape = (*kv_shape[:-1], s.head_dim // KV_GROUP)
            self.k_scale = [torch.zeros(sc_shape, dtype=torch.float16, device=device) for _ in s.full_layers]
            self.v_scale = [torch.zeros(sc_shape, dtype=torch.float16, device=device) for _ in s.full_layers]
        conv_shape = (num_slots, s.conv_dim, s.linear_conv_kernel_dim - 1)
        rec_shape = (num_slots, s.linear_num_value_heads, s.linear_key_head_dim, s.linear_value_head_dim)
        # one tensor for all GDN layers, each layer's state a view of it: what touches every layer
        # at once (a speculative round's commit) is one launch, not one per layer
        n_gdn = len(s.linear_layers)
        self.conv_all = torch.zeros((n_gdn, *conv_shape), dtype=dtype, device=device)
        self.recurrent_all = torch.zeros((n_gdn, *rec_shape), dtype=torch.float32, device=device)
        self.conv = list(self.conv_all.unbind(0))
        self.recurrent = list(self.recurrent_all.unbind(0))
        # per-token state of a speculative verify (keep_columns); None until a speculator asks
        self.col_conv: list[torch.Tensor] | None = None
        self.col_recurrent: list[torch.Tensor] = []
        self._keeping: set[int] = set()

    def kv(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[index], self.v[index]

    def kv_scales(self, index: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The fp16 group scales of layer `index`'s INT8 K and V, or None for a bf16 cache."""
        return (self.k_scale[index], self.v_scale[index]) if self.k_scale else None

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

    @torch.no_grad()
    def fill_random(self, slot: int, length: int, seed: int = 0) -> None:
        """Random K/V at positions 0..length-1 of `slot` (benchmarks: decode at a long context
        without prefilling it first; the time of a step does not depend on the values)."""
        gen = torch.Generator(device=self.k[0].device).manual_seed(seed)
        for i, (k, v) in enumerate(zip(self.k, self.v)):
            for t in (k, v):
                dst = t[slot, :length]
                if t.dtype == torch.int8:
                    dst.copy_(torch.randint(-127, 128, dst.shape, generator=gen, device=t.device, dtype=torch.int8))
                else:
                    dst.copy_(torch.randn(dst.shape, generator=gen, device=t.device, dtype=torch.float32).to(t.dtype))
            if self.k_scale:
                for sc in (self.k_scale[i], self.v_scale[i]):
                    sc[slot, :length] = (torch.rand(sc[slot, :length].shape, generator=gen, device=sc.device) * 0.02).to(sc.dtype)

    @property
    def nbytes(self) -> int:
        tensors = self.k + self.v + self.k_scale + self.v_scale + self.conv + self.recurrent
        return sum(t.numel() * t.element_size() for t in tensors)
