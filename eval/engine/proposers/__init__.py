"""Proposers: what a decoding method drafts each step (the `Proposer` protocol in base.py). One module per
proposer, each with a `make(decoder, **options)` factory; the decoder looks the method up here. Trained
drafters name the proposer that serves them in the registry (models/registry.py)."""

from __future__ import annotations

PROPOSERS = {  # decoding method -> "module:factory" (imported on first use)
    "medusa": "headstart.eval.engine.proposers.medusa:make",
    "eagle": "headstart.eval.engine.proposers.eagle:make",
    "eagle3": "headstart.eval.engine.proposers.eagle:make",  # the same dynamic tree for EAGLE-3 drafters
    "draft": "headstart.eval.engine.proposers.draft_model:make",
    "prompt_lookup": "headstart.eval.engine.proposers.prompt_lookup:make",
}
# methods whose drafts are trees of deterministic candidates (Draft.probs None): a prompt-lookup branch can
# join their tree (lookup_branch.py); draft-model chains are sampled, prompt lookup is the branch itself
TREE_METHODS = ("medusa", "eagle", "eagle3")
DRAFT = "draft"  # a draft LM proposes (method=draft draft=<model>, or a DistillSpec checkpoint's draft)
VANILLA = (
    "vanilla"  # no proposer: one token per target forward (the baseline every speedup is measured against)
)
METHODS = (VANILLA, *PROPOSERS)


def chain_options(method: str, k: int, drafter) -> tuple[dict, int]:
    """Decoder options that make `method` draft a chain of k tokens (what vLLM's num_speculative_tokens=k
    drafts), and the chain length it can reach -> (options, k)."""
    from headstart.models.registry import resolve

    return resolve(PROPOSERS[method].partition(":")[0] + ":chain_options")(k, drafter)


def tuning(method: str, backbone, **served):
    """The proposer's hooks for the decoding tuner (eval/tuning/tuner.py: `table`, `probe`, `settings`, `chain`,
    `draft_steps`, `max_chain`) over the drafter's serving options, or None when the tuner has no model of it
    (draft models, prompt lookup: their hand-set defaults stay)."""
    import importlib

    make = getattr(importlib.import_module(PROPOSERS[method].partition(":")[0]), "tuning", None)
    return None if make is None else make(backbone, **served)
