"""Greedy speculative decoding == greedy vanilla decoding, token for token (fp32, tiny random backbones), for
every method, through EOS and the length limit, with acceptance that actually varies."""

import random

import pytest
import torch

from headstart.eval.engine.decoder import Decoder, build_decoder
from headstart.eval.engine.kv_cache import CacheFullError
from headstart.eval.engine.proposers.base import Draft
from headstart.eval.engine.proposers.draft_model import DraftOptions
from headstart.eval.engine.proposers.lookahead import LookaheadOptions
from headstart.eval.engine.proposers.medusa import MedusaOptions
from headstart.eval.engine.proposers.prompt_lookup import PromptLookupOptions
from headstart.eval.engine.tree import Tree, TreeError, tree_from_paths
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter, save_drafter
from headstart.models.medusa import MedusaConfig
from helpers.heads import perturbed_heads

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = [
    "the cat sat on the mat. the cat sat on the",
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return",
    "abc abc abc abc abc",
    "Once upon a time, there was",
    "1, 2, 3, 4, 5, 6, 7,",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
    "zzzz yyyy zzzz yyyy zz",
    "The quick brown fox jumps over the lazy dog. The quick brown",
]
MAX_NEW = 40


def tiny(seed: int, init: float = 0.02):
    cfg = BackboneConfig(
        name=f"tiny{seed}", path="tiny", dtype="float32", tiny={"seed": seed, "initializer_range": init}
    )
    return load_backbone(cfg)


@pytest.fixture(scope="module")
def models():
    # init 0.02: collapses into repeats (drafts accepted); 0.1: repeats with switches; 0.2: varied text
    return {init: tiny(0, init) for init in (0.02, 0.1, 0.2)}


def prompts(backbone):
    return [backbone.tokenizer(t)["input_ids"] for t in TEXTS]


def decoders(backbone):
    untrained = build_drafter("medusa", MedusaConfig(num_heads=3), backbone)
    return {
        "medusa-sparse": Decoder(backbone, MedusaOptions(untrained)),
        "medusa-chain": Decoder(backbone, MedusaOptions(untrained, tree="chain")),
        "medusa-perturbed": Decoder(backbone, MedusaOptions(perturbed_heads(backbone), tree_nodes=24)),
        "medusa-accuracy-tree": Decoder(
            backbone,
            MedusaOptions(
                perturbed_heads(backbone, seed=1), head_accuracy=[[0.5, 0.2, 0.1]] * 3, tree_nodes=10
            ),
        ),
        "draft-other": Decoder(backbone, DraftOptions(tiny(7, 0.02), num_draft_tokens=3)),
        "draft-self": Decoder(backbone, DraftOptions(backbone, num_draft_tokens=4)),
        "prompt_lookup": Decoder(backbone, PromptLookupOptions(num_draft_tokens=5)),
        "lookahead": Decoder(backbone, "lookahead"),
        "lookahead-wide": Decoder(backbone, LookaheadOptions(window=6, ngram=5, guesses=6)),
        "lookahead-bigram": Decoder(backbone, LookaheadOptions(window=3, ngram=2, guesses=2)),
    }


