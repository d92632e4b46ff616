"""Prefill: the grouped GEMM over expert segments.

Tokens are sorted by expert with torch ops (`plan_tiles`: a stable argsort of the pairs, counts
by scatter-add, prefix sums; fixed shapes, no host sync), each expert's segment is cut into
tiles of BLOCK_M pairs, and the kernels of grouped_gemv.py run over the tiles with prefill-sized
blocks. Results go back by pair id: each pair's row of y sits at t * slots + j, so "scatter back"
is the per-token sum of `combine` (ordered, deterministic), not an atomic add.

The same plan with 16-pair tiles is the oracle of the fused decode plan (router.py).
"""

from __future__ import annotations

import torch

from ninfer_plugins.moe_triton.grouped_gemv import TileConfig
from ninfer_plugins.moe_triton.router import Routing, max_tiles


def plan_tiles(ids: torch.Tensor, num_ids: int, block_m: int, n_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, slots] (expert of each pair; the shared expert is id E) -> (tile_expert [n_tiles],
    tile_rows [n_tiles, block_m]), int32, as router.py describes; `num_ids` counts the shared id."""
    flat = ids.reshape(-1).long()
    dev = flat.device
    pairs = flat.numel()
    order = torch.argsort(flat, stable=True)
    # bincount would size its output from the data (a host sync); scatter_add keeps it fixed
    counts = torch.zeros(num_ids, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    tiles = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles, 0)
    first_tile = tile_end - tiles
    seg_start = torch.cumsum(counts, 0) - counts
    expert_of = flat[order]
    rank = torch.arange(pairs, device=dev) - seg_start[expert_of]
    rows = torch.full((n_tiles * block_m,), -1, dtype=torch.int32, device=dev)
    rows[first_tile[expert_of] * block_m + rank] = order.to(torch.int32)
    tile_expert = torch.searchsorted(tile_end, torch.arange(n_tiles, device=dev), right=True)
    tile_expert = torch.where(tile_expert < num_ids, tile_expert, -1).to(torch.int32)
    return tile_expert, rows.view(n_tiles, block_m)


def plan(r: Routing, num_experts: int, block_m: int) -> Routing:
    """Give a routing (ids already on the device) its tile plan for `block_m`-pair tiles."""
    shared = r.slots > r.top_k
    n_tiles = max_tiles(r.num_tokens, r.top_k, num_experts, block_m, shared)
    r.tile_expert, r.tile_rows = plan_tiles(r.ids, num_experts + 1, block_m, n_tiles)
    r.block_m = block_m
    return r


# Prefill: tiles of 64 pairs (8,192 tokens x 8 / 256 experts is 256 pairs an expert on average),
# weights as the MMA's A operand in 64-row (gate_up: twice, gate and up) or 128-row blocks;
# scales folded into bf16 weights as quant_int does above M = 64. Starting points for the sweep
# of bench/moe.py, not measured yet.
PREFILL_BLOCK_M = 64
PREFILL_GATE_UP = TileConfig(block_n=64, block_m=PREFILL_BLOCK_M, num_warps=4, num_stages=3, block_k=64, scale_w=True)
PREFILL_DOWN = TileConfig(block_n=128, block_m=PREFILL_BLOCK_M, num_warps=8, num_stages=3, block_k=64, scale_w=True)
