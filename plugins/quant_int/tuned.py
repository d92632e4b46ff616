"""Measured block sizes for the registered shapes (Qwen3.6/3.8-27B and Qwen3.6-35B-A3B linears).

Generated from one run of `python bench/quant_linear.py` on an NVIDIA H200 (2026-12-02, torch
2.11, Triton 3.6; numbers in BENCHMARKS.md): for every format and [n, k], the fastest of the
candidate configs at M = 1 (used for M <= 8; M = 4 and 8 were then timed with it), M = 16 (used for
M = 9..16) and M = 1024 (used for M > 64). Other shapes fall back to the rules in
`kernels.pick_config`.

(fmt id, n, k, bucket) -> (block_n, block_m, split_k, num_warps, num_stages, kb_step, scale_w, prefetch)
"""

from __future__ import annotations

TUNED: dict[tuple[int, int, int, str], tuple[int, int, int, int, int, int, bool, int]] = {
    (4, 512, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (4, 512, 2048, 'prefill'): (128, 64, 1, 4, 4, 1, True, 0),
    (4, 512, 2048, 'small'): (32, 16, 8, 2, 6, 1, False, 1),
    (4, 1024, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (4, 1024, 2048, 'prefill'): (128, 64, 1, 4, 4, 1, True, 0),
    (4, 1024, 2048, 'small'): (32, 16, 8, 2, 6, 1, False, 1),
    (4, 1024, 5120, '16'): (64, 16, 16, 4, 4, 1, False, 1),
    (4, 1024, 5120, 'prefill'): (128, 64, 1, 4, 4, 1, True, 0),
    (4, 1024, 5120, 'small'): (64, 16, 16, 4, 4, 1, False, 1),
    (4, 2048, 512, '16'): (32, 16, 1, 2, 4, 1, False, 1),
    (4, 2048, 512, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (4, 2048, 512, 'small'): (64, 16, 1, 4, 4, 1, False, 1),
    (4, 2048, 4096, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (4, 2048, 4096, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (4, 2048, 4096, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (4, 4096, 2048, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (4, 4096, 2048, 'prefill'): (256, 128, 1, 8, 3, 1, True, 0),
    (4, 4096, 2048, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (4, 5120, 6144, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (4, 5120, 6144, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (4, 5120, 6144, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (4, 5120, 17408, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (4, 5120, 17408, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (4, 5120, 17408, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (4, 6144, 5120, '16'): (64, 16, 4, 4, 3, 1, False, 1),
    (4, 6144, 5120, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (4, 6144, 5120, 'small'): (64, 16, 4, 4, 3, 1, False, 1),
    (4, 8192, 2048, '16'): (64, 16, 2, 4, 3, 1, False, 1),
    (4, 8192, 2048, 'prefill'): (256, 128, 1, 8, 3, 1, True, 0),
    (4, 8192, 2048, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (4, 10240, 5120, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (4, 10240, 5120, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (4, 10240, 5120, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (4, 12288, 5120, '16'): (64, 16, 2, 4, 3, 1, False, 1),
    (4, 12288, 5120, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (4, 12288, 5120, 'small'): (64, 16, 2, 4, 3, 1, False, 1),
    (4, 17408, 5120, '16'): (64, 16, 2, 4, 4, 1, False, 1),
    (4, 17408, 5120, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (4, 17408, 5120, 'small'): (64, 16, 2, 4, 4, 1, False, 1),
    (4, 248320, 2048, '16'): (64, 16, 1, 4, 3, 1, False, 1),
    (4, 248320, 2048, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (4, 248320, 2048, 'small'): (64, 16, 1, 4, 3, 1, False, 1),
    (4, 248320, 5120, '16'): (64, 16, 1, 4, 3, 1, False, 1),
    (4, 248320, 5120, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (4, 248320, 5120, 'small'): (64, 16, 1, 4, 3, 1, False, 1),
    (5, 512, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 512, 2048, 'prefill'): (128, 64, 1, 4, 4, 1, True, 0),
    (5, 512, 2048, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 1024, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 1024, 2048, 'prefill'): (128, 64, 1, 4, 4, 1, True, 0),
    (5, 1024, 2048, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 1024, 5120, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 1024, 5120, 'prefill'): (128, 64, 1, 4, 4, 1, True, 0),
    (5, 1024, 5120, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 2048, 512, '16'): (64, 16, 2, 4, 4, 1, False, 1),
    (5, 2048, 512, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (5, 2048, 512, 'small'): (64, 16, 2, 4, 4, 1, False, 1),
    (5, 2048, 4096, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 2048, 4096, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (5, 2048, 4096, 'small'): (64, 16, 16, 4, 4, 1, False, 1),
    (5, 4096, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 4096, 2048, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (5, 4096, 2048, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 5120, 6144, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 5120, 6144, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (5, 5120, 6144, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 5120, 17408, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 5120, 17408, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (5, 5120, 17408, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 6144, 5120, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 6144, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (5, 6144, 5120, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 8192, 2048, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (5, 8192, 2048, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (5, 8192, 2048, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (5, 10240, 5120, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (5, 10240, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (5, 10240, 5120, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (5, 12288, 5120, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (5, 12288, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (5, 12288, 5120, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (5, 17408, 5120, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (5, 17408, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (5, 17408, 5120, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (5, 248320, 2048, '16'): (64, 16, 1, 4, 4, 1, False, 1),
    (5, 248320, 2048, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (5, 248320, 2048, 'small'): (64, 16, 1, 4, 4, 1, False, 1),
    (5, 248320, 5120, '16'): (64, 16, 1, 4, 4, 1, False, 1),
    (5, 248320, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (5, 248320, 5120, 'small'): (64, 16, 1, 4, 4, 1, False, 1),
    (6, 512, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 512, 2048, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (6, 512, 2048, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 1024, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 1024, 2048, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (6, 1024, 2048, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 1024, 5120, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 1024, 5120, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (6, 1024, 5120, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 2048, 512, '16'): (64, 16, 2, 4, 4, 1, False, 1),
    (6, 2048, 512, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (6, 2048, 512, 'small'): (64, 16, 2, 4, 4, 1, False, 1),
    (6, 2048, 4096, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 2048, 4096, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (6, 2048, 4096, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 4096, 2048, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (6, 4096, 2048, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (6, 4096, 2048, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (6, 5120, 6144, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 5120, 6144, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (6, 5120, 6144, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 5120, 17408, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 5120, 17408, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (6, 5120, 17408, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 6144, 5120, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 6144, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (6, 6144, 5120, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (6, 8192, 2048, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (6, 8192, 2048, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (6, 8192, 2048, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (6, 10240, 5120, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (6, 10240, 5120, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (6, 10240, 5120, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (6, 12288, 5120, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (6, 12288, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (6, 12288, 5120, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (6, 17408, 5120, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (6, 17408, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (6, 17408, 5120, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (6, 248320, 2048, '16'): (64, 16, 1, 4, 4, 1, False, 1),
    (6, 248320, 2048, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (6, 248320, 2048, 'small'): (64, 16, 1, 4, 4, 1, False, 1),
    (6, 248320, 5120, '16'): (64, 16, 1, 4, 4, 1, False, 1),
    (6, 248320, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (6, 248320, 5120, 'small'): (64, 16, 1, 4, 4, 1, False, 1),
    (8, 512, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (8, 512, 2048, 'prefill'): (128, 64, 1, 4, 4, 1, True, 0),
    (8, 512, 2048, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (8, 1024, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (8, 1024, 2048, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (8, 1024, 2048, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (8, 1024, 5120, '16'): (32, 16, 8, 2, 4, 1, False, 1),
    (8, 1024, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (8, 1024, 5120, 'small'): (32, 16, 8, 2, 4, 1, False, 1),
    (8, 2048, 512, '16'): (64, 16, 2, 4, 4, 1, False, 1),
    (8, 2048, 512, 'prefill'): (128, 64, 1, 4, 4, 1, True, 0),
    (8, 2048, 512, 'small'): (64, 16, 2, 4, 4, 1, False, 1),
    (8, 2048, 4096, '16'): (32, 16, 8, 2, 4, 1, False, 1),
    (8, 2048, 4096, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (8, 2048, 4096, 'small'): (32, 16, 8, 2, 4, 1, False, 1),
    (8, 4096, 2048, '16'): (32, 16, 4, 2, 4, 1, False, 1),
    (8, 4096, 2048, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (8, 4096, 2048, 'small'): (32, 16, 4, 2, 4, 1, False, 1),
    (8, 5120, 6144, '16'): (32, 16, 8, 2, 4, 1, False, 1),
    (8, 5120, 6144, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (8, 5120, 6144, 'small'): (32, 16, 8, 2, 4, 1, False, 1),
    (8, 5120, 17408, '16'): (32, 16, 8, 2, 4, 1, False, 1),
    (8, 5120, 17408, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (8, 5120, 17408, 'small'): (32, 16, 8, 2, 4, 1, False, 1),
    (8, 6144, 5120, '16'): (32, 16, 8, 2, 4, 1, False, 1),
    (8, 6144, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (8, 6144, 5120, 'small'): (32, 16, 8, 2, 4, 1, False, 1),
    (8, 8192, 2048, '16'): (64, 16, 4, 4, 4, 1, False, 1),
    (8, 8192, 2048, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (8, 8192, 2048, 'small'): (64, 16, 4, 4, 4, 1, False, 1),
    (8, 10240, 5120, '16'): (32, 16, 4, 2, 4, 1, False, 1),
    (8, 10240, 5120, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (8, 10240, 5120, 'small'): (32, 16, 4, 2, 4, 1, False, 1),
    (8, 12288, 5120, '16'): (32, 16, 4, 2, 4, 1, False, 1),
    (8, 12288, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (8, 12288, 5120, 'small'): (32, 16, 4, 2, 4, 1, False, 1),
    (8, 17408, 5120, '16'): (32, 16, 2, 2, 4, 1, False, 1),
    (8, 17408, 5120, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (8, 17408, 5120, 'small'): (32, 16, 2, 2, 4, 1, False, 1),
    (8, 248320, 2048, '16'): (32, 16, 1, 2, 4, 1, False, 1),
    (8, 248320, 2048, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (8, 248320, 2048, 'small'): (32, 16, 1, 2, 4, 1, False, 1),
    (8, 248320, 5120, '16'): (32, 16, 1, 2, 4, 1, False, 1),
    (8, 248320, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (8, 248320, 5120, 'small'): (32, 16, 1, 2, 4, 1, False, 1),
    (16, 512, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 0),
    (16, 512, 2048, 'prefill'): (128, 64, 1, 4, 4, 1, True, 0),
    (16, 512, 2048, 'small'): (32, 16, 8, 2, 6, 1, False, 0),
    (16, 1024, 2048, '16'): (64, 16, 8, 4, 4, 1, False, 0),
    (16, 1024, 2048, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (16, 1024, 2048, 'small'): (32, 16, 8, 2, 6, 1, False, 0),
    (16, 1024, 5120, '16'): (64, 16, 8, 4, 4, 1, False, 1),
    (16, 1024, 5120, 'prefill'): (128, 64, 1, 4, 4, 1, True, 0),
    (16, 1024, 5120, 'small'): (64, 16, 8, 4, 4, 1, False, 1),
    (16, 2048, 512, '16'): (32, 16, 1, 2, 4, 1, False, 0),
    (16, 2048, 512, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (16, 2048, 512, 'small'): (32, 16, 1, 2, 4, 1, False, 0),
    (16, 2048, 4096, '16'): (64, 16, 4, 4, 3, 1, False, 0),
    (16, 2048, 4096, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (16, 2048, 4096, 'small'): (64, 16, 8, 4, 6, 1, False, 0),
    (16, 4096, 2048, '16'): (64, 16, 4, 4, 6, 1, False, 0),
    (16, 4096, 2048, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (16, 4096, 2048, 'small'): (64, 16, 4, 4, 6, 1, False, 0),
    (16, 5120, 6144, '16'): (128, 16, 4, 8, 4, 1, False, 0),
    (16, 5120, 6144, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (16, 5120, 6144, 'small'): (64, 16, 4, 4, 3, 1, False, 0),
    (16, 5120, 17408, '16'): (64, 16, 16, 4, 4, 1, False, 0),
    (16, 5120, 17408, 'prefill'): (128, 128, 1, 8, 4, 1, True, 0),
    (16, 5120, 17408, 'small'): (64, 16, 8, 4, 6, 1, False, 0),
    (16, 6144, 5120, '16'): (128, 16, 4, 8, 4, 1, False, 0),
    (16, 6144, 5120, 'prefill'): (128, 128, 1, 8, 3, 1, True, 0),
    (16, 6144, 5120, 'small'): (64, 16, 4, 4, 3, 1, False, 0),
    (16, 8192, 2048, '16'): (128, 16, 2, 8, 4, 1, False, 0),
    (16, 8192, 2048, 'prefill'): (256, 128, 1, 8, 3, 1, True, 0),
    (16, 8192, 2048, 'small'): (64, 16, 2, 4, 3, 1, False, 0),
    (16, 10240, 5120, '16'): (128, 16, 2, 8, 4, 1, False, 0),
    (16, 10240, 5120, 'prefill'): (256, 128, 1, 8, 3, 1, True, 0),
    (16, 10240, 5120, 'small'): (64, 16, 2, 4, 3, 1, False, 0),
    (16, 12288, 5120, '16'): (128, 16, 2, 8, 4, 1, False, 0),
    (16, 12288, 5120, 'prefill'): (256, 128, 1, 8, 3, 1, True, 0),
    (16, 12288, 5120, 'small'): (64, 16, 2, 4, 3, 1, False, 0),
    (16, 17408, 5120, '16'): (64, 16, 2, 4, 6, 1, False, 0),
    (16, 17408, 5120, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (16, 17408, 5120, 'small'): (64, 16, 2, 4, 6, 1, False, 0),
    (16, 248320, 2048, '16'): (128, 16, 1, 8, 4, 1, False, 0),
    (16, 248320, 2048, 'prefill'): (256, 128, 1, 8, 3, 1, True, 0),
    (16, 248320, 2048, 'small'): (64, 16, 1, 4, 3, 1, False, 0),
    (16, 248320, 5120, '16'): (128, 16, 1, 8, 4, 1, False, 0),
    (16, 248320, 5120, 'prefill'): (128, 256, 1, 8, 3, 1, True, 0),
    (16, 248320, 5120, 'small'): (64, 16, 1, 4, 3, 1, False, 0),
}


# The CUDA-core GEMV (gemv.py) for M <= 4: (fmt id, n, k, "m1" | "m4") -> (block_n, kb, split_k,
# num_warps, num_stages): the shapes where it beat the MMA kernel, from one run of
# `python bench/gemv_tune.py` on an NVIDIA H200 (2026-12-02, torch 2.11, Triton 3.6; BENCHMARKS.md
# "Decode GEMV"); each winner was checked against the fp32 reference in that run. Shapes and M
# not listed take the MMA kernel.
TUNED_GEMV: dict[tuple[int, int, int, str], tuple[int, ...]] = {
    (4, 512, 2048, 'm1'): (16, 4, 4, 4, 1),
    (4, 1024, 2048, 'm1'): (32, 4, 4, 4, 1),
    (4, 1024, 5120, 'm1'): (16, 4, 10, 4, 1),
    (4, 2048, 4096, 'm1'): (32, 2, 8, 4, 1),
    (4, 4096, 2048, 'm1'): (64, 2, 8, 4, 1),
    (4, 5120, 6144, 'm1'): (32, 1, 8, 2, 1),
    (4, 6144, 5120, 'm1'): (32, 2, 4, 4, 1),
    (4, 8192, 2048, 'm1'): (64, 2, 4, 4, 1),
    (4, 12288, 5120, 'm1'): (32, 2, 2, 4, 1),
    (4, 17408, 5120, 'm1'): (32, 2, 2, 4, 1),
    (5, 512, 2048, 'm1'): (16, 4, 4, 4, 1),
    (5, 512, 2048, 'm4'): (16, 2, 8, 2, 1),
    (5, 1024, 2048, 'm1'): (16, 4, 4, 4, 1),
    (5, 1024, 5120, 'm1'): (16, 4, 10, 4, 1),
    (5, 2048, 512, 'm1'): (16, 2, 2, 2, 1),
    (5, 2048, 512, 'm4'): (16, 2, 2, 2, 1),
    (5, 2048, 4096, 'm1'): (16, 4, 4, 4, 1),
    (5, 4096, 2048, 'm1'): (32, 4, 4, 4, 1),
    (5, 5120, 6144, 'm1'): (64, 2, 16, 4, 1),
    (5, 5120, 17408, 'm1'): (64, 2, 16, 4, 1),
    (5, 6144, 5120, 'm1'): (64, 2, 4, 4, 1),
    (5, 8192, 2048, 'm1'): (64, 2, 4, 4, 1),
    (5, 10240, 5120, 'm1'): (64, 2, 8, 4, 1),
    (5, 12288, 5120, 'm1'): (64, 2, 4, 4, 1),
    (5, 17408, 5120, 'm1'): (64, 2, 4, 4, 1),
    (6, 512, 2048, 'm1'): (16, 4, 4, 4, 1),
    (6, 512, 2048, 'm4'): (16, 2, 8, 2, 1),
    (6, 1024, 2048, 'm1'): (16, 4, 4, 4, 1),
    (6, 1024, 5120, 'm1'): (16, 4, 10, 4, 1),
    (6, 2048, 512, 'm1'): (16, 2, 2, 2, 1),
    (6, 2048, 512, 'm4'): (16, 2, 2, 2, 1),
    (6, 2048, 4096, 'm1'): (16, 4, 4, 4, 1),
    (6, 4096, 2048, 'm1'): (16, 2, 4, 2, 1),
    (6, 5120, 6144, 'm1'): (16, 4, 4, 4, 1),
    (6, 5120, 17408, 'm1'): (64, 2, 16, 4, 1),
    (6, 6144, 5120, 'm1'): (64, 2, 4, 4, 1),
    (6, 8192, 2048, 'm1'): (32, 1, 4, 2, 1),
    (6, 10240, 5120, 'm1'): (32, 1, 4, 2, 1),
    (6, 12288, 5120, 'm1'): (64, 2, 4, 4, 1),
    (6, 17408, 5120, 'm1'): (64, 2, 4, 4, 1),
    (8, 512, 2048, 'm1'): (16, 4, 4, 4, 1),
    (8, 512, 2048, 'm4'): (16, 4, 4, 4, 1),
    (8, 1024, 2048, 'm1'): (16, 4, 4, 4, 1),
    (8, 1024, 5120, 'm1'): (16, 4, 10, 4, 1),
    (8, 2048, 512, 'm1'): (16, 2, 2, 2, 1),
    (8, 2048, 512, 'm4'): (32, 1, 4, 2, 1),
    (8, 2048, 4096, 'm1'): (32, 2, 8, 4, 1),
    (8, 4096, 2048, 'm1'): (32, 2, 4, 4, 1),
    (8, 5120, 6144, 'm1'): (16, 2, 4, 2, 1),
    (8, 5120, 17408, 'm1'): (32, 4, 4, 4, 1),
    (8, 6144, 5120, 'm1'): (32, 2, 4, 4, 1),
    (8, 8192, 2048, 'm1'): (32, 2, 4, 4, 1),
    (8, 10240, 5120, 'm1'): (16, 2, 2, 2, 1),
    (8, 12288, 5120, 'm1'): (32, 2, 2, 4, 1),
    (8, 17408, 5120, 'm1'): (32, 2, 2, 4, 1),
    # merged projections (linear.merge_rows) and the q6 head, from `python3 bench/gemv_tune.py
    # --pairs q4_g64:27b.gate_up_merged,q5_g64:27b.in_proj_qkvz,q5_g64:27b.q_v_merged,q6_g64:27b.lm_head`
    # on the H200 (2026-12-02, copy 4.19 TB/s): GEMV against the MMA kernel at M = 1, µs:
    # 52.6 vs 61.3, 44.3 vs 57.6, 38.7 vs 50.6, 497.5 vs 799.4 (M = 4 stays on the MMA kernel)
    (4, 34816, 5120, 'm1'): (16, 4, 1, 4, 1),
    (5, 13312, 5120, 'm1'): (64, 2, 4, 4, 1),
    (5, 16384, 5120, 'm1'): (64, 2, 4, 4, 1),
    (6, 248320, 5120, 'm1'): (32, 1, 1, 2, 1),
}


# The f16x2 GEMV (gemv_h2.py) for M <= 4: (fmt id, n, k, "m1" | "m4") -> (block_n, kbs, ctas,
# num_warps, prefetch), or () where it lost to the kernel dispatched before it; measured with
# `python bench/h2_tune.py` on an NVIDIA H200 (2026-12-03, torch 2.11, Triton 3.6; BENCHMARKS.md
# "f16x2 GEMV"), each winner checked against the fp32 reference at M = 1..4 in that run ("m4" was
# timed at M = 4 and serves M = 2..4). At M = 1, shapes not listed take gemv_h2.default_config;
# at M = 2..4 they keep the CUDA-core GEMV or the MMA kernel.
TUNED_H2: dict[tuple[int, int, int, str], tuple] = {
    (4, 1024, 5120, 'm1'): (16, 8, 6, 4, True),
    (4, 1024, 5120, 'm4'): (),
    (4, 17408, 5120, 'm1'): (16, 8, 6, 4, True),
    (4, 17408, 5120, 'm4'): (),
    (4, 34816, 5120, 'm1'): (16, 8, 6, 4, True),
    (4, 34816, 5120, 'm4'): (),
    (5, 5120, 6144, 'm1'): (16, 8, 6, 4, True),
    (5, 5120, 6144, 'm4'): (),
    (5, 5120, 17408, 'm1'): (16, 8, 6, 4, True),
    (5, 5120, 17408, 'm4'): (16, 8, 6, 4, True),
    (5, 6144, 5120, 'm1'): (16, 8, 6, 4, True),
    (5, 6144, 5120, 'm4'): (),
    (5, 13312, 5120, 'm1'): (32, 4, 4, 4, True),
    (5, 13312, 5120, 'm4'): (16, 8, 6, 4, True),
    (5, 16384, 5120, 'm1'): (64, 4, 4, 8, True),
    (5, 16384, 5120, 'm4'): (32, 8, 4, 4, True),
    (6, 248320, 5120, 'm1'): (32, 8, 4, 4, True),
    (6, 248320, 5120, 'm4'): (32, 8, 4, 4, True),
    (8, 2048, 4096, 'm1'): (16, 4, 8, 4, True),
    (8, 2048, 4096, 'm4'): (),
    (8, 8192, 2048, 'm1'): (16, 4, 8, 4, True),
    (8, 8192, 2048, 'm4'): (),
    (8, 17408, 5120, 'm1'): (16, 4, 8, 4, True),
    (8, 17408, 5120, 'm4'): (),
    # `python3 bench/h2_tune.py --quick --pairs nvfp4:27b.gate_up_merged,nvfp4:27b.down_proj,
    # nvfp4:35b.in_proj_qkvz,nvfp4:35b.o_proj|out_proj,q8_g32:35b.in_proj_qkvz,q8_g32:35b.qkv_merged,
    # q6_g64:35b.lm_head,nvfp4:27b.in_proj_qkvz` (H200, 2026-12-03, fourth session, copy 4.09 TB/s;
    # BENCHMARKS.md "f16x2 GEMV"): NVFP4 at M = 1 1.2-2.2x faster than the MMA kernel, at M = 4
    # mostly slower; the 35B's q6 head 154.8 µs against 310.3
    (6, 248320, 2048, 'm1'): (32, 4, 4, 4, 1, False),
    (6, 248320, 2048, 'm4'): (16, 8, 6, 4, 1, True),
    (8, 9216, 2048, 'm1'): (32, 4, 4, 4, 1, False),
    (8, 9216, 2048, 'm4'): (32, 4, 4, 4, 1, False),
    (8, 12288, 2048, 'm1'): (32, 4, 4, 4, 1, False),
    (8, 12288, 2048, 'm4'): (16, 8, 6, 4, 1, True),
    (16, 2048, 4096, 'm1'): (16, 8, 6, 4, 1, True),
    (16, 2048, 4096, 'm4'): (),
    (16, 5120, 17408, 'm1'): (16, 8, 6, 4, 1, True),
    (16, 5120, 17408, 'm4'): (),
    (16, 12288, 2048, 'm1'): (16, 8, 6, 4, 1, True),
    (16, 12288, 2048, 'm4'): (),
    (16, 16384, 5120, 'm1'): (16, 8, 6, 4, 1, True),
    (16, 16384, 5120, 'm4'): (16, 8, 6, 4, 1, True),
    (16, 34816, 5120, 'm1'): (16, 8, 6, 4, 2, False),
    (16, 34816, 5120, 'm4'): (16, 8, 6, 4, 1, True),
    # the MTP drafter's q8 layer and the q4 shortlist head: `bash bench/calls/defaults_and_drafter_tune.sh`
    # (h2_tune, H200, 2026-12-03, sixth session, copy 4.18 TB/s): at M = 1 against the dispatch
    # before it, µs: qkv 35.3 -> 29.1, fc 26.3 -> 22.7, head 158.0 -> 127.5, gate_up 79.2 -> 66.7,
    # down 41.9 -> 39.7, o 19.8 -> 13.4; at M = 4 the dispatch (MMA kernel) wins every one
    (4, 131072, 5120, 'm1'): (32, 8, 4, 4, 1, False),
    (4, 131072, 5120, 'm4'): (),
    (8, 5120, 6144, 'm1'): (16, 4, 8, 4, 1, True),
    (8, 5120, 6144, 'm4'): (),
    (8, 5120, 10240, 'm1'): (16, 4, 8, 4, 1, True),
    (8, 5120, 10240, 'm4'): (),
    (8, 5120, 17408, 'm1'): (16, 8, 6, 4, 1, False),
    (8, 5120, 17408, 'm4'): (),
    (8, 14336, 5120, 'm1'): (16, 4, 8, 4, 1, True),
    (8, 14336, 5120, 'm4'): (),
    (8, 34816, 5120, 'm1'): (16, 4, 8, 4, 1, True),
    (8, 34816, 5120, 'm4'): (),
}


# The tensor-core decode GEMV (gemv_tc.py): (fmt, n, k, "m1" | "m4" | "m8") -> TCConfig fields
# (kb, stages, num_warps, ctas), from bench/tc_tune.py on the H200; () = it lost to the dispatch
# there (BENCHMARKS.md "Tensor-core decode GEMV").
TUNED_TC: dict[tuple[int, int, int, str], tuple] = {
    # python3 bench/tc_tune.py (H200, 2026-12-03, copy 4.19 TB/s, tree 05ad776): it wins at M = 4
    # and 8 on the big q4/q5 shapes (the speculative verify), loses at M = 1 and on down/k/v
    (4, 1024, 5120, 'm1'): (),
    (4, 1024, 5120, 'm4'): (),
    (4, 1024, 5120, 'm8'): (),
    (4, 34816, 5120, 'm1'): (),
    (4, 34816, 5120, 'm4'): (8, 2, 4, 2),
    # from here: the direct kernel (TCConfig.direct, 5th field), `python3 bench/tc_tune.py --direct`
    # (H200, 2026-12-04, copy 4.17 TB/s, bench/calls/tcd.sh), where it beat the dispatch; µs
    # dispatch -> direct at M = 1 / 4 / 8 in BENCHMARKS.md "Tenth run"
    (4, 34816, 5120, 'm8'): (8, 0, 4, 6, 2),
    (5, 5120, 6144, 'm1'): (),
    (5, 5120, 6144, 'm4'): (4, 0, 4, 6, 1),
    (5, 5120, 6144, 'm8'): (8, 0, 4, 6, 2),
    (5, 5120, 17408, 'm1'): (),
    # M = 4: 17 K blocks a slice won alone (40.1 -> 37.0 us, `bench/calls/gdn_down.sh`) and lost in
    # the 27B MTP round (12.77 / 12.75 ms at 8 against 13.02 / 13.02 at 17, alternated,
    # `bench/calls/down_ab.sh`): 8 stays. M = 8: 17 blocks, alone 61.6 -> 40.1 us, not yet timed in a
    # batched round (ninth session)
    (5, 5120, 17408, 'm4'): (8, 0, 4, 6, 2),
    (5, 5120, 17408, 'm8'): (17, 0, 4, 8, 2),
    (5, 13312, 5120, 'm1'): (),
    (5, 13312, 5120, 'm4'): (8, 0, 4, 4, 2),
    (5, 13312, 5120, 'm8'): (8, 0, 4, 6, 2),
    (5, 16384, 5120, 'm1'): (),  # won alone (28.0 vs 30.6 µs) but the 27B step lost 0.55 ms with it: BENCHMARKS.md
    (5, 16384, 5120, 'm4'): (8, 0, 4, 6, 2),
    (5, 16384, 5120, 'm8'): (8, 0, 4, 6, 2),
}


# The K-walk GEMV (gemv_kw.py) for M <= 4: (fmt id, n, k, "m1" | "m4") -> KWConfig fields
# (block_n, bw, splits, num_warps, prefetch, inline), or () where it lost to the kernel dispatched
# without it. Written from `bench/kw_bench.py`'s tuned_kw.py (a winner must beat the dispatched
# kernel alone), then kept only if the decode step with the table beats it without
# (`NINFER_KW=0` turns the table off). Measured on an H100 (the lent machine of 2026-12-05; copy
# 2.90 TB/s): `python3 bench/kw_bench.py`, µs a call against the kernel dispatched without the
# table. The step with every M <= 4 launch on the K-walk's default config (NINFER_KW=1) beat the
# dispatch without it by 23% on the 27B (98.5 -> 121.3 tok/s, same process, BENCHMARKS.md
# "Seventeenth run"); this table (each shape's winner, M = 4 only where it won) is not yet timed
# in the step, nor on an H200.
TUNED_KW: dict[tuple[int, int, int, str], tuple] = {
    # 38.31 vs 54.37 us (H2 BN16 KBS8 C6 w4 pf). Its grid's last 64 row blocks in two K shares
    # (KWConfig tail 64, tail_splits 2) timed 40.04 against 43.70 us alone, but the 27B step lost
    # with them: 8.41 / 8.38 against 8.32 ms (H100, BENCHMARKS.md twentieth run)
    (4, 34816, 5120, 'm1'): (16, 128, 1, 4, 2, False),
    (4, 34816, 5120, 'm4'): (16, 64, 1, 4, 1, False),  # 54.32 vs 56.82 us (TC KB8 S2 w4 C2)
    (5, 5120, 17408, 'm1'): (8, 128, 1, 2, 1, False),  # 28.9 vs 36.49 us (H2 BN16 KBS8 C6 w4 pf)
    (5, 5120, 17408, 'm4'): (8, 128, 1, 2, 1, False),  # 38.63 vs 48.05 us (TCD KB8 P2 w4 C6)
    (5, 16384, 5120, 'm1'): (16, 128, 1, 4, 1, False),  # 26.27 vs 31.29 us (H2 BN64 KBS4 C4 w8 pf)
    (5, 16384, 5120, 'm4'): (8, 128, 1, 2, 1, False),  # 32.84 vs 34.93 us (TCD KB8 P2 w4 C6)
    (5, 13312, 5120, 'm1'): (16, 64, 1, 4, 1, False),  # 20.51 vs 26.66 us (H2 BN32 KBS4 C4 w4 pf)
    (5, 13312, 5120, 'm4'): (),  # best 29.47 us vs 29.86 us (TCD KB8 P2 w4 C4)
    (5, 5120, 6144, 'm1'): (),  # best 11.57 us vs 11.54 us (H2 BN16 KBS8 C6 w4 pf)
    (5, 5120, 6144, 'm4'): (),  # best 15.1 us vs 14.58 us (TCD KB4 P1 w4 C6)
    # NVFP4 down, M = 1: with the g16-split8-f16 decode, 23.66 us (71.3% of copy) against the old
    # entry BN32 BW128 w8's 26.78 and the f16x2 GEMV's 29.34 (H100, kw_bench --shapes, BENCHMARKS.md
    # thirty-first run); the old decode had BN32 BW128 w8 at 27.09 vs 30.5 us
    (16, 5120, 17408, 'm1'): (8, 128, 2, 2, 1, False),
    (16, 5120, 17408, 'm4'): (8, 128, 1, 2, 1, False),  # 38.78 vs 40.98 us (None)
    (8, 12288, 2048, 'm1'): (8, 128, 1, 2, 1, False),  # 11.76 vs 12.71 us (H2 BN32 KBS4 C4 w4 pf)
    (8, 12288, 2048, 'm4'): (16, 64, 1, 4, 1, False),  # 13.78 vs 23.28 us (H2 BN16 KBS8 C6 w4 pf early)
    (8, 2048, 4096, 'm1'): (),  # best 7.48 us vs 6.68 us (H2 BN16 KBS4 C8 w4 pf)
    (8, 2048, 4096, 'm4'): (16, 128, 1, 4, 2, False),  # 8.49 vs 14.57 us (None)
    (6, 248320, 5120, 'm1'): (8, 128, 1, 2, 1, False),  # 333.5 vs 580.16 us (H2 BN32 KBS8 C4 w4 pf)
    (6, 248320, 5120, 'm4'): (16, 64, 1, 4, 1, False),  # 419.23 vs 579.41 us (H2 BN32 KBS8 C4 w4 pf)
    # the 35B-A3B's q6 head and merged q8 q+k+v with the 27B head's and the q8 qkvz's winners, not
    # timed alone: in the 35B int4 step (NINFER_KW_TRY=1 then, H100, BENCHMARKS.md twenty-third run)
    # 401.7 tok/s against 391.6 / 387.5 (the f16x2 GEMV had the head at 62.6% of copy on the H200)
    (6, 248320, 2048, 'm1'): (8, 128, 1, 2, 1, False),
    (6, 248320, 2048, 'm4'): (16, 64, 1, 4, 1, False),
    (8, 9216, 2048, 'm1'): (8, 128, 1, 2, 1, False),
    (8, 9216, 2048, 'm4'): (16, 64, 1, 4, 1, False),
    # the 27B --quant nvfp4 step's NVFP4 gate+up, qkv+z and q+v and its q8 head (they ran on the
    # f16x2 GEMV), with the configs of the q4/q5/q6 winners of the same shapes: the nvfp4 step
    # 9.825 / 9.855 -> 9.599 / 9.588 ms under NINFER_KW_TRY=1 (H100, alternated in one process, with
    # the g16-split8-f16 decode; BENCHMARKS.md thirty-first run; the KW GPU test passed on them).
    # Alone (quant_bars.py, M = 1): gate+up 73%, qkv+z 66%, q+v 63% of copy. The m4 entries (the
    # verify's M <= 4) are not timed on their own, nor in an MTP round
    (16, 34816, 5120, 'm1'): (16, 128, 1, 4, 2, False),
    (16, 34816, 5120, 'm4'): (16, 64, 1, 4, 1, False),
    (16, 16384, 5120, 'm1'): (16, 64, 1, 4, 1, False, True),  # kw_bench: 20.46 (77.7%) vs BN16 BW128 pf 21.90 us
    (16, 16384, 5120, 'm4'): (8, 128, 1, 2, 1, False),
    (16, 13312, 5120, 'm1'): (16, 64, 1, 4, 1, False),
    (8, 248320, 5120, 'm1'): (8, 128, 1, 2, 1, False),
    (8, 248320, 5120, 'm4'): (16, 64, 1, 4, 1, False),
    # the 27B MTP drafter's q8 layer and q4 shortlist head at M = 1 (three draft steps a round; they
    # ran on the f16x2 GEMV), with the configs of the K-walk winners of like shapes (q4 gate+up, q5
    # qkv+z, q5 down): the round 11.56 -> 11.45 ms, 1.403x -> 1.391x the plain step (H100, twice
    # each in one process, BENCHMARKS.md twenty-fourth run; the KW GPU test passed on them)
    (8, 34816, 5120, 'm1'): (16, 128, 1, 4, 2, False),
    (8, 14336, 5120, 'm1'): (16, 128, 1, 4, 1, False),
    (8, 5120, 17408, 'm1'): (8, 128, 1, 2, 1, False),
    (8, 5120, 10240, 'm1'): (8, 128, 1, 2, 1, False),
    (4, 131072, 5120, 'm1'): (16, 128, 1, 4, 2, False),
}

# The tensor-core K-walk GEMV (gemv_tkw.py): (fmt, n, k, "m1" | "m4" | "m8") -> (tb, pf, num_warps,
# splits[, pin[, ring]]) where it beat the kernel dispatched without it, measured by bench/tkw_bench.py; ()
# where it lost. m1/m4: measured on the H200 (BENCHMARKS.md, nineteenth run), where the pinned forms
# (next blocks' loads held at the loop's top) win every big matrix at M = 4 and it loses every M = 1.
# m8: the H100's winners (eighteenth run; M = 8 is not run on the H200 yet).
TUNED_TKW: dict[tuple[int, int, int, str], tuple] = {
    (4, 34816, 5120, 'm1'): (),  # best 44.16 us vs 33.4 us (KW BN16 BW128 S1 w4 pp)
    # the ring (3 stages, x in the ring; H100 only so far: 43.29 us against this config's pinned
    # register form 53.38 and the K-walk's 53.13, tkw_bench --set ring, nineteenth run); H200, pinned
    # registers: 45.71 vs 52.27 us (KW BN16 BW64 S1 w4 pf). NINFER_TKW_RING=0 gives the pinned form back
    (4, 34816, 5120, 'm4'): (2, 1, 4, 1, True, 3),
    (5, 5120, 17408, 'm1'): (),  # best 31.91 us vs 26.45 us (KW BN8 BW128 S1 w2 pf)
    (5, 5120, 17408, 'm4'): (4, 2, 4, 4, True),  # 32.27 vs 36.88 us (KW BN8 BW128 S1 w2 pf)
    (5, 16384, 5120, 'm1'): (),  # best 26.23 us vs 23.95 us (KW BN16 BW128 S1 w4 pf)
    (5, 16384, 5120, 'm4'): (4, 3, 4, 1, True),  # 26.57 vs 31.72 us (KW BN8 BW128 S1 w2 pf)
    (5, 13312, 5120, 'm1'): (),  # best 24.03 us vs 17.82 us (KW BN16 BW64 S1 w4 pf)
    (5, 13312, 5120, 'm4'): (4, 3, 4, 1, True),  # 24.43 vs 26.01 us (TCD KB8 P2 w4 C4)
    (5, 5120, 6144, 'm1'): (),  # best 13.89 us vs 10.62 us (H2 BN16 KBS8 C6 w4 pf)
    (5, 5120, 6144, 'm4'): (),  # best 14.15 us vs 13.6 us (TCD KB4 P1 w4 C6)
    (4, 1024, 5120, 'm1'): (),  # best 7.98 us vs 5.35 us (H2 BN16 KBS8 C6 w4 pf)
    (4, 1024, 5120, 'm4'): (),  # best 8.1 us vs 8.04 us (None)
    (4, 131072, 5120, 'm1'): (),  # best 140.06 us vs 134.83 us (H2 BN32 KBS8 C4 w4 pf): the MTP shortlist head
    (4, 131072, 5120, 'm4'): (4, 2, 4, 1, True),  # 139.9 vs 151.73 us (None)
    (4, 34816, 5120, 'm8'): (4, 1, 4, 4),  # H100: 58.64 vs 64.84 us (TCD KB8 P2 w4 C6)
    (5, 5120, 17408, 'm8'): (4, 1, 4, 4),  # H100: 39.46 vs 44.07 us (TCD KB17 P2 w4 C8)
    (5, 16384, 5120, 'm8'): (4, 2, 4, 1),  # H100: 32.27 vs 44.03 us (TCD KB8 P2 w4 C6)
}

# K-walk configs not yet measured in a step, dispatched ahead of TUNED_KW only under NINFER_KW_TRY=1
# (an A/B switch read at each launch, for `dense_27b.py --variants`). Its earlier entries (the 35B's
# head and q+k+v; the 27B MTP drafter's q8 layer and q4 shortlist head; the 27B nvfp4 model's NVFP4
# gate+up, qkv+z, q+v and q8 head) won and moved into TUNED_KW.
TUNED_KW_TRY: dict[tuple[int, int, int, str], tuple] = {
    # the 27B's q5 down at M = 1 in 4 K shares: 23.42 against the entry's 24.90 us (S1) in one kw_bench
    # run on an H200 (thirty-fourth run); in the step there -0.03 ms (within spread); on an H100 the
    # plain step under NINFER_KW_TRY=1 lost 0.07 ms (8.101 / 8.106 against 8.028 / 8.003, thirty-fifth run)
    (5, 5120, 17408, 'm1'): (8, 128, 4, 2, 1, False, False, 0, 0),
    # the --quant int8 27B's q8 qkv+z, q+v and o_proj at M = 1 (its gate+up and down have the MTP
    # drafter's entries of the same shapes), with the configs of the drafter's q8 entries
    (8, 16384, 5120, 'm1'): (16, 128, 1, 4, 1, False),
    (8, 13312, 5120, 'm1'): (16, 128, 1, 4, 1, False),
    (8, 5120, 6144, 'm1'): (8, 128, 1, 2, 1, False),
    # the 35B-A3B --quant nvfp4's NVFP4 qkvz and q+k+v and its q8 head, with the configs of the int4
    # recipe's q8 / q6 entries of the same shapes
    (16, 12288, 2048, 'm1'): (8, 128, 1, 2, 1, False),
    (16, 12288, 2048, 'm4'): (16, 64, 1, 4, 1, False),
    (16, 9216, 2048, 'm1'): (8, 128, 1, 2, 1, False),
    (16, 9216, 2048, 'm4'): (16, 64, 1, 4, 1, False),
    (8, 248320, 2048, 'm1'): (8, 128, 1, 2, 1, False),
    (8, 248320, 2048, 'm4'): (16, 64, 1, 4, 1, False),
    # the 27B MTP round's alignment: the drafter's q8 fc (5120 x 10240) and merged q+k+v (14336 x
    # 5120) at M = 4 had no K-walk entry and ran on the tile kernel (_qmm_kernel), 47.8 and 48.4 us
    # (1.2 and 1.6 TB/s) against the K-walk's 24.6 and 32.4 us for the same weights at M = 1 (H100
    # profile, thirty-fifth run). The q8 M = 4 winners' config (q8 qkvz, the q6/q8 heads). The round
    # under NINFER_KW_TRY=1 (these, the q8 o_proj entry above, the q5 down S4): 11.096 / 11.090 ms
    # against 11.079 / 11.086 (H100, alternated, thirty-fifth run): no gain; not promoted
    (8, 5120, 10240, 'm4'): (16, 64, 1, 4, 1, False),
    (8, 14336, 5120, 'm4'): (16, 64, 1, 4, 1, False),
}

# Tensor-core K-walk configs measured to win alone on one card but not yet in a step or round on the
# H200, dispatched ahead of TUNED_TKW only under NINFER_TKW_TRY=1 (an A/B switch read at each launch,
# for `dense_27b.py --variants`): the q4 shortlist head at M = 1 on a 4-stage ring, 153.64 against the
# f16x2 GEMV's 192.13 us on an H100 (tkw_bench --set ring, BENCHMARKS.md twentieth run); on the H200
# only the register forms were timed there (140.06 against 134.83 us).
TUNED_TKW_TRY: dict[tuple[int, int, int, str], tuple] = {
    (4, 131072, 5120, 'm1'): (2, 1, 4, 1, False, 4),
}


# The CUDA C++ GEMV (gemv_cu.py): (format, N, K, x rows) -> (rows a warp, unroll, warps, ksplit),
# gemv_cu.CUConfig's fields. A launch goes to that kernel where its shape is here (unless
# NINFER_CU_GEMV=0). Measured on an H100 by bench/cu_gemv_bench.py (thirty-sixth session,
# BENCHMARKS.md "Thirty-seventh run"): the winners by kw_bench's margins against what the dispatch
# picked before; the 27B int4 step went from 8.02 to 7.52 ms with them, the nvfp4 step from 9.09
# to 8.94 ms. The thirty-seventh session's entries (BENCHMARKS.md "Thirty-eighth run", H100): the
# 27B nvfp4 step 8.92 -> 7.61 ms (unmerged NVFP4 shapes), the 35B int4 step 2.217 -> 2.133 ms, the
# 35B nvfp4 step 2.562 -> 2.167 ms, the 27B int4 MTP round 10.97 -> 10.57 ms (gemv_mma at M = 4).
# A 5-tuple ending in True is the tensor-core form (gemv_cu.CUConfig's mma field, 16 rows a warp).
TUNED_CU: dict[tuple[int, int, int, int], tuple] = {
    (4, 34816, 5120, 1): (4, 1, 4, 1),  # 33.91 us 93.7% against KW BN16 BW128 S1 w4 pp 37.75 us
    (5, 5120, 17408, 1): (2, 1, 4, 4),  # 25.57 us 76.8% against KW BN8 BW128 S1 w2 pf 27.9 us
    (5, 16384, 5120, 1): (2, 1, 8, 1),  # 22.68 us 81.5% against KW BN16 BW128 S1 w4 pf 25.72 us
    (5, 5120, 6144, 1): (2, 2, 8, 1),  # 11.04 us 62.7% against H2 BN16 KBS8 C6 w4 pf 11.53 us
    (4, 1024, 5120, 1): (2, 1, 4, 4),  # 3.33 us 28.1% against H2 BN16 KBS8 C6 w4 pf 5.44 us
    (4, 1024, 5120, 4): (2, 1, 4, 2),  # 6.06 us 15.4% against None 7.65 us
    (8, 34816, 5120, 1): (2, 1, 4, 4),  # 61.72 us 103.0% against KW BN16 BW128 S1 w4 pp 69.99 us
    (8, 34816, 5120, 4): (4, 1, 4, 1),  # 71.14 us 89.3% against None 112.14 us
    (8, 14336, 5120, 1): (2, 1, 4, 2),  # 27.09 us 96.6% against KW BN16 BW128 S1 w4 pf 35.47 us
    (8, 14336, 5120, 4): (4, 1, 4, 1),  # 32.4 us 80.7% against None 50.21 us
    (8, 12288, 2048, 1): (2, 1, 4, 2),  # 10.64 us 84.3% against KW BN8 BW128 S1 w2 pf 11.67 us
    # NVFP4 (same bench, second H100 call of the session)
    (16, 34816, 5120, 1): (1, 1, 4, 1),  # 37.1 us 90.4% against KW BN16 BW128 S1 w4 pp 46.22 us
    (16, 5120, 17408, 1): (2, 1, 4, 4),  # H200 (39th run): 17.59 us 68.6% against R4 U1 w8 ks2 19.64 us; H100 R4 U1 w8 ks2 20.46 us 81.9%
    (16, 5120, 17408, 4): (16, 2, 8, 8, True),  # H200 (39th run): mma 24.08 us 50.1% against R2 U1 w4 ks2 40.19 us
    (16, 16384, 5120, 1): (2, 1, 4, 1),  # 18.39 us 85.8% against KW BN16 BW64 S1 w4 pf pin 22.22 us
    (16, 13312, 5120, 1): (2, 1, 4, 1),  # 15.69 us 81.8% against KW BN16 BW64 S1 w4 pf 20.01 us
    (16, 13312, 5120, 4): (2, 2, 4, 1),  # 30.56 us 42.0% against None 39.87 us
    (16, 5120, 6144, 1): (4, 1, 4, 2),  # 8.5 us 69.7% against H2 BN16 KBS8 C6 w4 pf early 11.25 us
    (16, 5120, 6144, 4): (2, 1, 4, 2),  # 16.62 us 35.6% against None 24.96 us
    (16, 12288, 2048, 1): (2, 1, 4, 1),  # 7.32 us 64.9% against H2 BN16 KBS8 C6 w4 pf early 8.84 us
    (16, 12288, 2048, 4): (2, 1, 4, 1),  # 13.07 us 36.3% against None 24.23 us
    (16, 9216, 2048, 1): (1, 1, 4, 1),  # 6.54 us 54.4% against H2 BN16 KBS8 C6 w4 pf early 8.72 us
    (16, 9216, 2048, 4): (2, 2, 4, 1),  # 10.56 us 33.7% against None 17.12 us
    # tensor-core form (gemv_mma) at M = 4 on the verify's q5 shapes (thirty-eighth run, H100, cu11)
    (5, 16384, 5120, 4): (16, 2, 8, 2, True),  # 27.86 us 65.9% against TKW TB4 P3 w4 S1 pin 32.56 us
    (5, 13312, 5120, 4): (16, 2, 8, 2, True),  # 25.38 us 58.8% against TKW TB4 P3 w4 S1 pin 26.24 us
    # the 35B-A3B's q8 projections, its q6 head and shortlist head (thirty-eighth run, H100, cu12)
    (8, 2048, 4096, 1): (2, 1, 4, 4),  # 4.53 us 65.7% against H2 BN16 KBS4 C8 w4 pf 6.52 us
    (8, 2048, 4096, 4): (2, 1, 8, 2),  # 7.36 us 40.4% against KW BN16 BW128 S1 w4 pp 10.57 us
    (8, 9216, 2048, 1): (4, 1, 4, 2),  # 7.95 us 84.2% against KW BN8 BW128 S1 w2 pf 9.87 us
    (8, 9216, 2048, 4): (2, 1, 4, 1),  # 11.58 us 57.8% against KW BN16 BW64 S1 w4 pf 12.59 us
    (8, 1024, 2048, 1): (2, 1, 4, 4),  # 2.4 us 31.0% against H2 BN32 KBS4 C4 w4 pf 4.41 us
    (8, 1024, 2048, 4): (2, 1, 8, 2),  # 3.96 us 18.8% against None 11.67 us
    (8, 2048, 512, 1): (2, 2, 8, 2),  # 1.91 us 19.5% against H2 BN32 KBS4 C4 w4 pf 3.55 us
    (8, 2048, 512, 4): (2, 1, 4, 1),  # 2.67 us 13.9% against GEMV BN32 KB1 SK4 w2 s1 6.58 us
    (6, 248320, 2048, 1): (1, 2, 4, 1),  # 130.94 us 101.3% against KW BN8 BW128 S1 w2 pf 154.22 us
    (4, 131072, 2048, 1): (2, 1, 4, 1),  # 47.0 us 101.3% against H2 BN32 KBS4 C4 w4 pf 85.38 us
    (4, 131072, 2048, 4): (16, 2, 4, 1, True),  # 56.96 us 83.6% against None 71.41 us
    # unmerged NVFP4 shapes of the 27B and 35B, the q8 / q6 heads, the 27B's shortlist head (thirty-eighth run, H100, cu9)
    (16, 17408, 5120, 1): (4, 1, 4, 2),  # H200 (39th run): 16.79 us 71.9% against R1 U1 w4 18.43 us; H100 R1 U1 w4 19.74 us 85.1%
    (16, 17408, 5120, 4): (16, 2, 8, 8, True),  # H200 (39th run): mma 23.58 us 51.2% against R2 U2 w4 36.47 us
    (16, 10240, 5120, 1): (1, 1, 4, 1),  # 12.96 us 76.3% against H2 BN16 KBS8 C6 w4 pf early 16.89 us
    (16, 10240, 5120, 4): (16, 2, 4, 4, True),  # H200 (39th run): mma 14.31 us 49.6% against R2 U1 w4 ks2 24.93 us
    (16, 6144, 5120, 1): (1, 1, 4, 1),  # 8.41 us 70.5% against H2 BN16 KBS8 C6 w4 pf early 11.42 us
    (16, 6144, 5120, 4): (16, 1, 8, 8, True),  # H200 (39th run): mma 9.56 us 44.6% against R2 U2 w4 15.21 us
    (16, 12288, 5120, 1): (2, 1, 4, 1),  # H200 (39th run): 12.89 us 66.1% against R1 U1 w4 13.7 us; H100 R1 U1 w4 14.83 us 80.0%
    (16, 12288, 5120, 4): (16, 2, 4, 4, True),  # H200 (39th run): mma 15.22 us 56.0% against R2 U1 w4 26.49 us
    (16, 1024, 5120, 1): (2, 1, 4, 4),  # 3.64 us 27.1% against H2 BN16 KBS8 C6 w4 pf early 5.82 us
    (16, 1024, 5120, 4): (2, 1, 8, 2),  # 6.37 us 15.5% against None 12.96 us
    (16, 8192, 2048, 1): (2, 1, 4, 1),  # 5.36 us 59.2% against H2 BN16 KBS8 C6 w4 pf early 8.63 us
    (16, 8192, 2048, 4): (4, 1, 4, 1),  # 9.32 us 34.0% against None 18.91 us
    (16, 4096, 2048, 1): (2, 4, 4, 1),  # 3.69 us 43.0% against H2 BN16 KBS8 C6 w4 pf early 6.09 us
    (16, 4096, 2048, 4): (4, 1, 4, 1),  # 5.39 us 29.4% against None 11.17 us
    (16, 512, 2048, 1): (2, 1, 4, 2),  # 2.49 us 7.9% against H2 BN16 KBS8 C6 w4 pf early 4.64 us
    (16, 512, 2048, 4): (2, 1, 4, 2),  # 3.48 us 5.7% against None 7.4 us
    (16, 2048, 4096, 1): (2, 1, 4, 4),  # 3.94 us 40.2% against H2 BN16 KBS8 C6 w4 pf early 6.55 us
    (16, 2048, 4096, 4): (2, 1, 4, 2),  # 5.91 us 26.8% against None 11.4 us
    (8, 248320, 5120, 1): (2, 1, 4, 4),  # 426.38 us 106.1% against KW BN8 BW128 S1 w2 pf 512.04 us
    (8, 248320, 5120, 4): (4, 1, 4, 1),  # 463.42 us 97.6% against KW BN16 BW64 S1 w4 pf 574.8 us
    (8, 248320, 2048, 1): (2, 1, 8, 2),  # 173.62 us 104.2% against H2 BN32 KBS4 C4 w4 pf 267.94 us
    (8, 248320, 2048, 4): (4, 1, 4, 1),  # 193.09 us 93.7% against None 247.34 us
    (4, 131072, 5120, 1): (2, 1, 4, 1),  # 118.64 us 100.6% against KW BN16 BW128 S1 w4 pp 141.22 us
    (4, 131072, 5120, 4): (16, 2, 4, 1, True),  # 139.16 us 85.8% against TKW TB4 P2 w4 S1 pin 164.42 us
    (6, 248320, 5120, 1): (2, 4, 4, 1),  # 320.28 us 103.8% against KW BN8 BW128 S1 w2 pf 380.7 us
}

# Per card (gemv_cu.card(): "H100", "H200"), entries over TUNED_CU's for that card only, and the
# winners on q5's prepared high-bit words (format gemv_cu.Q5_WORDS = 21: gemv_cu.q5_words, made at
# load only for the shapes named here). H100 (fortieth run, 2026-12-07, bench/cu_gemv_bench.py
# --ms 1,4 on the 27B's q5 down, q5 qkv+z and q4 gate+up, every config timed on the runs of qhigh
# and on words, the words bit-equal): on the H200 gemv_mma lost q4 gate+up at M = 4 to the
# tensor-core K-walk (39.59 against 36.76 us, thirty-ninth run), on the H100 it wins, so these stay
# off the H200 until it is measured there. Not yet timed in a whole step (the fortieth run's A/B
# built its model without the words).
TUNED_CU_CARD: dict[str, dict[tuple[int, int, int, int], tuple]] = {
    "H100": {
        (21, 5120, 17408, 1): (2, 2, 4, 2),  # words 22.6 us 86.8% against cu R2 U1 w4 ks4 24.53 us (best plain 24.39)
        (21, 5120, 17408, 4): (16, 1, 8, 8, True),  # words 29.66 us 66.1% against TKW TB4 P2 w4 S4 pin 33.83 us (plain mma 33.1)
        (21, 16384, 5120, 4): (16, 2, 4, 2, True),  # words 24.49 us 75.3% against cu mma U2 w8 ks2 27.64 us
        (5, 16384, 5120, 4): (16, 2, 4, 2, True, 0, 1),  # ofs 25.69 us 71.8% against cu mma U2 w8 ks2 27.64 us
        (4, 34816, 5120, 4): (16, 2, 4, 4, True),  # 36.64 us 86.6% against TKW TB2 R3 w4 S1 41.05 us
    },
}
