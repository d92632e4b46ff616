"""Random expert banks and routings for the MoE kernel tests (and bench/moe.py): packed weights
in any scheme, their decoded fp32 values (the oracle's inputs), and routings that hit chosen
experts (id 0, id E-1, one expert for every token)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    # Triton runs on the CPU only interpreted; decided before any kernel module is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ninfer.linear import DENSE, PackedWeight, dense_weight  # noqa: E402
from ninfer_plugins.moe_triton.moe import ExpertWeights, SharedWeights, stack_experts  # noqa: E402
from ninfer_plugins.quant_int import formats as QF  # noqa: E402
from ninfer_plugins.quant_nvfp4 import formats as NF  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# the activation dtype the kernels take on the GPU; the interpreter runs the CPU model's fp32
ACT = torch.bfloat16 if DEV == "cuda" else torch.float32


def pack_rows(w: torch.Tensor, scheme: str, groups: int) -> list[PackedWeight]:
    """w [groups * n, k] -> `groups` PackedWeights [n, k] (rows are encoded independently, so one
    encoder call serves every expert)."""
    n = w.shape[0] // groups
    if scheme == DENSE:
        return [dense_weight(t) for t in w.to(ACT).view(groups, n, -1)]
    if scheme == NF.SCHEME:
        # one global scale per expert, as a checkpoint quantized expert by expert has
        out = []
        for t in w.view(groups, n, -1):
            out.append(NF.quantize(t))
        return out
    p = QF.quantize(w, scheme)
    parts = {name: t.view(groups, n, *t.shape[1:]) for name, t in p.tensors.items()}
    return [PackedWeight(scheme, (n, w.shape[1]), {name: t[e] for name, t in parts.items()}, dict(p.meta)) for e in range(groups)]


def decoded(packed: list[PackedWeight]) -> torch.Tensor:
    def one(p):
        if p.scheme == DENSE:
            return p.tensors["weight"].float()
        return NF.dequantize(p) if p.scheme == NF.SCHEME else QF.dequantize(p)

    return torch.stack([one(p) for p in packed])


def expert_bank(E: int, H: int, I: int, scheme_gate_up: str, scheme_down: str, seed: int):
    """(ExpertWeights, decoded gate_up [E, 2I, H], decoded down [E, H, I]) on DEV."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    gu = torch.randn(E * 2 * I, H, generator=g, device=DEV) / H**0.5
    dn = torch.randn(E * H, I, generator=g, device=DEV) / I**0.5
    pgu, pdn = pack_rows(gu, scheme_gate_up, E), pack_rows(dn, scheme_down, E)
    w = ExpertWeights(stack_experts(pgu), stack_experts(pdn), E, H, I)
    return w, decoded(pgu), decoded(pdn)


def shared_expert(H: int, Is: int, scheme: str, seed: int, dense_gate: bool = True):
    """(SharedWeights, (gate, up, down) decoded, gate weight [1, H] in ACT)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    mats, dec = [], []
    for n, k in ((Is, H), (Is, H), (H, Is)):
        p = pack_rows(torch.randn(n, k, generator=g, device=DEV) / k**0.5, scheme, 1)
        mats.append(stack_experts(p))
        dec.append(decoded(p)[0])
    sg = (torch.randn(1, H, generator=g, device=DEV) / H**0.5).to(ACT)
    return SharedWeights(*mats, Is, sg if dense_gate else None), tuple(dec), sg


def logits_hitting(T: int, E: int, seed: int, boundary: bool = True) -> torch.Tensor:
    """Router logits [T, E]; with `boundary`, token 0 prefers expert E-1 and expert 0, and the
    last token repeats token 0's choice (two tokens in one tile)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    logits = torch.randn(T, E, generator=g, device=DEV)
    if boundary:
        logits[0, E - 1] += 8.0
        logits[0, 0] += 7.0
        logits[-1] = logits[0]
    return logits


def captured(step, warmups: int = 1):
    """(graph, what step returned while captured): `step` run `warmups` times on a side stream
    (kernels compile, scratch grows), then captured in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def tiny_pair_checkpoint(out_dir, vocab: int = 512, layers: int = 4):
    """A tiny Qwen3.6-35B-A3B checkpoint at widths the pair kernels and the one-launch block take
    (hidden 256, expert and shared-expert width 128; make_tiny's own 64 / 32 are below their
    128-wide K blocks): make_tiny's files, then its config and weights written again wider."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    from ninfer.testing import make_tiny
    from ninfer_plugins.qwen_hybrid import tiny as TT

    path = Path(make_tiny("qwen3.6-35b-a3b", out_dir, vocab=vocab, layers=layers))
    cfg = json.loads((path / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    text.update(hidden_size=256, moe_intermediate_size=128, shared_expert_intermediate_size=128)
    if isinstance(cfg.get("vision_config"), dict):
        cfg["vision_config"]["out_hidden_size"] = 256
    (path / "config.json").write_text(json.dumps(cfg, indent=4))
    save_file(TT.tiny_tensors(cfg, 0, "fused"), str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
