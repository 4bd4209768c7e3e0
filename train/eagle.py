"""Train an EAGLE drafter on a frozen backbone: EAGLE-1/2 by default, EAGLE-3 with `method=eagle3`.

accelerate launch train/eagle.py backbone=smollm2-135m data=sharegpt
accelerate launch train/eagle.py method=eagle3 method.ttt_steps=7 method.draft_vocab_size=32000
python train/eagle.py backbone=tiny debug=smoke            # one CPU process, seconds
"""

import hydra
from omegaconf import DictConfig

from headstart.train.cli import run_job
from headstart.train.config import register_configs

register_configs()


@hydra.main(config_path="../conf", config_name="eagle", version_base=None)
def main(cfg: DictConfig) -> None:
    run_job(cfg, entry="eagle")


if __name__ == "__main__":
    main()
