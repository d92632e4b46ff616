"""SpeculativeRound: draft K tokens, verify them in one target pass, accept, roll back (spec 3.1-3.2).

A round for a sequence whose processed frontier is E, whose last sampled token (the anchor `a`,
not yet run through the target) sits at E and whose drafter proposed d_1..d_K:

1. verify: one target forward over [a, d_1..d_K] at positions E..E+K -> K+1 distributions
   p_0..p_K, each the sampler's processed distribution with the drafts before it in the history;
2. accept: column i judges d_{i+1}. A point-mass draft is kept with probability p_i(d_{i+1})
   (a Purpose.SPEC_ACCEPT uniform); the first rejected column draws the correction from p_i with
   the draft removed (SPEC_CORRECTION); when all K pass, a bonus is drawn from p_K (SPEC_BONUS).
   Each token is therefore distributed exactly as p_i, as without speculation; greedy rows are
   point masses, so this is "longest matching prefix plus the target's token";
3. roll back: KV columns past the kept length are stale and simply overwritten later; the Gated
   DeltaNet state is set to the state after the last kept token (see ROLLBACK below);
4. re-draft: the drafter aligns its own state over the kept columns and proposes the next K.

The engine feeds the A+1 tokens through `_append` one by one; when a stop or a length limit ends
the request inside the round it calls `truncate`, which rolls the slot back to the kept prefix.

ROLLBACK of the recurrent state, measured in BENCHMARKS.md ("Speculative decoding"):
* "columns": the verify keeps the GDN state after each of its K+1 tokens (the verifier's
  columns, or the cache's `keep_columns`); the accepted count picks one. One pass, K+1 states.
* "replay": snapshot once, verify, restore and re-run the target over the kept tokens whenever a
  draft was rejected. Works with any cache that has snapshot/restore; costs a second forward.

BATCHED ROUNDS (a drafter with a `verifier`, the MTP speculator's, and "columns"): one round of
every sequence of the batch is one step of tensor ops with no host sync: the verify of B*(K+1)
rows (`verifier.forward`), the sampler's processed distributions with each column's history
(the slot's device-side counts plus the drafts before it), acceptance, correction and bonus
with counter-based uniforms, the GDN commit (`verifier.commit`, the accepted count a device
tensor), the history update, the drafter's alignment over all columns (`drafter.align_rows`)
and the next K drafts, left on the device for the next round. The host writes the inputs with
one copy and reads the kept tokens and accepted counts back: one sync per round. With the
runner's CUDA graphs (`graphs`, ninfer.graphs) the step is captured per batch size (exact sizes
up to EXACT_UP_TO, so no padding row ever runs it) and replayed; otherwise (`--no-cuda-graph`,
the CPU, other sizes) the very same step runs eagerly, so both give the same tokens.

ROUNDS LAUNCHED AHEAD (default; NINFER_SPEC_AHEAD=0 turns it off): a round leaves each row's
next anchor and start on the device (`next_in`), so the batch's next round can be launched (a
graph replayed, or eagerly on the same rule) right after it, before the host reads its results.
The host's reading, the engine's detokenizing and stop checks, and the next bookkeeping then
overlap the GPU (0.49
ms of a 13.8 ms 27B round were host time; the H200 measured 13.51 -> 13.30 ms a round,
BENCHMARKS.md "Eleventh run"). A round is launched ahead
only when every request keeps room for it whatever the round before accepts (context and
output budget), so the engine's next step runs a round for each of them. A request that stops
on a token inside the round before wastes the one ahead, harmlessly (its slot is reset when
next allocated). When the next batch differs, each row still valid (same request and slot, at
the frontier and fed the token that the round before it ended on) is kept for its request.

Other drafters (a scripted one in tests, or "replay") take the per-sequence path below, which
syncs three times a round: the drafts, the accepted count and the new tokens.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch

from ninfer.kernels.epoch import new_epoch
from ninfer.kernels.sampling import (
    counter_uniform,
    draw,
    draw_candidates,
    point_mass_accepts,
    residual_without,
    uniforms,
)
from ninfer.request import Request
from ninfer.sampling import Purpose, rows_sampler, sampling_logits

# rows of the int64 and float32 input buffers of a batched round (one column per sequence); the
# float rows are ninfer.graphs.sampling_columns' order
_ANCHOR, _START, _SLOTS, _SEEDS, _TOP_K = range(5)  # anchor and start adjacent: `next_in`'s order
_TEMP, _TOP_P, _MIN_P, _PRESENCE, _FREQUENCY = range(5)

log = structlog.get_logger("ninfer.speculative")

ROLLBACKS = ("columns", "replay")
# "columns" won on every measured shape (BENCHMARKS.md, "Speculative decoding")
DEFAULT_ROLLBACK = "columns"


def ahead_enabled() -> bool:
    """Batched rounds are launched one ahead (see `_launch_ahead`) unless NINFER_SPEC_AHEAD=0."""
    return os.environ.get("NINFER_SPEC_AHEAD", "1") != "0"


@dataclass
class _Round:
    """A batched round launched for `requests` (in order) and not read yet: its results are on
    their way to `host` (an event marks their arrival). A round launched ahead also carries what
    each row ran at (its start, the output length it follows, the anchor it fed), filled in when
    the round before it is read."""

    requests: list[Request]
    slots: list[int]
    host: torch.Tensor
    done: Any
    t: tuple[float, float, float]  # host clock: launch begun, inputs written, graph launched
    starts: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    fed: list[int] = field(default_factory=list)
    rows: list[list[int]] | None = None

    def read(self) -> list[list[int]]:
        if self.rows is None:
            if self.done is not None:
                self.done.synchronize()
            self.rows = self.host[: len(self.requests)].tolist()
        return self.rows

    def valid_for(self, j: int, r: Request, ready: list[bool]) -> bool:
        """Whether row j ran exactly the round `r` needs now: same request and slot, at r's frontier,
        after every token of the round before it, fed that round's last token."""
        return (self.requests[j] is r and r.slot == self.slots[j] and len(self.starts) > j and not r.finished and ready[r.slot]
                and r.num_computed == self.starts[j] and len(r.output_ids) == self.outputs[j]
                and r.output_ids[-1] == self.fed[j])


