"""Executes one scheduled batch on the model and samples the next tokens.

This is the eager path, the one that runs everywhere (CPU parity tests included). The CUDA-graph
decode path replaces `decode` for bucketed batch sizes without changing what it returns.

Look-ahead (`lookahead`, on by default, NINFER_LOOKAHEAD=0 turns it off): a decode step also launches the same requests'
next step before reading its own tokens. That next step feeds on those tokens on the device, so
while the host reads them and the engine detokenizes, checks stops and schedules, the GPU is
already running it; the next `decode` of the same batch only waits for it. A request can finish on
a token the host has not seen yet (a stop token or string): that step is then wasted, and
harmless, since a slot is reset when it is next allocated. A step is launched ahead only when every
request can take two more tokens (max_new_tokens, the cache's context). When the next batch is not
the same, every result still valid (same request, slot, position and fed token) is kept for its
request; the others run as usual. Off under speculative decoding (the engine's rounds move the
same state).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ninfer.model import CausalLM, ModelCache
from ninfer.sampling import Purpose, Sampler
from ninfer.scheduler import DecodeBatch, PrefillChunk


@dataclass
class _Ahead:
    """A step launched ahead for `requests` (in order): what each row ran at, and the token it
    fed (the previous step's, known once that step is read)."""

    requests: list[Any]
    slots: list[int]
    positions: list[int]
    outputs: list[int]  # len(output_ids) the request will have when this step's token is appended - 1
    wait: Callable[[], list[int]]
    fed: list[int] | None = None

    def valid_for(self, j: int, r: Any) -> bool:
        return (self.requests[j] is r and r.slot == self.slots[j] and r.num_computed == self.positions[j] and not r.finished
                and len(r.output_ids) == self.outputs[j] and self.fed is not None and r.output_ids[-1] == self.fed[j])


def lookahead_enabled() -> bool:
    return os.environ.get("NINFER_LOOKAHEAD", "1") != "0"


class Runner:
    def __init__(
        self, model: CausalLM, cache: ModelCache, sampler: Sampler, *, cuda_graph: bool = False, max_batch: int = 8
    ) -> None:
        self.model = model
        self.cache = cache
        self.sampler = sampler
        self.device = model.device
        # decode steps replayed from CUDA graphs (ninfer.graphs), where the model allows it
        self.graphs = None
        from ninfer.graphs import GraphDecoder, graphs_supported

        self.eager_reason = graphs_supported(model, cuda_graph)
        if self.eager_reason is None:
            self.graphs = GraphDecoder(model, cache, max_batch, sampler)
        # decode steps launched one ahead (see the module's docstring); the engine turns it off
        # under speculative decoding
        self.lookahead = lookahead_enabled()
        self._ahead: _Ahead | None = None
        # results of steps run ahead whose batch changed, by request id
        self._kept: dict[str, tuple[_Ahead, int, int]] = {}

    @torch.inference_mode()
    def prefill(self, chunk: PrefillChunk) -> int | None:
        """Run one prompt chunk; on the prompt's last chunk return the first generated token."""
        r = chunk.request
        ids = torch.tensor(r.prompt_ids[chunk.start : chunk.end], dtype=torch.long, device=self.device)
        hidden = self.model.forward(ids, self.cache, r.slot, chunk.start)
        # the speculative round aligns its drafter over the chunk's hidden states
        self.last_hidden = hidden
        r.num_computed = chunk.end
        if not chunk.last:
            return None
        logits = self.model.compute_logits(hidden[-1:])
        return int(self.sampler.sample(logits, [r.params], [r.output_ids], [r.num_tokens], Purpose.PREFILL)[0])

    @torch.inference_mode()
    def decode(self, batch: DecodeBatch) -> list[int]:
        """One token for every request in the batch: each feeds its last sampled token."""
        reqs = list(batch.requests)
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if len(ahead.requests) == len(reqs) and all(ahead.valid_for(j, r) for j, r in enumerate(reqs)):
                # the step is already running: launch the one after it, then read it
                self._ahead = self._launch_ahead(reqs, ahead.wait)
                return self._done(reqs, ahead.wait())
            self._keep(ahead)
        if self._kept:
            # what belongs to finished requests goes first: a new request may reuse a finished one's
            # id (never a live one's: add_request refuses that)
            self._kept = {rid: k for rid, k in self._kept.items() if not k[0].requests[k[1]].finished}
            kept = [self._kept.pop(r.id, None) for r in reqs]
            if any(k is not None for k in kept):
                return self._with_kept(reqs, kept)
        wait = self._launch(reqs)
        self._ahead = self._launch_ahead(reqs, wait)
        return self._done(reqs, wait())

    def _done(self, reqs: list[Any], tokens: list[int]) -> list[int]:
        for r in reqs:
            r.num_computed += 1
        if self._ahead is not None:
            self._ahead.fed = tokens
        return tokens

    def _keep(self, ahead: _Ahead) -> None:
        """The batch changed under a step run ahead: keep each row's token for its request."""
        tokens = ahead.wait()
        for j, r in enumerate(ahead.requests):
            self._kept[r.id] = (ahead, j, tokens[j])

    def _with_kept(self, reqs: list[Any], kept: list) -> list[int]:
        tokens: list[int | None] = [None] * len(reqs)
        for j, (r, k) in enumerate(zip(reqs, kept)):
            if k is None:
                continue
            ahead, row, token = k
            if not ahead.valid_for(row, r):
                raise RuntimeError(f"request {r.id}: a decode step ran ahead for it, and its sequence then changed "
                                   "other than by that step's input token (a bug: its state is one token on)")
            tokens[j] = token
            r.num_computed += 1
        rest = [r for r, t in zip(reqs, tokens) if t is None]
        if rest:
            new = self._launch(rest)()
            for r in rest:
                r.num_computed += 1
            it = iter(new)
            tokens = [t if t is not None else next(it) for t in tokens]
        return tokens  # type: ignore[return-value]

    def _launch_ahead(self, reqs: list[Any], previous: Callable[[], list[int]]) -> _Ahead | None:
        """The batch's next step, launched before the previous one's tokens are read; None where
        it is off or some request may finish on length before it."""
        if not self.lookahead or any(
            len(r.output_ids) + 2 > r.params.max_new_tokens or r.num_computed + 2 >= self.cache.max_context
            for r in reqs
        ):
            return None
        slots, positions = [r.slot for r in reqs], [r.num_computed + 1 for r in reqs]
        outputs = [len(r.output_ids) + 1 for r in reqs]
        return _Ahead(reqs, slots, positions, outputs, self._launch(reqs, previous=previous))

    def _launch(self, reqs: list[Any], previous: Callable[[], list[int]] | None = None) -> Callable[[], list[int]]:
        """Launch one decode step for reqs; the returned function waits for its tokens. previous:
        this is the step after the one `previous` reads (not yet read): the graph path feeds on
        its tokens on the device; the eager path reads them first (it has no overlap to win)."""
        ahead = previous is not None
        if self.graphs is not None:
            wait = self.graphs.launch(reqs, ahead=ahead)
            if wait is not None:
                return wait
        step = 1 if ahead else 0
        last = previous() if ahead else [r.output_ids[-1] for r in reqs]
        ids = torch.tensor(last, dtype=torch.long, device=self.device)
        slots = torch.tensor([r.slot for r in reqs], dtype=torch.long, device=self.device)
        positions = torch.tensor([r.num_computed + step for r in reqs], dtype=torch.long, device=self.device)
        hidden = self.model.decode(ids, self.cache, slots, positions)
        logits = self.model.compute_logits(hidden)
        history = [r.output_ids + [t] for r, t in zip(reqs, last)] if ahead else [r.output_ids for r in reqs]
        tokens = self.sampler.sample(
            logits, [r.params for r in reqs], history, [r.num_tokens + step for r in reqs], Purpose.DECODE
        )
        out = [int(t) for t in tokens.tolist()]
        return lambda: out
