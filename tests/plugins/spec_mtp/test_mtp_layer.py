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
