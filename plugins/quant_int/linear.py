"""LinearKernel objects over the shared Triton kernel, and the dequantize-then-matmul reference.

Both quantization plugins build theirs from these two classes, given how to reach the kernel's
layout (`to_prepared`) and how to get fp32 weights back (`dequantize`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ninfer.device import ANYWHERE, Requirements
from ninfer.linear import PackedWeight
from ninfer_plugins.quant_int import formats as F

if TYPE_CHECKING:
    from ninfer_plugins.quant_int import kernels as K


K_NVFP4 = 16  # kernels.NVFP4, without importing Triton here


def _kernels():
    # imported on first use: the reference path must not need Triton
    from ninfer_plugins.quant_int import kernels

    return kernels


def _dequant():
    from ninfer_plugins.quant_int import dequant

    return dequant

# Any CUDA GPU Triton compiles tl.dot in bf16 for (Ampere and later); no feature past that.
TRITON_SM80 = Requirements(devices=("cuda",), min_capability=(8, 0), features=("triton",))


def _nv_merge(preps: list[K.Prepared]) -> bool:
    """Whether NVFP4 parts that share an input are merged. Merged NVFP4 shapes were slower than the
    tuned parts on the Triton kernels (27B nvfp4 8K decode 73.9 -> 69.5 tok/s), so by default the
    parts stay apart. The CUDA GEMV reads the merged gate+up at 90% of copy on an H100 (37.1 us,
    BENCHMARKS.md thirty-seventh run), about 12 us under the two parts on the K-walk. An A/B switch
    read at load until a step has measured it: NINFER_NV_MERGE=1 merges where the CUDA GEMV has a
    one-token winner for the merged shape (tuned.TUNED_CU), =all every group."""
    v = os.environ.get("NINFER_NV_MERGE", "0")
    if v == "all":
        return True
    if v != "1":
        return False
    from ninfer_plugins.quant_int import gemv_cu

    return gemv_cu.tuned_entry(K_NVFP4, sum(p.n for p in preps), preps[0].k, 1) is not None


def _decode_config(x2: torch.Tensor, prepared: K.Prepared, kind: type | tuple[type, ...]) -> Any:
    """The dispatched decode config for these rows where it is of `kind` (a type or a tuple; bf16 on a GPU, unit
    last stride, 16-byte aligned, and the dispatch picks that kernel for this shape and row
    count); None otherwise. What the launches that fold extra work into a GEMV ask first."""
    if x2.dtype != torch.bfloat16 or x2.device.type != "cuda" or x2.stride(-1) != 1 or x2.data_ptr() % 16:
        return None
    cfg = _kernels().pick_gemv(prepared.fmt, x2.shape[0], prepared.n, prepared.k, prepared.sm_count)
    return cfg if isinstance(cfg, kind) else None


def _norm_pairs_on() -> bool:
    """gemv_kw.norm_spread(), read here before any import (every norm asks, the reference path too)."""
    return os.environ.get("NINFER_NORM_PAIRS", "1") != "0"


def _reads_pairs(cfg: Any) -> bool:
    """Whether a decode config's kernel reads x as gemv_kw's pairs from x_scratch: the CUDA GEMV, or
    a K-walk config that does not make them inline."""
    from ninfer_plugins.quant_int import gemv_cu, gemv_kw

    return isinstance(cfg, gemv_cu.CUConfig) or (isinstance(cfg, gemv_kw.KWConfig) and not cfg.inline)


def _h2_decode_config(x2: torch.Tensor, prepared: K.Prepared) -> Any:
    """The f16x2 GEMV's config where it is the decode kernel for these rows (see _decode_config)."""
    from ninfer_plugins.quant_int import gemv_h2

    return _decode_config(x2, prepared, gemv_h2.H2Config)


