import pytest
import torch
import torch.nn.functional as F

from headstart.models.checkpoint import build_drafter
from headstart.models.medusa import MedusaConfig, MedusaHeads


def test_heads_and_blocks_are_distinct_tensors(backbone):
    heads = build_drafter("medusa", MedusaConfig(num_heads=3, num_layers=2), backbone)
    ptrs = [p.data_ptr() for p in heads.parameters()]
    assert len(ptrs) == len(set(ptrs)), "two heads/blocks share storage (the `[ResBlock(h)] * n` bug)"
    assert len(heads.blocks) == 3 and all(len(b) == 2 for b in heads.blocks)
    # training one head leaves the others untouched
    with torch.no_grad():
        heads.blocks[0][0].linear.weight.add_(1.0)
    assert heads.blocks[1][0].linear.weight.abs().sum() == 0


@pytest.mark.parametrize("share", [False, True])
def test_fresh_heads_reproduce_backbone_distribution(backbone, share):
    heads = build_drafter("medusa", MedusaConfig(num_heads=2, share_lm_head=share), backbone)
    ids = torch.randint(0, backbone.vocab_size, (2, 7))
    hidden, _ = backbone(ids)
    logits = heads(hidden)  # (K, B, T, V)
    ref = backbone.model(ids).logits
    for k in range(2):
        torch.testing.assert_close(logits[k], ref, rtol=1e-4, atol=1e-4)


def test_shared_lm_head_saves_parameters(backbone):
    own = build_drafter("medusa", MedusaConfig(num_heads=3), backbone)
    shared = build_drafter("medusa", MedusaConfig(num_heads=3, share_lm_head=True), backbone)
    diff = sum(p.numel() for p in own.parameters()) - sum(p.numel() for p in shared.parameters())
    assert diff == 3 * backbone.vocab_size * backbone.hidden_size
    assert not any("lm_head" in k for k in shared.state_dict())


def test_loss_matches_reference_with_offsets_and_decay(backbone):
    torch.manual_seed(1)
    cfg = MedusaConfig(num_heads=3, decay=0.5, loss_chunk=5)
    heads = build_drafter("medusa", cfg, backbone)
    for p in heads.parameters():  # move away from the identity init so heads differ
        p.data.add_(0.01 * torch.randn_like(p))
    ids = torch.randint(0, backbone.vocab_size, (2, 12))
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt
    labels[1, 9:] = -100  # padding
    hidden, _ = backbone(ids)
    loss, count, metrics = heads.loss(hidden, labels)

    ref = 0.0
    logits = heads(hidden)  # (K, B, T, V)
    for k in range(3):
        tgt = labels[:, k + 2 :]
        lg = logits[k][:, : -(k + 2)]
        ce = F.cross_entropy(
            lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), ignore_index=-100, reduction="sum"
        )
        ref = ref + 0.5**k * ce
        assert metrics[f"head{k}/n"].item() == (tgt != -100).sum().item()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-4)
    assert count.item() == (labels[:, 2:] != -100).sum().item()


def test_config_range_checks():
    with pytest.raises(ValueError, match="num_heads"):
        MedusaConfig(num_heads=0)
    with pytest.raises(ValueError, match="decay"):
        MedusaConfig(decay=0.0)


def test_heads_module_has_no_backbone_state(backbone):
    heads = MedusaHeads(
        MedusaConfig(num_heads=1, share_lm_head=True), backbone.hidden_size, backbone.vocab_size
    )
    assert list(heads.state_dict()) == ["blocks.0.0.linear.weight", "blocks.0.0.linear.bias"]


@pytest.mark.parametrize("share", [False, True])
def test_fp32_heads_on_a_bf16_backbone_decode_and_train_without_autocast(share):
    from headstart.models.backbone import BackboneConfig, load_backbone

    bb = load_backbone(BackboneConfig(name="tiny", path="tiny", dtype="bfloat16"))
    heads = build_drafter("medusa", MedusaConfig(num_heads=2, share_lm_head=share), bb)
    assert heads.blocks_dtype == torch.float32  # fp32 master weights, whatever the backbone dtype
    ids = torch.randint(0, bb.vocab_size, (1, 6))
    hidden, _ = bb(ids)
    assert heads(hidden).shape == (2, 1, 6, bb.vocab_size)
    loss, count, _ = heads(hidden, ids)
    loss.backward()
    assert heads.blocks[0][0].linear.weight.grad is not None
