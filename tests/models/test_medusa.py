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


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("mix", [(1.0, 0.0), (0.5, 2.0)])
def test_soft_targets_are_the_backbones_distribution_at_t_plus_k_plus_1(backbone, share, mix):
    """Head k's row t trains on softmax(lm_head(h_{t+k+1})) (the backbone's own distribution for token
    t+k+2), under the CE / LK mix, on the rows whose token t+k+2 is labelled."""
    from headstart.models.losses import LossMix, mixed_loss

    torch.manual_seed(2)
    cfg = MedusaConfig(num_heads=3, decay=0.5, loss_chunk=5, share_lm_head=share, soft_targets=True)
    cfg.ce_weight, cfg.lk_weight = mix
    heads = build_drafter("medusa", cfg, backbone)
    for p in heads.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    ids = torch.randint(0, backbone.vocab_size, (2, 12))
    labels = ids.clone()
    labels[0, :4] = -100
    labels[1, 9:] = -100
    hidden, _ = backbone(ids)
    loss, count, metrics = heads.loss(hidden, labels)

    teacher = torch.softmax(backbone.model(ids).logits, -1)  # (B, T, V): position j predicts token j+1
    logits = heads(hidden)
    ref = 0.0
    for k in range(3):
        s = k + 2
        rows = labels[:, s:] != -100
        lg, p = logits[k][:, :-s][rows], teacher[:, s - 1 : -1][rows]
        ref = ref + 0.5**k * mixed_loss(lg, p, LossMix(*mix)).sum()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-4)
    assert count.item() == (labels[:, 2:] != -100).sum().item()


def test_soft_targets_of_fresh_heads_leave_only_the_shift(backbone):
    """A fresh head is the backbone's lm_head: its soft CE at q == p would be the entropy, so the loss is the
    cross-entropy between neighbouring positions' distributions, never below the soft targets' entropy."""
    from headstart.models.losses import soft_cross_entropy

    bb = backbone
    heads = build_drafter("medusa", MedusaConfig(num_heads=1, soft_targets=True), bb)
    ids = torch.randint(0, bb.vocab_size, (1, 9))
    hidden, _ = bb(ids)
    loss, _, _ = heads.loss(hidden, ids.clone())
    logits = bb.model(ids).logits[0]  # (T, V)
    p = torch.softmax(logits[1:-1], -1)  # head 0's targets: positions 1..T-2
    torch.testing.assert_close(loss, soft_cross_entropy(logits[:-2], p).sum(), rtol=1e-5, atol=1e-4)
    assert loss >= soft_cross_entropy(logits[1:-1], p).sum() - 1e-4  # Gibbs: H(p, q) >= H(p)


def test_loss_weights_are_checked():
    with pytest.raises(ValueError, match="lk_weight"):
        MedusaConfig(ce_weight=0.0, lk_weight=0.0)
