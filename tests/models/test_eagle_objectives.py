"""EAGLE's training options: the LK mix, GRIFFIN's mask against a hand-built reference, and the cheaper
training-time-test step (prompt rows skipped after step 0) against the full one."""

from __future__ import annotations

import pytest
import torch

from headstart.models.checkpoint import build_drafter
from headstart.models.eagle_config import Eagle3Config, EagleConfig
from headstart.models.eagle_ttt import pack_rows, teacher_targets
from headstart.models.losses import soft_cross_entropy


def _batch(t: int = 16) -> dict:
    """Two sequences: different prompt lengths, a second unlabelled turn in one, padding in the other."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 259, (2, t), generator=g)
    mask = torch.ones_like(ids)
    mask[1, t - 3 :] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, :3] = -100
    labels[0, 8:11] = -100  # a user turn in the middle
    labels[1, :7] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _run(backbone, cfg, batch, train=True, grads=True):
    torch.manual_seed(0)
    d = build_drafter("eagle3" if isinstance(cfg, Eagle3Config) else "eagle", cfg, backbone)
    d.train(train)
    final, aux = backbone(batch["input_ids"], batch["attention_mask"], layers=d.aux_layers)
    with torch.set_grad_enabled(grads):
        loss, n, metrics = d(aux if d.v3 else [final], final, batch)
    if grads:
        loss.backward()
    return d, loss.detach(), metrics, {k: p.grad for k, p in d.named_parameters() if p.grad is not None}


def _steps_in_full(backbone, d, batch, steps: int) -> list:
    """The reference for the step losses: the same unroll, every step's logits in full -> per step (known (B, T-1)
    bool: the row has a target, p (B, T-1, Dv): the teacher at position t+1+s, logits (B, T-1, Dv))."""
    ids = batch["input_ids"]
    final, aux = backbone(ids, batch["attention_mask"], layers=d.aux_layers)
    with torch.no_grad():
        g = d.fuse(aux)[:, :-1]
        valid = batch["attention_mask"][:, 1:].bool()
        t = g.shape[1]

        def shifted(x, s, fill):
            return torch.cat([x[:, 1 + s :], x.new_full((x.shape[0], s), fill)], 1)

        hs = d.unroll(g, ids[:, 1:], valid, steps, lambda s: shifted(ids, s, 0))
        teacher, _ = teacher_targets(
            final.reshape(-1, final.shape[-1]), d._frozen[1].weight[d.draft_ids()], 7, torch.float32
        )
        teacher = teacher.view(2, -1, teacher.shape[-1])  # (B, T, Dv) at every position
        out = []
        for s, h in enumerate(hs):
            known = shifted(batch["labels"], s + 1, -100) != -100
            p = torch.cat([teacher[:, 1 + s :], teacher[:, :s]], 1)[:, :t]  # (wrapped rows unused)
            out.append((known, p, d.head_input(h) @ d.lm_head.weight.T))
    return out


def test_pack_rows_by_hand():
    live = torch.tensor([[False, True, False, True], [False, False, False, True]])
    # live positions first, in order; the second sequence is padded with its first other position
    assert pack_rows(live).tolist() == [[1, 3], [3, 0]]
    # the full-layout order of a mask is kept
    rows = torch.tensor([[False, True, False, True], [False, False, False, True]])
    packed = rows.gather(1, pack_rows(live))
    x = torch.arange(8).view(2, 4)
    assert x.gather(1, pack_rows(live))[packed].tolist() == x[rows].tolist() == [1, 3, 7]


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("griffin", [False, True])
def test_skipping_prompt_rows_gives_the_same_loss_metrics_and_gradients(backbone, recompute, griffin):
    batch = _batch()
    runs = []
    for skip in (False, True):
        cfg = Eagle3Config(
            ttt_steps=4, draft_vocab_size=64, recompute=recompute, skip_prompt_rows=skip, griffin_mask=griffin
        )
        runs.append(_run(backbone, cfg, batch))
    (_, la, ma, ga), (_, lb, mb, gb) = runs
    torch.testing.assert_close(la, lb)
    for k in ma:
        torch.testing.assert_close(ma[k], mb[k])
    assert ga.keys() == gb.keys() and len(ga) > 5
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=1e-5, atol=1e-7)


def test_step_options_refuse_a_single_step():
    for option in ("griffin_mask", "skip_prompt_rows"):
        with pytest.raises(ValueError, match="ttt_steps >= 2"):
            Eagle3Config(ttt_steps=1, **{option: True})


def test_skipping_prompt_rows_runs_fewer_rows(backbone, monkeypatch):
    cfg = Eagle3Config(ttt_steps=3, draft_vocab_size=64, skip_prompt_rows=True)
    d = build_drafter("eagle3", cfg, backbone)
    seen = []
    step = d._step
    monkeypatch.setattr(d, "_step", lambda feat, *a: seen.append(feat.shape[1]) or step(feat, *a))
    batch = _batch()
    final, aux = backbone(batch["input_ids"], batch["attention_mask"], layers=d.aux_layers)
    d(aux, final, batch)
    # rows t with token t+3 or t+4 labelled (of 15): sequence 0 rows 0-4 and 7-12 (11), sequence 1 rows 3-9
    assert seen == [15, 11, 11]


def test_griffin_masks_steps_after_a_miss(backbone):
    """Reference: the same unroll, every step's logits in full, step s's rows weighted by decay**s only
    where steps 0..s-1 drafted the teacher's argmax (or had no target)."""
    batch = _batch()
    cfg = Eagle3Config(ttt_steps=3, draft_vocab_size=64, decay=0.5, griffin_mask=True, recompute=False)
    d, loss, metrics, _ = _run(backbone, cfg, batch, train=True, grads=False)
    alive, ref, masked = None, 0.0, 0
    for s, (known, p, logits) in enumerate(_steps_in_full(backbone, d, batch, 3)):
        alive = torch.ones_like(known) if alive is None else alive
        ce = soft_cross_entropy(logits[known], p[known])
        ref = ref + 0.5**s * (ce * alive[known]).sum()
        masked += int((known & ~alive).sum())
        hit = logits.argmax(-1) == p.argmax(-1)
        alive = alive & (hit | ~known)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    assert masked > 0  # a fresh drafter misses: the mask did something
    # the logged per-step sums stay unmasked (comparable across objectives)
    off = _run(
        backbone,
        Eagle3Config(ttt_steps=3, draft_vocab_size=64, decay=0.5, recompute=False),
        batch,
        grads=False,
    )
    torch.testing.assert_close(metrics["head2/loss_sum"], off[2]["head2/loss_sum"])
    assert loss < off[1]


