"""Requests -> batches.

Each step is one of:
* a prefill chunk of one request (at most `prefill_chunk` prompt tokens; at most
  `prefill_chunk_busy` while other requests decode), or
* a decode step over every running request whose prompt is done (up to `max_batch`).

While both kinds of work wait, steps alternate, so a long prompt never stalls the streams already
decoding for more than one chunk, and that chunk is the shorter busy one. Requests enter in
arrival order as slots free up.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ninfer.cache import StateSlots
from ninfer.request import Request, Status


@dataclass
class PrefillChunk:
    request: Request
    start: int
    end: int

    @property
    def last(self) -> bool:
        """The chunk that ends the prompt: its last position yields the first token."""
        return self.end == len(self.request.prompt_ids)


@dataclass
class DecodeBatch:
    requests: list[Request]


class Scheduler:
    def __init__(
        self, slots: StateSlots, *, prefill_chunk: int, max_batch: int, prefill_chunk_busy: int | None = None
    ) -> None:
        self.slots = slots
        self.prefill_chunk = prefill_chunk
        # None: the same as prefill_chunk; never more than it (the memory plan is sized for it).
        # EngineConfig's 0 (its default) is resolved by startup.plan before it gets here.
        if prefill_chunk_busy is not None and prefill_chunk_busy < 1:
            raise ValueError(f"prefill_chunk_busy must be at least 1 or None, got {prefill_chunk_busy}")
        self.prefill_chunk_busy = min(prefill_chunk if prefill_chunk_busy is None else prefill_chunk_busy, prefill_chunk)
        self.max_batch = max_batch
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._last_was_prefill = False

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_batch:
            slot = self.slots.allocate(self.waiting[0].id)
            if slot is None:
                return
            request = self.waiting.popleft()
            request.slot = slot
            request.status = Status.RUNNING
            self.running.append(request)

    def schedule(self) -> PrefillChunk | DecodeBatch | None:
        self._admit()
        prefilling = [r for r in self.running if r.prefilling]
        decoding = [r for r in self.running if not r.prefilling]
        if prefilling and (not decoding or not self._last_was_prefill):
            self._last_was_prefill = True
            r = prefilling[0]
            chunk = self.prefill_chunk_busy if decoding else self.prefill_chunk
            end = min(r.num_computed + chunk, len(r.prompt_ids))
            return PrefillChunk(r, r.num_computed, end)
        self._last_was_prefill = False
        if decoding:
            return DecodeBatch(decoding[: self.max_batch])
        return None

    def finish(self, request: Request) -> None:
        """Take a finished (or aborted) request out and give its slot back."""
        request.status = Status.FINISHED
        if request in self.running:
            self.running.remove(request)
        else:
            try:
                self.waiting.remove(request)
            except ValueError:
                pass
        if request.slot is not None:
            self.slots.free(request.slot)
            request.slot = None

    def find(self, request_id: str) -> Request | None:
        for r in (*self.running, *self.waiting):
            if r.id == request_id:
                return r
        return None