class SpeculativeRound:
    def __init__(
        self, model: Any, cache: Any, sampler: Any, drafter: Any, *, rollback: str | None = None, graphs: Any = None
    ) -> None:
        self.model = model
        self.cache = cache
        self.sampler = sampler
        self.drafter = drafter
        self.k = int(drafter.k)
        # the target's batched verify pass (batched rounds); None: the per-sequence path
        self.verifier = getattr(drafter, "verifier", None)
        can_keep = hasattr(cache, "keep_columns") or self.verifier is not None
        rollback = rollback or (DEFAULT_ROLLBACK if can_keep else "replay")
        if rollback not in ROLLBACKS:
            raise ValueError(f"rollback {rollback!r}: use one of {ROLLBACKS}")
        if rollback == "columns" and not can_keep:
            raise ValueError("this model's cache keeps no per-token state: use rollback='replay'")
        self.rollback = rollback
        self.device = model.device
        n = cache.num_slots
        # per slot: the next round's drafts, and whether they are valid (False after a plain step)
        self.drafts = torch.zeros(n, self.k, dtype=torch.long, device=self.device)
        self.ready = [False] * n
        # per slot, what `truncate` needs: the round's start E, verify ids (None: a batched round),
        # replay snapshot
        self._last: list[tuple[int, torch.Tensor | None, Any] | None] = [None] * n
        # host seconds of batched rounds by phase (inputs written, graph launched, waiting for the
        # results, bookkeeping after): `ninfer bench` reports where a round's wall time goes
        self.host_s = {"prepare": 0.0, "launch": 0.0, "wait": 0.0, "after": 0.0}
        # a batched round launched ahead and not read yet (unless NINFER_SPEC_AHEAD=0; `_init_batched`)
        self._pending: _Round | None = None
        if self.verifier is not None:
            self._init_batched(graphs)

    def _init_batched(self, graphs: Any) -> None:
        from ninfer.graphs import HistoryCounts, StepInputs

        n, dev = self.cache.num_slots, self.device
        self.vocab = self.model.shape.vocab_size
        self.inputs = StepInputs(5, 5, n, torch.device(dev))
        self.ints, self.floats = self.inputs.ints, self.inputs.floats
        # per sequence: the K+1 tokens the round keeps from (the first `accepted + 1`), then `accepted`
        self.out = torch.zeros(n, self.k + 2, dtype=torch.int64, device=dev)
        # constants of a round of every batch size (columns 0..K, their repeat over the batch, and
        # each sequence's first row), made once here rather than as launches inside every round
        m = self.k + 1
        self._col = torch.arange(m, device=dev)
        self._col_rep = self._col.repeat(n)
        self._row0 = torch.arange(n, device=dev) * m
        # the round's first and last bookkeeping as one Triton launch each (`spec_round`) where the
        # model's decode is fit for a graph (its fused kernels); NINFER_ROUND_IO=0 keeps the torch ops (A/B)
        self._fused_io = getattr(self.model, "graph_decode", False) and os.environ.get("NINFER_ROUND_IO", "1") != "0"
        # rounds launched one ahead (on unless NINFER_SPEC_AHEAD=0): the round in flight, rows of rounds whose
        # batch changed (by request id), and two host buffers for the results (a round launched
        # ahead copies its results while the one before it is read)
        self.ahead = ahead_enabled()
        self.ahead_rounds = 0
        self._kept: dict[str, tuple[_Round, int]] = {}
        cuda = torch.device(dev).type == "cuda"
        self._out_host = [torch.zeros(n, self.k + 2, dtype=torch.int64, pin_memory=cuda) for _ in range(2)]
        self._flip = 0
        # each round's next anchor and start, left on the device by the round itself
        self.next_in = torch.zeros(2, n, dtype=torch.int64, device=dev)
        # the runner's graphs share their pool and history counts with the rounds
        self.graphs = graphs
        self.history = graphs.history if graphs is not None else HistoryCounts(n, self.vocab, dev)
        self.sample_rows = rows_sampler(self.sampler)
        self.judge = getattr(self.sampler, "judge", None) or judge
        reason = "the runner decodes eagerly (its reason: --no-cuda-graph, the device, or the model)"
        if graphs is not None:
            drafter_reason = getattr(self.drafter, "graph_reason", lambda: "the drafter cannot be captured")
            reason = drafter_reason()
        # why rounds run eagerly (None: captured per batch size up to EXACT_UP_TO)
        self.eager_reason: str | None = reason

    # --- prompt --------------------------------------------------------------------------------

    @torch.inference_mode()
    def prefilled(self, r: Request, start: int, end: int, hidden: torch.Tensor, token: int | None) -> None:
        """After a prompt chunk [start, end) ran through the target (hidden [T, H]): align the
        drafter over it (each column sees the NEXT token: the prompt's, or on the last chunk the
        first sampled token) and, on the last chunk, draft the first round."""
        slot = r.slot
        last = token is not None
        nxt = r.prompt_ids[start + 1 : end] + ([token] if last else [r.prompt_ids[end]])
        now, nxt = (torch.tensor(x, dtype=torch.long, device=self.device) for x in (r.prompt_ids[start:end], nxt))
        out = self.drafter.align(slot, *self._mtp_inputs(now, nxt, hidden), start)
        self.ready[slot] = last
        if last:
            self.drafts[slot] = self._draft([slot], out[-1:], [end - 1])[0]

    # --- decode --------------------------------------------------------------------------------

    def split(self, requests: Sequence[Request]) -> tuple[list[Request], list[Request]]:
        """(requests that run a round, requests that take a plain step). A round needs valid drafts,
        room for K+1 positions in the context and at least two tokens of output budget left
        (spec 3.1: near capacity or budget, ordinary steps); a plain step leaves the drafter
        behind, so that sequence stays on plain steps."""
        rounds, plain = [], []
        for r in requests:
            room = r.num_tokens + self.k <= self.cache.max_context
            budget = r.params.max_new_tokens - len(r.output_ids) >= 2
            if self.ready[r.slot] and room and budget:
                rounds.append(r)
            else:
                self.ready[r.slot] = False
                r.spec.fallback_steps += 1
                plain.append(r)
        return rounds, plain

    @property
    def batched(self) -> bool:
        return self.verifier is not None and self.rollback == "columns"

    @torch.inference_mode()
    def run(self, requests: Sequence[Request]) -> list[list[int]]:
        """One round for each request: its A+1 new tokens (A accepted drafts, then the correction
        or bonus). Leaves each slot committed to all of them and the next drafts ready."""
        if self.batched:
            return self._run_batched(requests)
        tokens, seeds, positions = [], [], []
        for r in requests:
            toks, seed, pos = self._round(r)
            tokens.append(toks)
            seeds.append(seed)
            positions.append(pos)
        drafts = self._draft([r.slot for r in requests], torch.stack(seeds), positions)
        for r, d in zip(requests, drafts):
            self.drafts[r.slot] = d
        return tokens

    def _round(self, r: Request) -> tuple[list[int], torch.Tensor, int]:
        k, slot, p = self.k, r.slot, r.params
        e = r.num_computed
        drafts = self.drafts[slot]
        ids = torch.cat((torch.tensor([r.output_ids[-1]], dtype=torch.long, device=self.device), drafts))
        snap = None
        if self.rollback == "columns":
            self.cache.keep_columns(slot, k + 1)
        else:
            snap = self.cache.snapshot(slot)
        try:
            hidden = self.model.forward(ids, self.cache, slot, e)
        finally:
            if self.rollback == "columns":
                self.cache.stop_keeping(slot)
        logits = self.model.compute_logits(hidden)

        # column i judges d_{i+1}, the token at absolute position e+1+i, with the drafts before it
        # in the history (penalties count provisionally accepted drafts: spec 3.1)
        d = drafts.tolist()
        probs = self.sampler.probs(logits, [p] * (k + 1), [r.output_ids + d[:i] for i in range(k + 1)])
        u = uniforms([p] * k, range(e + 1, e + 1 + k), Purpose.SPEC_ACCEPT, self.device)
        ok = point_mass_accepts(probs[:k], drafts, u)
        accepted = int(torch.cumprod(ok.to(torch.int64), 0).sum())
        pos = e + 1 + accepted
        if accepted < k:
            dist = residual_without(probs[accepted : accepted + 1], drafts[accepted : accepted + 1])
            last = draw(dist, uniforms([p], [pos], Purpose.SPEC_CORRECTION, self.device))
        else:
            last = draw(probs[k:], uniforms([p], [pos], Purpose.SPEC_BONUS, self.device))
        out = d[:accepted] + [int(last[0])]

        self._commit(r, e, ids, snap, accepted + 1)
        self._last[slot] = (e, ids, snap)
        self._count(r, accepted)

        # the drafter's columns are the verify columns, each with its next token: the verify ids
        # shifted left, the correction or bonus at index `accepted`; all K+1 run (fixed shape), the
        # ones past `accepted` are overwritten before anything reads them
        nxt = torch.cat((drafts, last))
        nxt[accepted] = last[0]
        mtp_out = self.drafter.align(slot, *self._mtp_inputs(ids, nxt, hidden), e)
        return out, mtp_out[accepted], e + accepted

    def _mtp_inputs(self, now: torch.Tensor, nxt: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What the drafter's columns see, given each column's token `now`, the token after it `nxt`
        and the target's hidden there (spec 3.3): the hidden of position t with the token of t+1.
        (The acceptance test overrides this with the classic mis-wirings to show they cost.)"""
        return nxt, hidden

    def _commit(self, r: Request, e: int, ids: torch.Tensor, snap: Any, kept: int) -> None:
        """Make the slot hold exactly the first `kept` verify tokens: the anchor and kept-1 drafts."""
        if kept < ids.shape[0]:
            if self.rollback == "columns":
                self.cache.use_column(r.slot, kept - 1)
            else:
                self.cache.restore(r.slot, snap)
                self.model.forward(ids[:kept], self.cache, r.slot, e)
        r.num_computed = e + kept

    @torch.inference_mode()
    def truncate(self, r: Request, slot: int, kept: int) -> None:
        """The engine kept only `kept` tokens of the last round (a stop or a length limit inside it):
        roll `slot` back to them, so the slot holds exactly the committed prefix."""
        pending = self._pending
        if pending is not None and any(q is r for q in pending.requests) and not r.finished:
            # a round launched ahead already moved this slot past the round being cut: only a
            # request that ends here may be cut (the engine cuts on a stop or a length limit)
            raise RuntimeError(f"request {r.id}: cut inside a round while the next one runs ahead, and not finished")
        e, ids, snap = self._last[slot]
        r.num_computed = e + kept
        if ids is None:
            if getattr(self.verifier, "replayed", False):
                # the round's commit replayed the kept tokens on the slot's state in place
                # (NINFER_GDN_REPLAY, the default): there is no earlier state to cut back to. Only a request
                # that ends here is cut, and its slot is reset before it is used again.
                if not r.finished:
                    raise RuntimeError(f"request {r.id}: cut inside a round whose GDN commit replayed in place, "
                                       "and not finished")
            else:
                # a batched round: its columns still hold every verified token's state
                one = torch.tensor([slot], dtype=torch.long, device=self.device)
                self.verifier.commit(one, torch.tensor([kept - 1], dtype=torch.long, device=self.device))
            self.history.forget(slot)
        elif self.rollback == "columns":
            self.cache.use_column(slot, kept - 1)
        else:
            self.cache.restore(slot, snap)
            self.model.forward(ids[:kept], self.cache, slot, e)
        self.ready[slot] = False

    def _draft(self, slots: list[int], seeds: torch.Tensor, positions: list[int]) -> torch.Tensor:
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        slot_t = torch.tensor(slots, dtype=torch.long, device=self.device)
        return self.drafter.draft(slot_t, seeds, pos, max(positions) + self.k)

    def _count(self, r: Request, accepted: int) -> None:
        st, k = r.spec, self.k
        st.rounds += 1
        st.drafted += k
        st.accepted += accepted
        if len(st.accepted_per_position) < k:
            st.accepted_per_position.extend([0] * (k - len(st.accepted_per_position)))
        for i in range(accepted):
            st.accepted_per_position[i] += 1

    # --- batched rounds -------------------------------------------------------------------------

    def _run_batched(self, requests: Sequence[Request]) -> list[list[int]]:
        reqs = list(requests)
        pending, self._pending = self._pending, None
        if pending is not None:
            if len(pending.requests) == len(reqs) and all(pending.valid_for(j, r, self.ready) for j, r in enumerate(reqs)):
                # that round is already running: launch the one after it, then read it
                self._pending = self._launch_ahead(reqs)
                self.ahead_rounds += 1
                return self._book(pending, reqs)
            self._keep(pending)
        if self._kept:
            # what belongs to finished requests goes first (a new request may reuse a finished one's id)
            self._kept = {rid: v for rid, v in self._kept.items() if not v[0].requests[v[1]].finished}
            kept = [self._kept.pop(r.id, None) for r in reqs]
            if any(v is not None for v in kept):
                return self._with_kept(reqs, kept)
        launched = self._launch(reqs)
        self._pending = self._launch_ahead(reqs)
        return self._book(launched, reqs)

    def _launch(self, reqs: list[Request], ahead: bool = False) -> _Round:
        """One round of reqs, launched without waiting. ahead: the round after the one just
        launched for the same requests, fed on the device (the round leaves each row's next
        anchor and start in `next_in`); otherwise the host writes the inputs."""
        from ninfer.graphs import EXACT_UP_TO, sampling_columns

        b, k = len(reqs), self.k
        t0 = time.perf_counter()
        if ahead:
            # fed on the device: the round just launched left each row's next anchor and start
            self.ints[_ANCHOR : _START + 1, :b].copy_(self.next_in[:, :b])
        else:
            self.history.sync(reqs)
            ints = [[0] * b for _ in range(5)]
            floats = [[0.0] * b for _ in range(5)]
            for j, r in enumerate(reqs):
                ints[_ANCHOR][j] = r.output_ids[-1]
                ints[_SLOTS][j] = r.slot
                ints[_START][j] = r.num_computed
                ints[_SEEDS][j], ints[_TOP_K][j], row = sampling_columns(r.params)
                for n, v in enumerate(row):
                    floats[n][j] = v
            self.inputs.write(ints, floats)
        graph = self._graph(b) if self.eager_reason is None and b <= EXACT_UP_TO else None
        t1 = time.perf_counter()
        if graph is not None:
            graph.replay()
            new_epoch()  # what kernels noted as prepared may be overwritten (ninfer.kernels.epoch)
        else:
            # bounds of the reference attention's reads: the verify and alignment reach E+K, the
            # drafts E+A+K-1 <= E+2K-1; a round launched ahead starts up to K+1 past the frontier
            # the host knows (the round before it is not read yet)
            e = max(r.num_computed for r in reqs) + (k + 1 if ahead else 0)
            self._round_step(b, e + k + 1, e + 2 * k)
        # the results on their way to the host (the next round, if launched ahead, rewrites `out`
        # after this copy in stream order)
        self._flip ^= 1
        host = self._out_host[self._flip]
        cuda = self.out.is_cuda
        host[:b].copy_(self.out[:b], non_blocking=cuda)
        done = None
        if cuda:
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
        return _Round(reqs, [r.slot for r in reqs], host, done, (t0, t1, time.perf_counter()))

    def _launch_ahead(self, reqs: list[Request]) -> _Round | None:
        """The batch's next round, launched before the one just launched is read (so the host's
        reading, the engine's detokenizing, stop checks and scheduling overlap the GPU); None where
        it is off, the batch is past EXACT_UP_TO, or some request might take a plain step or
        finish on length before it (every request keeps room for it however many drafts the
        round before accepts). A request that stops on a token inside the round before wastes
        this one, harmlessly: its slot is reset when next allocated.

        Eager rounds (--no-cuda-graph, the CPU, a batch size whose capture failed) run ahead on
        the same rule, so which rows run together does not depend on capture. A row's bits
        depend on its batch where kernels change with the row count (the MoE runs up to 4
        tokens on the pair kernels and more on the tiles): a captured engine that ran rounds
        ahead and an eager one that did not gave different greedy tokens on the medium int4
        35B-A3B (twenty-second session)."""
        from ninfer.graphs import EXACT_UP_TO

        k, b = self.k, len(reqs)
        if not self.ahead or b > EXACT_UP_TO:
            return None
        for r in reqs:
            if (r.num_tokens + 2 * k + 1 > self.cache.max_context
                    or r.params.max_new_tokens - len(r.output_ids) - (k + 1) < 2):
                return None
        return self._launch(reqs, ahead=True)

    def _book(self, launched: _Round, reqs: list[Request]) -> list[list[int]]:
        """Read a round's results and do its bookkeeping; a round launched after it (ahead) learns
        what it ran at."""
        t2 = time.perf_counter()
        rows = launched.read()
        t3 = time.perf_counter()
        nxt = self._pending if self._pending is not None and self._pending.requests is reqs else None
        tokens = []
        for r, row in zip(reqs, rows):
            accepted = row[self.k + 1]
            tokens.append(self._book_row(r, row))
            if nxt is not None:
                nxt.starts.append(r.num_computed)
                nxt.outputs.append(len(r.output_ids) + accepted + 1)
                nxt.fed.append(row[accepted])
        h, (t0, t1, tl) = self.host_s, launched.t
        h["prepare"] += t1 - t0
        h["launch"] += tl - t1
        h["wait"] += t3 - t2
        h["after"] += time.perf_counter() - t3
        return tokens

    def _book_row(self, r: Request, row: list[int]) -> list[int]:
        accepted = row[self.k + 1]
        e = r.num_computed
        r.num_computed = e + accepted + 1
        self._last[r.slot] = (e, None, None)
        self._count(r, accepted)
        # the engine appends the kept tokens: the counts row already holds them
        self.history.counted(r, len(r.output_ids) + accepted + 1)
        return row[: accepted + 1]

    def _keep(self, launched: _Round) -> None:
        """The batch changed under a round launched ahead: keep each row for its request."""
        launched.read()
        for j, r in enumerate(launched.requests):
            self._kept[r.id] = (launched, j)

    def _with_kept(self, reqs: list[Request], kept: list) -> list[list[int]]:
        """Requests whose round already ran ahead take its rows; the others run a round now."""
        tokens: list[list[int] | None] = [None] * len(reqs)
        for j, (r, v) in enumerate(zip(reqs, kept)):
            if v is None:
                continue
            launched, row = v
            if not launched.valid_for(row, r, self.ready):
                raise RuntimeError(f"request {r.id}: a speculative round ran ahead for it, and its sequence then "
                                   "changed other than by the round before it (a bug: its state is a round on)")
            tokens[j] = self._book_row(r, launched.read()[row])
        rest = [r for r, t in zip(reqs, tokens) if t is None]
        if rest:
            it = iter(self._book(self._launch(rest), rest))
            tokens = [t if t is not None else next(it) for t in tokens]
        return tokens  # type: ignore[return-value]

    def _graph(self, b: int) -> Any:
        """The round of b sequences as a CUDA graph, captured on first use from the inputs just
        written: the warm-up runs two real rounds, so it puts back what a round moves that the
        replay does not rewrite first (the slots' GDN state, their drafts and history counts;
        K/V columns are rewritten before they are read)."""
        key = ("spec", b)
        if key in self.graphs.graphs or key in self.graphs.failed:
            return self.graphs.graphs.get(key)
        slots = self.ints[_SLOTS, :b].clone()

        def warm_up() -> None:
            state = self.verifier.snapshot(slots)
            drafts, counts = self.drafts.index_select(0, slots), self.history.counts.index_select(0, slots)
            try:
                self._round_step(b, None, None)
                self._round_step(b, None, None)
            finally:
                self.verifier.restore(slots, state)
                self.drafts.index_copy_(0, slots, drafts)
                self.history.counts.index_copy_(0, slots, counts)

        return self.graphs.capture(key, lambda: self._round_step(b, None, None), warm_up)

    def _verify(self, b: int, verify_len: int | None) -> tuple[torch.Tensor, ...]:
        """The target's pass over each sequence's anchor and drafts: (drafts [b, K], ids [b, M],
        positions [b, M], row slots [b*M], hidden [b*M, H], logits [b*M, V]); rows are
        sequence-major (b * M + column)."""
        slots, starts, anchor = self.ints[_SLOTS, :b], self.ints[_START, :b], self.ints[_ANCHOR, :b]
        if self._fused_io:
            from ninfer.kernels.triton.spec_round import round_inputs

            drafts, ids, pos, rows = round_inputs(self.drafts, slots, anchor, starts)
        else:
            drafts = self.drafts.index_select(0, slots)
            ids = torch.cat((anchor[:, None], drafts), 1)
            pos = starts[:, None] + self._col
            rows = slots[:, None].expand(b, self.k + 1).reshape(-1)
        hidden = self.verifier.forward(ids.reshape(-1), rows, pos.reshape(-1), slots, verify_len)
        return drafts, ids, pos, rows, hidden, sampling_logits(self.model, hidden)

    def _round_step(self, b: int, verify_len: int | None, draft_len: int | None) -> None:
        """One round of the first b sequences of the input buffers, tensor ops only (see BATCHED
        ROUNDS above); the reference attention's bounds are None when captured (fused kernels
        read lengths on the device)."""
        m, vocab, dev = self.k + 1, self.vocab, self.device
        i, f = self.ints[:, :b], self.floats[:, :b]
        slots, starts, seeds = i[_SLOTS], i[_START], i[_SEEDS]
        drafts, ids, pos, rows, hidden, logits = self._verify(b, verify_len)

        # column i judges d_{i+1} with the drafts before it in the history (spec 3.1): the slot's
        # counts plus d_0..d_{i-1} (extra_len = i), read in place by the sampler; the parameters,
        # the counts row and the drafts are the sequence's, shared by its m columns (group = m)
        cand, p, _ = self.sample_rows(
            logits, f[_TEMP], i[_TOP_K], f[_TOP_P], f[_MIN_P], f[_PRESENCE], f[_FREQUENCY], None, None, 0,
            counts=self.history.counts, count_rows=slots, extra_ids=drafts, extra_len=self._col_rep[: b * m],
            group=m,
        )  # fmt: skip
        # acceptance, the last token, and the kept tokens counted in the slots' histories
        accepted, kept = self.judge(
            cand.view(b, m, -1), p.view(b, m, -1), drafts, seeds, starts, vocab, self.history.counts, slots
        )
        at = accepted[:, None]
        self.verifier.commit(slots, accepted)

        # the drafter's columns are the verify columns, each with the token after it (`kept`: the
        # verify ids shifted left, `last` at `accepted`); the ones past `accepted` are overwritten
        # before anything reads them
        tokens, seen = self._mtp_inputs(ids.reshape(-1), kept.reshape(-1), hidden)
        if hasattr(self.drafter, "align_seeds") and os.environ.get("NINFER_MTP_SEED_ROWS", "1") != "0":
            # only the seed columns go past the MTP's attention (every column's K/V is written);
            # NINFER_MTP_SEED_ROWS=0: all columns through the layer, the seeds picked after (A/B)
            keep = self._row0[:b] + accepted
            seed_rows = self.drafter.align_seeds(rows, tokens, seen, pos.reshape(-1), verify_len, keep, columns=m)
        else:
            out = self.drafter.align_rows(rows, tokens, seen, pos.reshape(-1), verify_len)
            seed_rows = out.view(b, m, -1).gather(1, at[:, :, None].expand(b, 1, out.shape[-1]))[:, 0]
        new = self.drafter.draft(slots, seed_rows, starts + accepted, draft_len)
        # the new drafts into the slots' table, the kept tokens and `accepted` out, and the next
        # round's anchor (this round's last token) and start (past the kept tokens), for a round
        # launched ahead (`_launch` copies them into the inputs before its replay)
        if self._fused_io and all(t.dtype == torch.int64 and t.device == self.drafts.device for t in (new, kept, accepted)):
            from ninfer.kernels.triton.spec_round import round_outputs

            round_outputs(kept.contiguous(), accepted, new, slots, starts, self.drafts, self.out, self.next_in)
            return
        self.drafts.index_copy_(0, slots, new.to(device=dev, dtype=self.drafts.dtype))
        self.out[:b, :m].copy_(kept)
        self.out[:b, m].copy_(accepted)
        self.next_in[0, :b].copy_(kept.gather(1, at)[:, 0])
        self.next_in[1, :b].copy_(starts + accepted + 1)


def judge(
    cand: torch.Tensor,
    p: torch.Tensor,
    drafts: torch.Tensor,
    seeds: torch.Tensor,
    starts: torch.Tensor,
    vocab: int,
    counts: torch.Tensor | None = None,
    slots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Acceptance and the last token of a batch of rounds (spec 3.1), in tensors with no host sync.

    cand, p [B, K+1, C]: each verify column's processed distribution as candidates (ids and
    probabilities, `process`'s output); drafts [B, K]; seeds and starts (the frontier E) [B].
    Column i accepts d_{i+1} with probability p_i(d_{i+1}) (SPEC_ACCEPT uniform at E+1+i); the
    first rejected column draws the correction from p_i without the draft (SPEC_CORRECTION), and
    when all K pass the bonus is drawn from p_K (SPEC_BONUS), both at position E+1+accepted.
    Returns (accepted [B], kept [B, K+1]: the accepted drafts, then the last token, then drafts
    past it). The same tokens as the dense functions (point_mass_accepts, residual_without,
    draw) on scatter_probs of the same candidates. With `counts` [S, V] and `slots` [B], the
    history of slot b counts its kept tokens (the first accepted + 1).

    The reference; a sampler may carry a faster `judge` with this signature (cuda_fast's is one
    Triton launch)."""
    b, k = drafts.shape
    pos = starts[:, None] + torch.arange(1, k + 1, device=drafts.device)
    u = counter_uniform(seeds[:, None], pos, int(Purpose.SPEC_ACCEPT))
    # p_i(d_{i+1}): the draft's probability among column i's candidates (0 when it is not one)
    p_draft = torch.where(cand[:, :k] == drafts[:, :, None], p[:, :k], 0.0).sum(-1)
    accepted = torch.cumprod((u < p_draft).to(torch.int64), 1).sum(1)
    at = accepted[:, None]
    width = cand.shape[-1]
    col_ids = cand.gather(1, at[:, :, None].expand(b, 1, width))[:, 0]  # column `accepted`
    col_p = p.gather(1, at[:, :, None].expand(b, 1, width))[:, 0]
    rejected = torch.cat((drafts, drafts[:, :1]), 1).gather(1, at)  # (any id when all passed)
    corrected = accepted < k
    # the correction's distribution: the column without the rejected draft, renormalised (where
    # the draft held all the mass it was never rejected)
    rest = torch.where(col_ids == rejected, 0.0, col_p)
    total = rest.sum(-1, keepdim=True)
    rest = torch.where(total > 0, rest / total.clamp_min(torch.finfo(torch.float32).tiny), col_p)
    dist = torch.where(corrected[:, None], rest, col_p)
    purpose = torch.where(corrected, int(Purpose.SPEC_CORRECTION), int(Purpose.SPEC_BONUS))
    last = draw_candidates(col_ids, dist, vocab, counter_uniform(seeds, starts + 1 + accepted, purpose))
    kept = torch.cat((drafts, last[:, None]), 1).scatter(1, at, last[:, None])
    if counts is not None:
        keep = (torch.arange(k + 1, device=drafts.device)[None, :] <= at).to(counts.dtype)
        counts.view(-1).scatter_add_(0, (slots[:, None] * counts.shape[1] + kept).reshape(-1), keep.reshape(-1))
    return accepted, kept
