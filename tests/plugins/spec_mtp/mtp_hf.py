"""The MTP layer written with transformers' own Qwen3_5 modules, and a tiny trained model with it.

`HFMtp` is the independent side of the MTP parity test (spec 3.3 / formats.md 7, written from the
published math on transformers' decoder layer, not from our code) and the trainable copy used by
`trained_checkpoint`: a tiny hybrid model (3 Gated DeltaNet + 1 attention layer, hidden 128) and
its MTP layer trained together on CPU, byte-level, on Python's standard library sources, saved in
the HF layout with `mtp.*` tensors so the engine loads it like a real checkpoint.

Byte-level (vocab 256) rather than the real tokenizer: every byte of the corpus is in the
vocabulary, the model is small enough to learn it in minutes on two cores, and the ids stay
valid for the engine (which only needs ids below the vocabulary). Built once per machine into
$NINFER_CACHE (or ~/.cache/ninfer)/spec-mtp-trained-v<N>; `python tests/plugins/spec_mtp/mtp_hf.py`
builds it and prints the acceptance numbers of BENCHMARKS.md.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# Bump when the recipe changes: cached checkpoints of another version are rebuilt.
RECIPE_VERSION = 1
SEQ, BATCH = 128, 16
# Joint steps (target + MTP), ~0.3 s each on two idle cores: the full recipe (BENCHMARKS.md
# numbers, the slow test) and the reduced one CI builds when no full model is cached.
STEPS = 450
STEPS_CI = 200
LR = 3e-3
HELD_OUT_EVERY = 10  # every 10th stdlib file (sorted) is held out


def text_config(transformers, vocab: int = 256):
    return transformers.Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, intermediate_size=384, tie_word_embeddings=False, mtp_num_hidden_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
    )  # fmt: skip


class HFMtp(nn.Module):
    """fc(cat(norm_e(embed(x_{t+1})), norm_h(h_t))) -> one full-attention decoder layer -> norm,
    on transformers' modules. State-dict names are the published ones without `mtp.`."""

    def __init__(self, config) -> None:
        super().__init__()
        moe = hasattr(config, "num_experts") and getattr(config, "num_experts", 0)
        if moe:
            from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m
        else:
            from transformers.models.qwen3_5 import modeling_qwen3_5 as m
        prefix = "Qwen3_5Moe" if moe else "Qwen3_5"
        cfg = copy.deepcopy(config)
        cfg.layer_types = ["full_attention"]
        cfg.num_hidden_layers = 1
        # causal attention without a mask: transformers' eager path would attend to every column
        cfg._attn_implementation = "sdpa"
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        norm = getattr(m, f"{prefix}RMSNorm")
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = norm(h, eps=eps)
        self.pre_fc_norm_hidden = norm(h, eps=eps)
        self.layers = nn.ModuleList([getattr(m, f"{prefix}DecoderLayer")(cfg, 0)])
        self.norm = norm(h, eps=eps)
        self.rotary = getattr(m, f"{prefix}TextRotaryEmbedding")(cfg)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """embeds, hidden [B, T, H] (the embedding of each hidden's NEXT token), positions [B, T]."""
        u = self.fc(torch.cat((self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)), dim=-1))
        pe = self.rotary(u, positions)
        return self.norm(self.layers[0](u, position_embeddings=pe, position_ids=positions))

    def published_state_dict(self) -> dict[str, torch.Tensor]:
        return {f"mtp.{k}": v.detach().contiguous() for k, v in self.state_dict().items() if not k.startswith("rotary.")}


# --- the corpus -------------------------------------------------------------------------------------


def corpus() -> tuple[bytes, bytes]:
    """(train, held-out) bytes of the standard library sources: every 10th file is held out."""
    from ninfer_plugins.spec_mtp.shortlist import stdlib_files

    train, held = [], []
    for i, f in enumerate(stdlib_files()):
        try:
            data = f.read_bytes()
        except OSError:
            continue
        (held if i % HELD_OUT_EVERY == 0 else train).append(data)
    return b"".join(train), b"".join(held)


def _batches(data: bytes, steps: int, seed: int):
    arr = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(arr) - SEQ - 1, (BATCH,), generator=gen)
        yield torch.stack([arr[s : s + SEQ] for s in starts.tolist()])


# --- training ----------------------------------------------------------------------------------------


def train(out_dir: Path, steps: int = STEPS, seed: int = 0) -> dict:
    """Train the target and its MTP layer jointly (the MTP on the target's detached final-normed
    hidden states, predicting the token two ahead); save in the HF layout with mtp.* tensors."""
    import transformers
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    cfg = text_config(transformers)
    target = transformers.Qwen3_5ForCausalLM(cfg)
    mtp = HFMtp(cfg)
    params = list(target.parameters()) + list(mtp.parameters())
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=steps, pct_start=0.1)
    data, _ = corpus()
    log: list[tuple[int, float, float]] = []
    t0 = time.perf_counter()
    positions = torch.arange(SEQ - 1).expand(BATCH, -1)
    for step, x in enumerate(_batches(data, steps, seed)):
        h = target.model(input_ids=x).last_hidden_state  # final-normed: what the head reads
        logits = target.lm_head(h)
        loss_t = F.cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
        # column t: hidden h_t with the embedding of x_{t+1}, at position t, predicts x_{t+2}
        emb = F.embedding(x[:, 1:], target.model.embed_tokens.weight.detach())
        y = mtp(emb, h[:, :-1].detach(), positions)
        mtp_logits = F.linear(y[:, :-1], target.lm_head.weight.detach())
        loss_m = F.cross_entropy(mtp_logits.reshape(-1, cfg.vocab_size), x[:, 2:].reshape(-1))
        (loss_t + loss_m).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 25 == 0 or step == steps - 1:
            log.append((step, round(loss_t.item(), 4), round(loss_m.item(), 4)))
    seconds = time.perf_counter() - t0
    target.save_pretrained(out_dir)
    tensors = load_file(str(out_dir / "model.safetensors"))
    tensors.update(mtp.published_state_dict())
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out_dir / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    info = {
        "recipe": RECIPE_VERSION,
        "steps": steps,
        "seconds": round(seconds, 1),
        "threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "train_bytes": len(data),
        "losses": log,
    }
    (out_dir / "train.json").write_text(json.dumps(info, indent=1))
    return info


def cache_dir(steps: int = STEPS) -> Path:
    from ninfer.testing import cache_root

    return cache_root() / f"spec-mtp-trained-v{RECIPE_VERSION}-s{steps}"


def is_cached(steps: int = STEPS) -> bool:
    return (cache_dir(steps) / "train.json").is_file()


def trained_checkpoint(steps: int = STEPS) -> Path:
    """The trained tiny checkpoint, built once (atomically) into the cache."""
    path = cache_dir(steps)
    if (path / "train.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".spec-mtp-", dir=path.parent))
    try:
        train(tmp, steps)
        try:
            os.rename(tmp, path)
        except OSError:
            if not (path / "train.json").is_file():  # not another process's finished copy
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def held_out_prompts(n: int, length: int) -> list[list[int]]:
    """n byte prompts of `length` from the held-out files, at spread, fixed offsets."""
    _, held = corpus()
    step = (len(held) - length) // n
    # a deterministic jitter so prompts do not all start at a line boundary pattern
    return [list(held[i * step + zlib.crc32(bytes([i])) % 97 :][:length]) for i in range(n)]


if __name__ == "__main__":
    from mtp_acceptance import report  # noqa: E402 (the test module's measurement, shared)

    print(json.dumps(report(trained_checkpoint()), indent=1))
