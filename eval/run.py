"""Evaluate drafter checkpoints: measured speedup vs vanilla, tau, acceptance by draft position, per category.

    python eval/run.py checkpoint=runs/<run>/drafter out_dir=runs/<run>/eval [prompts=FILE] [limit_per_category=N]
    python eval/run.py checkpoint=runs/<run> out_dir=...      # every checkpoint in the run, best one marked
    python eval/run.py checkpoint=runs/<distillspec run>/drafter   # method `draft`, the distilled LM as draft

The stage itself is eval/stage/evaluate.py; this script composes the config and reports user errors in one line.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from headstart.errors import exit_on_user_error
from headstart.eval.stage.config import register_configs, to_eval_config
from headstart.eval.stage.evaluate import resolve_device, run
from headstart.eval.timing.openmp import spin_when_idle

register_configs()


@hydra.main(config_path="conf", config_name="eval", version_base=None)
def main(dcfg: DictConfig) -> None:
    with exit_on_user_error():
        cfg = to_eval_config(dcfg)
        cfg.out_dir = (
            HydraConfig.get().runtime.output_dir
        )  # the folder Hydra already made, ${now:} resolved once
        given = any(a.startswith("out_dir=") for a in sys.argv[1:])  # a re-executed run keeps its folder
        spin_when_idle(resolve_device(cfg.device), () if given else [f"out_dir={cfg.out_dir}"])
        run(cfg)


if __name__ == "__main__":
    main()
