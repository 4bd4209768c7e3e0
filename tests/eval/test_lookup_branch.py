"""The prompt-lookup branch merged into a drafter's tree (eval/engine/proposers/lookup_branch.py): the trie merge
by hand, greedy output == vanilla for Medusa and EAGLE-3 with the branch accepted, and after every step the
drafter's proposal equals a freshly started drafter's on the same context (so accepted() handed it a right path,
also after steps the lookup branch won)."""

import pytest
import torch

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.proposers.base import Draft, Sampling
from headstart.eval.engine.proposers.eagle import Eagle3Options
from headstart.eval.engine.proposers.lookup_branch import LookupBranch, merge_chain
from headstart.eval.engine.proposers.medusa import MedusaOptions
from headstart.eval.engine.proposers.prompt_lookup import PromptLookupOptions
from headstart.eval.engine.tree import tree_from_paths
from headstart.models.backbone import BackboneConfig, load_backbone
from headstart.models.checkpoint import build_drafter
from headstart.models.eagle_config import Eagle3Config
from headstart.models.medusa import MedusaConfig

pytestmark = pytest.mark.usefixtures("one_thread")

A, B, C, D, X = 10, 11, 12, 13, 99
# root -> A (1), root -> B (2), A -> C (3)
TOKENS, PARENTS = [A, B, C], (-1, 0, 0, 1)


@pytest.mark.parametrize(
    ("chain", "tokens", "parents"),
    [
        ([A, C, D], [A, B, C, D], (-1, 0, 0, 1, 3)),  # shares A, C; D hangs below C
        ([A, D, C], [A, B, C, D, C], (-1, 0, 0, 1, 1, 4)),  # shares A; after a new node nothing is shared
        ([D, A], [A, B, C, D, A], (-1, 0, 0, 1, 0, 4)),  # no shared prefix: a new child of the root
        ([A, C], TOKENS, PARENTS),  # wholly inside the tree: nothing added
    ],
)
def test_merge_is_a_trie(chain, tokens, parents):
    assert merge_chain(TOKENS, PARENTS, chain) == (tokens, parents)


class Fixed:
    """A proposer that always proposes the same tree, and remembers the paths it is told."""

    def __init__(self, tokens, tree):
        self.draft, self.width, self.paths = Draft(torch.tensor(tokens), tree), tree.size, []

    def start(self, prompt, hidden):
        pass

    def propose(self, context, sampling):
        return self.draft

    def accepted(self, path, hidden):
        self.paths.append(path)


def test_no_match_leaves_the_draft_and_a_long_match_is_cut_to_l():
    inner = Fixed(TOKENS, tree_from_paths([[0], [1], [0, 0]]))
    branch = LookupBranch(inner, 2, torch.device("cpu"))
    assert branch.width == inner.width + 2
    assert branch.propose([1, 2, 3, 4, 5], Sampling()) is inner.draft  # no n-gram repeats: unchanged
    # "5 6" seen before, followed by 7 8 9 ...: two lookup tokens under the root, the tree's ranks dropped
    draft = branch.propose([5, 6, 7, 8, 9, 1, 5, 6], Sampling())
    assert draft.tokens.tolist() == [A, B, C, 7, 8] and draft.tree.parents == PARENTS + (0, 4)
    assert branch.counts == {"steps": 2, "added": 1, "won": 0}
    branch.accepted([0, 4, 5], None)  # the path ends on a lookup node: the inner proposer gets it as it is
    branch.accepted([0, 1], None)
    assert inner.paths == [[0, 4, 5], [0, 1]] and branch.counts["won"] == 1
    with pytest.raises(ValueError, match="lookup_tokens=0"):
        LookupBranch(inner, 0, torch.device("cpu"))


