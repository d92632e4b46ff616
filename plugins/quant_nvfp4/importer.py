"""Import published NVFP4 checkpoints unchanged: NVIDIA ModelOpt and compressed-tensors layouts.

Per quantized linear (formats.md section 9):
* ModelOpt: `weight` uint8 [N, K/2], `weight_scale` e4m3 [N, K/16], `weight_scale_2` fp32 scalar
  (g, a multiplier), `input_scale` fp32 (the W4A4 activation scale).
* compressed-tensors `nvfp4-pack-quantized`: `weight_packed` (same bytes), `weight_scale`,
  `weight_global_scale` fp32 [1] = 1/g (a divisor), `input_global_scale` = 1/input_scale.
Both become the canonical "nvfp4" PackedWeight: codes and block scales byte-for-byte as published,
g = fp32(1 / weight_global_scale) for compressed-tensors (one rounding).

Which modules are quantized is read from the tensors themselves (a module with NVFP4 parts is
NVFP4, one with a plain `weight` is dense); the config's lists of unquantized modules
(`exclude_modules`, `ignore`, the per-layer `quantized_layers` of MIXED_PRECISION) are parsed
and checked against them, because producers are known to disagree with their own lists (ModelOpt
keeps `mtp.fc` in bf16 without listing it). FP8 modules of mixed-precision checkpoints (per-tensor
or per-channel scales) are dequantized to bf16: there is no fp8 linear kernel yet.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch

from ninfer.errors import CheckpointError
from ninfer.linear import PackedWeight, dense_weight
from ninfer_plugins.quant_nvfp4 import formats as F

log = structlog.get_logger("ninfer.quant_nvfp4")

_PARTS = ("weight", "weight_packed", "weight_scale", "weight_scale_2", "weight_global_scale", "input_scale", "input_global_scale")
_PREFIXES = ("model.language_model.", "model.")


def canonical_name(module: str) -> str:
    """`model.language_model.layers.3.mlp.up_proj` -> `layers.3.mlp.up_proj` (lm_head, mtp.* unchanged)."""
    for p in _PREFIXES:
        if module.startswith(p):
            return module[len(p) :]
    return module


@dataclass
class QuantConfig:
    """What a checkpoint's quantization config says (ModelOpt or compressed-tensors)."""

    producer: str  # "modelopt" | "compressed-tensors" | "none"
    group_size: int = F.BLOCK
    exclude: tuple[str, ...] = ()
    # MIXED_PRECISION: module -> algorithm ("NVFP4", "W4A16_NVFP4", "FP8", ...)
    layer_algos: dict[str, str] = field(default_factory=dict)

    def excluded(self, module: str) -> bool:
        names = {module, canonical_name(module), "model." + canonical_name(module)}
        for pat in self.exclude:
            if pat.startswith("re:"):
                rx = re.compile(pat[3:])
                if any(rx.match(n) for n in names):
                    return True
                continue
            for n in names:
                if n == pat or n.startswith(pat + ".") or fnmatch.fnmatchcase(n, pat):
                    return True
        return False

    def algo_for(self, module: str) -> str | None:
        if not self.layer_algos:
            return None
        c = canonical_name(module)
        for name, algo in self.layer_algos.items():
            # `layers.N.mlp.experts` covers every expert below it
            if canonical_name(name) in (c, c.rsplit(".", 2)[0]) or c.startswith(canonical_name(name) + "."):
                return algo
        return None


