"""`ninfer convert`: pack a bf16 checkpoint once, by the recipe `--quant` names, into a directory
that later starts load by copying bytes (packed_dir.py reads it back).

Memory: the source is read lazily (mmap), one canonical tensor at a time; each linear is packed
as it is read and its packed parts go to a shard buffer that is written out whenever it reaches
`max_shard_bytes`. Big groupwise-int matrices (the head) are quantized in row blocks, which gives
the same bytes (every int row is encoded on its own) without a full fp32 copy of the matrix. So
the peak is about one shard buffer plus one matrix in fp32: a 27B converts in 24 GiB of RAM.

What is packed is exactly what `--model SRC --quant Q` would pack at load time (same recipe, same
encoders), so the converted directory runs with identical logits:
* every linear of the text model, by the recipe (int4: quant_int's per-checkpoint profile; int8:
  q8_g32; nvfp4: quant_nvfp4's recipe, i.e. NVFP4 projections with the head in q8_g32; bf16:
  nothing packed). Norms, conv, A_log, dt_bias and the embedding are not linears: they are
  copied as stored (the model keeps its embedding in its own dtype).
* the MTP block is copied as published to `mtp.safetensors` (the model reads it in bf16 only
  when a speculator asks);
* the vision tower is not copied: ninfer runs the text model only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys
import uuid
from pathlib import Path
from typing import Any

import structlog
import torch

from ninfer.checkpoint import INDEX_NAME, SINGLE_NAME, WeightSource, load_hf_config
from ninfer.errors import UserError
from ninfer.outputs import new_folder_problem
from ninfer.linear import DENSE, PackedWeight, QuantScheme, dense_weight
from ninfer_plugins.packed_loader.packed_dir import MTP_FILE
from ninfer_plugins.packed_loader.published import published_quant_config
from ninfer_plugins.quant_int import formats as IF
from ninfer_plugins.quant_int.artifact import _DTYPES, FORMAT, FORMAT_VERSION, MANIFEST
from ninfer_plugins.qwen_hybrid.weights import detect_prefix, is_fused_experts, mtp_tensors, read_tensor, text_tensors

log = structlog.get_logger("ninfer.convert")

# Files beside the weights that a converted directory needs to start the same way.
SIDECARS = (
    "config.json",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    # spec_mtp's `--lm-head-draft` row ranking, when one was made for the source
    "shortlist.safetensors",
)
# Int matrices above this many elements are encoded in row blocks of about this size.
ROW_BLOCK_ELEMENTS = 1 << 25
DEFAULT_SHARD_BYTES = 2 << 30


def source_digest(root: Path) -> str:
    """sha256 over what identifies a checkpoint without reading its data: config.json, the index,
    and every safetensors file's name, size and header (names, dtypes, shapes, offsets)."""
    h = hashlib.sha256()
    for name in ("config.json", INDEX_NAME):
        if (root / name).is_file():
            h.update(name.encode() + b"\0" + (root / name).read_bytes())
    if (root / INDEX_NAME).is_file():
        files = sorted({root / f for f in json.loads((root / INDEX_NAME).read_text())["weight_map"].values()})
    elif (root / SINGLE_NAME).is_file():
        files = [root / SINGLE_NAME]
    else:
        files = sorted(root.glob("*.safetensors"))
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = fh.read(n)
        h.update(f"{f.name}\0{f.stat().st_size}\0".encode() + header)
    return h.hexdigest()


