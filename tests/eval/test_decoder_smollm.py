"""Greedy lossless decoding on the real SmolLM2-135M-Instruct in fp32 (slow: run with `-m slow`)."""

import json
from pathlib import Path

import pytest

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers.draft_model import DraftOptions
from headstart.eval.engine.proposers.medusa import MedusaOptions
from headstart.eval.engine.proposers.prompt_lookup import PromptLookupOptions
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter
from headstart.models.medusa import MedusaConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
PROMPTS = Path("/work/shared/data/dev_prompts.jsonl")


@pytest.fixture(scope="module")
def smollm():
    return load_backbone(BackboneConfig(dtype="float32"))


def chat_prompts(backbone, n=5):
    if not PROMPTS.is_file():
        pytest.skip(f"{PROMPTS} not found")
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()[:n]]
    tok = backbone.tokenizer
    return [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": r["turns"][0]}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        )
        for r in rows
    ]


def test_greedy_methods_equal_vanilla_on_smollm2(smollm):
    heads = build_drafter("medusa", MedusaConfig(num_heads=3), smollm)  # untrained: top-1 = the lm_head's
    decoders = {
        "medusa": Decoder(smollm, MedusaOptions(heads, tree_nodes=16), max_cache_len=512),
        "prompt_lookup": Decoder(smollm, PromptLookupOptions(), max_cache_len=512),
        "draft-self": Decoder(smollm, DraftOptions(smollm, num_draft_tokens=3), max_cache_len=512),
    }
    vanilla = Decoder(smollm, max_cache_len=512)
    for prompt in chat_prompts(smollm):
        ref = vanilla.generate(prompt, 64)
        assert len(ref.tokens) > 8
        for name, dec in decoders.items():
            out = dec.generate(prompt, 64)
            assert out.tokens == ref.tokens, f"{name}: {smollm.tokenizer.decode(out.tokens)!r}"
        assert all(n == 4 for n in out.stats.accepted_per_step[:-1])  # draft-self: the draft IS the target
