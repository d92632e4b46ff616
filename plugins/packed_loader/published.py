"""Published NVFP4 checkpoints (NVIDIA ModelOpt, compressed-tensors `nvfp4-pack-quantized`) as a
weight source: each linear's tensors are imported unchanged by quant_nvfp4's importer, one module
at a time, as the family loader asks for it.

What is quantized is read from the tensors (a module with NVFP4 parts is NVFP4, an FP8 module
becomes bf16, a plain weight stays dense): a module in the checkpoint's exclude / ignore list is
stored in bf16 and so loads dense, whatever `--quant` says. MoE experts are published one module
per expert (`experts.{e}.gate_proj`, `up_proj`, `down_proj`); gate and up are joined by rows into
the model's `gate_up_proj` without touching their codes or scales (`importer.concat_rows`).

`get` still answers for every tensor the model may want as a plain tensor (MTP, the shortlist
head): a quantized module's `weight` is then its fp32 dequantization.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog
import torch

from ninfer.checkpoint import WeightSource, load_hf_config
from ninfer.errors import CheckpointError, UserError
from ninfer.linear import DENSE, PackedWeight, dense_weight
from ninfer_plugins.quant_nvfp4 import formats as NF
from ninfer_plugins.quant_nvfp4.importer import QuantConfig, canonical_name, concat_rows, import_linears, parse_quant_config
from ninfer_plugins.qwen_hybrid.weights import is_fused_experts

log = structlog.get_logger("ninfer.packed_loader")

HF_QUANT_CONFIG = "hf_quant_config.json"
_PARTS = ("weight", "weight_packed", "weight_scale", "weight_scale_2", "weight_global_scale", "input_scale", "input_global_scale")
_FP8 = ("F8_E4M3", "F8_E5M2")


def _quantization_config(cfg: dict[str, Any]) -> dict[str, Any] | None:
    qc = cfg.get("quantization_config")
    if qc is None and isinstance(cfg.get("text_config"), dict):
        qc = cfg["text_config"].get("quantization_config")
    return qc if isinstance(qc, dict) else None


def _is_nvfp4(qc: dict[str, Any]) -> bool:
    method = str(qc.get("quant_method", "")).lower()
    if "modelopt" in method:
        algo = str(qc.get("quant_algo", "")).upper()
        return "FP4" in algo or algo == "MIXED_PRECISION" or any("FP4" in str(e.get("quant_algo", "")).upper() for e in (qc.get("quantized_layers") or {}).values())
    if "compressed" in method:
        if "nvfp4" in str(qc.get("format", "")).lower():
            return True
        for group in (qc.get("config_groups") or {}).values():
            w = group.get("weights") or {}
            if "nvfp4" in str(group.get("format", "")).lower() or (w.get("num_bits") == 4 and w.get("type") == "float"):
                return True
    return False


def published_quant_config(path: str | Path) -> QuantConfig | None:
    """The checkpoint's NVFP4 quantization config, or None when `path` is not a published NVFP4
    checkpoint (an hf_quant_config.json, or config.json's quantization_config naming ModelOpt or
    compressed-tensors NVFP4)."""
    p = Path(path)
    hq = None
    if (p / HF_QUANT_CONFIG).is_file():
        try:
            hq = json.loads((p / HF_QUANT_CONFIG).read_text(encoding="utf-8"))
            if not isinstance(hq, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{p / HF_QUANT_CONFIG} is not valid JSON ({e}); re-download it.") from e
    qc = _quantization_config(load_hf_config(p)) if (p / "config.json").is_file() else None
    if hq is None and (qc is None or not _is_nvfp4(qc)):
        return None
    return parse_quant_config({"quantization_config": qc} if qc else None, hq)


def check_quant_flag(path: Path, quant: str) -> None:
    if quant in ("auto", "nvfp4"):
        return
    raise UserError(
        f"{path} holds NVFP4 weights as published, which ninfer loads unchanged; drop --quant {quant} "
        "(or pass --quant nvfp4), or point --model at the bf16 checkpoint to quantize it yourself.",
        param="quant",
    )


class _OneModule:
    """The tensors of one module, in the shape `import_linears` reads (names + get)."""

    def __init__(self, names: list[str], get: Any) -> None:
        self._names, self.get = names, get

    def names(self) -> list[str]:
        return self._names


class PublishedNvfp4Source:
    """A published NVFP4 checkpoint, read lazily (mmap) module by module."""

    def __init__(self, path: str | Path, shape: Any, quant_config: QuantConfig) -> None:
        self.path = Path(path)
        self.quant_config = quant_config
        self._src = WeightSource(self.path)
        self.num_experts = int(getattr(shape, "num_experts", 0) or 0)
        self._linears = {name for name, _, _ in shape.linear_shapes()}
        modules: dict[str, dict[str, str]] = {}
        for name in self._src.names():
            module, _, part = name.rpartition(".")
            if part in _PARTS and module:
                modules.setdefault(module, {})[part] = name
        # modules whose `weight` is not a plain float matrix: NVFP4 (either layout) or FP8
        self._quantized: dict[str, dict[str, str]] = {
            m: parts
            for m, parts in modules.items()
            if "weight_packed" in parts
            or ("weight" in parts and "weight_scale_2" in parts)
            or ("weight" in parts and "weight_scale" in parts and self._src.info(parts["weight"]).dtype in _FP8)
        }
        self._hidden = {n for parts in self._quantized.values() for n in (parts.get("weight"), parts.get("weight_packed")) if n}
        n_fp4 = sum(1 for p in self._quantized.values() if "weight_packed" in p or "weight_scale_2" in p)
        log.info("published NVFP4 checkpoint", path=str(self.path), producer=quant_config.producer, nvfp4_modules=n_fp4,
                 fp8_modules=len(self._quantized) - n_fp4, excluded=len(quant_config.exclude))

    # --- linears ------------------------------------------------------------------------------------

    def _import(self, module: str) -> PackedWeight:
        parts = self._quantized[module]
        got = list(import_linears(_OneModule(list(parts.values()), self._src.get), self.quant_config))
        if len(got) != 1:
            raise CheckpointError(f"{self.path}: module {module} has tensors {sorted(parts)}, not an NVFP4 or FP8 linear.", tensor=module)
        return got[0][1]

    def _linear(self, module: str) -> PackedWeight:
        if module in self._quantized:
            return self._import(module)
        return dense_weight(self._src.get(module + ".weight"))

    @staticmethod
    def _dense(p: PackedWeight) -> torch.Tensor:
        return p.tensors["weight"] if p.scheme == DENSE else NF.dequantize(p)

    def _gate_up(self, gate: str, up: str) -> PackedWeight:
        a, b = self._linear(gate), self._linear(up)
        if a.scheme == b.scheme == NF.SCHEME:
            return concat_rows([a, b])
        # one half NVFP4 and the other not (no producer does this): both dense, exactly
        return dense_weight(torch.cat([self._dense(a).float(), self._dense(b).float()]))

    def get_packed(self, name: str) -> PackedWeight | list[PackedWeight] | None:
        """A linear's weight as imported (None for tensors that are not linears, and for experts
        stored unquantized, which the family loader stacks itself)."""
        if name.endswith(".weight"):
            module = name.removesuffix(".weight")
            if module in self._quantized:
                return self._import(module)
            if canonical_name(module) in self._linears and self._src.has(name):
                # excluded from quantization by the producer: loaded dense, whatever the recipe says
                return dense_weight(self._src.get(name))
            return None
        if not is_fused_experts(name) or self._src.has(name):
            return None
        base, _, leaf = name.rpartition(".")
        experts = range(self.num_experts)
        if leaf == "gate_up_proj":
            pairs = [(f"{base}.{e}.gate_proj", f"{base}.{e}.up_proj") for e in experts]
            if not any(m in self._quantized for pair in pairs for m in pair):
                return None
            return [self._gate_up(g, u) for g, u in pairs]
        downs = [f"{base}.{e}.down_proj" for e in experts]
        if not any(m in self._quantized for m in downs):
            return None
        return [self._linear(m) for m in downs]

    # --- plain tensors --------------------------------------------------------------------------

    def names(self) -> list[str]:
        visible = {n for n in self._src.names() if n not in self._hidden}
        return sorted(visible | {m + ".weight" for m in self._quantized})

    def has(self, name: str) -> bool:
        if name.endswith(".weight") and name.removesuffix(".weight") in self._quantized:
            return True
        return self._src.has(name) and name not in self._hidden

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module in self._quantized:
            p = self._import(module)
            w = self._dense(p).float()
            if shape is not None and tuple(w.shape) != tuple(shape):
                raise CheckpointError(
                    f"{self.path}: {module} is {list(w.shape)}, the model expects {list(shape)}; "
                    "the checkpoint does not match its config.json.",
                    tensor=name,
                )
            return w
        return self._src.get(name, shape)

    def shape(self, name: str) -> tuple[int, ...]:
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module in self._quantized:
            parts = self._quantized[module]
            w = self._src.info(parts.get("weight_packed") or parts["weight"])
            return (w.shape[0], w.shape[1] * 2) if w.dtype == "U8" else w.shape
        return self._src.shape(name)

    def close(self) -> None:
        self._src.close()

    def __repr__(self) -> str:
        return f"PublishedNvfp4Source({self.path}, {self.quant_config.producer}, {len(self._quantized)} quantized modules)"