def parse_quant_config(config: Mapping[str, Any] | None = None, hf_quant_config: Mapping[str, Any] | None = None) -> QuantConfig:
    """From config.json (or its `quantization_config`) and/or ModelOpt's hf_quant_config.json."""
    qc: Mapping[str, Any] = {}
    if config:
        qc = config.get("quantization_config", config) if isinstance(config, Mapping) else {}
    exclude: list[str] = []
    algos: dict[str, str] = {}
    producer = "none"
    group = F.BLOCK
    if hf_quant_config:
        q = hf_quant_config.get("quantization", hf_quant_config)
        producer = "modelopt"
        exclude += list(q.get("exclude_modules") or [])
        group = int(q.get("group_size") or group)
        for name, entry in (q.get("quantized_layers") or {}).items():
            algos[name] = str(entry.get("quant_algo", ""))
            group = int(entry.get("group_size") or group) if "NVFP4" in algos[name] else group
    method = str(qc.get("quant_method", "")).lower()
    if method:
        producer = "compressed-tensors" if "compressed" in method else "modelopt" if "modelopt" in method else method
    exclude += list(qc.get("ignore") or []) + list(qc.get("exclude_modules") or [])
    if qc.get("group_size"):
        group = int(qc["group_size"])
    for name, entry in (qc.get("quantized_layers") or {}).items():
        algos.setdefault(name, str(entry.get("quant_algo", "")))
    for grp in (qc.get("config_groups") or {}).values():
        weights = grp.get("weights") or {}
        if weights.get("num_bits") == 4 and weights.get("type") == "float" and weights.get("group_size"):
            group = int(weights["group_size"])
    if group != F.BLOCK:
        raise CheckpointError(f"this NVFP4 checkpoint uses group size {group}; NVFP4 is defined with blocks of 16.")
    return QuantConfig(producer, group, tuple(dict.fromkeys(exclude)), algos)


# --- tensors ----------------------------------------------------------------------------------------


def _reader(source: Any) -> tuple[list[str], Any]:
    """(names, get) for a WeightSource (names()/get()) or a plain mapping of name -> tensor."""
    if hasattr(source, "names") and hasattr(source, "get") and not isinstance(source, Mapping):
        return list(source.names()), source.get
    return list(source.keys()), source.__getitem__


