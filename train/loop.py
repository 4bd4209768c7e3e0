"""The one training loop for every drafter method, read top to bottom like accelerate's examples:
prepare -> accumulate -> backward -> clip -> step -> log -> eval -> save_state.

The frozen backbone runs under no_grad and is never passed to `accelerator.prepare` (no gradient sync, no
sharding); only the drafter, its optimizer, scheduler and data loaders are prepared.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path

import torch
from accelerate import Accelerator, InitProcessGroupKwargs
from accelerate.utils import DistributedType, ProjectConfiguration, set_seed
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from headstart.cli_checks import dir_problem
from headstart.data import build_datasets, collate
from headstart.hardware import machine_facts, resolve_dtype, resolve_mixed_precision
from headstart.logs import FILE_ONLY
from headstart.models import registry
from headstart.models.backbone import Backbone, load_backbone
from headstart.models.checkpoint import (
    CONFIG_NAME,
    DRAFTER_DIR,
    CheckpointError,
    build_drafter,
    checkpoint_meta,
    save_drafter,
    write_final_eval,
)
from headstart.tracking import LoggerConfig
from headstart.train.checkpoints import (
    check_resumable,
    find_resume_dir,
    prune_checkpoints,
    read_step,
    save_checkpoint,
    set_aside_previous_run,
)
from headstart.train.config import JobConfig, TrainConfig
from headstart.train.hidden_cache import collate_hidden, offline_datasets
from headstart.train.metrics import GradNorm, MetricSums, Throughput, head_topk_accuracy, progress
from headstart.train.monitor import banner, data_line, init_tracking, log_artifact, measured_tau, trace_rows
from headstart.train.run_lock import run_lock
from headstart.train.sampling import EpochShuffle, LengthGrouped

log = logging.getLogger("headstart.train")


def lr_lambda(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine decay to min_ratio at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_accelerator(t: TrainConfig, logger: LoggerConfig, run_dir: str) -> Accelerator:
    log_with = "wandb" if logger.kind == "wandb" else None
    acc = Accelerator(
        gradient_accumulation_steps=t.grad_accum,
        # our schedule counts optimizer steps, whatever the process count (accelerate would step it N times)
        step_scheduler_with_optimizer=False,
        mixed_precision=t.mixed_precision,
        cpu=t.device == "cpu",
        log_with=log_with,
        project_config=ProjectConfiguration(project_dir=run_dir, logging_dir=run_dir),
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=t.dist_timeout_s))],
    )
    check_strategy(acc, t)
    return acc


def check_strategy(acc: Accelerator, t: TrainConfig) -> None:
    """accelerate silently drops a DeepSpeed or FSDP launch config in some cases (FSDP on CPU, either one with
    `cpu=True`) and trains with plain DDP: refuse instead of training with another strategy than asked."""
    for env, kind in (
        ("ACCELERATE_USE_DEEPSPEED", DistributedType.DEEPSPEED),
        ("ACCELERATE_USE_FSDP", DistributedType.FSDP),
    ):
        if os.environ.get(env, "false").lower() == "true" and acc.distributed_type != kind:
            raise ValueError(
                f"the accelerate config asks for {kind.value} but accelerate set up {acc.distributed_type.value}: "
                "it runs FSDP on accelerators only, and neither FSDP nor DeepSpeed with cpu=True "
                f"(train.device={t.device}, use_cpu / ACCELERATE_USE_CPU). Fix: on GPUs drop those; on a CPU "
                "use accelerate_configs/cpu_ddp.yaml (DDP), or DeepSpeed without use_cpu"
            )


def resolve_dtypes(job: JobConfig, resolved: dict) -> None:
    """backbone.dtype and train.mixed_precision `auto` -> what the training device computes natively (said once,
    with why). The resolved values replace the settings in `job` and `resolved` (config.json, checkpoints, W&B,
    the resume check: a run resumed on a machine that resolves otherwise is refused, not silently changed);
    `resolved["compute"]` keeps what was asked, why, and the machine."""
    t = job.train
    on_cpu = t.device == "cpu" or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")
    device = torch.device("cuda" if torch.cuda.is_available() and not on_cpu else "cpu")
    asked = job.backbone.dtype
    job.backbone = job.backbone.resolved(device)
    precision, why = resolve_mixed_precision(t.mixed_precision, device)
    if precision != t.mixed_precision:
        log.info("train.mixed_precision: %s (%s)", precision, why)
    backbone_reason = resolve_dtype(asked, device, setting="backbone.dtype").reason
    resolved["compute"] = {
        "backbone.dtype": {"requested": asked, "resolved": job.backbone.dtype, "reason": backbone_reason},
        "train.mixed_precision": {"requested": t.mixed_precision, "resolved": precision, "reason": why},
        "machine": machine_facts(device),
    }
    t.mixed_precision = resolved["train"]["mixed_precision"] = precision
    resolved["backbone"]["dtype"] = job.backbone.dtype


@dataclass
class Run:
    """What one training run holds once built: the prepared drafter, optimizer, scheduler and loaders, the frozen
    backbone, and what the checkpoints record (the resolved config, the data statistics)."""

    job: JobConfig
    resolved: dict
    acc: Accelerator
    method: registry.Method
    step_fn: Callable
    backbone: Backbone
    drafter: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: EpochShuffle | LengthGrouped
    train_dl: DataLoader
    eval_dl: DataLoader
    eval_ds: Dataset  # held-out rows as tokenized (the quick eval decodes their prompts)
    data_stats: dict
    log_model: str = "none"  # W&B model logging: none | checkpoint | end
    eval_before: dict = field(default_factory=dict)  # a drafter that starts trained: its eval before step 1

    @property
    def run_dir(self) -> Path:
        return Path(self.job.run_dir)


def train(job: JobConfig, resolved: dict) -> Path:
    """Train job.method on job.backbone; returns the folder of the final drafter. The main process holds the
    run folder's lock throughout (a second job on it is refused before it reads or moves anything)."""
    resolve_dtypes(job, resolved)
    acc = make_accelerator(job.train, job.logger, job.run_dir)
    with run_lock(Path(job.run_dir), acc.is_main_process):
        return _train(job, resolved, acc)


