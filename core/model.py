"""What the engine needs from a model, whatever its family.

A family plugin's `ninfer_model` returns an object with this shape. One sequence lives in one
cache slot; the runner hands the model token ids, the slot and the position of the first token.
Hidden states returned are final-normed (what the head and the MTP layer read).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch


class ModelCache(Protocol):
    """Per-slot state: KV for full attention, conv and recurrent state for linear attention.

    Optional, for speculative rollback in one target pass (ninfer.speculative, "columns"):
    `keep_columns(slot, count)` makes the next forward of `slot` keep the recurrent state after
    each of its tokens, `stop_keeping(slot)` ends that, `use_column(slot, i)` makes the state
    after token i the slot's state. Without them a round snapshots, restores and replays.
    """

    num_slots: int
    max_context: int

    def reset(self, slot: int) -> None:
        """Zero a slot's recurrent and conv state so a new sequence can start in it."""

    def snapshot(self, slot: int) -> Any:
        """A copy of the slot's recurrent state (KV needs none: it is truncated by position)."""

    def restore(self, slot: int, snap: Any) -> None:
        """Put a snapshot back (speculative rollback)."""


class CausalLM(Protocol):
    shape: Any
    device: torch.device
    dtype: torch.dtype

    def allocate_cache(self, num_slots: int, max_context: int, kv_dtype: str) -> ModelCache: ...

    def forward(self, input_ids: torch.Tensor, cache: ModelCache, slot: int, start_pos: int) -> torch.Tensor:
        """Run `input_ids` [T] of the sequence in `slot` at positions start_pos..start_pos+T-1.

        Appends to the slot's KV and advances its recurrent state. Returns hidden [T, H].
        """

    def decode(self, input_ids: torch.Tensor, cache: ModelCache, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token for each of B sequences: ids [B], slots [B], positions [B] -> hidden [B, H]."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> float32 logits [..., vocab]."""
