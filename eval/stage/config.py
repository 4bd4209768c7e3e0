"""Typed schema for `eval/run.py`. eval/conf/eval.yaml only fills values; `EvalConfig` is registered in Hydra's
ConfigStore, so an unknown key (`max_new_token=8`) or a wrong type fails at compose time naming the key, and
`__post_init__` range checks run when the composed config becomes an object (`to_eval_config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from headstart.cli_checks import unknown_keys, unknown_message
from headstart.eval.engine.compiled import EVAL_MODES
from headstart.eval.engine.proposers import DRAFT, LOOKAHEAD, PROPOSERS, TREE_METHODS, TREE_NAMES
from headstart.eval.engine.proposers.lookahead import LookaheadOptions
from headstart.eval.errors import EvalError  # noqa: F401  (re-raised by the entry scripts)
from headstart.eval.stage.prompts import SHIPPED
from headstart.eval.timing.harness import TimingConfig
from headstart.eval.tuning.tuner import TunerConfig
from headstart.models.backbone import DTYPES
from headstart.models.int8 import MODES as INT8_MODES
from headstart.tracking import LoggerConfig

DEFAULT_PROMPTS = str(SHIPPED["dev"])
SPEC_METHODS = tuple(PROPOSERS)  # every decoding method but vanilla
PROPOSER_KEYS = ("num_draft_tokens", "tree", "tree_nodes", "topk")  # EvalConfig's keys for proposer options


@dataclass
class EvalConfig:
    # A drafter checkpoint folder (config.json + model.safetensors) or a run folder holding several of them.
    checkpoint: str = ""
    # Spec-Bench / MT-bench jsonl (question_id, category, turns), a shipped set's name (dev: vicuna + alpaca +
    # humaneval; spec_bench: a 24-prompt Spec-Bench slice; data/PROMPTS.md), or a list of them scored as one set
    prompts: Any = DEFAULT_PROMPTS
    out_dir: str = "runs/eval/${now:%Y-%m-%d_%H-%M-%S}"  # single process: a timestamp cannot differ by rank
    method: str = ""  # speculative method; empty: the checkpoint's own (medusa, ...; distillspec -> draft)
    limit_per_category: int = 0  # first N prompts of each category; 0: all
    max_new_tokens: int = 128  # per turn
    temperature: float = 0.0  # 0: greedy (and the spec output is checked against vanilla's)
    top_p: float = 1.0
    seed: int = 0  # turn t of prompt i samples with seed + 1000 i + t, the same for vanilla and spec
    device: str = "auto"  # auto (cuda when present) | cpu | cuda | cuda:N
    # auto: bfloat16 where this device computes it natively, float16 on CUDA without bf16, float32 otherwise
    # (headstart/hardware.py) | float32 | bfloat16 | float16 | empty: the dtype the checkpoint was trained in
    dtype: str = "auto"
    max_cache_len: int = 2048  # KV-cache length: every turn's full conversation + its answer must fit
    # The proposer options below: all unset (null) on a medusa / eagle checkpoint = the tuner's choice
    # (`tuner`, eval/tuning/tuner.py: measured on this device on its own tuning prompts, kept as this condition's
    # record in <checkpoint>/decoding.json; plain decoding when nothing pays); any one set = the user's options,
    # the rest at the proposer's defaults. Each proposer declares and checks the ones it takes
    # (eval/engine/proposers/: MedusaOptions, EagleOptions, DraftOptions, PromptLookupOptions); one it does not
    # take is refused.
    # prompt_lookup / draft: tokens proposed per step; eagle: tree depth. null = the proposer's default (4; eagle:
    # EAGLE-2's depth 5 on CUDA, 2 on CPU)
    num_draft_tokens: int | None = None
    # medusa: null (built from the checkpoint's head accuracies, else Medusa's default) | default | chain
    tree: str | None = None
    # medusa / eagle: candidate-tree size; null = the proposer's default (medusa 63 on CUDA, 4 on CPU; eagle 60, 6)
    tree_nodes: int | None = None
    # eagle: children per expanded node and nodes expanded per level; null = 10 on CUDA, 4 on CPU
    topk: int | None = None
    tuner: TunerConfig = field(default_factory=TunerConfig)  # tuner.mode=off: the hand-set defaults above
    # medusa / eagle / eagle3: up to this many prompt-lookup tokens merged into the drafter's tree each step, on
    # top of the tuner's (or the user's) tree (eval/engine/proposers/lookup_branch.py); 0 = off. The tuner
    # chooses its tree and the branch's length (0 to this many) together (eval/tuning/speed_model.py models
    # both); with the user's tree or tuner.mode=off the branch is this long
    lookup_tokens: int = 0
    draft: str = ""  # method=draft: the draft model (Hub id, folder or .gguf), same tokenizer as the target
    # a trained drafter's layers (or draft='s model) on CPU: auto = int8 weights where the drafter names them and
    # the kernel times faster than the trained weights on this CPU (models/int8.py: half the bytes where bf16 is
    # native; slower on AVX2 in float32; decoding stays lossless either way), as trained on a GPU | int8 (CPU
    # only) | native
    draft_weights: str = "auto"
    # the target's plain and verify steps (eval/engine/compiled.py): eager | auto (compiled where inductor runs)
    # | max-autotune | hardware (auto on a CPU computing float32, eager elsewhere; said at start). Vanilla runs
    # through the same path, so a speedup is never a kernel difference; when compiled, an eager vanilla is timed
    # in the same rounds (baselines/vanilla-eager: what compilation bought)
    compile: str = "eager"
    warmup: int = 1  # prompts decoded untimed (both paths) before measuring
    # training-free methods scored on the same prompts beside the drafter (e.g. [prompt_lookup]): compare.md
    # puts them side by side, overall and per category (eval/report/compare.py)
    baselines: list[str] = field(default_factory=list)
    # lookahead decoding's window W, n-gram size N and guesses G (lookahead.window=8 ...); unset: W=4, N=3, G=4,
    # sized for a CPU verify (eval/engine/proposers/lookahead.py). Only with lookahead in baselines (or method)
    lookahead: LookaheadOptions = field(default_factory=LookaheadOptions)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    # interleaved rounds, stopping rule, physical checks, CPU threads (eval/timing/harness.py): timing.budget_s=0 for one pass
    timing: TimingConfig = field(default_factory=TimingConfig)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise EvalError(f"temperature={self.temperature}: must be >= 0 (0 is greedy). Fix: temperature=0")
        if not 0 < self.top_p <= 1:
            raise EvalError(f"top_p={self.top_p}: must be in (0, 1]")
        for key, value, least, fix in (
            ("max_new_tokens", self.max_new_tokens, 1, "128 (the default)"),
            ("max_cache_len", self.max_cache_len, 2, "2048 (the default)"),
        ):
            if value < least:
                raise EvalError(f"{key}={value}: must be >= {least}. Fix: {key}={fix}")
        for key, value in self.proposer_options().items():
            if key != "tree" and value < 1:
                raise EvalError(f"{key}={value}: must be >= 1. Fix: {key}=null for the proposer's default")
        if self.tree is not None and self.tree not in TREE_NAMES:
            raise EvalError(
                f"tree={self.tree!r}: expected one of {list(TREE_NAMES)} or null (the proposer's)"
            )
        if self.lookup_tokens < 0:
            raise EvalError(f"lookup_tokens={self.lookup_tokens}: must be >= 0 (0 = no prompt-lookup branch)")
        if self.lookup_tokens and self.method and self.method not in TREE_METHODS:
            raise EvalError(
                f"lookup_tokens={self.lookup_tokens} with method={self.method}: the prompt-lookup branch joins the "
                f"draft tree of {list(TREE_METHODS)}. Fix: lookup_tokens=0"
            )
        if not isinstance(self.prompts, str) and not (
            isinstance(self.prompts, list) and self.prompts and all(isinstance(p, str) for p in self.prompts)
        ):
            raise EvalError(
                f"prompts={self.prompts!r}: expected a .jsonl path, a shipped set's name or a non-empty list of "
                "them. Fix: prompts=dev or prompts=[dev,spec_bench]"
            )
        if self.limit_per_category < 0 or self.warmup < 0:
            raise EvalError("limit_per_category and warmup must be >= 0 (limit 0 means all prompts)")
        if self.dtype not in ("", "auto", *DTYPES):
            raise EvalError(
                f"dtype={self.dtype!r}: expected auto, one of {sorted(DTYPES)} or empty (the checkpoint's). "
                "Fix: dtype=auto"
            )
        if self.method and self.method not in SPEC_METHODS:
            raise EvalError(f"method={self.method!r}: expected one of {list(SPEC_METHODS)} or empty")
        if self.method == DRAFT and not self.draft:
            raise EvalError(
                "method=draft needs a draft model. Fix: draft=<Hub id, folder or .gguf>, or method= (empty) "
                "with a distillspec checkpoint (its distilled draft is used)"
            )
        if self.compile not in EVAL_MODES:
            raise EvalError(
                f"compile={self.compile!r}: expected one of {list(EVAL_MODES)}. Fix: compile=eager"
            )
        if self.draft_weights not in INT8_MODES:
            raise EvalError(f"draft_weights={self.draft_weights!r}: expected one of {list(INT8_MODES)}")
        if self.draft_weights == "int8" and self.device.split(":")[0] not in ("auto", "cpu"):
            raise EvalError(
                f"draft_weights=int8 with device={self.device}: the int8 kernel runs on CPU only. "
                "Fix: draft_weights=auto (int8 on CPU where it times faster, as trained on a GPU) or native"
            )
        if not (self.device in ("auto", "cpu", "mps") or self.device.split(":")[0] == "cuda"):
            raise EvalError(f"device={self.device!r}: expected auto, cpu, cuda or cuda:N")
        free = baseline_methods()
        bad = [b for b in self.baselines if b not in free]
        if bad:
            raise EvalError(f"baselines={bad}: a baseline needs no drafter. Fix: pick from {list(free)}")
        if self.lookahead.set() and LOOKAHEAD not in (*self.baselines, self.method):
            raise EvalError(
                f"lookahead options {self.lookahead.set()} set but lookahead decoding is not run. "
                f"Fix: baselines=[{LOOKAHEAD}] (or drop the lookahead.* overrides)"
            )
        if not self.checkpoint:
            raise EvalError("checkpoint= is required. Fix: checkpoint=runs/<run>/drafter (or the run folder)")

    def proposer_options(self) -> dict[str, int | str]:
        """The proposer options the user set (not null), by name: the proposer's config checks they apply
        (with method=lookahead, the lookahead.* ones too)."""
        values = {k: getattr(self, k) for k in PROPOSER_KEYS}
        lookahead = self.lookahead.set() if self.method == LOOKAHEAD else {}
        return {k: v for k, v in values.items() if v is not None} | lookahead


def baseline_methods() -> tuple[str, ...]:
    """Decoding methods that need no trained drafter nor draft model (prompt lookup)."""
    from headstart.models import registry

    served = {m.proposer for m in registry.METHODS.values()} | {DRAFT}
    return tuple(m for m in SPEC_METHODS if m not in served)


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="eval_schema", node=EvalConfig)
    cs.store(group="logger", name="none", node=LoggerConfig(kind="none"))
    cs.store(group="logger", name="wandb", node=LoggerConfig(kind="wandb"))


def to_eval_config(cfg: DictConfig) -> EvalConfig:
    """Composed DictConfig -> EvalConfig (runs the __post_init__ checks; their ValueErrors are user errors)."""
    try:
        config = OmegaConf.to_object(cfg)
    except EvalError:
        raise
    except ValueError as e:  # a nested schema's range check (logger.kind=..., timing.rel_ci=...)
        raise EvalError(str(e)) from e
    if unknown := unknown_keys(cfg, config):
        raise EvalError(unknown_message(unknown, config))
    return config
