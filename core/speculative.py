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
* "columns": the verify keeps the GDN state after each of its K+1 tokens (the cache's
  `keep_columns`); the accepted count picks one. One pass, K+1 state copies.
* "replay": snapshot once, verify, restore and re-run the target over the kept tokens whenever a
  draft was rejected. Works with any cache that has snapshot/restore; costs a second forward.

For CUDA graphs the shapes are fixed per K: the verify is K+1 tokens, the drafter aligns K+1
columns and drafts K-1 single steps, and the accepted count can stay a device tensor (the
column is picked with `index_select`). The eager path here syncs the host three times a round:
the drafts (the sampler's histories count them), the accepted count and the new tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog
import torch

from ninfer.kernels.sampling import draw, point_mass_accepts, residual_without, uniforms
from ninfer.request import Request
from ninfer.sampling import Purpose

log = structlog.get_logger("ninfer.speculative")

ROLLBACKS = ("columns", "replay")
# "columns" won on every measured shape (BENCHMARKS.md, "Speculative decoding")
DEFAULT_ROLLBACK = "columns"


class SpeculativeRound:
    def __init__(self, model: Any, cache: Any, sampler: Any, drafter: Any, *, rollback: str | None = None) -> None:
        self.model = model
        self.cache = cache
        self.sampler = sampler
        self.drafter = drafter
        self.k = int(drafter.k)
        rollback = rollback or (DEFAULT_ROLLBACK if hasattr(cache, "keep_columns") else "replay")
        if rollback not in ROLLBACKS:
            raise ValueError(f"rollback {rollback!r}: use one of {ROLLBACKS}")
        if rollback == "columns" and not hasattr(cache, "keep_columns"):
            raise ValueError("this model's cache keeps no per-token state: use rollback='replay'")
        self.rollback = rollback
        self.device = model.device
        n = cache.num_slots
        # per slot: the next round's drafts, and whether they are valid (False after a plain step)
        self.drafts = torch.zeros(n, self.k, dtype=torch.long, device=self.device)
        self.ready = [False] * n
        # per slot, what `truncate` needs: the round's start E, verify ids, replay snapshot
        self._last: list[tuple[int, torch.Tensor, Any] | None] = [None] * n

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

    @torch.inference_mode()
    def run(self, requests: Sequence[Request]) -> list[list[int]]:
        """One round for each request: its A+1 new tokens (A accepted drafts, then the correction
        or bonus). Leaves each slot committed to all of them and the next drafts ready."""
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
        st = r.spec
        st.rounds += 1
        st.drafted += k
        st.accepted += accepted
        if len(st.accepted_per_position) < k:
            st.accepted_per_position.extend([0] * (k - len(st.accepted_per_position)))
        for i in range(accepted):
            st.accepted_per_position[i] += 1

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
        e, ids, snap = self._last[slot]
        r.num_computed = e + kept
        if self.rollback == "columns":
            self.cache.use_column(slot, kept - 1)
        else:
            self.cache.restore(slot, snap)
            self.model.forward(ids[:kept], self.cache, slot, e)
        self.ready[slot] = False

    def _draft(self, slots: list[int], seeds: torch.Tensor, positions: list[int]) -> torch.Tensor:
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        slot_t = torch.tensor(slots, dtype=torch.long, device=self.device)
        return self.drafter.draft(slot_t, seeds, pos, max(positions) + self.k)