def _train(job: JobConfig, resolved: dict, acc: Accelerator) -> Path:
    if (problem := dir_problem(Path(job.cache_dir), "cache_dir")) is not None:  # before hours of training
        raise ValueError(f"{problem} (its default: $HEADSTART_CACHE, else ~/.cache/headstart)")
    set_seed(job.train.seed)
    banner(job, acc, resolved["compute"]["machine"])
    resume_dir = prepare_run_dir(job, resolved, acc)
    run = build(job, resolved, acc)
    step = resume(run, resume_dir)
    init_tracking(acc, job.logger, job.run_dir, resolved, resuming=resume_dir is not None)
    run.log_model = job.logger.model_logging() if job.logger.kind == "wandb" else "none"
    evaluate_before(run, step)
    step, last_eval = train_steps(run, step)
    return finish(run, step, last_eval)


def prepare_run_dir(job: JobConfig, resolved: dict, acc: Accelerator) -> Path | None:
    """The checkpoint to resume from (None: a fresh start), refused when trained with other settings; the run
    folder made and its config.json written (main process)."""
    t, run_dir = job.train, Path(job.run_dir)
    resume_dir = find_resume_dir(run_dir, t.resume)  # the newest complete checkpoint (damaged ones skipped)
    check_resumable(resume_dir, run_dir, resolved)  # trained with these settings, or refused
    if resume_dir is not None and (done := read_step(resume_dir)) > t.max_steps:
        raise ValueError(  # else the step-`done` drafter would stay while config.json said max_steps
            f"run_dir={run_dir} holds checkpoint {resume_dir.name}, past train.max_steps={t.max_steps}. Fix: "
            f"train.max_steps={done} or more to keep or continue it, train.resume=never to start over (the "
            "old run is moved aside), or another run_dir=..."
        )
    if acc.is_main_process:
        if t.resume == "never" and (moved := set_aside_previous_run(run_dir)) is not None:
            log.warning("train.resume=never: moved the previous run's checkpoints and drafter to %s", moved)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(resolved, indent=2, default=str))
    acc.wait_for_everyone()
    return resume_dir