class TritonQuantLinear:
    """y = x @ W.T with W decoded in registers by the fused Triton kernel (kernels.py), or, from
    `dequant.DEQUANT_MIN_M` activation rows on (prefill), dequantized to a bf16 scratch in row
    chunks and multiplied by cuBLAS (dequant.py).

    bf16 activations take the kernels; other dtypes (a float32 parity run on a GPU) fall back to
    dequantizing the weight for that call, which is correct and slow.
    """

    requirements = TRITON_SM80

    def __init__(
        self,
        scheme: str,
        to_prepared: Callable[[PackedWeight], K.Prepared],
        dequantize: Callable[[K.Prepared], torch.Tensor],
        repacks: bool = False,
    ) -> None:
        self.name = f"triton.{scheme}"
        self.scheme = scheme
        # True when prepare() builds a copy in another layout (QLinear then drops the original)
        self.repacks = repacks
        self._to_prepared = to_prepared
        self._dequantize = dequantize

    def prepare(self, weight: PackedWeight) -> K.Prepared:
        if weight.scheme != self.scheme:
            raise ValueError(f"{self.name} got a {weight.scheme} weight")
        p = self._to_prepared(weight)
        _kernels().reserve_workspace(p)
        _dequant().reserve(p)
        return p

    def resident_bytes(self, n: int, k: int, packed_bytes: int, device) -> int:
        """The packed weight, plus (q5 on a GPU, under NINFER_Q5_WORDS=1 or where a CUDA GEMV winner
        on words applies) the prepared high-bit words, one bit a weight more (gemv_cu.q5_words), so
        the memory plan counts them. Counted for every q5 weight of a K such a winner names: the
        words of a merged weight (qkv + z) are made for a shape the plan sees only as its parts."""
        if self.scheme == "q5_g64" and getattr(device, "kind", "cpu") != "cpu":
            from ninfer_plugins.quant_int import gemv_cu

            if gemv_cu.words_on() or (not gemv_cu.words_off() and gemv_cu.words_for_k(k)):
                return packed_bytes + F.padded_k(k) * n // 8
        return packed_bytes

    def merge_prepared(self, preps: list[K.Prepared]) -> tuple[K.Prepared, list[K.Prepared]] | None:
        """Stack prepared weights of one format and K by rows: (the merged weight, each part as a
        row view of it), or None when a part has padding rows or they differ in layout."""
        p0 = preps[0]
        if p0.fmt == K_NVFP4 and not _nv_merge(preps):
            return None
        for p in preps:
            if (p.fmt, p.k, p.fast, p.device) != (p0.fmt, p0.k, p0.fast, p0.device) or p.qweight.shape[0] != p.n:
                return None
            if (p.qhigh is None) != (p0.qhigh is None) or (p.gscale is None) != (p0.gscale is None):
                return None

        def cat(field: str) -> torch.Tensor | None:
            return None if getattr(p0, field) is None else torch.cat([getattr(p, field) for p in preps])

        # q5words=None: the parts' prepared words describe the parts (the merged weight makes its own)
        merged = dataclasses.replace(p0, n=sum(p.n for p in preps), qweight=cat("qweight"), scales=cat("scales"),
                                     qhigh=cat("qhigh"), gscale=cat("gscale"), q5words=None)
        views, start = [], 0
        for p in preps:
            rows = slice(start, start + p.n)
            views.append(dataclasses.replace(
                merged, n=p.n, qweight=merged.qweight[rows], scales=merged.scales[rows],
                qhigh=None if merged.qhigh is None else merged.qhigh[rows],
                gscale=None if merged.gscale is None else merged.gscale[rows]))  # fmt: skip
            start += p.n
        _kernels().reserve_workspace(merged)
        _dequant().reserve(merged)
        return merged, views

    def apply_add_norm(self, x: torch.Tensor, prepared: K.Prepared, add_norm: Any) -> torch.Tensor | None:
        """y = apply(x), with add_norm's residual add and norm in the same launch (ninfer.linear.
        AddNorm; sets add_norm.out) where the f16x2 GEMV is this shape's decode kernel; None
        elsewhere (the caller runs it apart). Behind NINFER_GEMV_NORM=1 until an H200 run has
        checked and timed it."""
        if os.environ.get("NINFER_GEMV_NORM", "0") != "1":
            return None
        from ninfer_plugins.quant_int import gemv_h2

        x2 = x.reshape(-1, x.shape[-1])
        res = add_norm.residual
        if res.shape != (x2.shape[0], prepared.n) or res.dtype != x2.dtype or prepared.n > gemv_h2.ADD_NORM_MAX_N:
            return None
        cfg = _h2_decode_config(x2, prepared)
        if cfg is None:
            return None
        out = torch.empty_like(res)
        y = gemv_h2.launch(x2, prepared, cfg, add_norm=(res, add_norm.weight, add_norm.eps, out))
        add_norm.out = out
        return y.reshape(*x.shape[:-1], prepared.n)

    def norm_input(self, prepared: K.Prepared, x: torch.Tensor, weight: torch.Tensor, eps: float,
                   residual: torch.Tensor | None = None):
        """QLinear.norm_input: where a K-walk GEMV or the CUDA GEMV is this weight's decode kernel
        for x's rows, the norm and that GEMV's prepared x in one launch, so the GEMV on the result
        skips its own preparation launch. By default (NINFER_NORM_PAIRS=0 turns it off; H200, 35B
        int4 step -0.05 ms, 27B -0.04 ms, BENCHMARKS.md thirty-ninth run): the pairs of both GEMVs,
        made over every K block at once (gemv_kw.norm_pairs_spread; 1, 2 or 4 rows); the residual
        sum then goes to a new tensor, returned as (residual sum, norm). With it off,
        NINFER_KW_XREUSE=1: the f16x2 K-walk's pairs in one CTA a row (gemv_kw.norm_pairs, not
        inline) or the tensor-core K-walk's xq (gemv_tkw.norm_xq). None elsewhere."""
        spread = _norm_pairs_on()
        # gemv_kw.xreuse(), read here before any import: every norm asks
        if x.device.type != "cuda" or (not spread and os.environ.get("NINFER_KW_XREUSE", "0") != "1"):
            return None
        from ninfer_plugins.quant_int import gemv_cu, gemv_kw, gemv_tkw

        if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] != prepared.k or prepared.k % 128:
            return None
        if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(1) != 1):
            return None
        cfg = _decode_config(x, prepared, (gemv_kw.KWConfig, gemv_tkw.TKWConfig, gemv_cu.CUConfig))
        if spread:
            if not _reads_pairs(cfg) or x.shape[0] not in (1, 2, 4) or prepared.fmt not in gemv_kw.DECODES:
                return None
            s, h = gemv_kw.norm_pairs_spread(x, weight, eps, prepared.fmt, residual=residual, fast=prepared.fast)
            return h if s is None else (s, h)
        if isinstance(cfg, gemv_kw.KWConfig) and not cfg.inline and x.shape[0] in (1, 2, 4):
            return gemv_kw.norm_pairs(x, weight, eps, prepared.fmt, residual=residual, fast=prepared.fast)
        if isinstance(cfg, gemv_tkw.TKWConfig) and prepared.fmt in gemv_tkw.FORMATS:
            return gemv_tkw.norm_xq(x, weight, eps, prepared.fmt, residual=residual)
        return None

    def input_pairs(self, prepared: K.Prepared, rows: int, device: torch.device):
        """QLinear.input_pairs: where a K-walk GEMV (not inline) or the CUDA GEMV is this weight's
        decode kernel for `rows` rows (1, 2 or 4) on a GPU, an OutPairs that writes that GEMV's x
        pairs (gemv_kw._xpairs_blocks into its x_scratch); unless NINFER_NORM_PAIRS=0; None
        elsewhere."""
        if not _norm_pairs_on() or device.type != "cuda" or rows not in (1, 2, 4):
            return None
        from ninfer.kernels.triton.gdn import OutPairs
        from ninfer_plugins.quant_int import gemv_h2, gemv_kw

        if prepared.k % 128 or prepared.fmt not in gemv_kw.DECODES:
            return None
        if not _reads_pairs(_kernels().pick_gemv(prepared.fmt, rows, prepared.n, prepared.k, prepared.sm_count)):
            return None
        xp, inv, invm = gemv_kw.x_scratch(device, prepared.fmt, prepared.k)
        return OutPairs(fn=gemv_kw._xpairs_blocks, xp=xp, inv=inv, invm=invm, kw=gemv_kw.row_words(prepared.fmt, prepared.k),
                        nkb=prepared.k // 128, fmt=prepared.fmt, head=gemv_h2.HEAD[prepared.fmt],
                        asm=prepared.fast and not _kernels().interpreting())

    def inputs_made(self, prepared: K.Prepared, x: torch.Tensor) -> None:
        """QLinear.inputs_made: x's pairs are in the x_scratch (input_pairs' kernel wrote them):
        noted, so the GEMV on x skips its x-pairs launch."""
        from ninfer_plugins.quant_int import gemv_kw

        x2 = x.reshape(-1, prepared.k)
        if gemv_kw.reuse_inputs():
            gemv_kw.note_input(gemv_kw._pairs_key(x2.device, prepared.fmt, prepared.k), x, (x2.shape[0], False))

    def apply_gated(self, gu: torch.Tensor, prepared: K.Prepared) -> torch.Tensor | None:
        """y = apply(silu(gate) * up) for gu = [gate | up] [..., 2k], the silu and product done as
        the f16x2 GEMV prepares its input (no silu_mul launch), where that GEMV is this shape's
        decode kernel; None elsewhere (the caller runs silu_mul, then apply). On by default (H200,
        27B int4: 107.2 -> 109.4 tok/s); NINFER_GEMV_GATED=0 turns it off."""
        if os.environ.get("NINFER_GEMV_GATED", "1") == "0":
            return None
        g2 = gu.reshape(-1, gu.shape[-1])
        if g2.shape[1] != 2 * prepared.k or g2.stride(0) % 8:
            return None
        from ninfer_plugins.quant_int import gemv_cu, gemv_h2, gemv_kw, gemv_tkw

        # the f16x2 GEMV, either K-walk or the CUDA GEMV, which prepare their x gated the same way
        cfg = _decode_config(g2, prepared, (gemv_h2.H2Config, gemv_kw.KWConfig, gemv_tkw.TKWConfig, gemv_cu.CUConfig))
        if cfg is None:
            return None
        kernel = {gemv_kw.KWConfig: gemv_kw, gemv_tkw.TKWConfig: gemv_tkw, gemv_cu.CUConfig: gemv_cu}.get(type(cfg), gemv_h2)
        return kernel.launch(g2, prepared, cfg, gated=True).reshape(*gu.shape[:-1], prepared.n)

    def apply(self, x: torch.Tensor, prepared: K.Prepared, dequant_min_m: int | None = None) -> torch.Tensor:
        """dequant_min_m: rows from which to dequantize + cuBLAS (default dequant.DEQUANT_MIN_M)."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if x2.dtype != torch.bfloat16 or x2.device.type != "cuda":
            y = torch.nn.functional.linear(x2.float(), self._dequantize(prepared)).to(x.dtype)
        else:
            if x2.stride(-1) != 1 or x2.data_ptr() % 16:
                x2 = x2.contiguous()
            D = _dequant()
            if x2.shape[0] >= (D.DEQUANT_MIN_M if dequant_min_m is None else dequant_min_m):
                y = D.matmul(x2, prepared)
            else:
                y = _kernels().launch(x2, prepared)
        return y.reshape(*lead, prepared.n)


class ReferenceQuantLinear:
    """Dequantize once (fp32), then torch's matmul: runs anywhere; the oracle of the kernels.

    Meant for the CPU path and tiny models: it keeps a full fp32 copy of the weight.
    """

    requirements = ANYWHERE
    # the fp32 copy is all apply() reads
    repacks = True

    def __init__(self, scheme: str, dequantize: Callable[[PackedWeight], torch.Tensor]) -> None:
        self.name = f"reference.{scheme}"
        self.scheme = scheme
        self._dequantize = dequantize

    def prepare(self, weight: PackedWeight) -> torch.Tensor:
        if weight.scheme != self.scheme:
            raise ValueError(f"{self.name} got a {weight.scheme} weight")
        return self._dequantize(weight)

    def resident_bytes(self, n: int, k: int, packed_bytes: int, device) -> int:
        """The fp32 copy, plus the packed weight QLinear keeps beside it on the CPU (it drops it on a
        GPU, since this kernel `repacks`)."""
        return n * k * 4 + (packed_bytes if device.kind == "cpu" else 0)

    def merge_prepared(self, preps: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """The dequantized weights stacked by rows, and each part as a row view of them."""
        if any(p.dtype != preps[0].dtype or p.device != preps[0].device or p.dim() != 2 for p in preps):
            return None
        merged = torch.cat(preps)
        views, start = [], 0
        for p in preps:
            views.append(merged[start : start + p.shape[0]])
            start += p.shape[0]
        return merged, views

    def apply(self, x: torch.Tensor, prepared: torch.Tensor) -> torch.Tensor:
        if x.dtype == prepared.dtype:
            return torch.nn.functional.linear(x, prepared)
        return torch.nn.functional.linear(x.to(prepared.dtype), prepared).to(x.dtype)


# --- the int formats ---------------------------------------------------------------------------------


def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


def prepare_int(weight: PackedWeight) -> K.Prepared:
    """The stored layout is the kernel's: only rows are padded to whole blocks (a copy only when
    n is not a multiple of 128, which no registered shape has)."""
    K = _kernels()
    F.check_packed(weight)
    fmt = F.FORMATS[weight.scheme]
    n, k = weight.shape
    rows = -(-n // K.ROW_PAD) * K.ROW_PAD
    q = weight.tensors["qweight"]
    if fmt.bits == 8:
        q = q.view(torch.uint8)
    h = weight.tensors.get("qhigh")
    return K.Prepared(
        fmt=fmt.bits,
        n=n,
        k=k,
        qweight=K.pad_rows(q, rows),
        scales=K.pad_rows(weight.tensors["scales"], rows),
        qhigh=None if h is None else K.pad_rows(h, rows),
        sm_count=sm_count(q.device),
    )


def dequantize_int_prepared(p: K.Prepared) -> torch.Tensor:
    fmt = next(f for f in F.FORMATS.values() if f.bits == p.fmt)
    q = p.qweight[: p.n]
    tensors: dict[str, Any] = {"qweight": q.view(torch.int8) if fmt.bits == 8 else q, "scales": p.scales[: p.n]}
    if p.qhigh is not None:
        tensors["qhigh"] = p.qhigh[: p.n]
    return F.dequantize(PackedWeight(fmt.name, (p.n, p.k), tensors))


def int_kernels(scheme: str) -> tuple[TritonQuantLinear, ReferenceQuantLinear]:
    return TritonQuantLinear(scheme, prepare_int, dequantize_int_prepared), ReferenceQuantLinear(scheme, F.dequantize)
