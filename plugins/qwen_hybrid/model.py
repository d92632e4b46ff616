"""The hybrid decoder: 3 Gated DeltaNet layers then 1 gated-attention layer, repeated; a dense
SwiGLU or sparse MoE after each mixer; final offset RMSNorm and an untied head.

Follows `ninfer.model.CausalLM`. One sequence per cache slot: `forward` runs T tokens of one slot
(prefill, or a chunk of it: chunks give the same result as one pass), `decode` one token for each
of B slots.
"""

from __future__ import annotations

import os
from typing import Any

import structlog
import torch
from torch import nn

from ninfer.errors import UserError
from ninfer.kernels.epoch import new_epoch
from ninfer.linear import DENSE, AddNorm, LinearFactory, PackedWeight, QLinear, dense_weight
from ninfer_plugins.qwen_hybrid.cache import HybridCache
from ninfer_plugins.qwen_hybrid.layers import (
    DecoderLayer,
    ExpertBank,
    GatedAttention,
    GatedDeltaNet,
    TORCH_OPS,
    OffsetRMSNorm,
    Rotary,
    SparseMoe,
    SwiGLU,
    fuse_linears_below,
    input_linear,
    moe_kernel_for,
)
from ninfer_plugins.qwen_hybrid.shape import FULL, QwenHybridShape
from ninfer_plugins.qwen_hybrid.weights import init_tensor, load_text_weights, mtp_tensors, read_tensor, text_tensors

log = structlog.get_logger("ninfer.qwen_hybrid")


