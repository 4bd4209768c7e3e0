"""Train Medusa-1 heads on a frozen backbone.

accelerate launch train/medusa.py backbone=smollm2-135m data=sharegpt method.num_heads=5
python train/medusa.py backbone=tiny debug=smoke          # one CPU process, about a minute
"""

import hydra
from omegaconf import DictConfig

from headstart.train.cli import run_job
from headstart.train.config import register_configs

register_configs()


@hydra.main(config_path="../conf", config_name="medusa", version_base=None)
def main(cfg: DictConfig) -> None:
    run_job(cfg, entry="medusa")


if __name__ == "__main__":
    main()