@pytest.mark.parametrize("cls", [EagleConfig, Eagle3Config])
def test_the_lk_mix_is_linear_in_its_weights_and_bounded(backbone, cls):
    batch = _batch()
    extra = {"ttt_steps": 2, "draft_vocab_size": 64} if cls is Eagle3Config else {"w_feat": 0.0, "noise": 0.0}

    def loss(ce, lk):
        return _run(backbone, cls(ce_weight=ce, lk_weight=lk, **extra), batch, train=False, grads=False)

    _, ce, _, _ = loss(1.0, 0.0)
    _, lk, m, _ = loss(0.0, 1.0)
    _, both, _, _ = loss(2.0, 0.5)
    torch.testing.assert_close(both, 2 * ce + 0.5 * lk)
    for s in range(extra.get("ttt_steps", 1)):  # 1 - acceptance: in [0, 1] per row
        assert 0 <= m[f"head{s}/loss_sum"] <= m[f"head{s}/n"]
    with pytest.raises(ValueError, match="ce_weight"):
        cls(ce_weight=-1.0)


@pytest.mark.parametrize("griffin", [False, True])
def test_hass_adds_the_teachers_top_k_terms_to_every_step(backbone, griffin):
    """Reference: the same unroll, every step's logits in full, decay**s * (softCE + w * top-K CE) per row
    (with GRIFFIN's mask, only where the earlier steps drafted the teacher's argmax)."""
    from headstart.models.losses import top_k_loss

    batch = _batch()
    common = {
        "ttt_steps": 3,
        "draft_vocab_size": 64,
        "decay": 0.5,
        "recompute": False,
        "griffin_mask": griffin,
    }
    d, loss, metrics, _ = _run(
        backbone, Eagle3Config(hass_topk=4, hass_weight=0.6, **common), batch, grads=False
    )
    alive, ref = None, 0.0
    for s, (known, p, logits) in enumerate(_steps_in_full(backbone, d, batch, 3)):
        alive = torch.ones_like(known) if alive is None else alive
        row = soft_cross_entropy(logits[known], p[known]) + 0.6 * top_k_loss(logits[known], p[known], 4)
        ref = ref + 0.5**s * (row * (alive[known] if griffin else 1)).sum()
        hit = logits.argmax(-1) == p.argmax(-1)
        alive = alive & (hit | ~known)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    off = _run(backbone, Eagle3Config(**common), batch, grads=False)
    assert loss > off[1]  # the top-K terms add to the loss
    for s in range(3):  # what the steps rank is the teacher's argmax either way: the same histograms
        assert torch.equal(metrics[f"head{s}/rank_hist"], off[2][f"head{s}/rank_hist"])


def test_hass_on_eagle1_and_its_refusals(backbone):
    batch = _batch()
    extra = {"w_feat": 0.0, "noise": 0.0, "w_tok": 1.0}
    _, ce, _, _ = _run(backbone, EagleConfig(**extra), batch, train=False, grads=False)
    _, hass, _, grads = _run(backbone, EagleConfig(hass_topk=1, hass_weight=2.0, **extra), batch, train=False)
    assert hass > ce and grads  # trains: gradients reach the drafter
    with pytest.raises(ValueError, match="hass_topk=-1.*Fix: method.hass_topk=10"):
        Eagle3Config(hass_topk=-1)
    with pytest.raises(ValueError, match="hass_weight=0.0"):
        EagleConfig(hass_topk=10, hass_weight=0.0)
    with pytest.raises(ValueError, match="hass_topk=10 with method.lk_weight=0.5.*Fix: method.lk_weight=0"):
        Eagle3Config(hass_topk=10, lk_weight=0.5)
