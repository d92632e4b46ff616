"""The decode step captured in CUDA graphs: one graph per batch-size bucket, replayed per step.

A step is the model's `decode` (one token for each row), its logits and the sampler's whole
pipeline (`ninfer.kernels.sampling`: penalties, top-k, temperature, min-p, top-p, the counter-based
uniform, the inverse-CDF draw), all tensor ops on static buffers: no host sync inside, no
allocation outside the graph's pool. The host writes each step's inputs (ids, slots, positions,
sampling parameters) into the buffers with one copy from pinned memory (`StepInputs`), replays,
and reads the tokens back (the one sync per step, which the engine needs anyway to detokenize).

Buckets are the exact batch sizes up to EXACT_UP_TO (the same shapes as the eager path, so the
same kernels and bit-identical greedy tokens; at most 16 small graphs), then multiples of 16,
where a batch is padded with rows of slot -1 / position -1: the model then touches no state for
them (`graph_decode` models promise that) and their tokens are dropped. Each bucket is captured on
first use, after a warm-up run on padding rows only, so capturing never changes a sequence.

History counts for the penalties live on the device (`HistoryCounts`, [slots + 1, vocab], the last
row for padding): each replay adds the sampled token of each row, and the host rebuilds a slot's
row from the request's output ids whenever its bookkeeping says they diverged (a new request, a
step taken on the eager path).

Speculative rounds (ninfer.speculative) reuse this machinery: `capture(key, step, warm_up)` for
their own step (keys ("spec", b)), the same pool, and the same history counts, which a round
updates on the device with the tokens it keeps.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import structlog
import torch

from ninfer.kernels.epoch import new_epoch
from ninfer.kernels.sampling import _i64
from ninfer.sampling import Purpose, pad_count_rows, record_drawn, rows_sampler, sampling_logits

log = structlog.get_logger("ninfer.graphs")

EXACT_UP_TO = 16
# int64 rows of the input buffer, then float32 rows of the parameter buffer
_IDS, _SLOTS, _POS, _SEEDS, _SAMPLE_POS, _TOP_K = range(6)
_TEMP, _TOP_P, _MIN_P, _PRESENCE, _FREQUENCY = range(5)


def sampling_columns(p: Any) -> tuple[int, int, list[float]]:
    """One request's sampler inputs for a captured step: (seed as int64, top_k, the float rows
    [temperature, top_p, min_p, presence, frequency]); a greedy row is the same pipeline with
    top_k 1 and no penalties."""
    if p.greedy:
        return _i64(p.seed), 1, [1.0, 1.0, 0.0, 0.0, 0.0]
    return _i64(p.seed), p.effective_top_k, [p.temperature, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty]


def buckets_for(max_batch: int) -> list[int]:
    exact = list(range(1, min(max_batch, EXACT_UP_TO) + 1))
    return exact + list(range(2 * EXACT_UP_TO, max_batch + EXACT_UP_TO, EXACT_UP_TO))


def graphs_supported(model: Any, cuda_graph: bool) -> str | None:
    """Why decode steps will not be captured (None: they will)."""
    if not cuda_graph:
        return "--no-cuda-graph"
    if getattr(model, "device", torch.device("cpu")).type != "cuda":
        return "not on a CUDA device"
    # an MoE layer (a module holding `moe_prepared`, hookspecs' ninfer_moe_kernel) is capturable
    # only through a kernel that says `graph_safe` and runs this dtype; the reference routes on the host
    for bank in (m for m in getattr(model, "modules", tuple)() if hasattr(m, "moe_prepared")):
        k = getattr(bank, "kernel", None)
        if not getattr(k, "graph_safe", False) or getattr(model, "dtype", None) not in getattr(k, "fused_dtypes", ()):
            return f"the MoE kernel {getattr(k, 'name', k)} is not graph-safe here (a host sync per layer)"
    if not getattr(model, "graph_decode", False):
        return "the model's attention backends cannot run a decode step without a host sync"
    return None


class StepInputs:
    """A step's int64 and float32 input rows on the device ([int_rows, width], [float_rows, width]),
    views of one byte buffer that the host fills with one copy. On a GPU the copy comes from pinned
    memory and does not block the host, where two copies from pageable memory each waited for the
    stream. The staging buffer is only rewritten once the previous copy has run (an event), so a
    caller may write again before anything synchronises."""

    def __init__(self, int_rows: int, float_rows: int, width: int, device: torch.device) -> None:
        self.width = width
        n_int = int_rows * width * 8
        total = n_int + float_rows * width * 4
        self.cuda = device.type == "cuda"
        self.device = device
        self._device = torch.zeros(total, dtype=torch.uint8, device=device)
        self._host = torch.zeros(total, dtype=torch.uint8, pin_memory=self.cuda)
        self.ints = self._device[:n_int].view(torch.int64).view(int_rows, width)
        self.floats = self._device[n_int:].view(torch.float32).view(float_rows, width)
        self._host_ints = self._host[:n_int].view(torch.int64).view(int_rows, width)
        self._host_floats = self._host[n_int:].view(torch.float32).view(float_rows, width)
        self._copied: torch.cuda.Event | None = None

    def write(self, ints: list[list[int]], floats: list[list[float]]) -> None:
        """Columns 0..len(row)-1 of every row from the lists (one list a row); the device's other
        columns take whatever the staging buffer holds there, which no step of that width reads."""
        cols = len(ints[0])
        if cols > self.width or len(floats[0]) != cols:
            raise ValueError(f"step inputs: {cols} columns for a buffer of {self.width}")
        if self._copied is not None:
            self._copied.synchronize()
        self._host_ints[:, :cols] = torch.tensor(ints, dtype=torch.int64)
        self._host_floats[:, :cols] = torch.tensor(floats, dtype=torch.float32)
        self._device.copy_(self._host, non_blocking=self.cuda)
        if self.cuda:
            self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(self.device))


class GraphDecoder:
    def __init__(self, model: Any, cache: Any, max_batch: int, sampler: Any = None) -> None:
        self.model, self.cache = model, cache
        # the sampler's tensor pipeline (a fused kernel where a plugin gives one, else the reference)
        self.sample_rows = rows_sampler(sampler)
        # the step's tail (history counts, tokens out) inside the sampler; NINFER_STEP_TAIL=0 puts
        # back the torch ops after it (A/B)
        self.tail_in_sampler = os.environ.get("NINFER_STEP_TAIL", "1") != "0"
        self.device = model.device
        self.vocab = model.shape.vocab_size
        self.buckets = buckets_for(max_batch)
        top = self.buckets[-1]
        self.inputs = StepInputs(6, 5, top, self.device)
        self.ints, self.floats = self.inputs.ints, self.inputs.floats
        self.history = HistoryCounts(cache.num_slots, self.vocab, self.device)
        self.pad_row, self.counts = self.history.pad_row, self.history.counts
        self.tokens = torch.zeros(top, dtype=torch.int64, device=self.device)
        # the sampled tokens come back through pinned memory (one DMA, then an event), two buffers
        # so that a step launched ahead does not overwrite the tokens of the one before it
        self._cuda = self.device.type == "cuda"
        self._tokens_host = [torch.zeros(top, dtype=torch.int64, pin_memory=self._cuda) for _ in range(2)]
        self._flip = 0
        # keys: a batch bucket (the decode step) or another captured step's own key (a speculative
        # round: ("spec", b)); every graph allocates from one pool, since none runs while another does
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self.failed: set[Hashable] = set()
        self.pool = None

    # --- the captured step --------------------------------------------------------------------

    def _step(self, b: int) -> None:
        i, f = self.ints[:, :b], self.floats[:, :b]
        slots = i[_SLOTS]
        hidden = self.model.decode(i[_IDS], self.cache, slots, i[_POS])
        if not self.tail_in_sampler:
            rows = pad_count_rows(slots, self.pad_row)
            _, _, token = self.sample_rows(
                self.model.compute_logits(hidden), f[_TEMP], i[_TOP_K], f[_TOP_P], f[_MIN_P], f[_PRESENCE],
                f[_FREQUENCY], i[_SEEDS], i[_SAMPLE_POS], int(Purpose.DECODE), counts=self.counts, count_rows=rows,
            )  # fmt: skip
            record_drawn(token, self.counts, rows, True, self.tokens[:b])
            return
        # the sampler also counts each token into its slot's history (padding rows, slot -1, all
        # into the pad row, with atomic adds) and writes the tokens out: no launches after it
        self.sample_rows(
            sampling_logits(self.model, hidden), f[_TEMP], i[_TOP_K], f[_TOP_P], f[_MIN_P], f[_PRESENCE], f[_FREQUENCY],
            i[_SEEDS], i[_SAMPLE_POS], int(Purpose.DECODE), counts=self.counts, count_rows=slots,
            pad_row=self.pad_row, record=True, token_out=self.tokens[:b],
        )  # fmt: skip

    def _pad(self, start: int, end: int) -> None:
        self.ints[:, start:end] = 0
        self.ints[_SLOTS, start:end] = -1
        self.ints[_POS, start:end] = -1
        self.ints[_TOP_K, start:end] = 1
        self.floats[:, start:end] = 0.0
        self.floats[_TEMP, start:end] = 1.0
        self.floats[_TOP_P, start:end] = 1.0

    def _graph(self, b: int) -> torch.cuda.CUDAGraph | None:
        if b in self.graphs or b in self.failed:
            return self.graphs.get(b)
        self._pad(0, b)  # warm-up and capture see padding rows only: no sequence's state moves
        return self.capture(b, lambda: self._step(b))

    def capture(
        self, key: Hashable, step: Callable[[], None], warm_up: Callable[[], None] | None = None
    ) -> torch.cuda.CUDAGraph | None:
        """Graph `key` of `step` (tensor ops on static buffers, no host sync), captured in the shared
        pool on the first call, after `warm_up` (default: `step` twice) on a side stream: that
        compiles kernels and makes cuBLAS handles and the kernels' workspaces before capture.
        None when it cannot be captured: the key stays eager from then on."""
        if key in self.graphs or key in self.failed:
            return self.graphs.get(key)
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                if warm_up is None:
                    step()
                    step()
                else:
                    warm_up()
            torch.cuda.current_stream(self.device).wait_stream(side)
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            # inputs kernels noted as prepared are forgotten at a capture's start and end
            # (ninfer.kernels.epoch): its launches do not run then, and its replays later overwrite
            new_epoch()
            try:
                with torch.cuda.graph(graph, pool=self.pool):
                    step()
            finally:
                new_epoch()
        except Exception as exc:  # noqa: BLE001 - a step that cannot be captured still runs eagerly
            log.warning("step could not be captured; it stays eager", key=str(key), error=str(exc))
            self.failed.add(key)
            return None
        self.graphs[key] = graph
        log.debug("captured", key=str(key), graphs=len(self.graphs))
        return graph

    # --- one step -----------------------------------------------------------------------------

    def bucket(self, b: int) -> int | None:
        return next((x for x in self.buckets if x >= b), None)

    def decode(self, requests: Sequence[Any]) -> list[int] | None:
        """The next token of each request (each feeds its last sampled token at position
        num_computed), or None when no graph serves this batch size (the caller runs eagerly)."""
        wait = self.launch(requests)
        return None if wait is None else wait()

    def launch(self, requests: Sequence[Any], ahead: bool = False) -> Callable[[], list[int]] | None:
        """Write the step's inputs and replay it without waiting; returns the function that waits
        for its tokens and reads them (None when no graph serves this batch size).

        ahead: each request's step after the one just launched, before the host has seen that
        step's tokens. The ids come from the previous replay's tokens (copied on the device), the
        positions are one further, and the history counts already hold the previous token. The
        caller must launch it right after the step it follows, for the same requests in the same
        order."""
        b = len(requests)
        size = self.bucket(b)
        if size is None or size in self.failed:
            return None
        graph = self._graph(size)
        if graph is None:
            return None
        step = 1 if ahead else 0
        if not ahead:
            self.history.sync(requests)
        ints = [[0] * size for _ in range(6)]
        floats = [[0.0] * size for _ in range(5)]
        for j, r in enumerate(requests):
            ints[_IDS][j] = 0 if ahead else r.output_ids[-1]
            ints[_SLOTS][j] = r.slot
            ints[_POS][j] = r.num_computed + step
            ints[_SAMPLE_POS][j] = r.num_tokens + step
            ints[_SEEDS][j], ints[_TOP_K][j], row = sampling_columns(r.params)
            for i, v in enumerate(row):
                floats[i][j] = v
        for j in range(b, size):
            ints[_SLOTS][j] = ints[_POS][j] = -1
            ints[_TOP_K][j] = 1
            floats[_TEMP][j] = floats[_TOP_P][j] = 1.0
        self.inputs.write(ints, floats)
        if ahead:
            self.ints[_IDS, :b].copy_(self.tokens[:b])
        graph.replay()
        new_epoch()
        # two host buffers: an ahead step's tokens arrive while the step before it is read
        self._flip ^= 1
        host = self._tokens_host[self._flip]
        host[:b].copy_(self.tokens[:b], non_blocking=self._cuda)
        done = torch.cuda.Event() if self._cuda else None
        if done is not None:
            done.record(torch.cuda.current_stream(self.device))
        for r in requests:
            # the engine appends the sampled tokens: the counts row already holds them
            self.history.counted(r, len(r.output_ids) + 1 + step)

        def wait() -> list[int]:
            if done is not None:
                done.synchronize()
            return host[:b].tolist()

        return wait


class HistoryCounts:
    """Each slot's counts of its request's output tokens, on the device ([slots + 1, vocab]; the
    last row is where padding rows add): the history the penalties read inside a captured step.

    A step that adds its tokens on the device says so (`counted`); `sync` rebuilds a slot's row
    from the request's output ids whenever the bookkeeping says they diverged (a new request, a
    step taken on a path that does not count)."""

    def __init__(self, num_slots: int, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.device = device
        self.pad_row = num_slots
        self.counts = torch.zeros(num_slots + 1, vocab, dtype=torch.float32, device=device)
        # slot -> (request id, number of its output tokens the counts row holds)
        self._counted: dict[int, tuple[str, int]] = {}

    def sync(self, requests: Sequence[Any]) -> None:
        for r in requests:
            want = (r.id, len(r.output_ids))
            if self._counted.get(r.slot) == want:
                continue
            row = self.counts[r.slot]
            row.zero_()
            if r.output_ids:
                ids = torch.tensor(r.output_ids, dtype=torch.int64, device=self.device)
                row.index_put_((ids,), torch.ones(len(r.output_ids), device=self.device), accumulate=True)
            self._counted[r.slot] = want

    def counted(self, r: Any, n: int) -> None:
        """The row of `r.slot` now holds the first `n` output tokens of `r`."""
        self._counted[r.slot] = (r.id, n)

    def forget(self, slot: int) -> None:
        self._counted.pop(slot, None)
