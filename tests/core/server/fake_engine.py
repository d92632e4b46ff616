"""A real LLMEngine over a deterministic fake model, for the server tests.

The model's next token is a pure function of the sequence in its slot, so outputs do not depend on
batching, timing or which other requests run; the real tokenizer, chat format, detokenizer, stop
matcher, scheduler and AsyncEngine are used unchanged. What it generates depends on the prompt:

- `SCRIPT:<key>` in the prompt (the last one counts): replays `model.scripts[key]` (text, tokenized with the
  real tokenizer) then <|im_end|>: how tests force a tool call, a `</think>`, a stop string.
- `FOREVER`: words without end (disconnect and drain tests).
- `EXPLODE`: the step raises (an engine failure, not a user error).
- otherwise: a few words (sampled among three candidates, so seeds matter), with a reasoning
  part closed by `</think>` when the prompt opened `<think>`, then <|im_end|>.

`model.step_delay` slows every engine step (seconds), to give a disconnect time to land mid-run.
"""

from __future__ import annotations

import re
import time
from types import SimpleNamespace
from typing import Any

import torch

WORDS = (
    "the cat sat on a mat and dog ran to big red sun sky blue tree house car road fast slow green old new good "
    "day night water fire light dark cold warm small long short high low open close yes no apple river stone "
    "cloud bird fish wind rain"
).split()
_SCRIPT = re.compile(r"SCRIPT:(\w+)")
VOCAB = 248320  # rows of the real embedding: every tokenizer id is a valid prompt id


class FakeCache:
    def __init__(self, num_slots: int, max_context: int) -> None:
        self.num_slots = num_slots
        self.max_context = max_context
        self.hist: list[list[int]] = [[] for _ in range(num_slots)]
        self.prompt_len = [0] * num_slots
        self.plan: list[Any] = [None] * num_slots

    def reset(self, slot: int) -> None:
        self.hist[slot] = []
        self.prompt_len[slot] = 0
        self.plan[slot] = None

    def snapshot(self, slot: int) -> Any:
        return (list(self.hist[slot]), self.prompt_len[slot], self.plan[slot])

    def restore(self, slot: int, snap: Any) -> None:
        self.hist[slot], self.prompt_len[slot], self.plan[slot] = list(snap[0]), snap[1], snap[2]


