"""Where a DistillSpec draft starts: pruned copies hold exactly the chosen target layers, bad layer ids and
foreign tokenizers fail before training naming the culprit, and a checkpoint rebuilds from its folder alone."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import tiny_backbone
from safetensors.torch import load_file

from headstart.models.backbone import BackboneConfig
from headstart.models.checkpoint import build_drafter, load_drafter, save_drafter
from headstart.models.distill import DistillConfig
from headstart.models.distill_init import check_same_tokenizer, evenly_spaced
from headstart.models.tiny import _tokenizer_json, tiny_tokenizer

TINY4 = dict(num_hidden_layers=4, initializer_range=0.2)


def layer_params(model, i: int) -> dict[str, torch.Tensor]:
    return dict(model.model.layers[i].named_parameters())


def test_pruned_draft_copies_the_chosen_layers_embeddings_and_head():
    target = tiny_backbone(**TINY4)
    drafter = build_drafter("distillspec", DistillConfig(keep_layers=[0, 2, 3]), target)
    draft, tgt = drafter.draft, target.model
    assert draft.config.num_hidden_layers == 3 and draft.dtype == torch.float32
    for i, j in enumerate([0, 2, 3]):
        mine, theirs = layer_params(draft, i), layer_params(tgt, j)
        assert mine.keys() == theirs.keys()
        for name in mine:
            torch.testing.assert_close(mine[name], theirs[name], msg=f"draft layer {i} {name} != target {j}")
            assert mine[name].data_ptr() != theirs[name].data_ptr(), "a copy, not the target's own tensor"
        assert draft.model.layers[i].self_attn.layer_idx == i  # renumbered for the KV cache
    torch.testing.assert_close(draft.model.embed_tokens.weight, tgt.model.embed_tokens.weight)
    torch.testing.assert_close(draft.model.norm.weight, tgt.model.norm.weight)
    torch.testing.assert_close(draft.lm_head.weight, tgt.lm_head.weight)
    # distinct layers are distinct tensors (never `[layer] * n`)
    ptrs = {p.data_ptr() for i in range(3) for p in layer_params(draft, i).values()}
    assert len(ptrs) == 3 * len(layer_params(draft, 0))
    assert all(p.requires_grad for p in draft.parameters()) and draft.training


def test_keeping_every_layer_reproduces_the_target_logits():
    target = tiny_backbone(**TINY4)
    draft = build_drafter("distillspec", DistillConfig(keep_layers=[0, 1, 2, 3]), target).draft
    ids = torch.randint(0, target.vocab_size, (2, 9))
    torch.testing.assert_close(draft(ids).logits, target.model(ids).logits)


def test_default_keeps_evenly_spaced_layers_first_and_last():
    assert evenly_spaced(30, 6) == [0, 6, 12, 17, 23, 29] and evenly_spaced(30, 1) == [0]
    target = tiny_backbone(**TINY4)
    draft = build_drafter("distillspec", DistillConfig(num_layers=2), target).draft
    torch.testing.assert_close(
        layer_params(draft, 1)["mlp.up_proj.weight"], layer_params(target.model, 3)["mlp.up_proj.weight"]
    )


@pytest.mark.parametrize("cfg,match", [
    (DistillConfig(keep_layers=[0, 5]), r"layer 5 is outside the target's 4 layers \(0..3\)"),
    (DistillConfig(num_layers=9), "num_layers=9 but the target has only 4 layers"),
])  # fmt: skip
def test_bad_layer_choices_fail_at_build_time(cfg, match):
    with pytest.raises(ValueError, match=match):
        build_drafter("distillspec", cfg, tiny_backbone(**TINY4))


def test_fresh_draft_has_the_target_width_and_its_own_layers():
    target = tiny_backbone(**TINY4)
    draft = build_drafter("distillspec", DistillConfig(init="fresh", num_layers=1), target).draft
    assert draft.config.num_hidden_layers == 1 and draft.config.hidden_size == target.hidden_size
    assert not torch.equal(
        layer_params(draft, 0)["mlp.up_proj.weight"], layer_params(target.model, 0)["mlp.up_proj.weight"]
    )


def _swapped_tokenizer():
    """The tiny tokenizer with the ids of bytes 'a' and 'b' swapped."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(_tokenizer_json())
    vocab = spec["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    return tok, min(vocab["a"], vocab["b"])


def test_tokenizer_mismatch_names_the_first_differing_token():
    check_same_tokenizer(tiny_tokenizer(), tiny_tokenizer(), "same")  # identical: no error
    swapped, first = _swapped_tokenizer()
    token = "a" if tiny_tokenizer().get_vocab()["a"] == first else "b"
    with pytest.raises(ValueError, match=f"first mismatch is token '{token}', id {first} in the target"):
        check_same_tokenizer(tiny_tokenizer(), swapped, "swapped")
    extra = tiny_tokenizer()
    extra.add_tokens(["<draft_only>"])
    with pytest.raises(ValueError, match="'<draft_only>' .*exists only in the draft"):
        check_same_tokenizer(tiny_tokenizer(), extra, "extra")
    other_eos = tiny_tokenizer()
    other_eos.eos_token = "<|endoftext|>"
    with pytest.raises(
        ValueError, match=re.escape("eos token is '<|im_end|>' (id 258) in the target but '<|endoftext|>'")
    ):
        check_same_tokenizer(tiny_tokenizer(), other_eos, "eos")


def test_pretrained_draft_from_a_folder_checks_its_tokenizer(tmp_path):
    small = tiny_backbone(seed=5, num_hidden_layers=1)
    small.model.save_pretrained(tmp_path / "good")
    small.tokenizer.save_pretrained(tmp_path / "good")
    target = tiny_backbone()
    drafter = build_drafter(
        "distillspec", DistillConfig(init="pretrained", draft_path=str(tmp_path / "good")), target
    )
    torch.testing.assert_close(
        drafter.draft.model.layers[0].mlp.up_proj.weight, small.model.model.layers[0].mlp.up_proj.weight
    )
    assert all(p.requires_grad for p in drafter.draft.parameters())

    small.model.save_pretrained(tmp_path / "bad")
    _swapped_tokenizer()[0].save_pretrained(tmp_path / "bad")
    with pytest.raises(ValueError, match="first mismatch is token"):
        build_drafter(
            "distillspec", DistillConfig(init="pretrained", draft_path=str(tmp_path / "bad")), target
        )


def test_checkpoint_round_trip_rebuilds_from_the_folder_with_tied_weights(tmp_path):
    target = tiny_backbone(**TINY4)
    cfg = DistillConfig(keep_layers=[1, 3], divergence="tvd")
    drafter = build_drafter("distillspec", cfg, target)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.01 * torch.randn_like(p))
    bb_cfg = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0, **TINY4})
    save_drafter(tmp_path / "ckpt", drafter, "distillspec", cfg, bb_cfg, target, extra={"step": 3})
    meta = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert meta["draft_config"]["num_hidden_layers"] == 2 and meta["method_config"]["keep_layers"] == [1, 3]
    assert meta["tied_keys"] == {"draft.lm_head.weight": "draft.model.embed_tokens.weight"}
    state = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert all(k.startswith("draft.") for k in state) and "draft.lm_head.weight" not in state

    loaded, _ = load_drafter(tmp_path / "ckpt", target)
    assert loaded.draft.lm_head.weight is loaded.draft.model.embed_tokens.weight  # still tied
    for (k, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)
    ids = torch.randint(0, target.vocab_size, (1, 7))
    torch.testing.assert_close(loaded.draft(ids).logits, drafter.draft(ids).logits)


def test_freeze_embeddings_leaves_only_the_layers_trainable():
    drafter = build_drafter(
        "distillspec", DistillConfig(keep_layers=[0], freeze_embeddings=True), tiny_backbone()
    )
    frozen = {n for n, p in drafter.named_parameters() if not p.requires_grad}
    assert frozen == {"draft.model.embed_tokens.weight"}  # lm_head is the same (tied) tensor
