"""DistillSpec's data modes: the mixture coin is seeded by (seed, step), generated responses become the distilled
positions, batched left-padded generation equals one-prompt-at-a-time generation, and a training step moves
only the draft."""

from __future__ import annotations

import torch
from conftest import tiny_backbone

from headstart.data import collate
from headstart.data.chat import IGNORE
from headstart.models import registry
from headstart.models.checkpoint import build_drafter
from headstart.models.distill import DistillConfig
from headstart.train.distill_data import distill_batch, pick_mode, prompts_of


def chat_batch(tok, questions: list[str], answers: list[str]) -> dict:
    items = []
    for i, (q, a) in enumerate(zip(questions, answers)):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        r = tok(a + "<|im_end|>", add_special_tokens=False)["input_ids"]
        items.append(
            {"input_ids": torch.tensor(p + r), "labels": torch.tensor([IGNORE] * len(p) + r), "row_id": i}
        )
    return collate(items, pad_id=tok.pad_token_id)


def test_mixture_coin_is_seeded_by_seed_and_step_with_probability_lambda():
    draws = [pick_mode("mixture", 0.3, seed=1, step=s, training=True) for s in range(2000)]
    assert draws == [pick_mode("mixture", 0.3, seed=1, step=s, training=True) for s in range(2000)]
    assert abs(draws.count("student") / 2000 - 0.3) < 0.04
    assert draws != [pick_mode("mixture", 0.3, seed=2, step=s, training=True) for s in range(2000)]
    assert {pick_mode("mixture", 0.0, 0, s, True) for s in range(50)} == {"fixed"}
    assert {pick_mode("mixture", 1.0, 0, s, True) for s in range(50)} == {"student"}
    # held-out batches are always fixed data
    assert pick_mode("student", 0.5, 0, 0, training=False) == "fixed"


def test_prompt_is_everything_before_the_first_label():
    tok = tiny_backbone().tokenizer
    batch = chat_batch(tok, ["hi", "a longer question"], ["yes", "no"])
    prompts = prompts_of(batch)
    for row, p in enumerate(prompts):
        first = int((batch["labels"][row] != IGNORE).nonzero()[0])
        assert p == batch["input_ids"][row, :first].tolist()
        assert tok.decode(p).endswith("<|im_start|>assistant\n")


def test_student_mode_distills_the_drafts_own_greedy_responses():
    target = tiny_backbone(initializer_range=0.2)
    cfg = DistillConfig(keep_layers=[0], data_mode="student", gen_max_new_tokens=12, gen_temperature=0.0)
    drafter = build_drafter("distillspec", cfg, target)
    batch = chat_batch(target.tokenizer, ["hi", "a much longer question here"], ["yes", "no"])
    out = distill_batch(target, drafter, {**batch, "step": 3}, cfg)
    prompts = prompts_of(batch)
    for row, p in enumerate(prompts):
        n = int(out["attention_mask"][row].sum())
        ids, labels = out["input_ids"][row, :n].tolist(), out["labels"][row, :n]
        assert ids[: len(p)] == p and (labels[: len(p)] == IGNORE).all()
        response = ids[len(p) :]
        assert labels[len(p) :].tolist() == response and 1 <= len(response) <= 12
        # one prompt alone, no padding: batched left-padded generation must give the same greedy tokens
        alone = drafter.draft.generate(torch.tensor([p]), max_new_tokens=len(response), do_sample=False,
                                       pad_token_id=target.tokenizer.pad_token_id, eos_token_id=[258])  # fmt: skip
        assert alone[0, len(p) :].tolist() == response
    assert drafter.training, "generation restores train mode"


def test_teacher_mode_samples_from_the_target_reproducibly_per_step():
    target = tiny_backbone(initializer_range=0.2)
    cfg = DistillConfig(keep_layers=[0], data_mode="teacher", gen_max_new_tokens=8, gen_temperature=1.0)
    drafter = build_drafter("distillspec", cfg, target)
    batch = chat_batch(target.tokenizer, ["hi", "there"], ["yes", "no"])
    a = distill_batch(target, drafter, {**batch, "step": 5}, cfg)
    b = distill_batch(target, drafter, {**batch, "step": 5}, cfg)
    c = distill_batch(target, drafter, {**batch, "step": 6}, cfg)
    assert torch.equal(a["input_ids"], b["input_ids"]) and not torch.equal(a["input_ids"], c["input_ids"])
    drafter.eval()
    assert distill_batch(target, drafter, batch, cfg) is batch  # eval: the data set's own responses


def test_a_training_step_moves_the_draft_and_never_the_target():
    target = tiny_backbone(initializer_range=0.2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    cfg = DistillConfig(keep_layers=[0], data_mode="mixture", lambda_=0.5, gen_max_new_tokens=6)
    drafter = build_drafter("distillspec", cfg, target)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-2)
    batch = chat_batch(target.tokenizer, ["hi", "there"], ["yes yes", "no no no"])
    draft_before = drafter.draft.model.layers[0].mlp.up_proj.weight.clone()
    for step in range(3):
        loss, count, metrics = registry.get("distillspec").step_fn()(target, drafter, {**batch, "step": step})
        (loss / count).backward()
        opt.step()
        opt.zero_grad()
        assert 0 <= metrics["accept_sim_sum"] <= count and 0 <= metrics["top1_match_sum"] <= count
    assert all(p.grad is None and not p.requires_grad for p in target.parameters())
    for k, v in target.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not torch.equal(drafter.draft.model.layers[0].mlp.up_proj.weight, draft_before)