class Spy:
    """Wraps the drafter inside the branch: keeps each context with the drafter's own proposal, and whether the
    previous step's accepted path ended below a lookup-only node (a node past the drafter's tree)."""

    def __init__(self, inner):
        self.inner, self.width, self.steps, self._last, self._won = inner, inner.width, [], None, False

    def start(self, prompt, hidden):
        self._won = False
        self.inner.start(prompt, hidden)

    def propose(self, context, sampling):
        self._last = self.inner.propose(context, sampling)
        self.steps.append((list(context), self._last, self._won))
        return self._last

    def accepted(self, path, hidden):
        self._won = path[-1] >= self._last.tree.size
        self.inner.accepted(path, hidden)


def fresh_proposal(decoder: Decoder, context: list[int]) -> Draft:
    """The proposal of `decoder`'s drafter started from scratch on context[:-1] (one prefill, no history)."""
    with torch.inference_mode():
        decoder.runner.cache.reset()
        hidden, _ = decoder.runner.prefill(context[:-1])
        decoder.proposer.start(context[:-1], hidden)
        return decoder.proposer.propose(context, Sampling())


TEXTS = [
    "the cat sat on the mat. the cat sat on the",
    "def f(x):\n    return x + 1\n\ndef g(x):\n    return",
    "The quick brown fox jumps over the lazy dog. The quick brown",
]


def check_branch(backbone, make, max_new=40):
    """Greedy with the branch == vanilla; the branch won some steps; the drafter's state is right after each."""
    vanilla, dec = Decoder(backbone), make()
    spy = Spy(dec.proposer)
    dec.proposer = branch = LookupBranch(spy, 4, dec.device)
    reference = make()
    for graphs in (False, True):  # True: the fixed-shape (CUDA graph) path, padded to the width, run eagerly
        dec.runner.cuda_graphs = graphs
        for text in TEXTS:
            prompt = backbone.tokenizer(text)["input_ids"]
            out = dec.generate(prompt, max_new, eos_token_ids=[])
            assert out.tokens == vanilla.generate(prompt, max_new, eos_token_ids=[]).tokens, text
    assert branch.counts["won"] > 0 and branch.counts["added"] > branch.counts["won"], branch.counts
    # fixed shapes: a step the chain added to is padded to the whole branch, the others verify the tree alone
    widths = {spy.width + 4} | ({spy.width} if branch.counts["steps"] > branch.counts["added"] else set())
    assert {width for width, _, _ in dec.runner._graphs} == widths and set(branch.widths) >= widths
    after_won = 0
    for context, draft, won in spy.steps:
        fresh = fresh_proposal(reference, context)
        assert draft.tokens.tolist() == fresh.tokens.tolist() and draft.tree.parents == fresh.tree.parents
        after_won += won
    assert after_won > 0


def test_medusa_with_branch_is_lossless_and_keeps_its_state():
    backbone = load_backbone(
        BackboneConfig(name="tiny", path="tiny", dtype="float32", tiny={"seed": 0, "initializer_range": 0.1})
    )
    heads = build_drafter("medusa", MedusaConfig(num_heads=3), backbone)
    check_branch(backbone, lambda: Decoder(backbone, MedusaOptions(heads, tree_nodes=6)))


def test_eagle3_with_branch_is_lossless_and_keeps_its_state(backbone):
    torch.manual_seed(0)
    drafter = build_drafter("eagle3", Eagle3Config(draft_vocab_size=259, ttt_steps=2), backbone).eval()
    check_branch(
        backbone, lambda: Decoder(backbone, Eagle3Options(drafter, tree_nodes=6, num_draft_tokens=2))
    )


def test_refused_where_there_is_no_tree(backbone):
    with pytest.raises(ValueError, match="lookup_tokens applies to"):
        Decoder(backbone, PromptLookupOptions(), lookup_tokens=2)
    with pytest.raises(ValueError, match="lookup_tokens applies to"):
        Decoder(backbone, "vanilla", lookup_tokens=2)
    heads = build_drafter("medusa", MedusaConfig(num_heads=2), backbone)
    dec = Decoder(backbone, MedusaOptions(heads, tree_nodes=3), lookup_tokens=5)
    assert isinstance(dec.proposer, LookupBranch) and dec.proposer.width == 4 + 5
