"""Which cache slot each sequence lives in.

The model allocates the tensors (KV per attention layer, conv and recurrent state per Gated
DeltaNet layer) for a fixed number of slots at start; `StateSlots` hands slots to requests and
takes them back, resetting recurrent state so nothing of one request leaks into the next.
Paged KV (64-token pages shared across slots) replaces the per-slot KV later without changing
this interface: a slot then owns a block table instead of a contiguous stripe.
"""

from __future__ import annotations

from ninfer.model import ModelCache


class StateSlots:
    def __init__(self, cache: ModelCache) -> None:
        self.cache = cache
        self._free = list(range(cache.num_slots - 1, -1, -1))
        self._owner: dict[int, str] = {}

    @property
    def num_slots(self) -> int:
        return self.cache.num_slots

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, owner: str) -> int | None:
        """A fresh (reset) slot for `owner`, or None when all are taken."""
        if not self._free:
            return None
        slot = self._free.pop()
        self.cache.reset(slot)
        self._owner[slot] = owner
        return slot

    def free(self, slot: int) -> None:
        if slot not in self._owner:
            raise RuntimeError(f"slot {slot} freed twice")
        del self._owner[slot]
        self._free.append(slot)

    def owner(self, slot: int) -> str | None:
        return self._owner.get(slot)
