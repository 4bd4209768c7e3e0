"""A distilled draft exports as a standard HF causal-LM folder: transformers loads it as `assistant_model` and
greedy assisted output equals plain greedy output; the built-in decoder's `draft` method with it is lossless;
the card carries the measured figures; the Hub push never shows the token."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from conftest import tiny_backbone
from transformers import AutoModelForCausalLM

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers.draft_model import DraftOptions
from headstart.models.backbone import Backbone, BackboneConfig
from headstart.models.checkpoint import build_drafter, save_drafter
from headstart.models.distill import DistillConfig
from headstart.train import export as export_cli

TINY = {"seed": 0, "initializer_range": 0.2}
BB_CFG = BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny=TINY)


def trained_checkpoint(target, folder: Path) -> torch.nn.Module:
    cfg = DistillConfig(keep_layers=[0], divergence="tvd")
    drafter = build_drafter("distillspec", cfg, target)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.02 * torch.randn_like(p))
    extra = {"step": 7, "eval": {"eval/loss": 0.3, "eval/accept_sim": 0.61, "eval/top1_match": 0.42}}
    save_drafter(folder / "drafter", drafter, "distillspec", cfg, BB_CFG, target, extra=extra)
    return drafter


def prompt_ids(tok, text: str) -> list[int]:
    chat = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tok(chat, add_special_tokens=False)["input_ids"]


def test_export_is_a_standard_hf_folder_usable_as_assistant_model(tmp_path, monkeypatch, capsys):
    target = tiny_backbone(**TINY)
    drafter = trained_checkpoint(target, tmp_path / "run")
    (tmp_path / "run" / "eval").mkdir()
    report = {"method": "draft", "temperature": 0.0, "prompts": 5, "tau": 1.75, "speedup": 1.3}
    (tmp_path / "run" / "eval" / "report.json").write_text(json.dumps(report))
    pushed = []

    class FakeApi:
        def whoami(self):
            return {"name": "me"}

        def create_repo(self, repo_id, private, exist_ok):
            pushed.append(("create", repo_id))

        def upload_folder(self, repo_id, folder_path, commit_message):
            pushed.append(("upload", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    secret = "hf_SECRETtoken1234567890"
    monkeypatch.setenv("HF_TOKEN", secret)
    out = tmp_path / "export"
    export_cli.main(["--checkpoint", str(tmp_path / "run"), "--out", str(out), "--push", "me/draft"])
    printed = capsys.readouterr()
    assert secret not in printed.out + printed.err
    files = sorted(p.name for p in out.iterdir())
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "README.md",
    } <= set(files)
    assert pushed == [("create", "me/draft"), ("upload", "me/draft", files)]

    config = json.loads((out / "config.json").read_text())  # what vLLM reads to pick the draft's model class
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["vocab_size"] == target.vocab_size
    card = (out / "README.md").read_text()
    assert "`tiny`" in card and "1 - TVD = 0.610" in card and "| tau in headstart's decoder | 1.75 |" in card

    draft = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([prompt_ids(target.tokenizer, "alpha beta gamma")])
    # the trained weights, not the init
    torch.testing.assert_close(draft(ids).logits, drafter.draft(ids).logits)
    plain = target.model.generate(ids, max_new_tokens=24, do_sample=False)
    assisted = target.model.generate(ids, max_new_tokens=24, do_sample=False, assistant_model=draft)
    assert assisted.tolist() == plain.tolist()


def test_builtin_draft_decoder_with_the_distilled_draft_equals_vanilla(tmp_path):
    target = tiny_backbone(**TINY)
    drafter = trained_checkpoint(target, tmp_path)
    draft = Backbone(drafter.draft, target.tokenizer, name="distilled")
    spec = Decoder(target, DraftOptions(draft, num_draft_tokens=3), max_cache_len=256)
    vanilla = Decoder(target, "vanilla", max_cache_len=256)
    accepted = 0
    for text in ["alpha beta", "gamma delta epsilon zeta", "theta"]:
        ids = prompt_ids(target.tokenizer, text)
        want = vanilla.generate(ids, 32)
        got = spec.generate(ids, 32)
        assert got.tokens == want.tokens
        accepted += sum(got.stats.accepted_by_position)
    assert accepted > 0, "the draft was never accepted: the test exercised only the bonus-token path"
