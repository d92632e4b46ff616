"""Helpers of the spec_mtp tests: engines with and without speculation, a scripted drafter."""

from __future__ import annotations

import zlib

import torch

from ninfer.config import EngineConfig, SamplingParams
from ninfer.engine import LLMEngine
from ninfer.kernels.sampling import ReferenceSampler

VOCAB = 256
GREEDY = dict(temperature=0.0, ignore_eos=True)


def prompt_ids(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def make_engine(model, tok, *, k: int | None = None, drafter=None, rollback=None, lm_head_draft=False, max_context=512,
                max_batch=2, prefill_chunk=1024) -> LLMEngine:  # fmt: skip
    """An engine on `model`; with `k` (or a drafter) decode steps are speculative rounds."""
    from ninfer_plugins.spec_mtp.plugin import MtpSpeculator

    cache = model.allocate_cache(max_batch, max_context, "bf16")
    if drafter is None and k is not None:
        cfg = EngineConfig(model="tiny", spec="mtp", draft_tokens=k, lm_head_draft=lm_head_draft)
        drafter = MtpSpeculator().build(model, cache, cfg)
    elif drafter is not None and getattr(drafter, "verifier", None) is None:
        # the target's batched verify, as the MTP speculator gives its drafter
        from ninfer_plugins.spec_mtp.verify import HybridVerifier

        drafter.verifier = HybridVerifier(model, cache, drafter.k + 1)
    eng = LLMEngine(
        model, cache, ReferenceSampler(), tok, max_context=max_context, prefill_chunk=prefill_chunk,
        max_batch=max_batch, speculator=drafter,
    )  # fmt: skip
    if rollback is not None and eng.speculative is not None:
        eng.speculative.rollback = rollback
    return eng


def params(**kw) -> SamplingParams:
    return SamplingParams(**{"max_new_tokens": 32, **GREEDY, **kw})


class ScriptedDrafter:
    """Drafts the known greedy continuation `seq` (prompt + output), right for exactly
    `right(position)` tokens of each round and wrong after: every accepted count is scripted.

    Its "MTP output" rows are just their absolute positions, which is all `draft` needs."""

    def __init__(self, seq: list[int], k: int, right=None) -> None:
        self.seq, self.k = seq, k
        self.right = right or (lambda p: zlib.crc32(p.to_bytes(4, "little")) % (k + 1))
        self.log: list[int] = []  # scripted accepted count of each draft, in order

    verifier = None

    def align(self, slot, next_ids, hidden, start):
        return torch.arange(start, start + len(next_ids), dtype=torch.float32)[:, None]

    def align_rows(self, slots, next_ids, hidden, positions, max_len):
        return positions.to(torch.float32)[:, None]

    def draft(self, slots, seeds, positions, max_len):
        rows = []
        for p in positions.tolist():
            # the new anchor sits at p + 1: drafts stand for positions p + 2 ..
            truth = [self.seq[i] if i < len(self.seq) else 0 for i in range(p + 2, p + 2 + self.k)]
            n = self.right(p)
            self.log.append(n)
            rows.append(truth[:n] + [(t + 1) % VOCAB for t in truth[n:]])
        return torch.tensor(rows, dtype=torch.long)
