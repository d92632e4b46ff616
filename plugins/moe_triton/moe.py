"""`TritonMoe`: the sparse-MoE layer on the grouped Triton kernels (the `ninfer_moe_kernel` object).

A layer's step, no host sync in any case:
* decode at T <= 4 with int experts and a shared expert (`takes_pairs`): route_gemv at T = 1
  (router GEMV and routing in one launch; at 2..4 the `gate` QLinear, then route without a plan)
  -> pair_gemv.gate_up -> pair_gemv.down (routing weights and the combine fused);
* other decode (T <= 16): router logits (the `gate` QLinear) -> route (softmax, top-k,
  renormalise, shared gate, tile plan) -> gate_up (routed and shared) -> down (routed and shared,
  times the weights) -> combine;
* prefill: the same tile kernels with bigger tiles and a torch-sorted plan (grouped_gemm.py).

Weights. `prepare` stacks the experts' packed weights of a layer along rows (grouped_gemv.Matrix;
NVFP4 repacked once into quant_nvfp4's prepared layout) and points each expert's QLinear at a
view of the stack, so the weights are held once. The shared expert and its gate are read from
their QLinears at call time (a pointer each): a dense weight, or quant_int's / quant_nvfp4's
prepared layout (`Prepared`: fmt, qweight, scales, qhigh, gscale). Any other shared layout makes
the layer run the routed part here and the shared expert through its QLinears.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton

from ninfer.device import Requirements
from ninfer.linear import DENSE, PackedWeight
from ninfer_plugins.moe_triton import grouped_gemm as GM
from ninfer_plugins.moe_triton import grouped_gemv as GV
from ninfer_plugins.moe_triton import moe_block as MB
from ninfer_plugins.moe_triton import pair_gemv as PG
from ninfer_plugins.moe_triton import prefill_grouped as PF
from ninfer_plugins.moe_triton.router import DECODE_BLOCK_M, Routing, route, route_gemv, route_gemv_tokens
from ninfer_plugins.quant_int import kernels as QK
from ninfer_plugins.quant_int.formats import FORMATS

# Any CUDA GPU on which Triton compiles bf16 tl.dot (Ampere and later).
TRITON_SM80 = Requirements(devices=("cuda",), min_capability=(8, 0), features=("triton",))
NVFP4 = "nvfp4"
SCHEMES = (DENSE, *FORMATS, NVFP4)


@dataclass
class ExpertWeights:
    """A layer's routed experts, stacked: gate_up rows e * 2I + r, down rows e * H + n."""

    gate_up: GV.Matrix
    down: GV.Matrix
    num_experts: int
    hidden: int
    inner: int

    @property
    def bytes_per_expert(self) -> int:
        return (2 * self.inner * self.gate_up.nbytes_per_row) + self.hidden * self.down.nbytes_per_row


def _row_stack(ts: list[torch.Tensor]) -> torch.Tensor | None:
    """[E, n, ...] over the same memory when the E tensors are consecutive row slices of one
    contiguous tensor (the loader's one-call quantization of a bank), else None."""
    first = ts[0]
    base = first._base
    if base is None or not base.is_contiguous() or base.shape[0] != len(ts) * first.shape[0]:
        return None
    step = first.numel() * first.element_size()
    if any(t._base is not base or t.data_ptr() != base.data_ptr() + i * step for i, t in enumerate(ts)):
        return None
    return base.view(len(ts), *first.shape)


