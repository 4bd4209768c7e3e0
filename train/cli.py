"""What every entry script does after Hydra composed its config: type-check, set up logging, run the shared
loop, and turn the project's own errors into one clear line (exit code 2) instead of a traceback wall."""

from __future__ import annotations

import logging
import os
import sys

from omegaconf import DictConfig, OmegaConf

from headstart.data import DataError
from headstart.models.backbone import BackboneError
from headstart.train.config import to_job

USER_ERRORS = (BackboneError, DataError, ValueError, FileNotFoundError)


def run_job(cfg: DictConfig) -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.getLogger("headstart").setLevel(logging.INFO if rank == 0 else logging.WARNING)
    try:
        job = to_job(cfg)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        from headstart.train.loop import train

        final = train(job, resolved)
    except USER_ERRORS as e:
        if os.environ.get("HEADSTART_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if rank == 0:
        print(f"drafter written to {final}")