class QwenHybridModel(nn.Module):
    def __init__(
        self,
        shape: QwenHybridShape,
        factory: LinearFactory,
        device: torch.device,
        dtype: torch.dtype,
        full_backend: Any,
        linear_backend: Any,
        quant_schemes: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        s = shape
        self.shape = s
        self.device = device
        self.dtype = dtype
        self.factory = factory
        self.full_backend, self.linear_backend = full_backend, linear_backend
        self.quant_schemes = quant_schemes or {}
        self.rotary = Rotary(s, device)
        self.register_buffer("embed_tokens", torch.zeros(s.vocab_size, s.hidden_size, dtype=dtype, device=device))
        layers = []
        n_full = n_linear = 0
        for i, kind in enumerate(s.layer_types):
            name = f"layers.{i}"
            if kind == FULL:
                mixer = GatedAttention(s, f"{name}.self_attn", factory, full_backend, self.rotary, device)
                mixer.kv_index, n_full = n_full, n_full + 1
            else:
                mixer = GatedDeltaNet(s, f"{name}.linear_attn", factory, linear_backend, device, dtype)
                mixer.state_index, n_linear = n_linear, n_linear + 1
            if s.is_moe:
                mlp = SparseMoe(s, f"{name}.mlp", factory)
            else:
                mlp = SwiGLU(f"{name}.mlp", s.hidden_size, s.intermediate_size, factory)
            layers.append(DecoderLayer(mixer, mlp, s, device))
        self.layers = nn.ModuleList(layers)
        self.norm = OffsetRMSNorm(s.hidden_size, s.rms_norm_eps, device)
        self.lm_head = None if s.tie_word_embeddings else factory.make("lm_head", s.vocab_size, s.hidden_size)
        # fused small ops (norms, residual add, SwiGLU) come with a full backend that runs this dtype
        fused = dtype in getattr(full_backend, "fused_dtypes", ())
        self.ops = getattr(full_backend, "ops", None) if fused else None
        self.ops = self.ops or TORCH_OPS
        for module in self.modules():
            if isinstance(module, (DecoderLayer, SwiGLU)):
                module.ops = self.ops
        # MTP tensors stay in the checkpoint until a speculator asks for them (load_mtp_weights)
        self.weight_source: Any = None
        self.mtp_weights: dict[str, torch.Tensor] = {}

    # --- weights ---------------------------------------------------------------------------------

    def _weight_targets(self) -> dict[str, Any]:
        """Canonical tensor name -> a QLinear, an ExpertBank half, or (module, buffer name)."""
        targets: dict[str, Any] = {"embed_tokens.weight": (self, "embed_tokens"), "norm.weight": (self.norm, "weight")}
        if self.lm_head is not None:
            targets["lm_head.weight"] = self.lm_head
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}."
            targets[p + "input_layernorm.weight"] = (layer.input_layernorm, "weight")
            targets[p + "post_attention_layernorm.weight"] = (layer.post_attention_layernorm, "weight")
            m = layer.mixer
            if isinstance(m, GatedAttention):
                targets[p + "self_attn.q_norm.weight"] = (m.q_norm, "weight")
                targets[p + "self_attn.k_norm.weight"] = (m.k_norm, "weight")
            else:
                a = p + "linear_attn."
                targets[a + "conv1d.weight"] = (m, "conv_weight")
                targets[a + "A_log"] = (m, "A_log")
                targets[a + "dt_bias"] = (m, "dt_bias")
                targets[a + "norm.weight"] = (m, "norm_weight")
            if isinstance(layer.mlp, SparseMoe):
                targets[p + "mlp.experts.gate_up_proj"] = (layer.mlp.experts, "gate_up")
                targets[p + "mlp.experts.down_proj"] = (layer.mlp.experts, "down")
        for module in self.modules():
            if isinstance(module, QLinear) and ".experts." not in module.name:
                targets[module.name + ".weight"] = module
        return targets

    def _pack(self, linear: QLinear, w: torch.Tensor) -> PackedWeight:
        w = w.to(device=self.device, dtype=self.dtype)
        packed = dense_weight(w) if linear.scheme == DENSE else self.quant_schemes[linear.scheme].quantize(w).to(self.device)
        linear.set_weight(packed)
        return packed

    # Experts quantized per call: about 2^26 weights (a 256 MB fp32 working copy for the encoder)
    EXPERT_CHUNK_WEIGHTS = 1 << 26

    def _pack_experts(self, linears: list, stacked: torch.Tensor) -> list[PackedWeight] | None:
        """Every expert of a bank half, [E, n, k], in one scheme that encodes rows independently:
        quantized as one [E * n, k] weight in a few chunks, each expert's PackedWeight being row
        slices of it (bit-identical to packing them one by one, and the MoE kernel can take the
        whole stack without copying it). None where that does not apply (dense, NVFP4, mixed)."""
        scheme = linears[0].scheme
        qs = self.quant_schemes.get(scheme)
        if scheme == DENSE or qs is None or not getattr(qs, "rowwise", False) or any(lin.scheme != scheme for lin in linears):
            return None
        E, n, k = stacked.shape
        step = max(1, self.EXPERT_CHUNK_WEIGHTS // (n * k))
        out: dict[str, torch.Tensor] = {}
        meta: dict[str, Any] = {}
        for e0 in range(0, E, step):
            part = qs.quantize(stacked[e0 : e0 + step].reshape(-1, k).to(device=self.device, dtype=self.dtype))
            if not out:
                out = {name: torch.empty((E * n, *t.shape[1:]), dtype=t.dtype, device=self.device) for name, t in part.tensors.items()}
                meta = dict(part.meta)
            for name, t in part.tensors.items():
                out[name][e0 * n : e0 * n + t.shape[0]].copy_(t)
        packed = []
        for e, linear in enumerate(linears):
            p = PackedWeight(scheme, (n, k), {name: t[e * n : (e + 1) * n] for name, t in out.items()}, dict(meta))
            linear.set_weight(p)
            packed.append(p)
        return packed

    def _adopt(self, linear: QLinear, scheme: str) -> None:
        if linear.scheme != scheme:
            linear.scheme = scheme
            linear.kernel = self.factory.kernel_for(scheme, linear.n, linear.k)

    def _set_packed(self, linear: QLinear, packed: PackedWeight) -> PackedWeight:
        """A weight that arrived packed (a converted or pre-quantized checkpoint) decides its
        linear's scheme, and so its kernel, whatever the recipe said; a dense one still takes
        the model's dtype."""
        self._adopt(linear, packed.scheme)
        if packed.scheme == DENSE:
            return self._pack(linear, packed.tensors["weight"])
        packed = packed.to(self.device)
        linear.set_weight(packed)
        return packed

    @torch.no_grad()
    def assign(self, name: str, tensor: torch.Tensor | PackedWeight, targets: dict[str, Any] | None = None) -> None:
        """Put one canonical tensor (checked for shape by the caller) where it belongs: a linear
        weight is packed by its QLinear's scheme (or taken as is when already a PackedWeight).

        `targets` (from `_weight_targets`) saves rebuilding the map per tensor; it is not kept on
        the model, since it points back at the model and would keep it alive after `del`.
        """
        target = (targets or self._weight_targets())[name]
        if isinstance(target, QLinear):
            if isinstance(tensor, PackedWeight):
                self._set_packed(target, tensor)
            else:
                self._pack(target, tensor)
            return
        module, attr = target
        if isinstance(module, ExpertBank):
            if isinstance(tensor, list):
                # one PackedWeight per expert: the schemes they arrived in decide, MoE kernel included
                for linear, p in zip(getattr(module, attr), tensor):
                    self._adopt(linear, p.scheme)
                module.kernel = moe_kernel_for(
                    self.factory, list(module.gate_up), list(module.down), module.num_experts, module.gate_up[0].k, module.inner
                )
                if not all(p.scheme == DENSE for p in tensor):
                    module.load(attr, tensor, self._set_packed)
                    return
                tensor = torch.stack([p.tensors["weight"] for p in tensor])  # dense experts stay stacked
            module.load(attr, tensor.to(device=self.device, dtype=self.dtype), self._pack, self._pack_experts)
            return
        buf = getattr(module, attr)
        buf.copy_(tensor.reshape(buf.shape).to(device=buf.device, dtype=buf.dtype))

    def load_weights(self, source: Any) -> None:
        where = str(getattr(source, "path", "checkpoint"))
        targets = self._weight_targets()
        self.checkpoint_prefix = load_text_weights(source, self.shape, lambda n, t: self.assign(n, t, targets), where)
        self.weight_source = source
        self.fuse_linears()

    def fuse_linears(self) -> None:
        """After the weights are in: let layers merge dense projections that share their input
        (one GEMV launch instead of several; the parts become views, nothing is held twice)."""
        fuse_linears_below(self)

    @torch.no_grad()
    def random_weights(self, seed: int = 0) -> None:
        """Deterministic random weights (benchmarks, and the engine without a checkpoint)."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        targets = self._weight_targets()
        for name, shp in text_tensors(self.shape).items():
            self.assign(name, init_tensor(name, shp, gen, self.device), targets)
        self.fuse_linears()

    def load_mtp_weights(self) -> dict[str, torch.Tensor]:
        """The `mtp.*` tensors (names as published) on the model's device, read on first use."""
        if self.mtp_weights or not self.shape.mtp_num_hidden_layers:
            return self.mtp_weights
        source = self.weight_source
        if source is None or not source.has("mtp.fc.weight"):
            raise UserError("this checkpoint has no mtp.* tensors (MTP head); use --spec none or --spec dflash.")
        for name, shp in mtp_tensors(self.shape).items():
            t = read_tensor(source, name, shp, "", self.shape.num_experts)
            self.mtp_weights[name] = t.to(self.device, self.dtype if t.dim() > 1 else torch.float32)
        return self.mtp_weights

    # --- running -----------------------------------------------------------------------------------

    def allocate_cache(self, num_slots: int, max_context: int, kv_dtype: str = "bf16") -> HybridCache:
        return HybridCache(self.shape, num_slots, max_context, kv_dtype, self.dtype, self.device)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding(input_ids.to(self.device), self.embed_tokens)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, cache: HybridCache, slot: int, start_pos: int) -> torch.Tensor:
        t_len = int(input_ids.shape[0])
        if t_len == 0:
            return torch.empty(0, self.shape.hidden_size, dtype=self.dtype, device=self.device)
        if start_pos < 0 or start_pos + t_len > cache.max_context:
            raise UserError(
                f"positions {start_pos}..{start_pos + t_len - 1} do not fit the cache's {cache.max_context} "
                "positions; raise --max-context."
            )
        x = self.embed(input_ids)
        return self._run(x, lambda layer, h: layer.mixer.prefill(h, cache, slot, start_pos))

    def _run(self, x: torch.Tensor, mix, fold: bool = False) -> torch.Tensor:
        """The layer stack on the residual stream x: each residual add fused with the norm that
        follows it (the next layer's input norm, and the final norm after the last layer).

        `fold` (decode, fused ops, NINFER_GEMV_NORM=1): `mix(layer, h, add_norm)` and the dense
        MLP get an AddNorm, so the kernel of their last linear may do that add and norm in its
        own launch (it sets add_norm.out). A MoE layer may instead fold the post-mixer one into
        its first launch (`forward_add_norm`, NINFER_MOE_NORM=1). Each falls back to
        ops.add_rms_norm where nothing folded."""
        ops, layers, eps = self.ops, self.layers, self.shape.rms_norm_eps
        fold = fold and ops.name == "triton" and os.environ.get("NINFER_GEMV_NORM", "0") == "1"
        new_epoch()  # a pass: kernels' notes of inputs they prepared start afresh (ninfer.kernels.epoch)
        h = ops.rms_norm(x, layers[0].input_layernorm.weight, eps, into=input_linear(layers[0].mixer))
        for i, layer in enumerate(layers):
            post = layer.post_attention_layernorm.weight
            an = AddNorm(x, post, eps) if fold else None
            delta = mix(layer, h) if an is None else mix(layer, h, an)
            out = None
            if an is not None and an.out is not None:
                h = an.out
            else:
                moe_fold = getattr(layer.mlp, "forward_add_norm", None)
                out = moe_fold(delta, x, post, eps) if moe_fold is not None and ops.name == "triton" else None
                if out is None:
                    x, h = ops.add_rms_norm(delta, x, post, eps, into=input_linear(layer.mlp))
            after = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.norm
            if out is None:
                an = AddNorm(x, after.weight, eps) if fold and getattr(layer.mlp, "folds_add_norm", False) else None
                out = layer.mlp(h) if an is None else layer.mlp(h, add_norm=an)
                if an is not None and an.out is not None:
                    h = an.out
                    continue
            # the next layer's first projection, or the head after the last layer
            into = input_linear(layers[i + 1].mixer) if i + 1 < len(layers) else self.lm_head
            x, h = ops.add_rms_norm(out, x, after.weight, eps, into=into)
        return h

    @property
    def graph_decode(self) -> bool:
        """Whether `decode` is fit for a CUDA graph as it is: no host sync without `max_len`, and
        a slot of -1 (position -1) is a padding row that touches no state. True when both
        attention backends run fused for this dtype and say so, and every MoE layer runs a
        fused MoE kernel (the reference experts read routing counts on the host)."""
        fused = lambda b: self.dtype in getattr(b, "fused_dtypes", ())  # noqa: E731
        backends = all(fused(b) and getattr(b, "graph_decode", False) for b in (self.full_backend, self.linear_backend))
        return backends and all(fused(m.experts.kernel) for m in self.modules() if isinstance(m, SparseMoe))

    @torch.no_grad()
    def decode(
        self,
        input_ids: torch.Tensor,
        cache: HybridCache,
        slots: torch.Tensor,
        positions: torch.Tensor,
        max_len: int | None = None,
    ) -> torch.Tensor:
        """One token for each of B distinct slots; every position must be < cache.max_context
        (the scheduler's duty: checking here would sync the host).

        `max_len`, a bound above every position, lets attention read a fixed number of KV
        columns: with it (and device tensors in) the step has no host sync and no data-dependent
        shape, so the runner can capture it in a CUDA graph (one per max_len bucket).
        """
        slots = torch.as_tensor(slots, device=self.device, dtype=torch.long)
        positions = torch.as_tensor(positions, device=self.device, dtype=torch.long)
        x = self.embed(input_ids)
        meta = None
        if self.dtype in getattr(self.full_backend, "fused_dtypes", ()):
            meta = self.full_backend.decode_meta(cache, slots, positions)
        def mix(layer, h, add_norm=None):
            extra = {} if add_norm is None else {"add_norm": add_norm}
            return layer.mixer.decode(h, cache, slots, positions, max_len, meta=meta, **extra)

        return self._run(x, mix, fold=True)

    @torch.no_grad()
    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's logits in the model's dtype (what an argmax needs: no fp32 copy)."""
        if self.lm_head is None:
            return torch.nn.functional.linear(hidden, self.embed_tokens)
        return self.lm_head(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head_logits(hidden).float()
