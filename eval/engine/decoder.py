"""The built-in speculative decoder: one `Decoder` for every method, batch size 1, over a preallocated KV cache.

One step (Leviathan et al. 2023; Medusa, Cai et al. 2024, Sec. 2.1.2): the method proposes a tree of candidate
tokens below the root (the last emitted token); ONE target forward over root + candidates with a tree attention
mask gives the target's distribution after every node; an acceptance rule (`headstart.eval.engine.acceptance`) picks
the accepted path plus one bonus token; the path's K/V are compacted into place in the cache. 'vanilla' is the
same loop with no candidates (one token per target forward), so every speedup is measured against the same code.

Greedy (temperature 0) and sampling without `typical` are lossless: greedy output equals vanilla greedy output
token for token, sampled output is distributed as the target's (tests/eval/). Stops right after an EOS token,
never emits more than max_new_tokens.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from headstart.eval.engine.acceptance import (
    greedy_tree,
    sample_chain,
    sample_tree,
    target_probs,
    typical_tree,
)
from headstart.eval.engine.kv_cache import CacheFullError
from headstart.eval.engine.proposers import TREE_METHODS, VANILLA, proposer_config
from headstart.eval.engine.proposers.base import Draft, Proposer, ProposerConfig, Sampling
from headstart.eval.engine.proposers.lookup_branch import LookupBranch
from headstart.eval.engine.proposers.lookup_choice import LookupChoice
from headstart.eval.engine.runner import ModelRunner
from headstart.eval.engine.tree import Tree
from headstart.models.backbone import eos_token_ids

log = logging.getLogger("headstart.eval")


@dataclass
class DecodeStats:
    new_tokens: int = 0  # tokens generated (excluding prompt): 1 from the prefill + sum(accepted_per_step)
    target_forwards: int = 0  # target forwards after the prefill (one per verify step / vanilla step)
    accepted_per_step: list[int] = field(default_factory=list)  # emitted per target forward, bonus included
    # [i] = steps in which draft position i (0-based) was accepted / in which a draft for position i existed
    accepted_by_position: list[int] = field(default_factory=list)
    proposed_by_position: list[int] = field(default_factory=list)
    time_s: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("prefill", "draft", "verify", "bookkeeping", "total"), 0.0)
    )
    step_latency_s: list[float] = field(default_factory=list)  # per step: draft + verify + bookkeeping

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target forward after the prefill (Spec-Bench's mean accepted tokens, bonus
        counted): sum(accepted_per_step) / target_forwards. The prefill's token is not counted, so vanilla is
        exactly 1.0; 1.0 when no step ran. Aggregate over prompts by summing both, not by averaging taus."""
        return sum(self.accepted_per_step) / self.target_forwards if self.target_forwards else 1.0


@dataclass
class GenerateOutput:
    tokens: list[int]  # generated ids (prompt excluded); ends with EOS if one was produced
    stats: DecodeStats


