"""The quantization contract: weight formats, recipes, linear kernels and the module that joins them.

* A `QuantScheme` says how one [n, k] weight is stored (`PackedWeight`) and gives the reference
  `dequantize` every kernel is tested against.
* A `QuantRecipe` says which scheme each named linear of a model gets (`--quant int4` is a recipe).
* A `LinearKernel` computes `x @ W.T` for one scheme; plugins offer them through
  `ninfer_linear_kernel`, and the fastest whose requirements hold is chosen per (scheme, n, k).
* `QLinear` is the nn.Module the models hold: a packed weight plus its chosen kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
from torch import nn

from ninfer.device import ANYWHERE, DeviceInfo, Requirements

# The unquantized scheme: the weight kept in the model's dtype.
DENSE = "bf16"


@dataclass
class PackedWeight:
    """One linear weight in some scheme: named tensors plus the logical [n, k] shape."""

    scheme: str
    shape: tuple[int, int]
    tensors: dict[str, torch.Tensor]
    # scheme-specific facts that are not tensors (a global scale kept as float, a layout version)
    meta: dict[str, Any] = field(default_factory=dict)

    def to(self, device: torch.device | str) -> PackedWeight:
        return PackedWeight(self.scheme, self.shape, {k: v.to(device) for k, v in self.tensors.items()}, dict(self.meta))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


@dataclass(frozen=True)
class QuantScheme:
    name: str
    bits_per_weight: float
    version: int
    quantize: Callable[[torch.Tensor], PackedWeight]
    # the oracle: float32 [n, k]
    dequantize: Callable[[PackedWeight], torch.Tensor]
    description: str = ""
    # True when rows are encoded independently and every tensor of a PackedWeight is row-major in
    # n: quantizing a stack of matrices as one [sum n, k] weight then gives each matrix exactly its
    # own bits, as row slices (a loader packs 256 experts in a few calls instead of 256). NVFP4 is
    # not: its global scale spans the whole tensor.
    rowwise: bool = False


@dataclass(frozen=True)
class QuantRecipe:
    """Which scheme each linear gets. `rules` are tried in order: (predicate on name, scheme)."""

    name: str
    scheme_for: Callable[[str, int, int], str]
    description: str = ""


class LinearKernel(Protocol):
    name: str
    requirements: Requirements

    def prepare(self, weight: PackedWeight) -> Any:
        """Repack once at load time into the layout `apply` reads (default: as is)."""

    def apply(self, x: torch.Tensor, prepared: Any) -> torch.Tensor:
        """y = x @ W.T for x [..., k] -> [..., n], in x's dtype."""

    # Optional: `apply_add_norm(x, prepared, add_norm: AddNorm) -> y | None`: apply, plus the
    # block's residual add and norm in the same launch (sets add_norm.out), or None where this
    # call cannot fold it (QLinear.forward then runs apply and the caller the add and norm).
    # Optional: `apply_gated(gu, prepared) -> y | None`: y = apply(silu(gate) * up) for a merged
    # gate | up output gu [..., 2k], the activation computed inside the launch; None where it cannot.
    # Optional: `resident_bytes(n, k, packed_bytes, device: DeviceInfo) -> int`: what one [n, k]
    # weight holds once prepared on `device`, QLinear's kept packed copy included, where that is not
    # `packed_bytes` (the scheme's bits per weight). The memory plan asks it before any weight loads:
    # a kernel that dequantizes to an fp32 copy (the CPU reference path) holds 8x int4's bytes.


class DenseKernel:
    """torch's own matmul on an unquantized weight: runs anywhere, the default for `bf16`."""

    name = "torch.linear"
    requirements = ANYWHERE

    def prepare(self, weight: PackedWeight) -> torch.Tensor:
        return weight.tensors["weight"]

    def apply(self, x: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, prepared)


def dense_weight(w: torch.Tensor) -> PackedWeight:
    return PackedWeight(DENSE, (w.shape[0], w.shape[1]), {"weight": w})


@dataclass
class AddNorm:
    """A pre-norm block's step after a linear, offered to the linear's kernel: `residual +=
    linear(x)` (rounded to the residual's dtype, in place) and `out = (1 + weight) RMSNorm(residual)`.
    A kernel that can fold it into its own launch does both and sets `out`; otherwise `out` stays
    None and the caller runs them (see QLinear.forward)."""

    residual: torch.Tensor
    weight: torch.Tensor
    eps: float
    out: torch.Tensor | None = None


