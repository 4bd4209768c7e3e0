"""What the loop reports beside the loss: the banner, W&B tracking (run id kept for resume, model artifacts), tau
measured in the built-in decoder on held-out prompts, and (for checking sharding and resume) which rows each
rank consumed."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from accelerate import Accelerator

from headstart.hardware import machine_line
from headstart.logs import log_file
from headstart.tracking import LoggerConfig, log_model_artifact, training_run_kwargs
from headstart.train.config import JobConfig, TrainConfig

log = logging.getLogger("headstart.train")


def measured_tau(acc: Accelerator, t: TrainConfig, method: str, backbone, drafter, eval_ds) -> dict:
    """tau measured in the built-in decoder (greedy) on a few held-out prompts, beside the training loss: the
    number that serving sees, not a training-time proxy. Main process only; the others wait."""
    out: dict = {}
    if acc.is_main_process:
        from headstart.eval.engine.quick import quick_eval

        prompts = []
        for i in range(min(t.quick_eval_prompts, len(eval_ds))):
            item = eval_ds[i]
            first_label = int(
                (item["labels"] != -100).nonzero()[0]
            )  # the prompt ends where the answer starts
            prompts.append(item["input_ids"][:first_label].tolist())
        res = quick_eval(backbone, acc.unwrap_model(drafter), method, prompts, t.quick_eval_tokens)
        out = {"measured/tau": res["tau"]}
        out |= {f"measured/accept_pos{i}": a for i, a in enumerate(res["accept_by_position"])}
        log.info("measured tau %.3f on %d held-out prompts", res["tau"], len(prompts))
    acc.wait_for_everyone()
    return out


def banner(job: JobConfig, acc: Accelerator, machine: dict) -> None:
    """The first lines of a run: what is trained on what, where (`machine`: headstart.hardware.machine_facts),
    with how many processes (the details are in the log file). Main process only."""
    if not acc.is_main_process:
        return
    t = job.train
    lines = [
        f"headstart {job.method_name} -> {job.run_dir}",
        f"  backbone: {job.backbone.name} ({job.backbone.path}, {job.backbone.dtype})",
        f"  processes: {acc.num_processes} ({acc.distributed_type.value}, {acc.device.type}), mixed precision "
        f"{acc.mixed_precision}, batch {t.micro_batch_size} x {acc.num_processes} x {t.grad_accum}, "
        f"{t.max_steps} steps",
        f"  {machine_line(machine, job.backbone.dtype)}",
        f"  full log: {log_file() or '(none)'}",
    ]
    print("\n".join(lines), flush=True)


def data_line(job: JobConfig, acc: Accelerator, stats: dict, n_train: int, n_eval: int) -> None:
    if acc.is_main_process:
        cached = "tokenized cache" if stats.get("cache_hit") else "tokenized now"
        source = stats.get("source", job.data.source)
        print(
            f"  data: {job.data.name}: {n_train} train / {n_eval} eval samples from {source} ({cached})",
            flush=True,
        )


def trace_rows(run_dir: Path, rank: int, step: int, row_ids: torch.Tensor) -> None:
    folder = run_dir / "trace"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"rank{rank}.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "rows": row_ids.tolist()}) + "\n")


def init_tracking(
    acc: Accelerator, logger: LoggerConfig, run_dir: str, resolved: dict, resuming: bool
) -> None:
    """W&B through accelerate's tracker; a resumed run continues its W&B run (id kept in the run dir)."""
    if logger.kind != "wandb":
        return
    if logger.mode:
        os.environ["WANDB_MODE"] = logger.mode
    wandb_kw = training_run_kwargs(logger, run_dir, resuming) if acc.is_main_process else {}
    acc.init_trackers(logger.project, config=resolved, init_kwargs={"wandb": wandb_kw})


def log_artifact(acc: Accelerator, folder: Path, step: int, aliases: list[str], metrics: dict) -> None:
    if acc.is_main_process:
        log_model_artifact(acc.get_tracker("wandb", unwrap=True), folder, step, aliases, metrics)
