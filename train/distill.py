"""Distill a small draft model toward the frozen target (DistillSpec, Zhou et al. 2024).

accelerate launch train/distill.py backbone=smollm2-135m method.init=pruned method.num_layers=6 method.divergence=tvd
python train/distill.py backbone=tiny debug=smoke method.keep_layers=[0]   # one CPU process, seconds
python train/distill.py method.data_mode=mixture method.lambda_=0.5       # on-policy half of the time (GKD)

Then: python train/export.py --checkpoint runs/<run>   (a standard HF causal-LM folder: an `assistant_model`
for transformers, a draft model for vLLM), and `python eval/bench/distill_tau.py --checkpoint runs/<run>` for tau
before vs after distillation in the built-in decoder.
"""

import hydra
from omegaconf import DictConfig

from headstart.train.cli import run_job
from headstart.train.config import register_configs

register_configs()


@hydra.main(config_path="../conf", config_name="distill", version_base=None)
def main(cfg: DictConfig) -> None:
    run_job(cfg, entry="distill")


if __name__ == "__main__":
    main()
