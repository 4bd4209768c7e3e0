"""What every entry script does after Hydra composed its config: type-check, set up logging, run the shared
loop, and turn the project's own errors into one clear line (exit code 2) instead of a traceback wall."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

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
        tag = sweep_tag()
        if tag:  # a multirun job: its own run dir under the shared one (else job 2 would resume job 1)
            job.run_dir = resolved["run_dir"] = f"{job.run_dir}/{tag}"
        from headstart.train.loop import train

        try:
            final = train(job, resolved)
        except KeyboardInterrupt:
            stopped(job.run_dir, rank)
    if rank == 0:
        print(f"drafter written to {final}")


def stopped(run_dir: str, rank: int) -> None:
    """Ctrl-C: one line naming the checkpoint a rerun resumes from (instead of ~80 lines of traceback)."""
    from tqdm.auto import tqdm

    from headstart.train.checkpoints import checkpoint_dirs

    for bar in list(getattr(tqdm, "_instances", [])):  # drawn now, not after this line at exit
        bar.close()
    if rank == 0:
        done = checkpoint_dirs(Path(run_dir))
        where = f"the last checkpoint is {done[-1]}" if done else "no checkpoint was saved yet"
        print(f"stopped (Ctrl-C): {where}. Fix: rerun the same command to resume from it", file=sys.stderr)
    sys.exit(130)  # 128 + SIGINT, as a shell reports it


def sweep_tag() -> str:
    """In a Hydra multirun, this job's values of the swept keys (`method.num_heads=2,lr=0.001`); else ''."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return ""
    hc = HydraConfig.get()
    parser = OverridesParser.create()
    # the command line says which keys are swept; this job's task overrides hold their values
    args = [a for a in sys.argv[1:] if "=" in a and not a.startswith("-")]  # overrides, not Hydra's flags
    swept = {o.key_or_group for o in parser.parse_overrides(args) if o.is_sweep_override()}
    mine = [o for o in parser.parse_overrides(list(hc.overrides.task)) if o.key_or_group in swept]
    tag = ",".join(f"{o.key_or_group}={o.value()}" for o in mine) or f"job{hc.job.num}"
    return tag.replace("/", "_")
