"""Proposers: what a decoding method drafts each step (the `Proposer` protocol in base.py). One module per
proposer, each declaring its typed config (a `ProposerConfig`: the model it drafts with and its options, None =
the proposer's default) whose `make(decoder)` builds it; the decoder takes that config. Trained drafters name the
proposer that serves them in the registry (models/registry.py)."""

from __future__ import annotations

PROPOSERS = {  # decoding method -> "module:ProposerConfig subclass" (imported on first use)
    "medusa": "headstart.eval.engine.proposers.medusa:MedusaOptions",
    "eagle": "headstart.eval.engine.proposers.eagle:EagleOptions",
    "eagle3": "headstart.eval.engine.proposers.eagle:Eagle3Options",  # the same dynamic tree for EAGLE-3 drafters
    "draft": "headstart.eval.engine.proposers.draft_model:DraftOptions",
    "prompt_lookup": "headstart.eval.engine.proposers.prompt_lookup:PromptLookupOptions",
    "lookahead": "headstart.eval.engine.proposers.lookahead:LookaheadOptions",  # Jacobi window + n-gram pool
}
# methods whose drafts are trees of deterministic candidates (Draft.probs None): a prompt-lookup branch can
# join their tree (lookup_branch.py); draft-model chains are sampled, prompt lookup is the branch itself
TREE_METHODS = ("medusa", "eagle", "eagle3")
LOOKAHEAD = "lookahead"  # the baseline whose options (window, n-gram size, guesses) the eval config carries
TREE_NAMES = ("default", "chain")  # the named Medusa trees (`tree=`; proposers/medusa.py builds them)
DRAFT = "draft"  # a draft LM proposes (method=draft draft=<model>, or a DistillSpec checkpoint's draft)
VANILLA = (
    "vanilla"  # no proposer: one token per target forward (the baseline every speedup is measured against)
)
METHODS = (VANILLA, *PROPOSERS)


def proposer_config(method: str, **options):
    """The typed config of decoding `method` from options by name (a drafter's `serving()`, the tuner's and
    decoding.json's settings, the eval stage's keys), or None for vanilla. An option the method's config does
    not declare is refused with the ones it takes, not ignored."""
    from headstart.models.registry import resolve

    if method not in METHODS:
        raise ValueError(f"unknown decoding method {method!r}: expected one of {list(METHODS)}")
    if method == VANILLA:
        if options:
            raise ValueError(f"method 'vanilla' takes no proposer options, got {sorted(options)}")
        return None
    config = resolve(PROPOSERS[method])
    takes = config.option_names()
    if extra := sorted(set(options) - set(takes)):
        raise ValueError(
            f"{', '.join(extra)} do(es) not apply to method {method!r} (it takes {sorted(takes)})"
        )
    return config(**options)


def chain_options(method: str, k: int, drafter) -> tuple[dict, int]:
    """Decoder options that make `method` draft a chain of k tokens (what vLLM's num_speculative_tokens=k
    drafts), and the chain length it can reach -> (options, k)."""
    from headstart.models.registry import resolve

    return resolve(PROPOSERS[method].partition(":")[0] + ":chain_options")(k, drafter)


def stateless(method: str) -> bool:
    """Whether `method`'s proposer keeps nothing between steps (its module's STATELESS: Medusa's heads), so a step
    that verifies a lookup chain skips it (lookup_choice.py; vLLM with headstart's plugin); a drafter with a KV
    cache runs every step."""
    import importlib

    return getattr(importlib.import_module(PROPOSERS[method].partition(":")[0]), "STATELESS", False)


def tuning(method: str, backbone, **served):
    """The proposer's hooks for the decoding tuner (eval/tuning/tuner.py: `table`, `probe`, `settings`, `chain`,
    `draft_steps`, `max_chain`) over the drafter's serving options, or None when the tuner has no model of it
    (draft models, prompt lookup: their hand-set defaults stay)."""
    import importlib

    make = getattr(importlib.import_module(PROPOSERS[method].partition(":")[0]), "tuning", None)
    return None if make is None else make(backbone, **served)
