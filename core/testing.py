"""Tiny checkpoints for tests and the CLI's embedded default.

`make_tiny(like, out_dir)` writes a small random checkpoint in the exact Hugging Face layout of a
registered checkpoint (`ninfer make-tiny --like ID`); `default_tiny_path()` builds the embedded
default once into the cache and returns it. Weights are random: these check the code, not the
model's quality.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ninfer.errors import UserError

DEFAULT_TINY_LIKE = "qwen3.6-27b"
# The real tokenizer's ids run to 248076, so the default tiny keeps the real 248320-row vocab
# (16 M parameters per embedding at hidden 64: a 64 MB checkpoint).
DEFAULT_TINY_VOCAB = 248320
# Bump when the builder's output changes, so cached default checkpoints are rebuilt.
TINY_BUILDER_VERSION = 1
EXPERT_LAYOUTS = ("fused", "per_expert")


def reference_checkpoints_dir() -> Path | None:
    """`../shared/reference/checkpoints` next to a source checkout (or $NINFER_REFERENCE_DIR)."""
    env = os.environ.get("NINFER_REFERENCE_DIR")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "reference" / "checkpoints")
    for c in candidates:
        if c.is_dir():
            return c
    return None


def _registered(like: str) -> tuple[Any, Path]:
    """The spec registered under `like` and the folder of the plugin that registered it."""
    from ninfer.checkpoint import find_spec
    from ninfer.plugins import get_plugin_manager

    pm = get_plugin_manager()
    for name, plugin in pm.pm.list_name_plugin():
        hook = getattr(plugin, "ninfer_checkpoints", None)
        if hook is None:
            continue
        spec = find_spec(like, hook())
        if spec is not None:
            return spec, Path(plugin.__file__).parent
    ids = sorted(s.id for s in pm.collect("ninfer_checkpoints"))
    raise UserError(f"--like {like!r} is not a registered checkpoint; use one of: {', '.join(ids)}.", param="like")


def make_tiny(
    like: str,
    out_dir: str | os.PathLike[str],
    seed: int = 0,
    vocab: int | None = None,
    expert_layout: str = "fused",
    shards: int = 1,
    layers: int | None = None,
) -> Path:
    """Write a tiny random checkpoint shaped like registered checkpoint `like` into `out_dir`.

    `vocab` defaults to the real 248320 rows; `expert_layout` "fused" (as published) or
    "per_expert" (as transformers saves); `shards` > 1 writes an index and that many files;
    `layers` overrides the layer count (a multiple of 4 keeps the 3+1 pattern).
    """
    if expert_layout not in EXPERT_LAYOUTS:
        raise UserError(f"expert layout {expert_layout!r}: use fused or per_expert.")
    vocab = DEFAULT_TINY_VOCAB if vocab is None else int(vocab)
    if not 16 <= vocab <= 1_000_000:
        raise UserError(f"--vocab must be between 16 and 1000000, got {vocab}.", param="vocab")
    if shards < 1:
        raise UserError(f"shards must be at least 1, got {shards}.")
    spec, plugin_dir = _registered(like)
    published_file = plugin_dir / "config.json"
    if not published_file.is_file():
        raise UserError(f"{spec.id} ships no published config.json, so make-tiny cannot copy its layout.")
    if spec.family != "qwen_hybrid":
        raise UserError(f"make-tiny knows the qwen_hybrid family only, not {spec.family}.")
    from ninfer_plugins.qwen_hybrid.tiny import write_tiny

    out = Path(out_dir)
    write_tiny(
        json.loads(published_file.read_text()),
        out,
        seed=seed,
        vocab=vocab,
        expert_layout=expert_layout,
        shards=shards,
        layers=layers,
    )
    _copy_sidecars(spec, plugin_dir, out)
    return out


def make_medium(like: str, out_dir: str | os.PathLike[str]) -> str:
    """make_tiny's checkpoint (sidecars included, vocab 512, 4 layers), then config and weights
    rewritten wider: hidden 1,024, head dims 256 / 128, expert and MLP widths 256 / 1,024. The
    tiny checkpoints are too narrow for the decode kernels (the f16x2 and K-walk GEMVs and the MoE
    pair kernels want K a multiple of 256); GPU tests of those kernels in a whole model use this."""
    from safetensors.torch import save_file

    from ninfer_plugins.qwen_hybrid.tiny import _mrope_section, tiny_tensors

    path = make_tiny(like, out_dir, vocab=512, layers=4)
    cfg = json.loads((path / "config.json").read_text())
    text = cfg["text_config"] if "text_config" in cfg else cfg
    gqa = text["num_attention_heads"] // text["num_key_value_heads"]
    text.update(hidden_size=1024, num_key_value_heads=1, num_attention_heads=gqa, head_dim=256,
                linear_key_head_dim=128, linear_value_head_dim=128)
    if "num_experts" in text:
        text.update(moe_intermediate_size=256, shared_expert_intermediate_size=256)
    else:
        text["intermediate_size"] = 1024
    rope = text.get("rope_parameters")
    if rope and "mrope_section" in rope:
        partial = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))
        rope["mrope_section"] = _mrope_section(int(256 * partial) // 2)
    if isinstance(cfg.get("vision_config"), dict):
        cfg["vision_config"]["out_hidden_size"] = 1024
    (path / "config.json").write_text(json.dumps(cfg, indent=4))
    save_file(tiny_tensors(cfg, 0, "fused"), str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path)


def _copy_sidecars(spec: Any, plugin_dir: Path, out: Path) -> None:
    """generation_config.json and chat_template.jinja: real files, copied as published."""
    sources = []
    ref = reference_checkpoints_dir()
    for repo in spec.hf_repo_ids:
        if ref is not None:
            sources.append(ref / repo.replace("/", "__"))
    sources.append(plugin_dir)
    for name in ("generation_config.json", "chat_template.jinja"):
        for folder in sources:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, out / name)
                break


def cache_root() -> Path:
    return Path(os.environ.get("NINFER_CACHE") or Path.home() / ".cache" / "ninfer").expanduser()


def embedded_tiny_dir() -> Path:
    """Where the embedded default model lives (built or not)."""
    return cache_root() / f"tiny-{DEFAULT_TINY_LIKE}"


def default_tiny_path() -> Path:
    """The embedded default model: a tiny qwen3.6-27b built once (atomically) into the cache."""
    root = cache_root()
    path = embedded_tiny_dir()
    stamp = root / f"tiny-{DEFAULT_TINY_LIKE}.version"
    version = str(TINY_BUILDER_VERSION)
    if path.is_dir() and stamp.is_file() and stamp.read_text().strip() == version:
        return path
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tiny-{DEFAULT_TINY_LIKE}-", dir=root))
    try:
        make_tiny(DEFAULT_TINY_LIKE, tmp, seed=0, vocab=DEFAULT_TINY_VOCAB)
        if path.exists():
            # an older builder's output: move it aside first so the rename below is atomic
            old = Path(tempfile.mkdtemp(prefix=".tiny-old-", dir=root))
            try:
                os.rename(path, old / "x")
            except OSError:
                pass
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, path)
        except OSError:
            # another process won the race: its copy is as good as ours
            if not (path / "config.json").is_file():
                raise
        stamp.write_text(version)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


# --- oracle helpers ------------------------------------------------------------------------------


def load_model(path: str | os.PathLike[str], device: str = "cpu", **config: Any) -> Any:
    """Build the model of checkpoint directory `path` through the plugin hooks, as the engine does
    (parse config -> open weights -> build): the shortest way for a test to get a real model."""
    from ninfer.checkpoint import load_hf_config
    from ninfer.config import EngineConfig
    from ninfer.device import probe
    from ninfer.plugins import get_plugin_manager

    pm = get_plugin_manager()
    dev = probe(device)
    cfg = EngineConfig(model=str(path), device=device, **config)
    shape = pm.hook.ninfer_parse_config(hf_config=load_hf_config(path))
    if shape is None:
        raise UserError(f"{path}: no installed plugin recognises this config.json.")
    weights = pm.hook.ninfer_load_weights(path=str(path), shape=shape, config=cfg, device=dev)
    return pm.hook.ninfer_model(shape=shape, config=cfg, device=dev, weights=weights)


def greedy_generate(model: Any, prompt: Any, max_new: int, chunk: int | None = None) -> list[int]:
    """Plain greedy decoding in slot 0 (prefill in chunks of `chunk`, then one token per step):
    the reference loop parity tests compare against transformers' `generate`."""
    import torch

    ids = torch.as_tensor(prompt, dtype=torch.long)
    cache = model.allocate_cache(1, len(ids) + max_new, "bf16")
    step = chunk or len(ids)
    for start in range(0, len(ids), step):
        hidden = model.forward(ids[start : start + step], cache, 0, start)
    out = [int(model.compute_logits(hidden[-1]).argmax())]
    pos = len(ids)
    while len(out) < max_new:
        hidden = model.decode(torch.tensor([out[-1]]), cache, torch.tensor([0]), torch.tensor([pos]))
        out.append(int(model.compute_logits(hidden[0]).argmax()))
        pos += 1
    return out