class QLinear(nn.Module):
    """A bias-free linear layer whose weight lives in some scheme and runs through a chosen kernel."""

    def __init__(self, name: str, n: int, k: int, scheme: str, kernel: LinearKernel) -> None:
        super().__init__()
        self.name = name
        self.n, self.k = n, k
        self.scheme = scheme
        self.kernel = kernel
        # the weight as loaded; None on a GPU when the kernel keeps a layout of its own
        self.packed: PackedWeight | None = None
        self.prepared: Any = None
        # merge_dense: the merged linear this one is a row slice of; a new weight here makes it stale
        self.merged_into: QLinear | None = None
        self.stale = False

    def set_weight(self, packed: PackedWeight) -> None:
        if tuple(packed.shape) != (self.n, self.k):
            from ninfer.errors import CheckpointError

            raise CheckpointError(
                f"{self.name}: weight is {list(packed.shape)}, the model expects [{self.n}, {self.k}].",
                tensor=self.name,
            )
        self.prepared = self.kernel.prepare(packed)
        if self.merged_into is not None:
            # the merged copy no longer holds this weight: its users fall back to the parts
            self.merged_into.stale = True
            self.merged_into = None
        # A kernel that builds its own layout (`repacks`, e.g. NVFP4's g16-split8-f16) leaves the
        # original unused by forward(); off the CPU it is dropped, else the weights are held twice
        # there (27B nvfp4: 31.9 GiB peak against int4's 19.5 on the H200). On the CPU it stays
        # for introspection (tests compare loaded bytes); readers must accept None.
        off_cpu = any(t.device.type != "cpu" for t in packed.tensors.values())
        self.packed = None if off_cpu and getattr(self.kernel, "repacks", False) else packed

    def forward(self, x: torch.Tensor, add_norm: AddNorm | None = None) -> torch.Tensor:
        """y = x @ W.T; with `add_norm`, the kernel may also fold the block's residual add and
        norm into its launch (kernels with `apply_add_norm`; it sets add_norm.out when it did)."""
        if self.prepared is None:
            raise RuntimeError(f"{self.name}: weight was never loaded")
        if add_norm is not None and add_norm.out is None:
            fold = getattr(self.kernel, "apply_add_norm", None)
            y = fold(x, self.prepared, add_norm) if fold is not None else None
            if y is not None:
                return y
        return self.kernel.apply(x, self.prepared)

    def norm_input(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                   residual: torch.Tensor | None = None):
        """The (1 + weight) RMSNorm that makes this linear's input (after `residual += x` in place,
        when given), made by this linear's kernel where it does more in that launch (kernels with
        `norm_input`: quant_int's K-walk and CUDA GEMVs take their x pairs from it, unless
        NINFER_NORM_PAIRS=0); None where it does not (the caller norms as
        usual). A kernel may leave `residual` as it was and put the sum in a new tensor: it then
        returns (that sum, the norm), and the caller carries the sum on as the residual stream."""
        fn = getattr(self.kernel, "norm_input", None)
        if fn is None or self.prepared is None:
            return None
        return fn(self.prepared, x, weight, eps, residual)

    def input_pairs(self, rows: int, device: torch.device):
        """What the kernel that makes this linear's input (of `rows` rows, on `device`) may also
        write for it, so that this linear's kernel skips its own preparation launch: an
        ninfer.kernels.triton.gdn.OutPairs (quant_int's K-walk and CUDA GEMVs' x pairs, unless
        NINFER_NORM_PAIRS=0), or None. After that kernel ran, `inputs_made(x)` says on which tensor."""
        fn = getattr(self.kernel, "input_pairs", None)
        if fn is None or self.prepared is None:
            return None
        return fn(self.prepared, rows, device)

    def inputs_made(self, x: torch.Tensor) -> None:
        """x's prepared form (asked for with input_pairs) was written by the kernel that made x."""
        fn = getattr(self.kernel, "inputs_made", None)
        if fn is not None and self.prepared is not None:
            fn(self.prepared, x)

    def forward_gated(self, gu: torch.Tensor) -> torch.Tensor | None:
        """y = (silu(gate) * up) @ W.T for gu = [gate | up] [..., 2k], where the kernel can take
        the activation into its own launch (`apply_gated`); None otherwise (the caller runs the
        activation, then forward)."""
        if self.prepared is None:
            raise RuntimeError(f"{self.name}: weight was never loaded")
        fold = getattr(self.kernel, "apply_gated", None)
        return fold(gu, self.prepared) if fold is not None else None

    def extra_repr(self) -> str:
        return f"{self.name}: [{self.n}, {self.k}] {self.scheme} via {self.kernel.name}"


