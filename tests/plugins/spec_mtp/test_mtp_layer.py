"""The MTP layer against one built from transformers' own modules, and its prompt alignment."""

from __future__ import annotations

import pytest
import torch
from spec_helpers import VOCAB, make_engine, params, prompt_ids

from ninfer_plugins.qwen_hybrid.weights import mtp_tensors
from ninfer_plugins.spec_mtp.mtp import MtpCache, MtpDrafter, MtpLayer


def test_every_published_mtp_tensor_has_a_home(dense, moe):
    for model in (dense, moe):
        assert set(MtpLayer(model).weight_targets()) == set(mtp_tensors(model.shape))


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_matches_an_mtp_built_from_transformers_modules(request, which):
    transformers = pytest.importorskip("transformers")
    from mtp_hf import HFMtp
    from safetensors.torch import load_file

    model = request.getfixturevalue(which)
    path = model.weight_source.path
    ref = HFMtp(transformers.AutoConfig.from_pretrained(path).text_config).float()
    sd = {k[4:]: v.float() for k, v in load_file(str(path / "model.safetensors")).items() if k.startswith("mtp.")}
    missing, unexpected = ref.load_state_dict(sd, strict=False)
    assert not unexpected and all(m.startswith("rotary.") for m in missing)

    layer = MtpLayer(model)
    layer.load(model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (12,), generator=gen)
    hidden = torch.randn(12, model.shape.hidden_size, generator=gen)
    cache = MtpCache(model.shape, 2, 64, torch.float32, model.device)
    # slot 1, two chunks, then one decode column: catches slot, position and chunking mistakes
    ours = torch.cat([layer(model, ids[a:b], hidden[a:b], cache, 1, a) for a, b in ((0, 7), (7, 11))])
    ours = torch.cat((ours, layer.decode(model, ids[11:], hidden[11:], cache, torch.tensor([1]), torch.tensor([11]), 12)))
    with torch.no_grad():
        theirs = ref(model.embed(ids)[None], hidden[None], torch.arange(12)[None])[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_first_drafts_do_not_depend_on_prefill_chunks(dense, tok):
    """Each chunk's last MTP column needs the next chunk's first token: chunking must not change
    what the MTP sees."""
    prompt = prompt_ids(45, seed=9)
    drafts = []
    for chunk in (1024, 16, 7):
        eng = make_engine(dense, tok, k=4, prefill_chunk=chunk)
        eng.add_request(prompt, params(max_new_tokens=3))
        while not any(o.new_token_ids for o in eng.step()):
            pass
        drafts.append(eng.speculative.drafts[0].clone())
    # the same drafts computed directly: target over the prompt, MTP over [x1..xn, first token]
    cache = dense.allocate_cache(1, 64, "bf16")
    h = dense.forward(torch.tensor(prompt), cache, 0, 0)
    first = int(dense.compute_logits(h[-1:]).argmax())
    drafter = MtpDrafter(dense, 1, 64, 4)
    out = drafter.align(0, torch.tensor(prompt[1:] + [first]), h, 0)
    direct = drafter.draft(torch.tensor([0]), out[-1:], torch.tensor([44]), 49)[0]
    for d in drafts:
        assert torch.equal(d, direct)


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_align_seeds_equal_align_rows_at_the_kept_rows(request, which):
    """The round's alignment with only the seed rows past attention (`align_seeds`): the same
    outputs as `align_rows` at those rows, and the same K/V written for every column."""
    model = request.getfixturevalue(which)
    drafter = MtpDrafter(model, 3, 64, 3)
    gen = torch.Generator().manual_seed(4)
    b, m = 2, 4
    slots = torch.tensor([2, 0]).repeat_interleave(m)
    positions = torch.tensor([10, 20])[:, None].add(torch.arange(m)).reshape(-1)
    ids = torch.randint(0, VOCAB, (b * m,), generator=gen)
    hidden = torch.randn(b * m, model.shape.hidden_size, generator=gen).to(model.dtype)
    keep = torch.tensor([1, m + 3])
    # history before the columns, so that attention has something to read
    for slot, start in ((2, 0), (0, 0)):
        drafter.align(slot, torch.randint(0, VOCAB, (start + 20,), generator=gen)[:20],
                      torch.randn(20, model.shape.hidden_size, generator=gen).to(model.dtype), 0)
    k0, v0 = drafter.cache.k.clone(), drafter.cache.v.clone()
    rows = drafter.align_rows(slots, ids, hidden, positions, 24)
    k_rows, v_rows = drafter.cache.k.clone(), drafter.cache.v.clone()
    drafter.cache.k.copy_(k0)
    drafter.cache.v.copy_(v0)
    seeds = drafter.align_seeds(slots, ids, hidden, positions, 24, keep)
    assert seeds.shape == (b, model.shape.hidden_size)
    assert torch.equal(drafter.cache.k, k_rows) and torch.equal(drafter.cache.v, v_rows)
    assert not torch.equal(k_rows, k0)
    torch.testing.assert_close(seeds, rows[keep], rtol=1e-4, atol=1e-5)


def test_rounds_draft_the_same_with_seed_rows_only(dense, tok, monkeypatch):
    """A round's alignment with o_proj and the MLP on the seed columns only (the default) drafts
    what the alignment over every column did (NINFER_MTP_SEED_ROWS=0): same tokens, same
    acceptance, same drafts left for the next round."""
    prompts = [prompt_ids(n, seed=n) for n in (19, 33)]
    got = {}
    for mode in ("1", "0"):
        monkeypatch.setenv("NINFER_MTP_SEED_ROWS", mode)
        eng = make_engine(dense, tok, k=3, max_batch=2)
        ids = [eng.add_request(p, params(max_new_tokens=14)) for p in prompts]
        out, stats = {i: [] for i in ids}, {}
        while eng.has_unfinished():
            for o in eng.step():
                out[o.request_id] += o.new_token_ids
                if o.finished:
                    stats[o.request_id] = o.stats["spec"]
        got[mode] = ([out[i] for i in ids], [stats[i] for i in ids], eng.speculative.drafts.clone())
    assert got["1"][0] == got["0"][0]
    assert got["1"][1] == got["0"][1]
    assert torch.equal(got["1"][2], got["0"][2])


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_the_layer_merges_its_projections_once_loaded(request, which, monkeypatch):
    """After load, the attention's q|gate, k, v are one linear and (dense) gate | up one, as in the
    target's layers: the drafter's merged shapes are what its tuned GEMV entries are for.
    NINFER_MTP_FUSE=0 keeps them apart."""
    from ninfer.linear import live

    model = request.getfixturevalue(which)
    for fuse in ("0", "1"):
        monkeypatch.setenv("NINFER_MTP_FUSE", fuse)
        layer = MtpLayer(model)
        attn = layer.layers[0].mixer
        assert live(attn.qkv_proj) is None
        layer.load(model)
        merged = live(attn.qkv_proj) is not None or live(attn.qv_proj) is not None
        assert merged == (fuse == "1")
        if which == "dense":
            assert (live(layer.layers[0].mlp.gate_up) is not None) == (fuse == "1")
