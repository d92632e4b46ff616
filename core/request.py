"""One generation request as the engine tracks it, and what the engine reports back per step."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgspec

from ninfer.config import SamplingParams


class Status(Enum):
    WAITING = "waiting"  # no slot yet
    RUNNING = "running"  # has a slot: prefilling or decoding
    FINISHED = "finished"


class SpecStats(msgspec.Struct, kw_only=True):
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    accepted_per_position: list[int] = []
    # plain one-token steps a speculating engine took (near the context or output limit)
    fallback_steps: int = 0


class RequestOutput(msgspec.Struct, kw_only=True):
    """What one engine step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    text_delta: str
    finished: bool = False
    # "stop" (stop token or stop string), "length" (max_new_tokens or context), "abort"
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # set on the final output only
    stats: dict[str, Any] | None = None


@dataclass
class Request:
    id: str
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    # tokens already run through the model (prompt and generated)
    num_computed: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None
    # text produced so far (after stop-string truncation)
    text: str = ""
    detok: Any = None
    stops: Any = None
    spec: SpecStats = field(default_factory=SpecStats)
    arrival: float = field(default_factory=time.perf_counter)
    prefill_start: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefilling(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def timing(self) -> dict[str, float]:
        """Phase seconds: queue (arrival -> prefill start), prefill, decode, total."""
        end = self.finish_time or time.perf_counter()
        start = self.prefill_start or end
        first = self.first_token_time or end
        return {
            "queue_s": start - self.arrival,
            "prefill_s": first - start,
            "decode_s": end - first,
            "total_s": end - self.arrival,
        }