def stack_experts(packed: list[PackedWeight], dense_stack: torch.Tensor | None = None, linears: Any = ()) -> GV.Matrix:
    """Experts' weights of one scheme and shape -> one Matrix, rows e * n + r. `dense_stack` is the
    layer's [E, n, k] tensor when the experts are dense (no copy); `linears`, the experts'
    QLinears, are pointed at views of an int stack."""
    scheme = packed[0].scheme
    if any(p.scheme != scheme or p.shape != packed[0].shape for p in packed):
        raise ValueError("the grouped MoE kernels need every expert of a layer in one scheme and shape")
    n, k = packed[0].shape
    if scheme == DENSE:
        w = dense_stack if dense_stack is not None else torch.stack([p.tensors["weight"] for p in packed])
        return GV.Matrix(GV.DENSE_FMT, w.reshape(-1, k), k)
    if scheme == NVFP4:
        return _stack_nvfp4(packed, linears)
    shared = {name: _row_stack([p.tensors[name] for p in packed]) for name in packed[0].tensors}
    if all(t is not None for t in shared.values()):
        # quantized as one stack by the loader: the experts' weights already are its row slices
        parts = shared
    else:
        parts = {name: torch.stack([p.tensors[name] for p in packed]) for name in packed[0].tensors}
        for e, linear in enumerate(linears):
            # the expert's own QLinear keeps a view of the stack (its fallback path), not a second copy
            if not getattr(linear.kernel, "repacks", False):
                linear.set_weight(PackedWeight(scheme, (n, k), {name: t[e] for name, t in parts.items()}, dict(packed[e].meta)))
    fmt = FORMATS[scheme].bits
    q = parts["qweight"]
    if fmt == 8:
        q = q.view(torch.uint8)
    h = parts.get("qhigh")
    rows = len(packed) * n
    return GV.Matrix(fmt, q.reshape(rows, -1), k, parts["scales"].reshape(rows, -1), None if h is None else h.reshape(rows, -1))


def _stack_nvfp4(packed: list[PackedWeight], linears: Any) -> GV.Matrix:
    """NVFP4 experts -> one Matrix in quant_nvfp4's prepared layout ("g16-split8-f16"), rows e * n + r,
    a global scale per row (experts may differ). Where the experts' own QLinears repack (the GPU
    kernel), they are pointed at views of the stack, so the layer's weights are held once (rows
    must then be a multiple of the kernel's row padding, which the views also need)."""
    from ninfer_plugins.quant_int import kernels as QK
    from ninfer_plugins.quant_nvfp4.importer import concat_rows
    from ninfer_plugins.quant_nvfp4.kernels import prepare_nvfp4

    n, k = packed[0].shape
    p = prepare_nvfp4(concat_rows(packed))
    rows = len(packed) * n
    if n % QK.ROW_PAD == 0:
        from ninfer_plugins.quant_nvfp4.kernels import nvfp4_kernels

        for e, linear in enumerate(linears):
            if not getattr(linear.kernel, "repacks", False):
                continue
            if getattr(linear.prepared, "fmt", None) != QK.NVFP4:
                # another NVFP4 kernel prepared this expert (the W4A4 one of quant_nvfp4.native,
                # on FP4 tensor cores): the grouped kernels read the stack, and the expert's own
                # linear (the fallback path) runs W4A16 from views of it, so the weights are held once
                linear.kernel = nvfp4_kernels()[0]
            sl = slice(e * n, (e + 1) * n)
            linear.prepared = dataclasses.replace(p, n=n, qweight=p.qweight[sl], scales=p.scales[sl], gscale=p.gscale[sl])
    return GV.Matrix(GV.NVFP4_FMT, p.qweight[:rows], k, p.scales[:rows], None, p.gscale[:rows])


def matrix_of(linear: Any) -> GV.Matrix | None:
    """A QLinear's weight as the grouped kernels read it, or None for a layout they do not know."""
    p = linear.prepared
    if isinstance(p, torch.Tensor) and p.dim() == 2 and p.stride(-1) == 1:
        return GV.Matrix(GV.DENSE_FMT, p, linear.k)
    fmt = getattr(p, "fmt", None)
    if fmt in GV.INT_FMTS and isinstance(getattr(p, "qweight", None), torch.Tensor):
        return GV.Matrix(fmt, p.qweight, linear.k, p.scales, p.qhigh)
    if fmt == GV.NVFP4_FMT and isinstance(getattr(p, "gscale", None), torch.Tensor):
        return GV.Matrix(fmt, p.qweight, linear.k, p.scales, None, p.gscale)
    return None


@dataclass
class SharedWeights:
    gate: GV.Matrix
    up: GV.Matrix
    down: GV.Matrix
    inner: int
    gate_weight: torch.Tensor | None  # dense [1, H] shared_expert_gate, else its logits are computed


def shared_weights(moe: Any) -> SharedWeights | None:
    se = moe.shared_expert
    g, u, d = matrix_of(se.gate_proj), matrix_of(se.up_proj), matrix_of(se.down_proj)
    if g is None or u is None or d is None or g.fmt != u.fmt:
        return None
    sg = moe.shared_expert_gate.prepared
    dense_gate = isinstance(sg, torch.Tensor) and sg.dim() == 2
    return SharedWeights(g, u, d, se.gate_proj.n, sg if dense_gate else None)


