"""What every entry script does after Hydra composed its config: type-check, set up logging, run the shared
loop, and turn the project's own errors into one clear line (exit code 2) instead of a traceback wall."""

from __future__ import annotations

import logging
import os

from omegaconf import DictConfig, OmegaConf

from headstart.errors import exit_on_user_error
from headstart.train.config import to_job


def run_job(cfg: DictConfig, entry: str) -> None:
    """`entry`: the calling script (train/<entry>.py); a method another script trains is refused."""
    rank = int(os.environ.get("RANK", "0"))
    logging.getLogger("headstart").setLevel(logging.INFO if rank == 0 else logging.WARNING)
    with exit_on_user_error():
        job = to_job(cfg, entry)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        from headstart.train.loop import train

        final = train(job, resolved)
    if rank == 0:
        print(f"drafter written to {final}")