class FakeModel:
    """hidden = (candidate 1, 2, 3, forced id or -1) for the next position; logits from that."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.shape = SimpleNamespace(vocab_size=VOCAB, family="fake")
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.scripts: dict[str, str] = {}
        self.step_delay = 0.0
        self.steps = 0  # engine steps run (prefill chunks and decode batches)
        self.words = [tokenizer.encode(" " + w)[0] for w in WORDS]
        self.im_end = tokenizer.im_end_id
        self.close_think = tokenizer.encode("\n</think>\n\n")

    def allocate_cache(self, num_slots: int, max_context: int, kv_dtype: str) -> FakeCache:
        return FakeCache(num_slots, max_context)

    # --- the "network" ---

    def _plan(self, cache: FakeCache, slot: int) -> Any:
        if cache.plan[slot] is None:
            prompt = cache.hist[slot][: cache.prompt_len[slot]]
            text = self.tok.decode(prompt)
            h = sum((i + 1) * t for i, t in enumerate(prompt)) % 1_000_003
            if "EXPLODE" in text:
                raise RuntimeError("the fake model exploded, as asked")
            keys = _SCRIPT.findall(text)  # the last one: earlier turns may hold older scripts
            if keys:
                script = self.tok.encode(self.scripts.get(keys[-1], f"no script {keys[-1]}"))
                cache.plan[slot] = ("script", [*script, self.im_end])
            elif "FOREVER" in text:
                cache.plan[slot] = ("forever", h)
            else:
                thinking = text.endswith("<think>\n")
                n_reason = 3 + h % 5 if thinking else 0
                n_content = 3 + (h // 7) % 6
                cache.plan[slot] = ("free", h, n_reason, n_content)
        return cache.plan[slot]

    def _decide(self, cache: FakeCache, slot: int) -> list[float]:
        plan = self._plan(cache, slot)
        hist = cache.hist[slot]
        n = len(hist) - cache.prompt_len[slot]  # tokens generated so far
        if plan[0] == "script":
            seq = plan[1]
            return [0, 0, 0, float(seq[n] if n < len(seq) else self.im_end)]
        if plan[0] == "free":
            _, h, n_reason, n_content = plan
            close = self.close_think if n_reason else []
            if n_reason <= n < n_reason + len(close):
                return [0, 0, 0, float(close[n - n_reason])]
            if n >= n_reason + len(close) + n_content:
                return [0, 0, 0, float(self.im_end)]
        k = (hist[-1] * 31 + n * 17) % len(self.words)
        w = self.words
        return [float(w[k]), float(w[(k + 5) % len(w)]), float(w[(k + 11) % len(w)]), -1.0]

    def forward(self, input_ids: torch.Tensor, cache: FakeCache, slot: int, start_pos: int) -> torch.Tensor:
        self._tick()
        hist = cache.hist[slot]
        del hist[start_pos:]
        hist.extend(int(t) for t in input_ids.tolist())
        cache.prompt_len[slot] = len(hist)
        cache.plan[slot] = None
        out = torch.zeros(len(input_ids), 4)
        out[-1] = torch.tensor(self._decide(cache, slot))
        return out

    def decode(self, input_ids: torch.Tensor, cache: FakeCache, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self._tick()
        rows = []
        for t, s, p in zip(input_ids.tolist(), slots.tolist(), positions.tolist()):
            hist = cache.hist[s]
            assert p == len(hist), "decode position out of step with the slot's history"
            hist.append(t)
            rows.append(self._decide(cache, s))
        return torch.tensor(rows)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.reshape(-1, 4)
        logits = torch.full((hidden.shape[0], VOCAB), -1e4)
        for i, (c1, c2, c3, forced) in enumerate(hidden.tolist()):
            if forced >= 0:
                logits[i, int(forced)] = 30.0
            else:
                logits[i, int(c1)] = 4.0
                logits[i, int(c2)] = 3.0
                logits[i, int(c3)] = 2.0
        return logits

    def _tick(self) -> None:
        self.steps += 1
        if self.step_delay:
            time.sleep(self.step_delay)


class FakeSampler:
    """Greedy or seeded top-k/temperature draws; the draw is a function of (seed, position)."""

    name = "fake"

    def sample(self, logits: torch.Tensor, params: Any, history: Any, positions: Any, purpose: Any = 0) -> torch.Tensor:
        out = []
        for row, p, pos in zip(logits, params, positions):
            if p.greedy:
                out.append(int(row.argmax()))
                continue
            vals, idx = row.topk(p.effective_top_k)
            w = torch.softmax(vals / p.temperature, dim=0)
            g = torch.Generator().manual_seed(hash((p.seed, pos)) & (2**62 - 1))
            u = float(torch.rand(1, generator=g))
            k = int(torch.searchsorted(torch.cumsum(w, 0), torch.tensor([u * float(w.sum())]))[0])
            out.append(int(idx[min(k, len(idx) - 1)]))
        return torch.tensor(out, dtype=torch.long)


_TOKENIZER: Any = None


def tokenizer() -> Any:
    global _TOKENIZER
    if _TOKENIZER is None:
        from ninfer.frontend.tokenizer import load_tokenizer

        _TOKENIZER = load_tokenizer(None)
    return _TOKENIZER


def make_fake_engine(*, max_batch: int = 4, max_context: int = 512, prefill_chunk: int = 64) -> Any:
    from ninfer.engine import LLMEngine
    from ninfer.frontend.chat import ChatFormat

    tok = tokenizer()
    model = FakeModel(tok)
    cache = model.allocate_cache(max_batch, max_context, "bf16")
    engine = LLMEngine(
        model,
        cache,
        FakeSampler(),
        tok,
        max_context=max_context,
        prefill_chunk=prefill_chunk,
        max_batch=max_batch,
        info={"model": "fake-qwen"},
    )
    engine.chat = ChatFormat()
    engine.spec = None
    return engine
