"""Executes one scheduled batch on the model and samples the next tokens.

This is the eager path, the one that runs everywhere (CPU parity tests included). The CUDA-graph
decode path replaces `decode` for bucketed batch sizes without changing what it returns.
"""

from __future__ import annotations

import torch

from ninfer.model import CausalLM, ModelCache
from ninfer.sampling import Purpose, Sampler
from ninfer.scheduler import DecodeBatch, PrefillChunk


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
            self.graphs = GraphDecoder(model, cache, max_batch)

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
        reqs = batch.requests
        if self.graphs is not None:
            tokens = self.graphs.decode(reqs)
            if tokens is not None:
                for r in reqs:
                    r.num_computed += 1
                return tokens
        ids = torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.long, device=self.device)
        slots = torch.tensor([r.slot for r in reqs], dtype=torch.long, device=self.device)
        positions = torch.tensor([r.num_computed for r in reqs], dtype=torch.long, device=self.device)
        hidden = self.model.decode(ids, self.cache, slots, positions)
        for r in reqs:
            r.num_computed += 1
        logits = self.model.compute_logits(hidden)
        tokens = self.sampler.sample(
            logits, [r.params for r in reqs], [r.output_ids for r in reqs], [r.num_tokens for r in reqs], Purpose.DECODE
        )
        return [int(t) for t in tokens.tolist()]
