"""Packed weights on disk, for `ninfer convert` and for loading what it wrote.

A directory holds safetensors shards (`model-00001-of-00003.safetensors`, ...) and `ninfer.json`:

    {"format": "ninfer-packed", "format_version": 1,
     "schemes": {"q4_g64": 1, "nvfp4": 1, ...},          # version of every scheme used
     "recipe": "int4", "source_digest": "...", "metadata": {...},
     "linears": {"layers.0.mlp.gate_proj": {"scheme": "q4_g64", "shape": [n, k],
                 "parts": {"qweight": {"dtype": "U8", "shape": [...]}, ...}, "meta": {...}}},
     "tensors": {"norm.weight": {"dtype": "BF16", "shape": [...]}, ...},   # stored as given
     "weight_map": {"layers.0.mlp.gate_proj.qweight": "model-00001-of-00003.safetensors", ...}}

A linear's parts are stored as `<linear>.<part>` (e.g. `lm_head.qweight`, `lm_head.scales`; a bf16
linear as `<linear>.weight`). `load_packed` checks, before reading any data, that every scheme is
installed at the version written, every recorded tensor is in its shard with the recorded dtype
and shape, each linear's parts are what its scheme stores for [n, k], and (when the caller passes
the model's expectations) that every expected linear is there with its shape. Each failure is a
CheckpointError naming the tensor and the fix.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from ninfer.checkpoint import read_safetensors_header
from ninfer.errors import CheckpointError
from ninfer.linear import DENSE, PackedWeight

MANIFEST = "ninfer.json"
FORMAT = "ninfer-packed"
FORMAT_VERSION = 1

_DTYPES = {
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.bool: "BOOL",
}
_FROM_NAME = {v: k for k, v in _DTYPES.items()}


def _check_dense(p: PackedWeight) -> None:
    w = p.tensors.get("weight")
    if w is None:
        raise CheckpointError(f"bf16 weight {list(p.shape)} lacks its 'weight' tensor.", tensor="weight")
    if not w.dtype.is_floating_point or tuple(w.shape) != tuple(p.shape):
        raise CheckpointError(
            f"bf16 weight: 'weight' is {w.dtype} {list(w.shape)}, expected a float tensor {list(p.shape)}.", tensor="weight"
        )


def _checker(scheme: str):
    from ninfer_plugins.quant_int import formats as IF
    from ninfer_plugins.quant_nvfp4 import formats as NF

    if scheme == DENSE:
        return _check_dense
    if scheme in IF.FORMATS:
        return IF.check_packed
    if scheme == NF.SCHEME:
        return NF.check_packed
    return None


def scheme_versions(plugins: Any | None = None) -> dict[str, int]:
    """Installed schemes and their versions (from the plugins' ninfer_quant_schemes)."""
    if plugins is None:
        from ninfer.plugins import get_plugin_manager

        plugins = get_plugin_manager()
    return {s.name: s.version for s in plugins.collect("ninfer_quant_schemes")}


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="tensor", file=sys.stderr, disable=not enabled, leave=False)