def pack_weight(scheme: QuantScheme | None, w: torch.Tensor, row_block: int = ROW_BLOCK_ELEMENTS) -> PackedWeight:
    """`w` [n, k] in `scheme` (None: kept dense, as stored)."""
    if scheme is None:
        return dense_weight(w)
    n, k = w.shape
    if scheme.name not in IF.FORMATS or n * k <= row_block:
        return scheme.quantize(w)
    rows = max(1, row_block // max(k, 1))
    parts = [scheme.quantize(w[i : i + rows]) for i in range(0, n, rows)]
    return PackedWeight(scheme.name, (n, k), {p: torch.cat([x.tensors[p] for x in parts]) for p in parts[0].tensors}, dict(parts[0].meta))


class ShardWriter:
    """Tensors to safetensors shards of at most `max_bytes` each (one tensor may exceed it),
    written as they fill; `finish` names them model-0000i-of-0000n and returns the weight map."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root, self.max_bytes = root, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.size = 0
        self.written: list[tuple[str, list[str]]] = []

    def add(self, name: str, t: torch.Tensor) -> None:
        t = t.detach().to("cpu").contiguous()
        if t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone()  # a view (one expert of a stack): safetensors stores whole storages only
        nbytes = t.numel() * t.element_size()
        if self.pending and self.size + nbytes > self.max_bytes:
            self.flush()
        self.pending[name] = t
        self.size += nbytes

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        fname = f"part-{len(self.written) + 1:05d}.safetensors.partial"
        save_file(self.pending, str(self.root / fname), metadata={"format": FORMAT})
        self.written.append((fname, list(self.pending)))
        self.pending, self.size = {}, 0

    def finish(self) -> dict[str, str]:
        self.flush()
        weight_map: dict[str, str] = {}
        for i, (tmp, names) in enumerate(self.written):
            final = f"model-{i + 1:05d}-of-{len(self.written):05d}.safetensors"
            os.replace(self.root / tmp, self.root / final)
            weight_map.update(dict.fromkeys(names, final))
        return weight_map


def _refuse_packed_source(src: Path) -> None:
    if (src / MANIFEST).is_file():
        raise UserError(f"{src} is already a `ninfer convert` directory; convert the original bf16 checkpoint instead.", param="model")
    if published_quant_config(src) is not None or "quantization_config" in load_hf_config(src):
        raise UserError(
            f"{src} is already quantized (its config.json has a quantization_config); load it directly with "
            "--model, or convert the original bf16 checkpoint.",
            param="model",
        )


def convert(
    path: str | Path,
    shape: Any,
    spec: Any,
    quant: str,
    out: str | Path,
    *,
    plugins: Any = None,
    progress: bool = True,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    row_block: int = ROW_BLOCK_ELEMENTS,
) -> Path:
    """Pack the bf16 checkpoint at `path` (its family shape and registered spec, if any) by the
    `quant` recipe into `out`; returns `out`. The directory appears whole or not at all."""
    from tqdm import tqdm

    if plugins is None:
        from ninfer.plugins import get_plugin_manager

        plugins = get_plugin_manager()
    src, out = Path(path), Path(out).expanduser()
    if (why := new_folder_problem(out, "--out", "ninfer convert")) is not None:
        raise UserError(why, param="out")
    _refuse_packed_source(src)
    recipe = None
    if quant != "bf16":
        recipe = plugins.hook.ninfer_quant_recipe(quant=quant, shape=shape, spec=spec)
        if recipe is None:
            raise UserError(f"--quant {quant}: no installed plugin provides it; use --quant bf16.", param="quant")
    schemes: dict[str, QuantScheme] = {s.name: s for s in plugins.collect("ninfer_quant_schemes")}
    source = WeightSource(src)
    prefix = detect_prefix(source, str(src))
    linears = {name for name, _, _ in shape.linear_shapes()}
    wanted = text_tensors(shape)
    mtp = mtp_tensors(shape) if source.has("mtp.fc.weight") else {}

    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "schemes": {},
        "recipe": quant,
        "source_digest": source_digest(src),
        "metadata": {
            "source": str(src.resolve()),
            "spec": getattr(spec, "id", None),
            "family": getattr(shape, "family", None),
            "recipe_description": getattr(recipe, "description", "every linear kept as stored"),
            "mtp_file": MTP_FILE if mtp else None,
        },
        "linears": {},
        "tensors": {},
        "weight_map": {},
    }

    out.parent.mkdir(parents=True, exist_ok=True)
    # beside `out` (same filesystem, so the final rename is atomic); mkdir honours the umask
    tmp = out.parent / f".{out.name}.converting-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    writer = ShardWriter(tmp, max_shard_bytes)

    def add_linear(name: str, w: torch.Tensor) -> None:
        n, k = w.shape
        scheme_name = recipe.scheme_for(name, n, k) if recipe is not None else DENSE
        if scheme_name != DENSE and scheme_name not in schemes:
            raise UserError(f"--quant {quant} puts {name} in {scheme_name}, which no installed plugin provides.", param="quant")
        p = pack_weight(None if scheme_name == DENSE else schemes[scheme_name], w, row_block)
        if p.scheme != DENSE:
            manifest["schemes"][p.scheme] = int(schemes[p.scheme].version)
        parts = {}
        for part, t in p.tensors.items():
            parts[part] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape)}
            writer.add(f"{name}.{part}", t)
        meta = {k2: v for k2, v in p.meta.items() if isinstance(v, (int, float, str, bool))}
        manifest["linears"][name] = {"scheme": p.scheme, "shape": [n, k], "parts": parts, "meta": meta}

    try:
        bar = tqdm(total=len(wanted) + len(mtp), desc=f"converting to {quant}", unit="tensor", file=sys.stderr, disable=not progress)
        for name, shp in wanted.items():
            t = read_tensor(source, name, shp, prefix, shape.num_experts)
            if is_fused_experts(name):
                base, _, leaf = name.rpartition(".")
                for e in range(shp[0]):
                    add_linear(f"{base}.{e}.{leaf}", t[e])
            elif name.removesuffix(".weight") in linears:
                add_linear(name.removesuffix(".weight"), t)
            else:
                manifest["tensors"][name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape)}
                writer.add(name, t)
            del t
            bar.update(1)
        manifest["weight_map"] = writer.finish()
        if mtp:
            from safetensors.torch import save_file

            tensors = {}
            for name, shp in mtp.items():
                tensors[name] = read_tensor(source, name, shp, "", shape.num_experts).contiguous()
                bar.update(1)
            save_file(tensors, str(tmp / MTP_FILE), metadata={"format": "pt"})
            del tensors
        bar.close()
        for name in SIDECARS:
            if (src / name).is_file():
                shutil.copyfile(src / name, tmp / name)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        source.close()
    log.info("converted", source=str(src), out=str(out), quant=quant, linears=len(manifest["linears"]), schemes=manifest["schemes"])
    return out
