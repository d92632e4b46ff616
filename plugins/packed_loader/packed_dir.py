"""A `ninfer convert` directory read back as a weight source: bytes copied, nothing requantized.

Layout (written by convert.py, read by `quant_int.artifact.load_packed`): safetensors shards plus
`ninfer.json`. Linears are stored under their canonical module names (`layers.0.mlp.gate_proj`,
`layers.3.mlp.experts.7.gate_up_proj`, `lm_head`) as the parts of their scheme; every other text
tensor (embedding, norms, conv, A_log, dt_bias) is stored as it was in the source, under its
canonical name. The MTP block, which the model reads only when a speculator asks, sits in its own
`mtp.safetensors` (as published, bf16) so that loading does not copy it to the device for nothing.

The source answers the family loader's questions in its own vocabulary: names carry the published
`model.language_model.` prefix, `get_packed` hands each linear's PackedWeight (a list of one per
expert for a fused experts name), `get` the plain tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ninfer.checkpoint import WeightSource
from ninfer.errors import CheckpointError, UserError
from ninfer.linear import PackedWeight
from ninfer_plugins.quant_int.artifact import MANIFEST, load_packed, read_manifest, scheme_versions
from ninfer_plugins.qwen_hybrid.weights import (
    PUBLISHED_PREFIX,
    hf_name,
    is_fused_experts,
    text_tensors,
)

MTP_FILE = "mtp.safetensors"


def canonical(name: str) -> str:
    return name[len(PUBLISHED_PREFIX) :] if name.startswith(PUBLISHED_PREFIX) else name


def is_convert_dir(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def check_quant_flag(path: Path, quant: str, recipe: str | None) -> None:
    """`--quant` on a converted directory may only repeat what it was converted with."""
    if quant in ("auto", recipe):
        return
    raise UserError(
        f"{path} was converted with --quant {recipe}; drop --quant (or pass --quant {recipe}) to load it, "
        f"or run ninfer convert --quant {quant} on the original checkpoint.",
        param="quant",
    )


def _plain_names(shape: Any) -> dict[str, tuple[int, ...]]:
    """Canonical name -> shape of the text tensors that are not linears (stored as they were)."""
    linears = {name for name, _, _ in shape.linear_shapes()}
    return {
        name: shp
        for name, shp in text_tensors(shape).items()
        if not is_fused_experts(name) and name.removesuffix(".weight") not in linears
    }


class PackedDirSource:
    """The tensors of a `ninfer convert` directory, checked then loaded onto `device`."""

    def __init__(self, path: str | Path, shape: Any, device: str = "cpu", *, plugins: Any = None, progress: bool = True) -> None:
        self.path = Path(path)
        where = self.path / MANIFEST
        manifest = read_manifest(self.path)
        # the plain tensors against the model, before any data is read (load_packed checks the
        # linears against `expected` and every tensor against its shard header)
        stored = manifest.get("tensors", {})
        for name, shp in _plain_names(shape).items():
            info = stored.get(name)
            if info is None:
                raise CheckpointError(f"{where} lists no tensor {name}; the directory is incomplete: run ninfer convert again.", tensor=name)
            if list(info["shape"]) != list(shp):
                raise CheckpointError(
                    f"{self.path}: tensor {name} is {list(info['shape'])} but the model expects {list(shp)}; "
                    "the directory was converted from another checkpoint or is damaged: run ninfer convert again.",
                    tensor=name,
                )
        expected = {name: (n, k) for name, n, k in shape.linear_shapes()}
        versions = scheme_versions(plugins)
        linears, plain, manifest = load_packed(self.path, versions=versions, expected=expected, device=device, progress=progress)
        self.manifest = manifest
        self.recipe: str | None = manifest.get("recipe")
        self.device = device
        self.num_experts = int(getattr(shape, "num_experts", 0) or 0)
        self._linears: dict[str, PackedWeight] = linears
        self._plain: dict[str, torch.Tensor] = {hf_name(n, PUBLISHED_PREFIX): t for n, t in plain.items()}
        self._plain_names = set(self._plain)
        mtp_file = (manifest.get("metadata") or {}).get("mtp_file")
        self._mtp: WeightSource | None = None
        if mtp_file:
            if not (self.path / mtp_file).is_file():
                raise CheckpointError(f"{where} names {mtp_file} but it is missing; run ninfer convert again.")
            self._mtp = WeightSource(self.path / mtp_file)

    # --- what the family loader asks --------------------------------------------------------------

    def get_packed(self, name: str) -> PackedWeight | list[PackedWeight] | None:
        c = canonical(name)
        if is_fused_experts(c):
            base, _, leaf = c.rpartition(".")
            per = [f"{base}.{e}.{leaf}" for e in range(self.num_experts)]
            if not per or per[0] not in self._linears:
                return None
            return [self._linears[n] for n in per]
        if c.endswith(".weight"):
            return self._linears.get(c.removesuffix(".weight"))
        return None

    def names(self) -> list[str]:
        return sorted(self._plain_names | set(self._mtp.names() if self._mtp else ()))

    def has(self, name: str) -> bool:
        return name in self._plain_names or (self._mtp is not None and self._mtp.has(name))

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """A plain tensor as stored. Each is handed over once (the model copies it into its own
        buffer, so keeping it here would double its memory); asking again reads it from disk."""
        if name in self._plain:
            t = self._plain.pop(name)
        elif name in self._plain_names:
            t = self._read(canonical(name))
        elif self._mtp is not None and self._mtp.has(name):
            return self._mtp.get(name, shape)
        else:
            raise CheckpointError(f"{self.path}: the converted checkpoint has no tensor {name}.", tensor=name)
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise CheckpointError(
                f"{self.path}: tensor {name} is {list(t.shape)}, the model expects {list(shape)}; run ninfer convert again.",
                tensor=name,
            )
        return t

    def _read(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(str(self.path / self.manifest["weight_map"][name]), framework="pt") as h:
            return h.get_tensor(name).to(self.device)

    def close(self) -> None:
        self._plain.clear()
        if self._mtp is not None:
            self._mtp.close()

    def __repr__(self) -> str:
        return f"PackedDirSource({self.path}, recipe {self.recipe}, {len(self._linears)} linears)"
