"""What the device can do, and whether an implementation's requirements hold on it.

Every implementation a plugin offers (a linear kernel, an attention backend, a sampler, a
speculator) carries a `Requirements`; the core checks it against the probed `DeviceInfo` before
any weight loads, so an impossible request fails in one sentence instead of deep in a kernel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ninfer.errors import UserError


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    index: int | None
    name: str
    capability: tuple[int, int] | None  # CUDA compute capability, None on CPU
    total_memory: int  # bytes
    free_memory: int  # bytes
    sm_count: int  # streaming multiprocessors (CPU: cores)
    features: frozenset[str] = field(default_factory=frozenset)

    @property
    def torch_device(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index or 0}"

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}" if self.capability else "cpu"

    def describe(self) -> str:
        gib = self.total_memory / 2**30
        if self.kind == "cpu":
            return f"CPU ({self.sm_count} cores, {gib:.0f} GiB)"
        return f"{self.name} ({self.sm}, {self.sm_count} SMs, {gib:.0f} GiB)"


def _features_for(capability: tuple[int, int] | None) -> frozenset[str]:
    if capability is None:
        return frozenset({"fp32", "bf16"})
    major, minor = capability
    feats = {"fp32", "fp16", "cuda"}
    if major >= 8:
        feats |= {"bf16", "triton", "async_copy"}
    if (major, minor) >= (8, 9):
        feats.add("fp8")
    if major >= 9:
        feats |= {"tma", "wgmma"}
    if major >= 10:
        # Blackwell (sm_100 datacenter, sm_120 consumer) adds FP4 tensor cores (NVFP4 MMA).
        feats.add("fp4")
    return frozenset(feats)


def _cpu_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def probe(spec: str = "auto") -> DeviceInfo:
    """Probe `cpu`, `cuda`, `cuda:N`, or `auto` (the first CUDA device, else the CPU)."""
    import torch

    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        mem = _cpu_memory()
        return DeviceInfo("cpu", None, "cpu", None, mem, mem, os.cpu_count() or 1, _features_for(None))
    if not (spec == "cuda" or (spec.startswith("cuda:") and spec[5:].isdigit())):
        raise UserError(f"--device {spec!r} is not a device: use cpu, cuda or cuda:N.", param="device")
    if not torch.cuda.is_available():
        raise UserError(
            f"--device {spec} asked for a CUDA GPU but torch sees none; use --device cpu "
            "or install a CUDA build of torch.",
            param="device",
        )
    index = int(spec[5:]) if ":" in spec else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise UserError(f"--device {spec}: only {count} CUDA device(s) are visible (cuda:0..cuda:{count - 1}).")
    props = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    cap = (props.major, props.minor)
    return DeviceInfo("cuda", index, props.name, cap, total, free, props.multi_processor_count, _features_for(cap))


@dataclass(frozen=True)
class Requirements:
    """What an implementation needs. An empty Requirements runs anywhere."""

    devices: tuple[str, ...] = ("cpu", "cuda")
    min_capability: tuple[int, int] | None = None
    max_capability: tuple[int, int] | None = None
    features: tuple[str, ...] = ()
    min_memory: int = 0  # bytes of device memory

    def problem(self, device: DeviceInfo) -> str | None:
        """Why this cannot run on `device`, or None when it can."""
        if device.kind not in self.devices:
            return f"needs {' or '.join(self.devices)}, this is {device.kind}"
        cap = device.capability
        if self.min_capability and (cap is None or cap < self.min_capability):
            need = f"sm_{self.min_capability[0]}{self.min_capability[1]}+"
            return f"needs {need}, this device is {device.sm}"
        if self.max_capability and cap is not None and cap > self.max_capability:
            return f"needs at most sm_{self.max_capability[0]}{self.max_capability[1]}, this device is {device.sm}"
        missing = [f for f in self.features if f not in device.features]
        if missing:
            return f"needs {', '.join(missing)}, which {device.sm} lacks"
        if self.min_memory and device.total_memory < self.min_memory:
            return f"needs {self.min_memory / 2**30:.1f} GiB, this device has {device.total_memory / 2**30:.1f} GiB"
        return None

    def describe(self) -> str:
        parts = ["/".join(self.devices)]
        if self.min_capability:
            parts.append(f">=sm_{self.min_capability[0]}{self.min_capability[1]}")
        if self.features:
            parts.append("+".join(self.features))
        return " ".join(parts)


ANYWHERE = Requirements()
CUDA_SM80 = Requirements(devices=("cuda",), min_capability=(8, 0))
