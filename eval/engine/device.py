"""Device helpers shared by everything that reads a clock around GPU work."""

from __future__ import annotations

import torch


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so a wall-clock reading covers it (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
