"""The Medusa draft step through torch.compile (eval/engine/proposers/medusa.py): the same candidates as the eager
heads, for plain, root-token and truncated-vocabulary heads, and a failed compile drafts eagerly with a warning."""

from __future__ import annotations

import pytest
import torch

from headstart.eval.engine.proposers import medusa
from headstart.eval.engine.proposers.medusa import DraftStep, draft_function
from headstart.eval.engine.tree import tree_from_paths
from helpers.heads import perturbed_heads
from tests.conftest import tiny_backbone

pytestmark = pytest.mark.usefixtures("one_thread")
# a draft that falls back to eager would pass the equality checks while testing nothing
FALLBACK = "error:compiling the Medusa draft step failed"
TREE = tree_from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])


@pytest.mark.filterwarnings(FALLBACK)
@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"draft_vocab_size": 64}, id="truncated"),  # the main job's heads
        pytest.param({"root_token": True}, id="root-token"),
        pytest.param({}, id="shared", marks=pytest.mark.slow),  # about 10 s a compile
        pytest.param({"share_lm_head": False}, id="own-heads", marks=pytest.mark.slow),
    ],
)
def test_compiled_draft_equals_eager(config):
    backbone = tiny_backbone(initializer_range=0.1)
    heads = perturbed_heads(backbone, **config).eval()
    if heads.root_proj is not None:
        heads.attach_embeddings(backbone.embed_tokens)
    step = DraftStep(heads, TREE, backbone.device)
    draft = draft_function(step, True, backbone.device)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for i in range(3):
            hidden = torch.randn(heads.hidden_size, generator=g)
            root = torch.tensor(5 + i)
            ref = (
                heads(hidden, depth=3, root=root).topk(2, dim=-1).indices
            )  # what the proposer drafted before
            want = heads.to_target(ref).view(-1)[TREE.medusa_index(backbone.device)[0]]
            got = draft(hidden, root)
            assert torch.equal(got, want) and torch.equal(step(hidden, root), want)


def test_a_draft_that_fails_to_compile_runs_eagerly(monkeypatch):
    def broken(fn, device):
        def run(*args):
            raise RuntimeError("no compiler today")

        return run

    monkeypatch.setattr(medusa.compiled, "compiled_function", broken)
    backbone = tiny_backbone()
    heads = perturbed_heads(backbone).eval()
    step = DraftStep(heads, TREE, backbone.device)
    draft = draft_function(step, True, backbone.device)
    hidden = torch.randn(heads.hidden_size)
    with pytest.warns(
        UserWarning, match="compiling the Medusa draft step failed .*no compiler today.*eagerly"
    ):
        first = draft(hidden, None)
    assert torch.equal(first, step(hidden, None))
    assert torch.equal(draft(hidden, None), first)  # no second warning: eager from then on