def merge_dense(linears: list[QLinear], name: str) -> QLinear | None:
    """One QLinear over the rows of several dense ones that read the same input (gate and up,
    a GDN layer's four input projections): one GEMV launch instead of several, which at one token
    is mostly launch and latency. The parts are re-pointed at row views of the merged weight, so
    the weights are held once and every other path (prefill, the reference cores) keeps working
    on the parts. None unless every part is dense, loaded, 2-D and alike (device, dtype, k)."""
    if len(linears) < 2 or any(x.scheme != DENSE or not isinstance(x.prepared, torch.Tensor) for x in linears):
        return None
    # only kernels that run the weight as loaded (prepare is the identity): another layout would
    # be prepared twice
    if any(x.packed is None or x.prepared is not x.packed.tensors.get("weight") for x in linears):
        return None
    ws = [x.prepared for x in linears]
    w0 = ws[0]
    if any(w.dim() != 2 or w.shape[1] != w0.shape[1] or w.dtype != w0.dtype or w.device != w0.device for w in ws):
        return None
    merged = QLinear(name, sum(w.shape[0] for w in ws), w0.shape[1], DENSE, linears[0].kernel)
    merged.set_weight(dense_weight(torch.cat(ws)))
    start = 0
    for x, w in zip(linears, ws):
        x.set_weight(dense_weight(merged.prepared[start : start + w.shape[0]]))
        # a plain attribute, not a registered submodule (nn.Module would make it one)
        x.__dict__["merged_into"] = merged
        start += w.shape[0]
    merged.splits = [w.shape[0] for w in ws]
    return merged


def merge_rows(linears: list[QLinear], name: str) -> QLinear | None:
    """merge_dense for any scheme: dense parts as there; quantized parts of one scheme and K whose
    kernel can stack its prepared layout by rows (`merge_prepared`, e.g. the int and NVFP4
    Triton kernels: row-major packed rows, per-row scales) become one linear over all their rows,
    the parts re-pointed at row views of it. At one token a quantized launch carries ~10 µs of
    fixed cost (ramp, split-K fix-up, drain: BENCHMARKS.md), so two launches cost more than one
    of twice the rows. None where the parts cannot be merged."""
    if len(linears) < 2:
        return None
    if all(x.scheme == DENSE for x in linears):
        return merge_dense(linears, name)
    first = linears[0]
    if any(x.scheme != first.scheme or x.k != first.k or type(x.kernel) is not type(first.kernel) or x.prepared is None
           for x in linears):
        return None
    merge = getattr(first.kernel, "merge_prepared", None)
    got = merge([x.prepared for x in linears]) if merge is not None else None
    if got is None:
        return None
    merged_prepared, views = got
    merged = QLinear(name, sum(x.n for x in linears), first.k, first.scheme, first.kernel)
    merged.prepared = merged_prepared
    for x, view in zip(linears, views):
        x.prepared = view
        x.__dict__["merged_into"] = merged
        # the part's loaded tensors are what its prepared layout was (the int kernels read them as
        # loaded): off the CPU they would now be held twice, the merged copy and these (measured:
        # +8.3 GiB on the 27B int4). As in set_weight, readers of `packed` accept None.
        if x.packed is not None and any(t.device.type != "cpu" for t in x.packed.tensors.values()):
            x.packed = None
    merged.splits = [x.n for x in linears]
    return merged


def live(merged: QLinear | None) -> QLinear | None:
    """`merged` while every part still holds the weight it was merged from, else None."""
    return merged if merged is not None and not merged.stale else None


class LinearFactory:
    """Makes every QLinear of a model: scheme from the recipe, kernel chosen once per (scheme, n, k).

    `choices` keeps what was chosen (and passed over) for the startup report.
    """

    def __init__(self, plugins: Any, device: DeviceInfo, recipe: QuantRecipe | None) -> None:
        self.plugins = plugins
        self.device = device
        self.recipe = recipe
        self.choices: dict[tuple[str, int, int], Any] = {}

    def scheme_for(self, name: str, n: int, k: int) -> str:
        return self.recipe.scheme_for(name, n, k) if self.recipe else DENSE

    def kernel_for(self, scheme: str, n: int, k: int) -> LinearKernel:
        key = (scheme, n, k)
        if key not in self.choices:
            self.choices[key] = self.plugins.choose(
                "ninfer_linear_kernel", self.device, slot=f"linear[{scheme} {n}x{k}]", scheme=scheme, n=n, k=k
            )
        return self.choices[key].impl

    def make(self, name: str, n: int, k: int) -> QLinear:
        scheme = self.scheme_for(name, n, k)
        return QLinear(name, n, k, scheme, self.kernel_for(scheme, n, k))
