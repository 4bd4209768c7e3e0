"""The architecture matrix: for each family users bring (tiny random configs, models/families.py), Medusa,
EAGLE-3 and a DistillSpec draft train a few steps through the real loop, export in every layout, reload from
the checkpoint and from each exported folder, and decode greedily token for token like the target itself
(fp32). The reference is HF's own forward over the whole sequence, no cache: it owns the sliding windows,
soft caps and expert routing, so a decoder that gets any of them wrong diverges."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.proposers.draft_model import DraftOptions
from headstart.eval.engine.proposers.eagle import Eagle3Options
from headstart.eval.engine.proposers.medusa import MedusaOptions
from headstart.eval.engine.proposers.prompt_lookup import PromptLookupOptions
from headstart.models.backbone import Backbone, BackboneConfig, load_backbone
from headstart.models.checkpoint import read_meta
from headstart.models.export import export
from headstart.models.export.eagle import read_layout as read_eagle
from headstart.models.export.medusa import read_layout as read_medusa
from headstart.models.families import TINY_FAMILIES
from headstart.models.registry import get
from headstart.train.config import register_configs, to_job
from headstart.train.loop import train

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))
from test_decoder_lossless import OracleProposer  # noqa: E402

from helpers import train_overrides, write_chat_file  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
CONF = Path(__file__).resolve().parents[2] / "conf"
register_configs()

# method -> (entry config, overrides): a few steps on a few short rows, everything else as users get it
METHODS = {
    "medusa": ("medusa", {"method.num_heads": 2}),
    "eagle3": ("eagle", {"method": "eagle3", "method.draft_vocab_size": 64, "method.min_coverage": 0}),
    "distillspec": ("distill", {"method.keep_layers": "[0]", "method.gen_max_new_tokens": 8}),
}
TEXTS = ["the cat sat on the mat. the cat sat on the", "1, 2, 3, 4, 5, 6, 7,", "abc abc abc abc abc"]
MAX_NEW = 16


def train_tiny(tmp_path: Path, family: str, method: str, tiny: dict | None = None) -> Path:
    """`tiny`: overrides of the family's tiny config (models/families.py)."""
    entry, extra = METHODS[method]
    data = write_chat_file(tmp_path / "chat.jsonl", n=12)
    extra = {
        **{f"+backbone.tiny.{k}": v for k, v in (tiny or {}).items()},
        "+backbone.tiny.family": family,
        "+backbone.tiny.initializer_range": 0.1,  # varied text: drafts are accepted sometimes, not always
        "backbone.attn_implementation": "eager" if family == "gemma2" else "sdpa",  # soft caps: eager only
        "train.max_steps": 2,
        "train.eval_every": 2,
        "train.save_every": 2,
        "train.micro_batch_size": 2,
        "data.eval_rows": 2,
        "data.max_length": 64,
        **extra,
    }
    overrides = train_overrides(tmp_path / "run", data, tmp_path / "cache", **extra)
    if method != "medusa":
        overrides = [o for o in overrides if not o.startswith("method.num_heads=")]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose(config_name=entry, overrides=overrides)
    return train(to_job(cfg, entry), OmegaConf.to_container(cfg, resolve=True))


@torch.no_grad()
def reference(backbone: Backbone, prompt: list[int]) -> list[int]:
    """Greedy continuation from HF's full forward over the whole sequence each step (no KV cache)."""
    ids = list(prompt)
    for _ in range(MAX_NEW):
        ids.append(int(backbone.model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def exported_decoders(backbone: Backbone, method: str, folders: list[Path], meta: dict) -> dict[str, Decoder]:
    """A decoder per exported folder, each read back the way its engine would."""
    out = {}
    for folder in folders:
        if method == "medusa":
            out[folder.name] = Decoder(backbone, MedusaOptions(read_medusa(folder)))
        elif method == "eagle3":
            out[folder.name] = Decoder(backbone, Eagle3Options(read_eagle(folder, backbone)))
        else:
            model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.float32, attn_implementation=backbone.config._attn_implementation
            )
            assert (
                json.loads((folder / "config.json").read_text())["model_type"] == backbone.config.model_type
            )
            draft = Backbone(model, backbone.tokenizer, name="draft")
            out[folder.name] = Decoder(backbone, DraftOptions(draft_backbone=draft, num_draft_tokens=3))
    return out


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("family", list(TINY_FAMILIES))
def test_family_trains_exports_and_decodes_losslessly(tmp_path, family, method):
    drafter_dir = train_tiny(tmp_path, family, method)
    meta = read_meta(drafter_dir)
    folders = export(drafter_dir, tmp_path / "export")
    assert len(folders) == len(get(method).layouts) or method == "distillspec"
    backbone = load_backbone(BackboneConfig(**{**meta["backbone"], "dtype": "float32"}))
    decoders = {
        "checkpoint": build_decoder(get(method).proposer, backbone, drafter_dir),
        **exported_decoders(backbone, method, folders, meta),
        "prompt_lookup": Decoder(backbone, PromptLookupOptions(num_draft_tokens=4)),
        # a drafter two steps old is rarely right: random trees hiding the target's own continuation make sure
        # deep acceptance and non-prefix KV compaction run under every family's windows and caps
        "oracle": Decoder(backbone),
    }
    for i, text in enumerate(TEXTS):
        prompt = backbone.tokenizer(text)["input_ids"]
        ref = reference(backbone, prompt)
        decoders["oracle"].proposer = OracleProposer(prompt + ref, seed=i)
        outs = {name: dec.generate(prompt, MAX_NEW, eos_token_ids=[]) for name, dec in decoders.items()}
        for name, out in outs.items():
            assert out.tokens == ref, f"{family} {method} ({name}) diverged from the target's greedy output"
        assert outs["oracle"].stats.tau > 1.5  # the oracle's trees were accepted several tokens deep