class Decoder:
    """One interface for every decoding method: vanilla (`proposer=None` or "vanilla") or the typed config of a
    proposer of eval/engine/proposers/ (`MedusaOptions`, `EagleOptions` / `Eagle3Options`, `DraftOptions`,
    `PromptLookupOptions`, `LookaheadOptions`: the drafter or draft LM and the proposer's options, documented
    there). A method name alone builds that proposer's config with its defaults (`Decoder(backbone, "prompt_lookup")`).
    `lookup_tokens` (medusa, eagle, eagle3; 0 = off) adds up to that many prompt-lookup tokens to the drafter's
    tree each step (proposers/lookup_branch.py), verified in the same forward; with `lookup_min_match=m` the
    step verifies EITHER the drafter's draft or the lookup chain, the latter when its n-gram match is at least m
    tokens (proposers/lookup_choice.py: the rule headstart's vLLM plugin serves), and with `lookup_max_tokens` that
    chain grows with its match, up to that many tokens (suffix decoding's rule); with `lookup_min_score=s` instead
    of a min_match, suffix decoding's own draft of up to lookup_tokens (prompt and earlier replies' suffix trees)
    whenever it scores at least s (eval/engine/suffix_lookup.py; the plugin's `source: "suffix"`); with
    `lookup_drafter_floor` a request's min_match drops to 1 once its drafter averages under that many accepted
    drafts a step (eval/engine/drafter_floor.py).
    `typical=True` (medusa, temperature > 0) uses Medusa's typical acceptance, which is LOSSY. `cuda_graphs`
    (default: True on CUDA) captures each verify width in a CUDA graph; the first generate() of each width pays
    the capture. `compile` ("eager" | "auto" | "max-autotune", eval/engine/compiled.py) runs the plain and the
    verify step through torch.compile instead: the first generate() compiles both widths (minutes on a CPU, then
    cached on disk).
    """

    def __init__(
        self,
        backbone,
        proposer: ProposerConfig | str | None = None,
        *,
        typical: bool = False,
        max_cache_len: int = 2048,
        device=None,
        cuda_graphs: bool | None = None,
        lookup_tokens: int = 0,
        lookup_min_match: int | None = None,
        lookup_max_tokens: int | None = None,
        lookup_min_score: float | None = None,
        lookup_drafter_floor: float | None = None,
        compile: str = "eager",
    ) -> None:
        config = proposer_config(proposer) if isinstance(proposer, str) else proposer
        method = VANILLA if config is None else config.method
        self.device = torch.device(device) if device is not None else backbone.device
        if self.device.type != backbone.device.type or (
            self.device.index is not None and self.device != backbone.device
        ):
            backbone.to(self.device)
        self.backbone, self.method, self.typical = backbone, method, typical
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.max_cache_len = max_cache_len
        self.runner = ModelRunner(backbone, max_cache_len, self.cuda_graphs, compile)
        if lookup_max_tokens is not None and (not lookup_tokens or lookup_min_match is None):
            raise ValueError(
                f"lookup_max_tokens={lookup_max_tokens} applies to the lookup chain choice only. "
                "Fix: set lookup_tokens and lookup_min_match too, or drop lookup_max_tokens"
            )
        chooser = None  # the setting that makes the step choose between the drafter's chain and the lookup's
        if lookup_min_match is not None or lookup_min_score is not None:
            chooser = f"lookup_min_match={lookup_min_match}" if lookup_min_score is None else f"lookup_min_score={lookup_min_score}"  # fmt: skip
        if lookup_drafter_floor is not None and lookup_min_match is None:
            raise ValueError(
                f"lookup_drafter_floor={lookup_drafter_floor} lowers lookup_min_match per request. "
                "Fix: set lookup_tokens and lookup_min_match too, or drop lookup_drafter_floor"
            )
        if chooser is not None and not lookup_tokens:
            raise ValueError(
                f"{chooser} needs lookup_tokens >= 1 (the lookup chain's length). Fix: set lookup_tokens, or drop "
                f"{chooser.split('=')[0]}"
            )
        self.proposer: Proposer | None = None if config is None else config.make(self)
        if lookup_tokens:
            if method not in TREE_METHODS:
                raise ValueError(
                    f"lookup_tokens applies to methods with a draft tree {list(TREE_METHODS)}, not {method!r}. "
                    "Fix: lookup_tokens=0"
                )
            if chooser is None:
                self.proposer = LookupBranch(self.proposer, lookup_tokens, self.device)
            else:
                self.proposer = LookupChoice(
                    self.proposer,
                    lookup_min_match,
                    lookup_tokens,
                    self.device,
                    max_tokens=lookup_max_tokens,
                    min_score=lookup_min_score,
                    drafter_floor=lookup_drafter_floor,
                )
        self.runner.compile_widths = {1, *verify_widths(self.proposer)}  # the rest: eager
        self.eos_token_ids = eos_token_ids(backbone)
        self._sync = torch.cuda.synchronize if self.device.type == "cuda" else _no_sync

    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        eos_token_ids: list[int] | None = None,
    ) -> GenerateOutput:
        if not prompt_ids:
            raise ValueError("generate() needs a non-empty prompt")
        if max_new_tokens < 1:
            return GenerateOutput([], DecodeStats())
        width = self.proposer.width if self.proposer else 1
        need = len(prompt_ids) + max_new_tokens + width
        if need > self.max_cache_len:
            raise CacheFullError(
                f"prompt of {len(prompt_ids)} tokens + max_new_tokens={max_new_tokens} + verify width {width} "
                f"needs {need} cache positions > max_cache_len={self.max_cache_len}; nothing is truncated. "
                "Fix: Decoder(max_cache_len=...) or a shorter prompt / max_new_tokens"
            )
        limit = getattr(self.backbone.config, "max_position_embeddings", None)
        if limit and len(prompt_ids) + max_new_tokens > limit:
            log.warning(
                "prompt of %d tokens + max_new_tokens=%d passes the backbone's position limit "
                "(max_position_embeddings=%d): tokens past it are decoded at positions the model was not trained "
                "on and may be garbage. Fix: a shorter prompt or max_new_tokens",
                len(prompt_ids),
                max_new_tokens,
                limit,
            )
        generator = torch.Generator(device=self.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        sampling = Sampling(temperature, top_p, generator)
        eos = set(self.eos_token_ids if eos_token_ids is None else eos_token_ids)
        with torch.inference_mode():
            return self._generate(list(prompt_ids), max_new_tokens, sampling, eos)

    def _pick(self, logits: torch.Tensor, sampling: Sampling) -> int:
        if sampling.greedy:
            return int(logits.argmax())
        probs = target_probs(logits, sampling.temperature, sampling.top_p)
        return int(torch.multinomial(probs, 1, generator=sampling.generator))

    def _generate(self, prompt: list[int], max_new: int, sampling: Sampling, eos: set[int]) -> GenerateOutput:
        stats, runner, proposer, clock = DecodeStats(), self.runner, self.proposer, time.perf_counter
        t0 = clock()
        runner.cache.reset()
        hidden, logits = runner.prefill(prompt)
        out = [self._pick(logits, sampling)]
        if proposer is not None:
            proposer.start(prompt, hidden)
        context = prompt + out
        self._sync()
        t_prev = clock()
        stats.time_s["prefill"] = t_prev - t0
        widths = verify_widths(proposer)
        done = out[0] in eos or max_new == 1
        while not done:
            draft = proposer.propose(context, sampling) if proposer is not None else None
            self._sync()
            t_draft = clock()
            root = torch.tensor([context[-1]], device=self.device)
            if draft is None:  # plain step: one token
                hidden, logits = runner.step(root, last_only=True)
                self._sync()
                t_verify = clock()
                path, bonus, tokens = [0], self._pick(logits[0], sampling), [context[-1]]
                runner.cache.commit(1)
            else:
                ids = torch.cat([root, draft.tokens])  # (N,) root + candidates
                verify_tree = draft.tree
                if runner.fixed_shapes and draft.tree.size not in widths:  # fixed shapes: pad
                    width = next(w for w in widths if w > draft.tree.size)
                    verify_tree = draft.tree.padded(width)
                    ids = torch.cat([ids, ids.new_zeros(width - draft.tree.size)])
                hidden, logits = runner.step(ids, verify_tree)
                self._sync()
                t_verify = clock()
                tokens = ids[: draft.tree.size].tolist()
                path, bonus = self._accept(tokens, draft, logits[: draft.tree.size], sampling)
                runner.cache.accept(path)
                self._count_positions(stats, draft.tree, len(path) - 1)
                if hasattr(proposer, "verified"):  # optional hook (proposers/base.py): the verify logits
                    proposer.verified(logits)
            if proposer is not None:
                proposer.accepted(path, hidden)
            emitted = [tokens[i] for i in path[1:]] + [bonus]
            for n, token in enumerate(emitted, start=1):  # stop after EOS / at the length limit
                if token in eos or len(out) + n == max_new:
                    emitted, done = emitted[:n], True
                    break
            out += emitted
            context += emitted
            stats.target_forwards += 1
            stats.accepted_per_step.append(len(emitted))
            self._sync()
            t_end = clock()
            stats.time_s["draft"] += t_draft - t_prev
            stats.time_s["verify"] += t_verify - t_draft
            stats.time_s["bookkeeping"] += t_end - t_verify
            stats.step_latency_s.append(t_end - t_prev)
            t_prev = t_end
        stats.new_tokens = len(out)
        stats.time_s["total"] = t_prev - t0
        return GenerateOutput(out, stats)

    def _accept(
        self, tokens: list[int], draft: Draft, logits: torch.Tensor, sampling: Sampling
    ) -> tuple[list[int], int]:
        parents = draft.tree.parents
        if sampling.greedy:
            return greedy_tree(tokens, list(parents), logits.argmax(-1).tolist())
        probs = target_probs(logits, sampling.temperature, sampling.top_p)  # (N, V)
        if self.typical:
            return typical_tree(tokens, list(parents), probs, sampling.generator)
        if draft.probs is not None:  # a chain sampled from a draft model
            n, bonus = sample_chain(draft.tokens, draft.probs, probs, sampling.generator)
            return list(range(n + 1)), bonus
        return sample_tree(tokens, list(parents), probs, sampling.generator)

    @staticmethod
    def _count_positions(stats: DecodeStats, tree: Tree, accepted: int) -> None:
        depth = tree.max_depth
        for counts in (stats.proposed_by_position, stats.accepted_by_position):
            counts.extend([0] * (depth - len(counts)))
        for i in range(depth):
            stats.proposed_by_position[i] += 1
        for i in range(accepted):
            stats.accepted_by_position[i] += 1


def _no_sync() -> None:
    pass


def verify_widths(proposer: Proposer | None) -> tuple[int, ...]:
    """The widths a fixed-shape decoder (compiled, CUDA graphs) verifies at, one graph each: a tree is padded to
    the smallest that holds it (proposers/base.py: `widths`, default the proposer's `width` alone)."""
    if proposer is None:
        return (1,)
    return getattr(proposer, "widths", (proposer.width,))


def build_decoder(
    method: str,
    backbone,
    checkpoint_dir=None,
    *,
    typical: bool = False,
    max_cache_len: int = 2048,
    device=None,
    cuda_graphs: bool | None = None,
    lookup_tokens: int = 0,
    lookup_min_match: int | None = None,
    lookup_max_tokens: int | None = None,
    lookup_min_score: float | None = None,
    lookup_drafter_floor: float | None = None,
    compile: str = "eager",
    **options,
) -> Decoder:
    """A Decoder for `method`. `checkpoint_dir`: the drafter the method serves, as a `LoadedDrafter`
    (models/checkpoint.py; the caller read its config.json once) or a drafter folder (loaded here, once). Its
    `serving()` options (the drafter, a draft LM, measured head accuracies) are added unless given in `options`:
    the proposer's options by name, as the tuner and decoding.json keep them, typed here (`proposer_config`)."""
    from headstart.models.checkpoint import LoadedDrafter, load_drafter
    from headstart.models.registry import METHODS

    loaded = checkpoint_dir
    if loaded is not None and not isinstance(loaded, LoadedDrafter):
        loaded = LoadedDrafter(*load_drafter(loaded, backbone), Path(loaded))
    if loaded is not None:
        served = loaded.drafter.serving(backbone, loaded.meta)
        options = {**{k: v for k, v in served.items() if v is not None}, **options}
    elif (
        method in {m.proposer for m in METHODS.values()}
        and not {"drafter", "draft_backbone"} & options.keys()
    ):
        raise ValueError(f"method {method!r} needs checkpoint_dir= (a drafter folder written by train/)")
    config = proposer_config(method, **options)
    return Decoder(backbone, config, typical=typical, max_cache_len=max_cache_len, device=device,
                   cuda_graphs=cuda_graphs, lookup_tokens=lookup_tokens, lookup_min_match=lookup_min_match,
                   lookup_max_tokens=lookup_max_tokens, lookup_min_score=lookup_min_score,
                   lookup_drafter_floor=lookup_drafter_floor, compile=compile)  # fmt: skip
