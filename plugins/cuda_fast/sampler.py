"""The sampler of the CUDA fast path: the reference sampler, whose captured-step pipeline
(`sample_rows`: penalties, top-k, temperature, min-p, top-p, the counter-based draw) runs as two
Triton launches (`ninfer.kernels.triton.sample.fused_sample`) instead of ~100 small torch ops.

A batched speculative round's acceptance (`judge`) is one more launch (`fused_judge`).

The eager calls (`probs`, `sample`) stay the reference's: they build their inputs on the host
anyway. NINFER_FUSED_SAMPLE=0 puts the captured steps back on the reference pipeline (A/B)."""

from __future__ import annotations

import os

from ninfer.kernels.sampling import ReferenceSampler
from ninfer.kernels.sampling import sample_rows as reference_rows


def fused_enabled() -> bool:
    return os.environ.get("NINFER_FUSED_SAMPLE", "1") != "0"


class TritonSampler(ReferenceSampler):
    name = "triton"

    def __init__(self) -> None:
        from ninfer_plugins.cuda_fast.plugin import GPU

        self.requirements = GPU
        self.fused = fused_enabled()

    def sample_rows(self, logits, temperature, top_k, top_p, min_p, presence, frequency, seeds, positions, purpose,
                    *, counts=None, count_rows=None, extra_ids=None, extra_len=None, group=1, pad_row=None,
                    record=False, token_out=None):  # fmt: skip
        kw = dict(counts=counts, count_rows=count_rows, extra_ids=extra_ids, extra_len=extra_len, group=group,
                  pad_row=pad_row, record=record, token_out=token_out)  # fmt: skip
        if not self.fused:
            return reference_rows(logits, temperature, top_k, top_p, min_p, presence, frequency, seeds, positions,
                                  purpose, **kw)  # fmt: skip
        from ninfer.kernels.triton.sample import fused_sample

        return fused_sample(logits, temperature, top_k, top_p, min_p, presence, frequency, seeds, positions, purpose, **kw)

    def judge(self, cand, p, drafts, seeds, starts, vocab, counts=None, slots=None):
        """A batched round's acceptance, last token and history update (ninfer.speculative.judge)
        in one launch."""
        if not self.fused:
            from ninfer.speculative import judge

            return judge(cand, p, drafts, seeds, starts, vocab, counts, slots)
        from ninfer.kernels.triton.sample import fused_judge

        return fused_judge(cand, p, drafts, seeds, starts, vocab, counts, slots)