def build(job: JobConfig, resolved: dict, acc: Accelerator) -> Run:
    """Backbone, data, drafter (its data-driven init, EAGLE's feature cache), optimizer, schedule and loaders,
    prepared by accelerate. The order is the seeded order every resume and every rank repeats."""
    t = job.train
    with acc.main_process_first():  # the GGUF conversion and tokenization happen once, on the main process
        backbone = load_backbone(job.backbone, device=acc.device)
        train_ds, eval_ds, data_stats = build_datasets(
            job.data,
            backbone.tokenizer,
            Path(job.cache_dir) / "data",
            backbone=backbone,
            show_progress=acc.is_local_main_process,
        )
    log.info("data: %s", json.dumps(data_stats, default=str), extra=FILE_ONLY)
    data_line(job, acc, data_stats, len(train_ds), len(eval_ds))
    if len(eval_ds) == 0:
        raise ValueError(
            f"data: none of the data.eval_rows={job.data.eval_rows} held-out rows is usable (too long or empty), "
            "so the drafter cannot be evaluated. Fix: more data.eval_rows or a larger data.max_length"
        )

    method = registry.get(job.method_name)
    step_fn = method.step_fn()
    drafter = build_drafter(method.name, job.method, backbone)
    init_stats = drafter.init_from_data(train_ds)  # e.g. EAGLE-3's draft vocabulary, from the training labels
    if init_stats:
        data_stats = {**data_stats, **init_stats}
        log.info("drafter data init: %s", json.dumps(init_stats, default=str))
    loader_sets, collate_fn = feature_sets(job, acc, backbone, drafter, train_ds, eval_ds, data_stats)
    optimizer, scheduler = make_optimizer(job, drafter)
    make_dl = partial(
        DataLoader,
        batch_size=t.micro_batch_size,
        collate_fn=partial(collate_fn, pad_id=backbone.tokenizer.pad_token_id),
    )
    if t.group_by_length:  # a group = the rows of one micro-batch across all processes
        sampler = LengthGrouped(train_ds.lengths, t.micro_batch_size * acc.num_processes, t.seed)
    else:
        sampler = EpochShuffle(len(train_ds), t.seed)
    train_dl = make_dl(loader_sets["train"], sampler=sampler, drop_last=True)
    eval_dl = make_dl(loader_sets["eval"], shuffle=False)
    if len(train_dl) < acc.num_processes:
        raise ValueError(
            f"only {len(train_ds)} training rows for batch {t.micro_batch_size} x "
            f"{acc.num_processes} processes. Fix: more data (data.max_rows) or a smaller batch"
        )
    drafter, optimizer, train_dl, eval_dl, scheduler = acc.prepare(
        drafter, optimizer, train_dl, eval_dl, scheduler
    )
    return Run(job, resolved, acc, method, step_fn, backbone, drafter, optimizer, scheduler, sampler,
               train_dl, eval_dl, eval_ds, data_stats)  # fmt: skip