class TritonMoe:
    """The grouped Triton MoE (see the module doc). `requirements` and `fused_dtypes` are
    arguments so a test can run it interpreted on the CPU in a float32 model."""

    name = "triton.moe"
    # A decode step (T <= decode_max) routes, plans and runs on the GPU with grids fixed by shapes,
    # and prefill plans with torch ops that never read a value on the host: a CUDA graph may
    # capture either (core/graphs.py asks this before capturing an MoE model's decode step).
    graph_safe = True

    def __init__(
        self,
        requirements: Requirements = TRITON_SM80,
        fused_dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,),
        decode_max: int = DECODE_BLOCK_M,
        configs: dict[str, GV.TileConfig] | None = None,
        fast: bool | None = None,
        pairs: bool = True,
    ) -> None:
        self.requirements = requirements
        self.fused_dtypes = fused_dtypes
        self.decode_max = min(decode_max, DECODE_BLOCK_M)
        self.configs = {
            "decode_gate_up": GV.DECODE_GATE_UP,
            "decode_down": GV.DECODE_DOWN,
            "prefill_gate_up": GM.PREFILL_GATE_UP,
            "prefill_down": GM.PREFILL_DOWN,
            **(configs or {}),
        }
        self.fast = fast
        # decode at T <= PAIR_MAX through pair_gemv.py where the layer's formats allow it
        self.pairs = pairs

    # --- the ninfer_moe_kernel contract -----------------------------------------------------------

    def prepare(self, bank: Any, gate_up: list[PackedWeight], down: list[PackedWeight]) -> ExpertWeights:
        return ExpertWeights(
            stack_experts(gate_up, bank.stacked.get("gate_up"), bank.gate_up),
            stack_experts(down, bank.stacked.get("down"), bank.down),
            bank.num_experts,
            down[0].shape[0],
            bank.inner,
        )

    def experts(self, bank: Any, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """sum_k weights[:, k] * expert_{ids[:, k]}(x), routed experts only."""
        w = self._weights(bank)
        k = ids.shape[1]
        r = Routing(ids.to(torch.int32).contiguous(), weights.to(torch.float32).contiguous(), k, k)
        return self.run(x.contiguous(), r, w)

    def forward_layer(self, moe: Any, x: torch.Tensor, add_norm: Any = None) -> torch.Tensor:
        """The whole layer: router, top-k, renormalise, routed experts, sigmoid-gated shared expert.
        `add_norm` (ninfer.linear.AddNorm): the block's residual add and norm after the layer,
        folded into the pair down kernel where that runs (NINFER_GEMV_NORM=1; sets add_norm.out)."""
        w = self._weights(moe.experts)
        if x.shape[0] == 0:
            return torch.zeros_like(x)
        x = x.contiguous()
        shared = shared_weights(moe)
        self._reserve_pairs(moe, x, w, shared)
        router = self._fused_router(moe, x, w, shared)
        if router is not None:
            return self._run_routed_by_gemv(moe, x, w, shared, router, add_norm=add_norm)
        logits = moe.gate(x)
        decode = x.shape[0] <= self.decode_max
        if shared is None:
            r = self._route(logits, moe.top_k, w.num_experts, decode)
            routed = self.run(x, r, w)
            gate = torch.sigmoid(moe.shared_expert_gate(x).float())
            return (routed.float() + gate * moe.shared_expert(x).float()).to(x.dtype)
        # the pair kernels read ids and weights only: no tile plan to build
        plan = decode and not self.takes_pairs(x.shape[0], w, shared)
        gate = (dict(x=x, shared_gate_weight=shared.gate_weight) if shared.gate_weight is not None
                else dict(shared_gate_logit=moe.shared_expert_gate(x)))
        r = self._route(logits, moe.top_k, w.num_experts, decode, plan, **gate)
        return self.run(x, r, w, shared, add_norm)

    def forward_layer_add_norm(self, moe: Any, delta: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                               eps: float) -> torch.Tensor | None:
        """The layer with the post-mixer step folded into its first launch: residual += delta,
        x = (1 + w) RMSNorm(residual), then the layer on x, where route_gemv serves this call
        (one token on the pair kernels; NINFER_MOE_NORM=1, off until an H200 run has checked and
        timed it; or the one-launch block, NINFER_MOE_BLOCK=1 NINFER_MOE_BLOCK_NORM=1). None where it
        does not: the caller then runs the norm and `forward_layer`."""
        if os.environ.get("NINFER_MOE_NORM", "0") != "1" and not MB.folds_norm():
            return None
        w = self._weights(moe.experts)
        shared = shared_weights(moe)
        if delta.shape[0] == 0 or delta.stride(-1) != 1 or residual.stride(-1) != 1 or norm_weight.stride(-1) != 1:
            return None
        router = self._fused_router(moe, delta, w, shared)
        if router is None:
            return None
        self._reserve_pairs(moe, delta, w, shared)
        return self._run_routed_by_gemv(moe, delta, w, shared, router, fold_norm=(residual, norm_weight, eps))

    # --- steps ---------------------------------------------------------------------------------------

    def _reserve_pairs(self, moe: Any, x: torch.Tensor, w: ExpertWeights, shared: SharedWeights | None) -> None:
        """The pair kernels' split-K scratch for the layer's top_k, sized on the first eager call
        (a prefill, or a graph's warm-up), never inside a capture; then a no-op."""
        if self.pairs and x.is_cuda and not QK.capturing(x) and self.takes_pairs(1, w, shared):
            PG.reserve(x.device, moe.top_k + 1, w.hidden, w.inner)
            if MB.enabled() and self._block_fits(w, shared):
                MB.scratch(x.device, x.dtype, w.num_experts, moe.top_k + 1, w.hidden, w.inner)

    def _block_fits(self, w: ExpertWeights, shared: SharedWeights) -> bool:
        return MB.supports(w.gate_up, w.down, (shared.gate, shared.up, shared.down), w.hidden, w.inner, shared.inner)

    def _run_routed_by_gemv(self, moe: Any, x: torch.Tensor, w: ExpertWeights, shared: SharedWeights,
                            router: torch.Tensor, fold_norm: tuple | None = None, add_norm: Any = None) -> torch.Tensor:
        """One decode token: router GEMV and routing in one launch (route_gemv), then the two
        pair kernels. fold_norm = (residual, weight, eps): x is the mixer's output, and route_gemv
        also adds it to the residual and routes (and hands the experts) the norm of the sum."""
        if (MB.enabled() and (fold_norm is None or MB.folds_norm()) and not self._gemv_norm(add_norm, x, w)
                and self._block_fits(w, shared)):
            # router, experts and combine in one launch (moe_block.py; NINFER_MOE_BLOCK=1), with
            # the post-mixer residual add and norm (NINFER_MOE_BLOCK_NORM=1)
            fold = None if fold_norm is None else (*fold_norm, torch.empty_like(x))
            out, _, _ = MB.moe_block(x, router, shared.gate_weight, moe.top_k, w.gate_up, shared.gate, shared.up,
                                     w.down, shared.down, w.inner, w.num_experts, fast=self.fast, add_norm=fold)
            return out
        ws = QK.Workspace.get(x.device)
        ws.ensure(triton.next_power_of_2(x.shape[0]) * (w.num_experts + 1), 1, QK.capturing(x))
        xe = x if fold_norm is None else torch.empty_like(x)
        r = route_gemv(x, router, moe.top_k, shared.gate_weight, (ws.partials, ws.counters),
                       add_norm=None if fold_norm is None else (*fold_norm, xe))
        return self.run(xe, r, w, shared, add_norm)

    @staticmethod
    def _gemv_norm(add_norm: Any, x: torch.Tensor, w: ExpertWeights) -> bool:
        """Whether the pair down kernel takes the block's residual add and norm (NINFER_GEMV_NORM=1)."""
        return (add_norm is not None and add_norm.out is None and os.environ.get("NINFER_GEMV_NORM", "0") == "1"
                and add_norm.residual.shape == (x.shape[0], w.hidden) and add_norm.residual.dtype == x.dtype)

    def _weights(self, bank: Any) -> ExpertWeights:
        w = bank.moe_prepared
        if not isinstance(w, ExpertWeights):
            raise RuntimeError(f"{type(bank).__name__}: the expert weights were never loaded")
        return w

    def _route(self, logits: torch.Tensor, top_k: int, num_experts: int, decode: bool, plan: bool = True,
               **shared: Any) -> Routing:
        if decode:
            return route(logits, top_k, plan=plan, **shared)
        return GM.plan(route(logits, top_k, **shared), num_experts, self.configs["prefill_gate_up"].block_m)

    def _fused_router(self, moe: Any, x: torch.Tensor, w: ExpertWeights, shared: SharedWeights | None) -> torch.Tensor | None:
        """The dense router weight [E, H] when this call routes inside its first launch: route_gemv
        (the pair path at T = 1, where it was measured faster; NINFER_ROUTE_GEMV_T to try more)
        or the one-launch block (up to moe_block.max_tokens() when it is on), with a dense router
        and shared gate in x's dtype; else None."""
        most = max(route_gemv_tokens(), MB.max_tokens() if MB.enabled() else 0)
        if x.shape[0] > most or not self.takes_pairs(x.shape[0], w, shared) or shared.gate_weight is None:
            return None
        rw = moe.gate.prepared
        if not (isinstance(rw, torch.Tensor) and rw.dim() == 2 and rw.shape == (w.num_experts, w.hidden)
                and rw.stride(-1) == 1 and rw.dtype == x.dtype and shared.gate_weight.dtype == x.dtype):
            return None
        return rw

    def takes_pairs(self, tokens: int, w: ExpertWeights, shared: SharedWeights | None) -> bool:
        """Whether `tokens` tokens run the pair kernels (pair_gemv.py) rather than the tiles."""
        if not self.pairs or shared is None or not 0 < tokens <= PG.PAIR_MAX:
            return False
        return PG.supports(w.gate_up, w.down, (shared.gate, shared.up, shared.down), w.hidden, w.inner, shared.inner)

    def run(self, x: torch.Tensor, r: Routing, w: ExpertWeights, shared: SharedWeights | None = None,
            add_norm: Any = None) -> torch.Tensor:
        """The grouped kernels over a routing; plans it first when it has none. `add_norm`: see
        forward_layer (taken by the pair kernels only)."""
        if r.slots > r.top_k and self.takes_pairs(r.num_tokens, w, shared):
            # one value for both launches: a down launched early must follow a gate_up launched so
            early = PG.early()
            h = PG.gate_up(x, r.ids, w.gate_up, shared.gate, shared.up, w.inner, w.num_experts, fast=self.fast,
                           early_down=early)
            fold = None
            if self._gemv_norm(add_norm, x, w):
                fold = (add_norm.residual, add_norm.weight, add_norm.eps, torch.empty_like(add_norm.residual))
            y = PG.down(h, r.ids, r.weights, w.down, shared.down, w.hidden, w.num_experts, x.dtype, fast=self.fast,
                        add_norm=fold, early_down=early)
            if fold is not None:
                add_norm.out = fold[3]
            return y
        decode = r.num_tokens <= self.decode_max
        smats = None if shared is None else (shared.gate, shared.up, shared.down)
        if not decode and x.dtype == torch.bfloat16 and PF.takes(r.num_tokens, w.gate_up, w.down, smats):
            # a long prefill: decode every expert to bf16, then grouped GEMMs (NINFER_MOE_PREFILL=grouped)
            return PF.run(x, r.ids, r.weights, r.top_k, w.gate_up, w.down, w.num_experts, w.inner, shared)
        cu, cd = (self.configs["decode_gate_up"], self.configs["decode_down"]) if decode else (
            self.configs["prefill_gate_up"], self.configs["prefill_down"])
        if r.tile_expert is None:
            GM.plan(r, w.num_experts, cu.block_m)
        s_inner = shared.inner if shared is not None else 0
        h = GV.gate_up(x, r, w.gate_up, w.inner, w.num_experts, cu,
                       shared=None if shared is None else (shared.gate, shared.up), shared_inner=s_inner, fast=self.fast)
        y = GV.down(h, r, w.down, w.hidden, w.inner, w.num_experts, cd,
                    shared=None if shared is None else shared.down, shared_inner=s_inner, fast=self.fast)
        return GV.combine(y, r.num_tokens, r.slots, x.dtype)
