"""LLMEngine: the step loop. AsyncEngine: the same engine driven from asyncio (the server).

`step()` asks the scheduler for a batch, hands it to the runner, turns sampled tokens into
`RequestOutput`s (text deltas, stops, finish reasons) and gives finished requests' slots back.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import structlog

from ninfer.cache import StateSlots
from ninfer.config import SamplingParams
from ninfer.errors import UserError
from ninfer.request import Request, RequestOutput
from ninfer.runner import Runner
from ninfer.scheduler import DecodeBatch, PrefillChunk, Scheduler

log = structlog.get_logger("ninfer.engine")


class LLMEngine:
    def __init__(
        self,
        model: Any,
        cache: Any,
        sampler: Any,
        tokenizer: Any,
        *,
        max_context: int,
        prefill_chunk: int = 1024,
        prefill_chunk_busy: int | None = None,
        max_batch: int = 8,
        info: dict[str, Any] | None = None,
        speculator: Any = None,
        cuda_graph: bool = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.slots = StateSlots(cache)
        # prefill_chunk_busy: the chunk while other requests decode (None: prefill_chunk)
        self.scheduler = Scheduler(
            self.slots, prefill_chunk=prefill_chunk, prefill_chunk_busy=prefill_chunk_busy, max_batch=max_batch
        )
        self.runner = Runner(model, cache, sampler, cuda_graph=cuda_graph, max_batch=max_batch)
        # a drafter (--spec): decode steps become speculative rounds
        self.speculative = None
        if speculator is not None:
            from ninfer.speculative import SpeculativeRound

            self.speculative = SpeculativeRound(model, cache, sampler, speculator, graphs=self.runner.graphs)
            # a round moves the state a step run ahead would already have moved
            self.runner.lookahead = False
        # what was loaded and chosen (model id, device, kernels): for logs, /v1/models, --json
        self.info = info or {}
        self._ids = itertools.count()
        self._requests: dict[str, Request] = {}

    # --- requests ---------------------------------------------------------------------------------

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise UserError when the request cannot be served as given (before it is queued)."""
        if not prompt_ids:
            raise UserError("The prompt is empty: give at least one token.", param="prompt")
        vocab = self.model.shape.vocab_size
        bad = [t for t in prompt_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise UserError(f"Prompt token id {bad[0]!r} is outside the vocabulary [0, {vocab}).", param="prompt")
        if len(prompt_ids) >= self.max_context:
            raise UserError(
                f"The prompt has {len(prompt_ids)} tokens and the context holds {self.max_context}: "
                f"shorten the prompt or raise --max-context.",
                param="messages",
                code="context_length_exceeded",
            )

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> str:
        self.check_request(prompt_ids, params)
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self._requests:
            raise UserError(f"Request id {rid!r} is already in flight.")
        from ninfer.frontend.detokenize import StreamDecoder
        from ninfer.frontend.stops import StopMatcher

        r = Request(rid, list(prompt_ids), params)
        r.detok = StreamDecoder(self.tokenizer)
        r.stops = StopMatcher(list(params.stop))
        self._requests[rid] = r
        self.scheduler.add(r)
        return rid

    def abort(self, request_id: str) -> bool:
        """Cancel a request now: its slot is free before the next step."""
        r = self._requests.pop(request_id, None)
        if r is None:
            return False
        r.finish_reason = "abort"
        r.finish_time = time.perf_counter()
        self.scheduler.finish(r)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def stats(self) -> dict[str, int]:
        return {
            "num_slots": self.slots.num_slots,
            "free_slots": self.slots.num_free,
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
        }

    # --- the step ---------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        if isinstance(batch, PrefillChunk):
            r = batch.request
            if r.prefill_start is None:
                r.prefill_start = time.perf_counter()
            token = self.runner.prefill(batch)
            if self.speculative is not None:
                self.speculative.prefilled(r, batch.start, batch.end, self.runner.last_hidden, token)
            return [] if token is None else [self._append(r, token)]
        assert isinstance(batch, DecodeBatch)
        if self.speculative is not None:
            return self._speculative_step(batch)
        tokens = self.runner.decode(batch)
        return [self._append(r, t) for r, t in zip(batch.requests, tokens)]

    def _speculative_step(self, batch: DecodeBatch) -> list[RequestOutput]:
        """A round for each request that can run one, a plain step for the rest (spec 3.1)."""
        spec = self.speculative
        rounds, plain = spec.split(batch.requests)
        outputs = []
        if plain:
            tokens = self.runner.decode(DecodeBatch(plain))
            outputs += [self._append(r, t) for r, t in zip(plain, tokens)]
        if rounds:
            for r, tokens in zip(rounds, spec.run(rounds)):
                slot = r.slot
                outs = []
                for t in tokens:
                    outs.append(self._append(r, t))
                    if outs[-1].finished:
                        break
                if len(outs) < len(tokens):
                    # a stop or a limit inside the round: the slot keeps exactly the kept prefix
                    spec.truncate(r, slot, len(outs))
                outputs.append(_merge(outs))
        return outputs

    def _append(self, r: Request, token: int) -> RequestOutput:
        now = time.perf_counter()
        if r.first_token_time is None:
            r.first_token_time = now
        p = r.params
        r.output_ids.append(token)
        finish = None
        if not p.ignore_eos and token in p.stop_token_ids:
            # the stop token counts as generated (usage) but never appears in the text
            finish = "stop"
            delta = r.stops.push(r.detok.flush())[0] + r.stops.flush()
        else:
            delta, matched = r.stops.push(r.detok.push([token]))
            if matched:
                finish = "stop"
            elif len(r.output_ids) >= p.max_new_tokens or r.num_tokens >= self.max_context:
                finish = "length"
                delta += r.stops.push(r.detok.flush())[0] + r.stops.flush()
        r.text += delta
        out = RequestOutput(
            request_id=r.id,
            new_token_ids=[token],
            text_delta=delta,
            prompt_tokens=len(r.prompt_ids),
            completion_tokens=len(r.output_ids),
        )
        if finish is not None:
            r.finish_reason = finish
            r.finish_time = now
            self.scheduler.finish(r)
            self._requests.pop(r.id, None)
            out.finished = True
            out.finish_reason = finish
            out.stats = self._final_stats(r)
        return out

    @staticmethod
    def _final_stats(r: Request) -> dict[str, Any]:
        t = r.timing()
        n_out = len(r.output_ids)
        return {
            **t,
            "prefill_tok_s": len(r.prompt_ids) / t["prefill_s"] if t["prefill_s"] > 0 else 0.0,
            # the first token comes from prefill: decode rate counts the tokens after it
            "decode_tok_s": (n_out - 1) / t["decode_s"] if n_out > 1 and t["decode_s"] > 0 else 0.0,
            "spec": _spec_stats(r),
        }

    # --- convenience ------------------------------------------------------------------------------

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> RequestOutput:
        """Run one request to the end (other queued requests advance too); the merged output."""
        rid = self.add_request(prompt_ids, params)
        ids: list[int] = []
        text: list[str] = []
        while True:
            for out in self.step():
                if out.request_id != rid:
                    continue
                ids += out.new_token_ids
                text.append(out.text_delta)
                if out.finished:
                    out.new_token_ids = ids
                    out.text_delta = "".join(text)
                    return out


def _merge(outs: list[RequestOutput]) -> RequestOutput:
    """One output for the tokens a speculative round appended one by one."""
    last = outs[-1]
    if len(outs) > 1:
        last.new_token_ids = [t for o in outs for t in o.new_token_ids]
        last.text_delta = "".join(o.text_delta for o in outs)
    return last


def _spec_stats(r: Request) -> dict[str, Any]:
    """Spec 3.1's counters plus acceptance = accepted / drafted, tokens/round = 1 + accepted / rounds."""
    s = r.spec
    return {
        "drafted": s.drafted,
        "accepted": s.accepted,
        "rounds": s.rounds,
        "accepted_per_position": list(s.accepted_per_position),
        "fallback_steps": s.fallback_steps,
        "acceptance": s.accepted / s.drafted if s.drafted else 0.0,
        "tokens_per_round": 1 + s.accepted / s.rounds if s.rounds else 0.0,
    }


class AsyncEngine:
    """Drives an LLMEngine on one background thread; asyncio callers stream its outputs.

    Closing or cancelling a `generate` stream (a client that went away) aborts the request; the
    slot is free before the engine's next step.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._cmds: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._stop = threading.Event()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="ninfer-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def info(self) -> dict[str, Any]:
        return self.engine.info

    def stats(self) -> dict[str, int]:
        return self.engine.stats()

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        self.engine.check_request(prompt_ids, params)
        rid = request_id or f"areq-{next(self._ids)}"
        q: asyncio.Queue[Any] = asyncio.Queue()
        self._streams[rid] = (asyncio.get_running_loop(), q)
        self._cmds.put(("add", rid, list(prompt_ids), params))
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self._cmds.put(("abort", rid))

    def abort(self, request_id: str) -> None:
        self._cmds.put(("abort", request_id))

    def shutdown(self, *, drain: bool = True, timeout: float = 30.0) -> None:
        """Stop the loop; with `drain`, first let in-flight requests finish (up to `timeout`)."""
        if drain:
            deadline = time.monotonic() + timeout
            while (self._streams or self.engine.has_unfinished()) and time.monotonic() < deadline:
                time.sleep(0.01)
        self._stop.set()
        self._cmds.put(("noop",))
        self._thread.join(timeout=5)

    # --- the engine thread ------------------------------------------------------------------------

    def _deliver(self, rid: str, item: Any) -> None:
        target = self._streams.get(rid)
        if target is None:
            return
        loop, q = target
        try:
            loop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody listens any more
            self._streams.pop(rid, None)

    def _handle(self, cmd: tuple[Any, ...]) -> None:
        kind = cmd[0]
        if kind == "add":
            _, rid, ids, params = cmd
            if rid not in self._streams:  # cancelled before it was queued
                return
            try:
                self.engine.add_request(ids, params, request_id=rid)
            except Exception as exc:  # noqa: BLE001 - reported to the caller, not swallowed
                self._deliver(rid, exc)
        elif kind == "abort":
            self.engine.abort(cmd[1])

    def _loop(self) -> None:
        while not self._stop.is_set():
            block = not self.engine.has_unfinished()
            try:
                cmd = self._cmds.get(block=block, timeout=0.1 if block else None) if block else self._cmds.get_nowait()
            except queue.Empty:
                cmd = None
            while cmd is not None:
                self._handle(cmd)
                try:
                    cmd = self._cmds.get_nowait()
                except queue.Empty:
                    cmd = None
            if not self.engine.has_unfinished():
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # noqa: BLE001
                # A failed step must not take the server down or leak slots: fail what was in
                # flight, free it, keep serving the next request.
                log.exception("engine step failed; aborting in-flight requests")
                for r in list(self.engine.scheduler.running) + list(self.engine.scheduler.waiting):
                    self.engine.abort(r.id)
                    self._deliver(r.id, RuntimeError(f"internal error in the engine step: {exc}"))
                continue
            for out in outputs:
                self._deliver(out.request_id, out)