def feature_sets(job: JobConfig, acc: Accelerator, backbone, drafter, train_ds, eval_ds, data_stats: dict):
    """What the data loaders read and how they collate it: the tokenized rows, or for EAGLE the backbone's
    features cached once before training (recorded in `data_stats["hidden_cache"]`)."""
    loader_sets = {"train": train_ds, "eval": eval_ds}
    feature_cache = drafter.feature_cache()
    if feature_cache is None:
        return loader_sets, collate
    layers, cache_dtype = feature_cache
    with acc.main_process_first():  # built once, on the main process; the others then reuse it
        loader_sets, data_stats["hidden_cache"] = offline_datasets(
            backbone,
            layers,
            loader_sets,
            Path(job.cache_dir) / "hidden",
            cache_dtype,
            show_progress=acc.is_local_main_process,
        )
    return loader_sets, collate_hidden


def make_optimizer(
    job: JobConfig, drafter
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the drafter's trainable parameters; linear warmup then cosine decay over optimizer steps."""
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    o = job.optim
    optimizer = torch.optim.AdamW(trainable, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
    schedule = partial(lr_lambda, warmup=o.warmup_steps, total=job.train.max_steps, min_ratio=o.min_lr_ratio)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def resume(run: Run, resume_dir: Path | None) -> int:
    """The step to start from: 0, or the checkpoint's after loading its full state (drafter, optimizer,
    schedule, RNGs, loader position)."""
    if resume_dir is None:
        return 0
    try:
        run.acc.load_state(str(resume_dir))
    except Exception as e:  # noqa: BLE001 - sizes matched but the content is damaged: say which
        raise CheckpointError(
            f"checkpoint {resume_dir} could not be loaded ({type(e).__name__}: {str(e)[:200]}). Fix: move "
            "it out of checkpoints/ to resume from the previous one, or train.resume=never"
        ) from e
    step = read_step(resume_dir)
    run.eval_before = (checkpoint_meta(resume_dir / DRAFTER_DIR) or {}).get("eval_before", {})
    log.info("resumed from %s at step %d", resume_dir, step)
    return step


def evaluate_before(run: Run, step: int) -> None:
    """A drafter that starts trained (a pretrained draft LM) is evaluated once before it is changed: the
    baseline its training must beat (logged at step 0, kept in its checkpoints and final_eval.json)."""
    if step or not getattr(run.acc.unwrap_model(run.drafter), "starts_trained", False):
        return
    run.eval_before = evaluate(
        run.acc, run.step_fn, run.backbone, run.drafter, run.eval_dl, run.job.train.eval_batches
    )
    run.acc.log(run.eval_before, step=0)
    log.info("step 0 eval (before training) %s", brief(run.eval_before))


def brief(evaluation: dict) -> str:
    """An evaluation as its log line shows it: 4 decimals, no per-rank histograms."""
    return json.dumps({k: round(v, 4) for k, v in evaluation.items() if "/rank" not in k})


def worse_than_before(before: dict, after: dict) -> str:
    """One line when training raised the held-out loss of a drafter that started trained, else ''."""
    key = "eval/loss"
    if key not in before or key not in after or after[key] <= before[key]:
        return ""
    agree = "eval/top1_match"
    top1 = (
        f", top-1 agreement {before[agree]:.4f} -> {after[agree]:.4f}"
        if agree in before and agree in after
        else ""
    )
    return (
        f"training made the drafter worse than it started: held-out loss {before[key]:.4f} -> {after[key]:.4f}"
        f"{top1}. Fix: a lower optim.lr, a larger batch (train.grad_accum) or more data; the drafter it started "
        "from is the better one to serve"
    )


def train_steps(run: Run, step: int) -> tuple[int, dict]:
    """prepare -> accumulate -> backward -> clip -> step, until max_steps; after each optimizer step
    `after_step` logs, evaluates and saves. -> (the last step, the last evaluation)."""
    acc, t, drafter, train_dl = run.acc, run.job.train, run.drafter, run.train_dl
    consumed = step * t.grad_accum  # micro-batches this process has already seen
    epoch, skip = divmod(consumed, len(train_dl))
    bar = tqdm(total=t.max_steps, initial=step, disable=not acc.is_local_main_process, desc="train")
    meters = Meters()
    last_eval: dict = {}
    drafter.train()
    while step < t.max_steps:
        train_dl.set_epoch(epoch)  # accelerate re-applies its own epoch counter to the sampler on __iter__
        run.sampler.set_epoch(epoch)
        batches = acc.skip_first_batches(train_dl, skip) if skip else train_dl
        skip = 0
        for batch in batches:
            if t.trace_rows:
                trace_rows(run.run_dir, acc.process_index, step, batch["row_ids"])
            batch["step"], batch["seed"] = step, t.seed  # methods that sample seed from these (resume-exact)
            with acc.accumulate(drafter):
                loss, metrics = forward_loss(acc, run.step_fn, run.backbone, drafter, batch)
                acc.backward(loss)
                if acc.sync_gradients:  # clip (0: off, the norm is still measured)
                    meters.grad_norm.add(acc, drafter, run.job.optim.grad_clip or math.inf)
                run.optimizer.step()
                if acc.sync_gradients:
                    run.scheduler.step()
                run.optimizer.zero_grad(set_to_none=True)
            meters.sums.add(metrics)
            meters.speed.add(batch)
            if not acc.sync_gradients:
                continue
            step += 1
            bar.update(1)
            last_eval = after_step(run, step, meters, bar, last_eval)
            if step >= t.max_steps:
                break
        epoch += 1
    bar.close()
    return step, last_eval


@dataclass
class Meters:
    """Training metrics summed between two log lines, the gradient norm and the throughput."""

    sums: MetricSums = field(default_factory=MetricSums)
    grad_norm: GradNorm = field(default_factory=GradNorm)
    speed: Throughput = field(default_factory=Throughput)


# the first draft position's training accuracy by method: Medusa's / EAGLE's first head or step, DistillSpec's
# draft argmax against the target's
FIRST_POSITION = {"train/head0/top1": "acc0", "train/top1_match": "top1"}


def first_position_accuracy(logs: dict) -> dict:
    """The progress bar's accuracy field: named for what the method logs, absent when it logs none."""
    return {name: f"{logs[key]:.2f}" for key, name in FIRST_POSITION.items() if key in logs}


def after_step(run: Run, step: int, meters: Meters, bar, last_eval: dict) -> dict:
    """Log, evaluate (loss metrics, then the quick eval's measured tau) and save, each on its own cadence and
    at the last step. -> the latest evaluation."""
    acc, t = run.acc, run.job.train
    if step % t.log_every == 0 or step == t.max_steps:
        logs = meters.sums.summarize(acc, prefix="train/") | {"train/lr": run.scheduler.get_last_lr()[0]}
        logs |= meters.grad_norm.summarize() | meters.speed.summarize(acc)
        logs |= progress(step, t, acc.num_processes, len(run.train_dl))
        meters.sums = MetricSums()
        acc.log(logs, step=step)
        bar.set_postfix(loss=f"{logs['train/loss']:.3f}", **first_position_accuracy(logs))
    if step % t.eval_every == 0 or step == t.max_steps:
        last_eval = evaluate(acc, run.step_fn, run.backbone, run.drafter, run.eval_dl, t.eval_batches)
        acc.log(last_eval, step=step)
        log.info("step %d eval %s", step, brief(last_eval))
    quick_every = t.eval_every if t.quick_eval_every is None else t.quick_eval_every
    if quick_every and (step % quick_every == 0 or step == t.max_steps):
        measured = measured_tau(acc, t, run.method.name, run.backbone, run.drafter, run.eval_ds)
        acc.log(measured, step=step)
        last_eval |= measured
    if step % t.save_every == 0 or step == t.max_steps:
        save(run, step, last_eval)
    return last_eval


def save(run: Run, step: int, last_eval: dict) -> None:
    """A checkpoint of the full training state plus the drafter (safetensors + config); old ones pruned."""
    acc = run.acc
    extra = {
        "step": step,
        "job": run.resolved,
        "data_stats": run.data_stats,
        "eval": last_eval,
        "head_topk_accuracy": head_topk_accuracy(last_eval),
    } | ({"eval_before": run.eval_before} if run.eval_before else {})
    state = partial(save_drafter_state, acc, run.job, run.backbone, run.drafter, extra=extra)
    ckpt = save_checkpoint(acc, run.run_dir, step, state)
    if acc.is_main_process:
        prune_checkpoints(run.run_dir, run.job.train.keep_checkpoints)
    log.info("checkpoint %s", ckpt, extra=FILE_ONLY)
    if run.log_model == "checkpoint":
        log_artifact(acc, ckpt / DRAFTER_DIR, step, ["latest"], last_eval)


def finish(run: Run, step: int, last_eval: dict) -> Path:
    """The last checkpoint's drafter copied to <run_dir>/drafter (not recomputed), final_eval.json written,
    the final artifact logged. -> the drafter folder."""
    acc, run_dir = run.acc, run.run_dir
    final = run_dir / DRAFTER_DIR
    final_eval = last_eval  # the last step always evaluates (step == max_steps)
    if acc.is_main_process:
        last = run_dir / "checkpoints" / f"step_{step:08d}" / DRAFTER_DIR
        if not final_eval and (last / CONFIG_NAME).is_file():  # no step ran (a finished run re-run): its eval
            final_eval = json.loads((last / CONFIG_NAME).read_text()).get("eval", {})
        if last.is_dir():  # the last checkpoint's drafter is the final one: copy, don't recompute
            tmp = final.with_name(DRAFTER_DIR + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(last, tmp)
            old = final.with_name(DRAFTER_DIR + ".old")  # a reader never finds drafter/ missing for long
            shutil.rmtree(old, ignore_errors=True)
            if final.exists():
                final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        if run.eval_before:
            final_eval = final_eval | {f"before/{k}": v for k, v in run.eval_before.items()}
            if warning := worse_than_before(run.eval_before, final_eval):
                log.warning(warning)
        write_final_eval(run_dir, final_eval)
    acc.wait_for_everyone()
    if run.log_model != "none":
        log_artifact(acc, final, step, ["final", "latest"], final_eval)
    acc.end_training()
    return final


def forward_loss(acc: Accelerator, step_fn, backbone, drafter, batch) -> tuple[torch.Tensor, dict]:
    """The method's summed loss, normalized by the global target count of this micro-batch so the gradient
    does not depend on how rows are split across processes."""
    with acc.autocast():
        loss_sum, count, metrics = step_fn(backbone, drafter, batch)
    global_count = acc.reduce(count.detach().clone(), reduction="sum").clamp_min(1)
    # DDP averages gradients over processes, hence the num_processes factor.
    loss = loss_sum * acc.num_processes / global_count
    metrics = {"loss_sum": loss_sum.detach(), "count": count.detach(), **metrics}
    return loss, metrics


@torch.no_grad()
def evaluate(acc: Accelerator, step_fn, backbone, drafter, eval_dl, max_batches: int) -> dict:
    drafter.eval()
    sums = MetricSums()
    for i, batch in enumerate(eval_dl):
        if i >= max_batches:
            break
        _, metrics = forward_loss(acc, step_fn, backbone, drafter, batch)
        sums.add(metrics)
    drafter.train()
    return sums.summarize(acc, prefix="eval/")


def save_drafter_state(acc, job: JobConfig, backbone, drafter, out: Path, extra: dict) -> None:
    """The drafter as safetensors + resolved config (what eval and export read). Called on every rank."""
    state = acc.get_state_dict(drafter)  # gathers FSDP / ZeRO-3 shards onto the main process
    if acc.is_main_process:
        meta = (job.method_name, job.method, job.backbone)
        save_drafter(out, acc.unwrap_model(drafter), *meta, backbone, extra=extra, state=state)
