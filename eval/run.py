"""Evaluate drafter checkpoints: measured speedup vs vanilla, tau, acceptance by draft position, per category.

    python eval/run.py checkpoint=runs/<run>/drafter out_dir=runs/<run>/eval [prompts=FILE] [limit_per_category=N]
    python eval/run.py checkpoint=runs/<run> out_dir=...      # every checkpoint in the run, best one marked
    python eval/run.py checkpoint=runs/<distillspec run>/drafter   # method `draft`, the distilled LM as draft

The backbone is rebuilt from the checkpoint's config.json (dtype/device overridable). Each prompt is decoded
with vanilla then speculative decoding (interleaved, after a warm-up) through the same Decoder; see score.py.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import asdict, replace
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from tqdm.auto import tqdm

from headstart.eval.config import EvalConfig, EvalError, register_configs, to_eval_config
from headstart.eval.engine.kv_cache import CacheFullError
from headstart.eval.prompts import PromptSet, chat_ids, load_prompts
from headstart.eval.report import log_wandb, write_report, write_runs_summary
from headstart.eval.measure import score_prompts
from headstart.eval.score import GenOpts, aggregate, check_fits
from headstart.eval.engine.tree import TreeError
from headstart.models.backbone import Backbone, BackboneConfig, BackboneError, load_backbone
from headstart.models.checkpoint import CONFIG_NAME, WEIGHTS_NAME, read_meta

log = logging.getLogger("headstart.eval")
# What the CLIs print as one line (exit 2) instead of a traceback: the user can fix these without reading code.
USER_ERRORS = (EvalError, BackboneError, FileNotFoundError, CacheFullError, TreeError)
DRAFTER_METHODS = ("medusa", "eagle", "eagle3")  # methods whose decoder needs the checkpoint's drafter


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise EvalError(f"device={name} but CUDA is not available here. Fix: device=cpu (or auto)")
    return torch.device(name)


def _is_checkpoint(p: Path) -> bool:
    """A drafter folder: weights plus a headstart config.json (not, e.g., an HF model folder in the run)."""
    if not ((p / CONFIG_NAME).is_file() and (p / WEIGHTS_NAME).is_file()):
        return False
    try:
        meta = json.loads((p / CONFIG_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and {"method", "backbone", "backbone_fingerprint"} <= meta.keys()


def step_of(path: Path, meta: dict) -> int | None:
    if isinstance(meta.get("step"), int):
        return meta["step"]
    found = [
        int(m.group(1)) for part in path.parts if (m := re.fullmatch(r"(?:step|checkpoint)[_-]?(\d+)", part))
    ]
    return found[-1] if found else None


def find_checkpoints(path: str) -> list[Path]:
    """A checkpoint folder itself, or every checkpoint folder under a run folder (half-written ones skipped)."""
    root = Path(path)
    if not root.is_dir():
        raise EvalError(
            f"checkpoint={path}: no such folder. Fix: checkpoint=runs/<run>/drafter or a run folder"
        )
    if _is_checkpoint(root):
        return [root]
    found = sorted(
        p.parent for p in root.rglob(CONFIG_NAME) if _is_checkpoint(p.parent) and ".tmp" not in p.parent.name
    )
    if not found:
        raise EvalError(
            f"checkpoint={path} holds no drafter checkpoint (a folder with {CONFIG_NAME} + {WEIGHTS_NAME}). "
            "Fix: point at runs/<run>/drafter, a checkpoints/step_*/drafter folder, or the run folder"
        )
    return found


class Evaluator:
    """Scores checkpoints on one prompt set; backbones are loaded once per distinct spec."""

    def __init__(self, cfg: EvalConfig, prompts: PromptSet) -> None:
        self.cfg, self.prompts = cfg, prompts
        self.device = resolve_device(cfg.device)
        self._backbones: dict[str, Backbone] = {}
        self.opts = GenOpts(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.seed, cfg.max_cache_len)

    def backbone(self, bcfg: BackboneConfig) -> Backbone:
        key = json.dumps(asdict(bcfg), sort_keys=True, default=str)
        if key not in self._backbones:
            log.info("loading backbone %s (%s, %s) on %s", bcfg.name, bcfg.path, bcfg.dtype, self.device)
            self._backbones[key] = load_backbone(bcfg, self.device)
            self._check_prompts_fit(self._backbones[key])
        return self._backbones[key]

    def _check_prompts_fit(self, backbone: Backbone) -> None:
        """Fail before hours of decoding, not at the prompt that overflows the cache (first turns only:
        later turns depend on the answers and are checked as they come)."""
        for p in self.prompts.prompts:
            ids = chat_ids(backbone.tokenizer, [{"role": "user", "content": p.turns[0]}])
            check_fits(len(ids), self.opts, f"prompt {p.question_id!r}")

    def decoders(self, ckpt: Path, meta: dict, backbone: Backbone, bcfg: BackboneConfig):
        from headstart.eval.engine.decoder import build_decoder

        cfg = self.cfg
        # a DistillSpec checkpoint holds a draft LM: the decoder's `draft` method, with that LM as the draft
        method = cfg.method or ("draft" if meta["method"] == "distillspec" else meta["method"])
        if method in DRAFTER_METHODS and method != meta["method"]:
            raise EvalError(
                f"method={method} but {ckpt} holds a {meta['method']} drafter. Fix: method= (empty)"
            )
        opts = {"max_cache_len": cfg.max_cache_len, "num_draft_tokens": cfg.num_draft_tokens or None}
        if method == "medusa":
            opts.update(tree=cfg.tree or None, tree_nodes=cfg.tree_nodes or None)
        if method in ("eagle", "eagle3"):
            opts.update(tree_nodes=cfg.tree_nodes or None, topk=cfg.topk or None)
        if method == "draft" and cfg.draft:  # an HF draft model named on the command line
            dcfg = BackboneConfig(name="draft", path=cfg.draft, dtype=bcfg.dtype)
            opts["draft_backbone"] = self.backbone(dcfg)
        # medusa / eagle load their drafter from the checkpoint; draft without draft= loads the distilled LM
        from_ckpt = method in DRAFTER_METHODS or (method == "draft" and not cfg.draft)
        vanilla = build_decoder("vanilla", backbone, None, max_cache_len=cfg.max_cache_len)
        spec = build_decoder(method, backbone, str(ckpt) if from_ckpt else None, **opts)
        return method, vanilla, spec

    def evaluate(self, ckpt: Path, out_dir: Path) -> dict:
        cfg = self.cfg
        meta = read_meta(ckpt)
        bcfg = BackboneConfig(**meta["backbone"])
        if cfg.dtype:
            bcfg = replace(bcfg, dtype=cfg.dtype)
        backbone = self.backbone(bcfg)
        method, vanilla, spec = self.decoders(ckpt, meta, backbone, bcfg)
        n = len(self.prompts.prompts)
        log.info("scoring %s (%s) on %d prompts -> %s", ckpt, method, n, out_dir)
        with tqdm(total=n, desc=f"eval {method} vs vanilla", unit="prompt") as bar:
            records, timing = score_prompts(
                vanilla,
                spec,
                backbone,
                self.prompts.prompts,
                self.opts,
                cfg.warmup,
                on_prompt=lambda i, total: bar.update(i - bar.n),
                timing=cfg.timing,
            )
        report = {
            "method": method,
            "backbone": {**asdict(bcfg), "fingerprint": backbone.fingerprint()},
            "checkpoint": str(ckpt),
            **({"draft": cfg.draft or str(ckpt)} if method == "draft" else {}),  # which draft LM proposed
            "step": step_of(ckpt, meta),
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_new_tokens": cfg.max_new_tokens,
            "device": str(self.device),
            "dtype": bcfg.dtype,
            "warmup_prompts": min(cfg.warmup, n),
            "prompts": {
                "file": self.prompts.path,
                "n": n,
                "categories": self.prompts.categories,
                "bad_rows": self.prompts.bad_rows,
                "bad_examples": self.prompts.bad_examples,
            },
            **aggregate(records, greedy=cfg.temperature == 0, timing=timing),
            "timing": timing,  # pairs, rounds, step costs, bound, flags, threads and load (eval/timing.py)
        }
        figures = write_report(out_dir, report, records)
        log.info("%s: tau %.3f, speedup %.3fx %s", ckpt, report["tau"] or 0, report["speedup"] or 0,
                 report["speedup_ci"])  # fmt: skip
        for flag in report["speedup_flags"]:
            log.warning("%s: speedup flagged, not used to rank: %s", ckpt, flag)
        return {"report": report, "figures": figures}


def score_run_dir(ev: Evaluator, checkpoints: list[Path], root: Path, out: Path) -> tuple[dict, dict]:
    """Score every checkpoint under `root` into out/<its relative path>; mark the best. -> summary, W&B payload."""
    entries, figures = [], {}
    for ckpt in checkpoints:
        sub = out / ckpt.relative_to(root)
        res = ev.evaluate(ckpt, sub)
        r = res["report"]
        entries.append({"checkpoint": str(ckpt), "step": r["step"], "tau": r["tau"], "speedup": r["speedup"],
                        "speedup_ci": r["speedup_ci"], "predicted_speedup": r["predicted_speedup"],
                        "flags": r["speedup_flags"], "efficiency": r["efficiency"],
                        "report": str(sub / "report.json")})  # fmt: skip
        figures[str(ckpt)] = res["figures"]
    summary = write_runs_summary(out, entries)
    best = next(e for e in summary["checkpoints"] if e["best"])
    log.info("best: %s (speedup %.3fx, tau %.3f)", best["checkpoint"], best["speedup"] or 0, best["tau"] or 0)
    rows = summary["checkpoints"]
    payload = {
        "history": [{"eval/tau": e["tau"], "eval/speedup": e["speedup"], "train/step": e["step"]} for e in rows],
        "table": (["checkpoint", "step", "tau", "speedup", "best"],
                  [[e["checkpoint"], e["step"], e["tau"], e["speedup"], e["best"]] for e in rows]),
        "figures": {"tau_vs_step": out / "tau_vs_step.png", **figures[best["checkpoint"]]},
    }  # fmt: skip
    return summary, payload


def run(cfg: EvalConfig) -> dict:
    """Score one checkpoint, or every checkpoint of a run folder; returns the report (or the runs summary)."""
    checkpoints = find_checkpoints(cfg.checkpoint)
    prompts = load_prompts(cfg.prompts, cfg.limit_per_category)
    if prompts.bad_rows:
        log.warning(
            "%s: skipped %d bad rows, e.g. %s", prompts.path, prompts.bad_rows, prompts.bad_examples[0]
        )
    ev, out = Evaluator(cfg, prompts), Path(cfg.out_dir)
    if checkpoints == [Path(cfg.checkpoint)]:
        res = ev.evaluate(checkpoints[0], out)
        summary = r = res["report"]
        payload = {
            "history": [{"eval/tau": r["tau"], "eval/speedup": r["speedup"], "eval/efficiency": r["efficiency"]}],
            "table": (["category", "n", "tau", "speedup"],
                      [[k, c["n"], c["tau"], c["speedup"]] for k, c in r["categories"].items()]),
            "figures": res["figures"],
        }  # fmt: skip
    else:
        summary, payload = score_run_dir(ev, checkpoints, Path(cfg.checkpoint), out)
    if cfg.logger.kind == "wandb":
        keys = ("checkpoint", "prompts", "method", "temperature", "max_new_tokens", "limit_per_category")
        config = {k: getattr(cfg, k) for k in keys}
        log_wandb(cfg.logger, out, f"eval-{out.name}", config, **payload)
    return summary


register_configs()


@hydra.main(config_path="../conf/eval", config_name="eval", version_base=None)
def main(dcfg: DictConfig) -> None:
    try:
        cfg = to_eval_config(dcfg)
        # the folder Hydra already made, with its ${now:} resolved once
        cfg.out_dir = HydraConfig.get().runtime.output_dir
        run(cfg)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
