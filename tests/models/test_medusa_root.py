"""Medusa heads that read the root token (`method.root_token`): fresh ones are Medusa's, the loss feeds head k at
position t the token t+1 (the root the decoder gives it), a checkpoint round-trips and decodes losslessly, and
the vLLM export names the architecture headstart's plugin registers (the Medusa repo's layout refuses them)."""

import json

import pytest
import torch
import torch.nn.functional as F

from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.proposers.medusa import MedusaOptions
from headstart.models.backbone import BackboneConfig
from headstart.models.checkpoint import build_drafter, save_drafter
from headstart.models.export.medusa import ROOT_ARCH, read_layout, write_layout
from headstart.models.medusa import MedusaConfig
from headstart.train.steps import medusa_step
from helpers.heads import perturbed_heads

TEXTS = ["the cat sat on the mat. the cat sat on the", "1, 2, 3, 4, 5, 6, 7,", "Once upon a time, there was"]


def root_heads(backbone, num_heads=3, scale=0.0):
    return perturbed_heads(backbone, num_heads, scale, root_token=True)


def test_fresh_root_heads_are_medusa_heads(backbone):
    plain = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    heads = root_heads(backbone, 2)
    assert sum(p.numel() for p in heads.parameters()) - sum(p.numel() for p in plain.parameters()) == (
        backbone.hidden_size**2
    )
    ids = torch.randint(0, backbone.vocab_size, (2, 7))
    hidden, _ = backbone(ids)
    root = torch.randint(0, backbone.vocab_size, (2, 7))
    torch.testing.assert_close(heads(hidden, root=root), plain(hidden))
    with pytest.raises(RuntimeError, match="root token"):
        heads(hidden)


def test_root_changes_the_draft_once_trained(backbone):
    heads = root_heads(backbone, 1, scale=0.5)
    hidden = torch.randn(backbone.hidden_size)
    a, b = (heads(hidden, root=torch.tensor(t)) for t in (3, 4))
    assert not torch.allclose(a, b)


def test_loss_reads_token_t_plus_1_at_position_t(backbone):
    torch.manual_seed(1)
    heads = root_heads(backbone, 3, scale=0.3)
    heads.cfg.decay, heads.cfg.loss_chunk = 0.5, 5
    ids = torch.randint(0, backbone.vocab_size, (2, 12))
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt
    labels[1, 9:] = -100  # padding
    hidden, _ = backbone(ids)
    loss, count, _ = heads(hidden, labels, input_ids=ids)

    logits = heads(hidden[:, :-1], root=ids[:, 1:])  # (K, B, T-1, V): position t reads root t+1
    ref = 0.0
    for k in range(3):
        target = labels[:, k + 2 :]
        lg = logits[k][:, : target.shape[1]]
        ce = F.cross_entropy(
            lg.reshape(-1, lg.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum"
        )
        ref = ref + 0.5**k * ce
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-4)
    assert count.item() == (labels[:, 2:] != -100).sum().item()


def test_training_step_passes_the_input_ids_and_reaches_the_projection(backbone):
    heads = root_heads(backbone, 2)
    ids = torch.randint(0, backbone.vocab_size, (2, 10))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    loss, count, _ = medusa_step(backbone, heads, batch)
    loss.backward()
    assert count.item() == 2 * 8
    assert heads.root_proj.weight.grad.abs().sum() > 0


def test_checkpoint_round_trips_and_decodes_losslessly(backbone, tmp_path):
    heads = root_heads(backbone, 2, scale=0.3)
    cfg = MedusaConfig(num_heads=2, root_token=True)
    save_drafter(
        tmp_path / "ck",
        heads,
        "medusa",
        cfg,
        BackboneConfig(name="tiny", path="tiny", dtype="float32"),
        backbone,
    )
    dec = build_decoder("medusa", backbone, str(tmp_path / "ck"), tree_nodes=4)
    torch.testing.assert_close(dec.proposer.heads.root_proj.weight, heads.root_proj.weight)
    vanilla = Decoder(backbone)
    for text in TEXTS:
        prompt = backbone.tokenizer(text)["input_ids"]
        want = vanilla.generate(prompt, 24).tokens
        assert dec.generate(prompt, 24).tokens == want
        hybrid = Decoder(backbone, MedusaOptions(heads, tree="chain"), lookup_tokens=3)
        assert hybrid.generate(prompt, 24).tokens == want


def test_the_repo_layout_refuses_root_heads_in_one_line(backbone, tmp_path):
    with pytest.raises(ValueError, match="root_token") as e:
        write_layout(root_heads(backbone, 2), "medusa", tmp_path / "medusa", "org/model")
    assert "\n" not in str(e.value) and not (tmp_path / "medusa").exists()


def test_the_vllm_layout_names_the_plugins_architecture_and_round_trips(backbone, tmp_path):
    heads = root_heads(backbone, 2, scale=0.3)
    folder = write_layout(heads, "vllm", tmp_path / "vllm", "org/model")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == [
        ROOT_ARCH
    ]  # a vLLM without the plugin refuses it, never drops the weight
    back = read_layout(folder)
    torch.testing.assert_close(back.root_proj.weight, heads.root_proj.weight)
    prompt = backbone.tokenizer(TEXTS[0])["input_ids"]
    want = Decoder(backbone, MedusaOptions(heads, tree="chain")).generate(prompt, 24).stats.accepted_per_step
    got = Decoder(backbone, MedusaOptions(back, tree="chain")).generate(prompt, 24).stats.accepted_per_step
    assert got == want