def save_packed(
    out_dir: str | Path,
    linears: Mapping[str, PackedWeight] | Iterable[tuple[str, PackedWeight]],
    *,
    versions: Mapping[str, int],
    tensors: Mapping[str, torch.Tensor] | None = None,
    recipe: str | None = None,
    source_digest: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    max_shard_bytes: int = 4 << 30,
    progress: bool = True,
) -> Path:
    """Write packed linears (and any plain tensors, e.g. norms and the embedding) plus ninfer.json.

    `versions` maps each scheme name to its QuantScheme.version (`scheme_versions()` gives the
    installed ones); a scheme used but absent from it is an error, so a file never records a
    version its writer did not know.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    items = list(linears.items() if isinstance(linears, Mapping) else linears)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "schemes": {},
        "recipe": recipe,
        "source_digest": source_digest,
        "metadata": dict(metadata or {}),
        "linears": {},
        "tensors": {},
        "weight_map": {},
    }
    flat: list[tuple[str, torch.Tensor]] = []
    for name, p in items:
        if p.scheme != DENSE and p.scheme not in versions:
            raise ValueError(f"{name}: scheme {p.scheme} has no version in `versions`")
        if p.scheme != DENSE:
            manifest["schemes"][p.scheme] = int(versions[p.scheme])
        parts = {}
        for part, t in p.tensors.items():
            parts[part] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape)}
            flat.append((f"{name}.{part}", t))
        meta = {k: v for k, v in p.meta.items() if isinstance(v, (int, float, str, bool))}
        manifest["linears"][name] = {"scheme": p.scheme, "shape": list(p.shape), "parts": parts, "meta": meta}
    for name, t in (tensors or {}).items():
        manifest["tensors"][name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape)}
        flat.append((name, t))
    names = [n for n, _ in flat]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"tensor name {dup} would be written twice")
    shards: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, t in flat:
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, t))
        size += nbytes
    bar = _progress(len(flat), "writing", progress)
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: t.detach().to("cpu").contiguous() for n, t in shard}, str(out / fname), metadata={"format": FORMAT})
        for n, _ in shard:
            manifest["weight_map"][n] = fname
        bar.update(len(shard))
    bar.close()
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return out


def read_manifest(path: str | Path) -> dict[str, Any]:
    f = Path(path) / MANIFEST
    if not f.is_file():
        raise CheckpointError(f"{path} has no {MANIFEST}: it is not a `ninfer convert` directory.")
    try:
        m = json.loads(f.read_text(encoding="utf-8"))
        if not isinstance(m, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{f} is corrupt ({e}); run ninfer convert again.") from e
    if m.get("format") != FORMAT or m.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{f} is format {m.get('format')!r} version {m.get('format_version')!r}; this ninfer reads "
            f"{FORMAT!r} version {FORMAT_VERSION}: run ninfer convert again."
        )
    return m


def load_packed(
    path: str | Path,
    *,
    versions: Mapping[str, int],
    expected: Mapping[str, tuple[int, int]] | None = None,
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> tuple[dict[str, PackedWeight], dict[str, torch.Tensor], dict[str, Any]]:
    """(linears by name, plain tensors by name, the manifest) of a `ninfer convert` directory.

    `versions`: the installed schemes (`scheme_versions()`); `expected`: linear name -> [n, k]
    the model will build (every one must be present with that shape). Data is only read after
    every check passed, then copied to `device`.
    """
    from safetensors import safe_open

    root = Path(path)
    m = read_manifest(root)
    where = root / MANIFEST
    for scheme, ver in m.get("schemes", {}).items():
        if scheme not in versions:
            raise CheckpointError(
                f"{where}: weights are packed as {scheme}, which no installed plugin provides; "
                "install the plugin or convert with another --quant."
            )
        if int(ver) != int(versions[scheme]):
            raise CheckpointError(
                f"{where}: weights are packed as {scheme} version {ver}, this ninfer reads version {versions[scheme]}; "
                "run ninfer convert again."
            )
    # what each shard holds, from its header only
    headers: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}
    for fname in sorted(set(m.get("weight_map", {}).values())):
        f = root / fname
        if not f.is_file():
            raise CheckpointError(f"{where} lists shard {fname} but it is missing; run ninfer convert again.")
        try:
            # the header, with every tensor's byte range checked against the file's size
            # (safetensors' own errors on a damaged file are not sentences)
            info = read_safetensors_header(f)
        except CheckpointError as e:
            reason = str(e).split(";")[0]
            raise CheckpointError(f"{reason}; this shard of a `ninfer convert` directory is damaged: run ninfer convert again.") from None
        headers[fname] = {k: (t.dtype, t.shape) for k, t in info.items()}

    def locate(tname: str, want_dtype: str, want_shape: list[int]) -> str:
        fname = m["weight_map"].get(tname)
        if fname is None or tname not in headers.get(fname, {}):
            raise CheckpointError(f"{root}: tensor {tname} is missing; run ninfer convert again.", tensor=tname)
        dtype, shape = headers[fname][tname]
        if dtype != want_dtype or list(shape) != list(want_shape):
            raise CheckpointError(
                f"{fname}: tensor {tname} is {dtype} {list(shape)}, {MANIFEST} says {want_dtype} {list(want_shape)}; "
                "the directory is damaged: run ninfer convert again.",
                tensor=tname,
            )
        return fname

    plan: list[tuple[str, str, str]] = []  # (tensor name, file, owner)
    for name, entry in m.get("linears", {}).items():
        scheme, (n, k) = entry["scheme"], entry["shape"]
        check = _checker(scheme)
        if check is None:
            raise CheckpointError(f"{where}: {name} uses scheme {scheme}, which no installed plugin provides.", tensor=name)
        metas = {}
        for part, info in entry["parts"].items():
            fname = locate(f"{name}.{part}", info["dtype"], info["shape"])
            metas[part] = torch.empty(info["shape"], dtype=_FROM_NAME[info["dtype"]], device="meta")
            plan.append((f"{name}.{part}", fname, name))
        try:
            check(PackedWeight(scheme, (n, k), metas))
        except CheckpointError as e:
            raise CheckpointError(f"{name}: {e.message} Run ninfer convert again.", tensor=name) from e
        if expected is not None and name in expected and tuple(expected[name]) != (n, k):
            raise CheckpointError(
                f"{name} is packed as [{n}, {k}] but the model expects {list(expected[name])}; the directory was "
                "converted from another checkpoint.",
                tensor=name,
            )
    for missing in sorted(set(expected or {}) - set(m.get("linears", {}))):
        raise CheckpointError(f"{root}: linear {missing} is missing; run ninfer convert again.", tensor=missing)
    for name, info in m.get("tensors", {}).items():
        plan.append((name, locate(name, info["dtype"], info["shape"]), ""))

    linears: dict[str, PackedWeight] = {
        name: PackedWeight(e["scheme"], (e["shape"][0], e["shape"][1]), {}, dict(e.get("meta", {})))
        for name, e in m.get("linears", {}).items()
    }
    plain: dict[str, torch.Tensor] = {}
    bar = _progress(len(plan), "loading", progress)
    by_file: dict[str, list[tuple[str, str]]] = {}
    for tname, fname, owner in plan:
        by_file.setdefault(fname, []).append((tname, owner))
    for fname, names in by_file.items():
        with safe_open(str(root / fname), framework="pt") as h:
            for tname, owner in names:
                t = h.get_tensor(tname).to(device)
                if owner:
                    linears[owner].tensors[tname[len(owner) + 1 :]] = t
                else:
                    plain[tname] = t
                bar.update(1)
    bar.close()
    return linears, plain, m
