"""The shortlist proposal head (--lm-head-draft) and `ninfer convert --shortlist`."""

from __future__ import annotations

import shutil

import torch
from spec_helpers import VOCAB, make_engine, params, prompt_ids

from ninfer.plugins import get_plugin_manager
from ninfer.testing import greedy_generate, load_model, make_tiny
from ninfer_plugins.spec_mtp.shortlist import (
    SHORTLIST_FILE,
    ShortlistHead,
    convert_shortlist,
    default_rows,
    greedy_counts,
    load_shortlist,
    rank_rows,
    shortlist_for,
)


def test_rank_rows_forces_specials_then_counts_with_low_ids_first():
    counts = torch.tensor([5, 9, 0, 9, 1, 7, 0, 0])
    ids = rank_rows(counts, 4, forced=[6, 99])  # 99 is outside the vocabulary: ignored
    # forced 6 (count 0) plus the three best: 1 and 3 tie at 9 (lower id first), then 5 (7)
    assert ids.tolist() == [1, 3, 5, 6]
    assert rank_rows(counts, 8).tolist() == [1, 3, 5, 0, 4, 2, 6, 7]


def test_default_rows_keep_the_published_share():
    assert default_rows(248320) == 131072
    assert default_rows(256) == 135


def test_head_proposes_the_best_shortlist_row(dense):
    ids = torch.arange(0, VOCAB, 3)
    h = torch.randn(6, dense.shape.hidden_size, generator=torch.Generator().manual_seed(1))
    head = ShortlistHead(dense, ids)
    assert head.scheme == "bf16"
    assert head.propose(h).tolist() == ids[dense.compute_logits(h)[:, ids].argmax(-1)].tolist()


def test_quantized_head_is_q4_rows_of_the_full_head(dense):
    schemes = {s.name: s for s in get_plugin_manager().collect("ninfer_quant_schemes")}
    ids = torch.arange(1, VOCAB, 2)
    head = ShortlistHead(dense, ids, schemes)
    assert head.scheme == "q4_g64"
    h = torch.randn(5, dense.shape.hidden_size, generator=torch.Generator().manual_seed(2))
    assert head.propose(h).tolist() == ids[head.linear(h).argmax(-1)].tolist()
    w = head.linear(torch.eye(dense.shape.hidden_size)).T  # the rows as the kernel sees them
    full = dense.lm_head(torch.eye(dense.shape.hidden_size)).T[ids]
    # q4 with a scale per 64: every weight within half a step (max|row group| / 7 / 2)
    assert float((w - full).abs().max()) <= float(full.abs().max()) / 14 + 1e-6


def test_lm_head_draft_is_lossless(dense, tok):
    prompt = prompt_ids(24, seed=4)
    out = make_engine(dense, tok, k=3, lm_head_draft=True).generate(prompt, params(max_new_tokens=40))
    assert out.new_token_ids == greedy_generate(dense, prompt, 40)


def test_lm_head_draft_is_lossless_on_the_moe_family(moe, tok):
    """The 35B-A3B's MTP layer (sparse MoE) proposing from the shortlist head: plain greedy tokens."""
    prompt = prompt_ids(19, seed=6)
    eng = make_engine(moe, tok, k=3, lm_head_draft=True)
    assert eng.speculative.drafter.head is not None
    out = eng.generate(prompt, params(max_new_tokens=32))
    assert out.new_token_ids == greedy_generate(moe, prompt, 32)


def test_convert_writes_the_model_s_own_ranking_and_the_engine_loads_it(tmp_path):
    ckpt = make_tiny("qwen3.6-27b", tmp_path / "m", vocab=VOCAB, layers=4)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abc def\n" * 40 + "".join(chr(c) for c in range(33, 127)))
    path = convert_shortlist(str(ckpt), str(ckpt), 50, str(corpus), device="cpu")
    assert path == ckpt / SHORTLIST_FILE
    ids = load_shortlist(path)
    assert len(ids) == 50 and len(set(ids.tolist())) == 50 and int(ids.max()) < VOCAB
    model = load_model(ckpt)
    from ninfer.frontend.tokenizer import load_tokenizer

    text_ids = [t for t in load_tokenizer(None).encode(corpus.read_text()) if t < VOCAB]
    counts = greedy_counts(model, text_ids)
    assert counts[ids].sum() == counts[torch.sort(-counts, stable=True).indices[:50]].sum()
    assert torch.equal(shortlist_for(model, None), ids)
    # without the file: the corpus-frequency stand-in, the published share of the rows
    shutil.copytree(ckpt, tmp_path / "bare", ignore=shutil.ignore_patterns(SHORTLIST_FILE))
    assert len(shortlist_for(load_model(tmp_path / "bare"), None)) == default_rows(VOCAB)