def check_stats(out, max_new):
    s = out.stats
    assert s.new_tokens == len(out.tokens) == 1 + sum(s.accepted_per_step) <= max_new
    assert s.target_forwards == len(s.accepted_per_step) == len(s.step_latency_s)
    assert all(a <= p for a, p in zip(s.accepted_by_position, s.proposed_by_position))
    assert all(a >= b for a, b in zip(s.accepted_by_position, s.accepted_by_position[1:]))
    assert set(s.time_s) == {"prefill", "draft", "verify", "bookkeeping", "total"}
    parts = s.time_s["prefill"] + s.time_s["draft"] + s.time_s["verify"] + s.time_s["bookkeeping"]
    assert parts == pytest.approx(s.time_s["total"], rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("init", [0.02, 0.1, 0.2])
def test_greedy_speculative_equals_vanilla(models, init):
    backbone = models[init]
    vanilla = Decoder(backbone)
    refs = [vanilla.generate(p, MAX_NEW, eos_token_ids=[]) for p in prompts(backbone)]
    for ref in refs:
        assert ref.stats.accepted_per_step == [1] * (MAX_NEW - 1) and ref.stats.tau == 1.0
    steps = {}
    for name, dec in decoders(backbone).items():
        steps[name] = []
        for prompt, ref in zip(prompts(backbone), refs):
            out = dec.generate(prompt, MAX_NEW, eos_token_ids=[])
            assert out.tokens == ref.tokens, f"{name} diverged from vanilla on {prompt[:8]}..."
            check_stats(out, MAX_NEW)
            steps[name] += out.stats.accepted_per_step[:-1]  # the last one may be cut by the length limit
    assert all(n == 5 for n in steps["draft-self"])  # the draft IS the target: everything accepted
    if init == 0.1:  # acceptance really varies: some steps take several tokens, some only the bonus
        for name in ("medusa-sparse", "medusa-perturbed", "draft-other", "prompt_lookup", "lookahead"):
            assert max(steps[name]) > 1 and min(steps[name]) == 1, (name, steps[name])


@pytest.mark.parametrize("max_new", [1, 2, 3, 7, 23])
def test_eos_and_length_limit(models, max_new):
    backbone = models[0.1]
    vanilla = Decoder(backbone)
    decs = decoders(backbone)
    for prompt in prompts(backbone)[:4]:
        full = vanilla.generate(prompt, 30, eos_token_ids=[]).tokens
        eos = full[5]  # a token the target really produces, so that generation stops on it
        ref = full[: full.index(eos) + 1][:max_new]
        assert vanilla.generate(prompt, max_new, eos_token_ids=[eos]).tokens == ref
        for name, dec in decs.items():
            out = dec.generate(prompt, max_new, eos_token_ids=[eos])
            assert out.tokens == ref, name
            check_stats(out, max_new)


def test_fixed_shape_path_equals_vanilla(models):
    """The path CUDA graphs replay (static buffers, whole-cache attention, padded chains), run eagerly on CPU."""
    backbone = models[0.1]
    vanilla = Decoder(backbone)
    decs = decoders(backbone)
    for dec in decs.values():
        dec.runner.cuda_graphs = True
        if hasattr(dec.proposer, "runner"):
            dec.proposer.runner.cuda_graphs = True
    for prompt in prompts(backbone)[:4]:
        ref = vanilla.generate(prompt, 24, eos_token_ids=[])
        for name, dec in decs.items():
            assert dec.generate(prompt, 24, eos_token_ids=[]).tokens == ref.tokens, name
    assert {w for w, _, _ in decs["prompt_lookup"].runner._graphs} == {
        1,
        6,
    }  # misses: width 1, else padded to K+1
    assert {w for w, _, _ in decs["draft-other"].proposer.runner._graphs} == {1, 2}


def test_fixed_shape_steps_cross_cache_buckets_losslessly(models):
    """Fixed-shape steps attend over the smallest cache bucket holding the prefix (eval/engine/runner.py): a
    decode that starts below 256 cached positions and ends above reads 256 slots, then 512, and equals the
    eager decode token for token."""
    from headstart.eval.engine.runner import attended, bucket

    assert [bucket(n, 2048) for n in (1, 256, 257, 1000, 3000)] == [256, 256, 512, 1024, 2048]
    assert bucket(100, 128) == 128  # never past the buffer
    # a compiled CPU step's length is a dynamic dimension of its graph: the prefix rounded up to 64 slots
    assert [attended(n, 2048, 64) for n in (1, 64, 65, 300, 3000)] == [64, 64, 128, 320, 2048]
    assert attended(300, 2048, None) == 512  # captured CUDA graphs: the bucket
    backbone = models[0.1]
    prompt = [(7 * i) % 250 + 3 for i in range(240)]
    ref = Decoder(backbone, max_cache_len=1024).generate(prompt, 40, eos_token_ids=[]).tokens
    for options in (None, PromptLookupOptions(num_draft_tokens=3)):
        dec = Decoder(backbone, options, max_cache_len=1024)
        dec.runner.cuda_graphs = True
        assert dec.generate(prompt, 40, eos_token_ids=[]).tokens == ref
        assert {slots for _, _, slots in dec.runner._graphs} == {256, 512}


class OracleProposer:
    """Random trees (EAGLE-like: new structure every step) hiding the target's greedy continuation at a random
    node, sometimes corrupted part-way: exercises deep acceptance, non-prefix compaction and truncation."""

    def __init__(self, reference: list[int], width: int = 12, seed: int = 0) -> None:
        self.reference, self.width, self.rng = reference, width, random.Random(seed)

    def start(self, prompt, hidden):
        pass

    def propose(self, context, sampling):
        rng, n = self.rng, self.rng.randint(1, self.width - 1)
        parents = [-1] + [rng.randrange(i) for i in range(1, n + 1)]
        tokens = [rng.randrange(259) for _ in range(n + 1)]
        path, node = [], rng.randrange(n + 1)
        while node > 0:
            path.append(node)
            node = parents[node]
        truth = self.reference[len(context) :]
        for d, node in enumerate(reversed(path)):
            if d < len(truth):
                tokens[node] = truth[d]
        if path and rng.random() < 0.3:
            tokens[rng.choice(path)] = (tokens[path[0]] + 1) % 259
        return Draft(torch.tensor(tokens[1:]), Tree(tuple(parents)))

    def accepted(self, path, hidden):
        pass


def test_random_trees_with_oracle_tokens(models):
    backbone = models[0.2]
    vanilla = Decoder(backbone)
    dec = Decoder(backbone)
    for i, prompt in enumerate(prompts(backbone)):
        ref = vanilla.generate(prompt, MAX_NEW, eos_token_ids=[])
        dec.proposer = OracleProposer(prompt + ref.tokens, seed=i)
        out = dec.generate(prompt, MAX_NEW, eos_token_ids=[])
        assert out.tokens == ref.tokens
        check_stats(out, MAX_NEW)
        assert out.stats.tau > 1.5 and min(out.stats.accepted_per_step) == 1


def test_build_decoder_from_checkpoint(models, tmp_path):
    backbone = models[0.02]
    heads = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    cfg = BackboneConfig(name="tiny", path="tiny", dtype="float32")
    save_drafter(
        tmp_path / "ck",
        heads,
        "medusa",
        MedusaConfig(num_heads=2),
        cfg,
        backbone,
        extra={"head_topk_accuracy": [[0.6, 0.2, 0.1], [0.4, 0.2]]},
    )
    dec = build_decoder("medusa", backbone, str(tmp_path / "ck"), tree_nodes=5)
    assert dec.proposer.tree.size == 6 and dec.proposer.tree.max_depth == 2
    prompt = prompts(backbone)[0]
    assert dec.generate(prompt, 20).tokens == Decoder(backbone).generate(prompt, 20).tokens
    assert build_decoder("vanilla", backbone, None).method == "vanilla"
    with pytest.raises(ValueError, match="checkpoint_dir"):
        build_decoder("medusa", backbone)


def test_clear_errors(models):
    backbone = models[0.02]
    heads = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    with pytest.raises(TreeError, match="depth 3 > 2"):
        Decoder(backbone, MedusaOptions(heads, tree=[[0], [0, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match="unknown decoding method"):
        Decoder(backbone, "beam")
    with pytest.raises(ValueError, match="drafter"):
        Decoder(backbone, MedusaOptions())
    dec = Decoder(backbone, MedusaOptions(heads, tree=tree_from_paths([[0], [1]])), max_cache_len=32)
    with pytest.raises(CacheFullError, match="max_cache_len=32"):
        dec.generate(list(range(40)), 4)  # prompt longer than the cache: refused, not truncated
    with pytest.raises(CacheFullError, match="nothing is truncated"):
        dec.generate(list(range(20)), 12)
    assert len(dec.generate(list(range(20)), 9, eos_token_ids=[]).tokens) == 9  # 20 + 9 + 3 fits