def _modules(names: list[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for name in names:
        module, _, part = name.rpartition(".")
        if part in _PARTS and module:
            out.setdefault(module, {})[part] = name
    return out


def _scalar(t: torch.Tensor, what: str, name: str) -> float:
    if t.numel() != 1:
        raise CheckpointError(f"{name}: {what} should hold one number, it has shape {list(t.shape)}.", tensor=name)
    return float(t.reshape(()).to(torch.float32))


def _nvfp4(module: str, parts: dict[str, str], get: Any, compressed: bool) -> PackedWeight:
    wname = parts["weight_packed" if compressed else "weight"]
    w = get(wname)
    s = get(parts["weight_scale"]) if "weight_scale" in parts else None
    if w.dtype != torch.uint8 or w.dim() != 2:
        raise CheckpointError(f"{wname} should be uint8 [N, K/2] (two E2M1 codes per byte), it is {w.dtype} {list(w.shape)}.", tensor=wname)
    n, k = w.shape[0], w.shape[1] * 2
    sname = parts.get("weight_scale", module + ".weight_scale")
    if s is None or s.dtype != torch.float8_e4m3fn or tuple(s.shape) != (n, k // F.BLOCK):
        got = "missing" if s is None else f"{s.dtype} {list(s.shape)}"
        raise CheckpointError(f"{sname} should be float8_e4m3fn [{n}, {k // F.BLOCK}], it is {got}.", tensor=sname)
    meta: dict[str, Any] = {"source": "compressed-tensors" if compressed else "modelopt"}
    if compressed:
        gname = parts.get("weight_global_scale")
        if gname is None:
            raise CheckpointError(f"{module} has weight_packed but no weight_global_scale.", tensor=module + ".weight_global_scale")
        gs = get(gname).to(torch.float32).reshape(-1)[:1].reshape(())
        if not (float(gs) > 0 and torch.isfinite(gs)):
            raise CheckpointError(f"{gname} is {float(gs)}; a global scale must be a positive number.", tensor=gname)
        g = torch.ones((), dtype=torch.float32) / gs.cpu()
        if "input_global_scale" in parts:
            meta["input_scale"] = 1.0 / _scalar(get(parts["input_global_scale"]), "input_global_scale", parts["input_global_scale"])
    else:
        gname = parts.get("weight_scale_2")
        if gname is None:
            raise CheckpointError(f"{module} has NVFP4 codes but no weight_scale_2.", tensor=module + ".weight_scale_2")
        g = torch.tensor(_scalar(get(gname), "weight_scale_2", gname), dtype=torch.float32)
        if "input_scale" in parts:
            meta["input_scale"] = _scalar(get(parts["input_scale"]), "input_scale", parts["input_scale"])
    return PackedWeight(F.SCHEME, (n, k), {"weight": w, "weight_scale": s, "weight_scale_2": g.to(w.device)}, meta)


def _fp8_dense(module: str, parts: dict[str, str], get: Any) -> PackedWeight:
    w = get(parts["weight"])
    s = get(parts["weight_scale"]).to(torch.float32)
    if s.numel() == 1:
        dense = w.to(torch.float32) * s.reshape(())
    elif s.numel() == w.shape[0]:
        dense = w.to(torch.float32) * s.reshape(-1, 1)
    else:
        raise CheckpointError(
            f"{parts['weight_scale']}: an fp8 weight scale of shape {list(s.shape)} is neither per tensor nor per row "
            f"of {list(w.shape)}; this fp8 layout is not supported.",
            tensor=parts["weight_scale"],
        )
    return dense_weight(dense.to(torch.bfloat16))


def import_linears(source: Any, quant_config: QuantConfig | None = None) -> Iterator[tuple[str, PackedWeight]]:
    """Every 2-D linear of `source` as (module name as stored, PackedWeight).

    NVFP4 modules (either layout) come out as scheme "nvfp4", tensors unchanged; fp8 modules and
    plain weights come out dense ("bf16"). 1-D and 3-D tensors (norms, conv, fused expert stacks)
    and non-weight tensors are not linears and are left to the model's loader.
    """
    cfg = quant_config or QuantConfig("none")
    names, get = _reader(source)
    for module, parts in sorted(_modules(names).items()):
        if "weight_packed" in parts:
            packed = _nvfp4(module, parts, get, compressed=True)
        elif "weight" in parts and "weight_scale_2" in parts:
            packed = _nvfp4(module, parts, get, compressed=False)
        elif "weight" in parts:
            w = get(parts["weight"])
            if w.dim() != 2:
                continue
            if w.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and "weight_scale" in parts:
                packed = _fp8_dense(module, parts, get)
            elif w.dtype.is_floating_point and w.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
                packed = dense_weight(w)
            else:
                raise CheckpointError(f"{parts['weight']}: a {w.dtype} weight with no scales is not a layout ninfer reads.", tensor=parts["weight"])
        else:
            continue
        if packed.scheme == F.SCHEME and cfg.excluded(module):
            log.warning("module is in the checkpoint's unquantized list but stored as NVFP4; loading it as NVFP4", module=module)
        algo = cfg.algo_for(module)
        if packed.scheme == F.SCHEME and algo is not None and "FP4" not in algo.upper():
            log.warning("config says another format for this module; its tensors are NVFP4", module=module, algo=algo)
        if packed.scheme == F.SCHEME and ("input_scale" not in packed.meta or "A16" in (algo or "").upper()):
            # published weight-only (no activation scale calibrated, or ModelOpt's W4A16_NVFP4): its
            # activations stay bf16 even where FP4 tensor cores could take them (quant_nvfp4.native)
            packed.meta["weight_only"] = True
        yield module, packed


def concat_rows(weights: list[PackedWeight]) -> PackedWeight:
    """Stack NVFP4 weights along N (gate and up of one expert into gate_up).

    Global scales that differ are kept per row (`weight_scale_2` [N]) instead of being reconciled,
    which would re-round the block scales.
    """
    ks = {p.shape[1] for p in weights}
    if len(ks) != 1 or any(p.scheme != F.SCHEME for p in weights):
        raise ValueError("concat_rows needs nvfp4 weights of one K")
    gs = [p.tensors["weight_scale_2"].to(torch.float32).reshape(-1) for p in weights]
    n = sum(p.shape[0] for p in weights)
    if all(g.numel() == 1 for g in gs) and all(bool(torch.equal(g, gs[0])) for g in gs):
        g = gs[0].reshape(())
    else:
        g = torch.cat([g.expand(p.shape[0]) for g, p in zip(gs, weights)])
    # a W4A4 kernel quantizes the merged input with one static scale: the largest of the parts'
    # calibrated ones (none unless every part has one)
    inputs = [p.meta.get("input_scale") for p in weights]
    meta = {"input_scale": max(float(v) for v in inputs)} if inputs and all(v is not None for v in inputs) else {}
    if any(p.meta.get("weight_only") for p in weights):
        meta["weight_only"] = True  # one weight-only part keeps the merged input bf16
    return PackedWeight(
        F.SCHEME,
        (n, ks.pop()),
        {
            "weight": torch.cat([p.tensors["weight"] for p in weights]),
            "weight_scale": torch.cat([p.tensors["weight_scale"] for p in weights]),
            "weight_scale_2": g.contiguous(),
        },
        meta,
    )
