"""What differs between drafter methods inside the shared loop: how one micro-batch becomes a summed loss.

Each entry maps a method name to `step(backbone, drafter, batch) -> (loss_sum, count, metrics)`, where
`drafter` is the (possibly DDP/FSDP-wrapped) module and must be *called* (not its methods) so the wrapper can
hook in; `count` is the number of targets the loss is summed over (the loop normalizes by its global sum), and
metrics are summed tensors (see train/metrics.py). The drafter modules themselves are built by
`headstart.models.checkpoint.build_drafter`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def medusa_step(backbone, drafter, batch: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    hidden, _ = backbone(batch["input_ids"], batch["attention_mask"])  # (B, T, H), no grad
    return drafter(hidden, batch["labels"])


STEPS: dict[str, Callable] = {"medusa": medusa_step}
