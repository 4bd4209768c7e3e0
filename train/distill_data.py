"""DistillSpec's data modes, as a transform of one training batch before the loss (GKD, Agarwal et al. 2024,
Alg. 1; DistillSpec, Zhou et al. 2024, Sec. 3):

- `fixed`: the data set's sequences; the assistant-labelled tokens are the distilled positions;
- `teacher`: the frozen target answers each row's prompt (sequence-level KD on fresh samples);
- `student`: the draft answers each row's prompt (on-policy: the states the draft will visit at serving time);
- `mixture`: per batch, student-generated with probability lambda, else fixed.

A row's prompt is its tokens before the first labelled one (for multi-turn rows: the first user turn). Responses
come from one batched, left-padded `generate`, then are re-packed right-padded in the data set's format, so the
loss code does not know where a batch came from. The mixture coin and the sampled responses are seeded from
(seed, step), so a resumed run draws exactly what an uninterrupted one would. Held-out batches (eval mode) are
always `fixed`, so eval metrics stay comparable across steps and data modes.
"""

from __future__ import annotations

import torch

from headstart.data import collate
from headstart.data.chat import IGNORE
from headstart.models.backbone import eos_token_ids, generate_batch


def _mix(*parts: int) -> int:
    seed = 0
    for p in parts:
        seed = (seed * 1_000_003 + int(p)) % (2**63 - 1)
    return seed


def pick_mode(data_mode: str, lambda_: float, seed: int, step: int, training: bool) -> str:
    """The data mode of one batch: `mixture` resolves to student / fixed by a coin seeded from (seed, step)."""
    if not training:
        return "fixed"
    if data_mode != "mixture":
        return data_mode
    coin = torch.Generator().manual_seed(_mix(seed, step))
    return "student" if torch.rand((), generator=coin).item() < lambda_ else "fixed"


def prompts_of(batch: dict) -> list[list[int]]:
    """Each row's tokens before its first labelled token (at least one token)."""
    out = []
    for ids, labels, mask in zip(batch["input_ids"], batch["labels"], batch["attention_mask"]):
        labelled = (labels != IGNORE).nonzero()
        end = int(labelled[0]) if len(labelled) else int(mask.sum())
        out.append(ids[: max(end, 1)].tolist())
    return out


def generate_responses(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    pad_id: int,
    stops: list[int],
    seed: int,
) -> list[list[int]]:
    """Batched seeded generation; each row's new tokens up to and including its first stop token."""
    responses = []
    for new in generate_batch(model, prompts, max_new_tokens, temperature, pad_id, stops, seed):
        cut = next((i + 1 for i, t in enumerate(new) if t in stops), len(new))
        responses.append(new[:cut])
    return responses


def distill_batch(backbone, drafter, batch: dict, cfg) -> dict:
    """The batch the loss sees: the data set's (fixed) or one whose responses were just generated."""
    step = int(batch.get("step", 0))
    mode = pick_mode(cfg.data_mode, cfg.lambda_, cfg.seed, step, drafter.training)
    if mode == "fixed":
        return batch
    # through the DDP wrapper's .module: generation is no_grad and needs no gradient sync (not FSDP / ZeRO-3)
    model = backbone.model if mode == "teacher" else getattr(drafter, "module", drafter).draft
    tok = backbone.tokenizer
    prompts = prompts_of(batch)
    seed = _mix(cfg.seed, step, int(batch["row_ids"][0]))  # ranks and micro-batches sample differently
    responses = generate_responses(
        model,
        prompts,
        cfg.gen_max_new_tokens,
        cfg.gen_temperature,
        tok.pad_token_id,
        eos_token_ids(tok, backbone.model),
        seed,
    )
    items = [
        {
            "input_ids": torch.tensor(p + r),
            "labels": torch.tensor([IGNORE] * len(p) + r),
            "row_id": int(row),
        }
        for p, r, row in zip(prompts, responses, batch["row_ids"])
    ]
    out = collate(items, pad_id=tok.pad_token_id)
    return {k: v.to(batch["input_ids"].device) for k, v in out.items()}
