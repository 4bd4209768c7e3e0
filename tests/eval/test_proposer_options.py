"""Proposer options as typed configs (eval/engine/proposers/): each proposer declares its options (None = its
default), checks them where declared, and refuses one it does not take; the eval stage's keys (null = unset)
reach them unchanged."""

from __future__ import annotations

import pytest

from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.proposers import proposer_config
from headstart.eval.engine.proposers.draft_model import DraftOptions
from headstart.eval.engine.proposers.eagle import Eagle3Options, EagleOptions
from headstart.eval.engine.proposers.medusa import MedusaOptions
from headstart.eval.engine.proposers.prompt_lookup import PromptLookupOptions
from headstart.eval.errors import EvalError
from headstart.eval.stage.config import EvalConfig


def test_a_method_name_and_options_become_its_typed_config():
    assert proposer_config("vanilla") is None
    assert proposer_config("medusa", tree_nodes=5) == MedusaOptions(tree_nodes=5)
    eagle3 = proposer_config("eagle3", num_draft_tokens=3, topk=2)
    assert type(eagle3) is Eagle3Options and eagle3.method == "eagle3" and eagle3.tree_nodes is None
    assert EagleOptions.method == "eagle" and isinstance(eagle3, EagleOptions)
    assert proposer_config("draft", num_draft_tokens=2) == DraftOptions(num_draft_tokens=2)
    assert proposer_config("prompt_lookup") == PromptLookupOptions(num_draft_tokens=4, max_ngram=3)


def test_an_option_the_proposer_does_not_take_is_refused_naming_what_it_takes():
    with pytest.raises(
        ValueError, match=r"topk do\(es\) not apply to method 'medusa' \(it takes \['drafter', "
    ):
        proposer_config("medusa", topk=3)
    with pytest.raises(ValueError, match="'vanilla' takes no proposer options, got \\['tree'\\]"):
        proposer_config("vanilla", tree="chain")
    with pytest.raises(ValueError, match="unknown decoding method 'beam'"):
        proposer_config("beam")
    with pytest.raises(TypeError, match="max_ngram"):
        MedusaOptions(max_ngram=2)  # the dataclass itself


@pytest.mark.parametrize(
    "make",
    [
        lambda: MedusaOptions(tree_nodes=0),
        lambda: EagleOptions(topk=0),
        lambda: Eagle3Options(num_draft_tokens=-1),
        lambda: DraftOptions(num_draft_tokens=0),
        lambda: PromptLookupOptions(max_ngram=0),
    ],
)
def test_zero_is_not_a_default_none_is(make):
    with pytest.raises(ValueError, match="must be >= 1. Fix: .*=None for the default"):
        make()


def test_a_medusa_tree_name_is_checked_where_declared():
    assert MedusaOptions(tree="chain").tree == "chain"
    with pytest.raises(ValueError, match="tree='widest'"):
        MedusaOptions(tree="widest")


def test_the_decoder_takes_a_config_or_a_method_name(backbone):
    assert Decoder(backbone).method == "vanilla" and Decoder(backbone).proposer is None
    lookup = Decoder(backbone, PromptLookupOptions(num_draft_tokens=2), max_cache_len=64)
    assert lookup.method == "prompt_lookup" and lookup.proposer.width == 3
    assert Decoder(backbone, "prompt_lookup", max_cache_len=64).proposer.width == 5  # its defaults
    assert build_decoder("prompt_lookup", backbone, max_cache_len=64, num_draft_tokens=3).proposer.width == 4
    with pytest.raises(ValueError, match="tree_nodes do\\(es\\) not apply to method 'prompt_lookup'"):
        build_decoder("prompt_lookup", backbone, tree_nodes=4)


def test_eval_keys_unset_are_null_and_set_ones_are_checked(tmp_path):
    cfg = EvalConfig(checkpoint=str(tmp_path))
    assert cfg.proposer_options() == {}
    cfg = EvalConfig(checkpoint=str(tmp_path), tree="chain", tree_nodes=6)
    assert cfg.proposer_options() == {"tree": "chain", "tree_nodes": 6}
    with pytest.raises(EvalError, match="tree_nodes=0: must be >= 1. Fix: tree_nodes=null"):
        EvalConfig(checkpoint=str(tmp_path), tree_nodes=0)
    with pytest.raises(EvalError, match="tree=''"):
        EvalConfig(checkpoint=str(tmp_path), tree="")
