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

import time
from dataclasses import dataclass, field

import torch

from headstart.eval.engine.acceptance import greedy_tree, sample_chain, sample_tree, target_probs, typical_tree
from headstart.eval.engine.kv_cache import CacheFullError
from headstart.eval.engine.proposers.base import Draft, Proposer, Sampling
from headstart.eval.engine.runner import ModelRunner
from headstart.eval.engine.tree import Tree, default_tree, tree_from_accuracy, tree_from_paths

METHODS = ("vanilla", "medusa", "draft", "prompt_lookup", "eagle", "eagle3")
DEFAULT_TREE_NODES = 63  # Medusa's default budget (mc_sim_7b_63), for GPUs
# On a CPU a verify forward of 4-8 tokens costs about one step, 16 already ~1.5 steps (SmolLM2-135M, bf16):
# measured speedup peaked at 3-6 nodes for the CPU-trained heads (tau ~1.4), so CPU runs default to 4.
CPU_TREE_NODES = 4
DRAFT_TOKENS = 4  # prompt_lookup / draft: tokens proposed per step
# EAGLE-2's dynamic tree as (depth, nodes, top-k): EAGLE-2's own defaults on GPUs. On a CPU each drafter level
# costs ~1/6 of a SmolLM2-135M forward, so deep trees lose: measured on the dev prompts (1 thread, bf16), the
# EAGLE-3 drafter went from 1.02x at (4, 8, 8) to 1.18x at (2, 6, 4), EAGLE-1 from 0.82x to 1.01x.
EAGLE_TREE, CPU_EAGLE_TREE = (5, 60, 10), (2, 6, 4)


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
    """One interface for every method: 'vanilla', 'medusa', 'draft', 'prompt_lookup', 'eagle'/'eagle3'.

    medusa: `drafter` = MedusaHeads; `tree` = a `Tree`, a list of top-k rank paths, "chain" (top-1 of every
    head), "default" (Medusa's mc_sim_7b_63 cut to `tree_nodes` and to the heads' depth) or None (the tree
    built from `head_accuracy` if given, else "default"). draft: `draft_backbone` proposes `num_draft_tokens`.
    prompt_lookup: up to `num_draft_tokens` tokens from n-grams of up to `max_ngram`. eagle/eagle3: `drafter` =
    EagleDrafter; EAGLE-2's dynamic tree of `tree_nodes` nodes, `num_draft_tokens` levels deep, expanding the
    `topk` most confident nodes per level (defaults: EAGLE_TREE on CUDA, CPU_EAGLE_TREE on CPU). None = the
    method's default.
    `typical=True` (medusa,
    temperature > 0) uses Medusa's typical acceptance, which is LOSSY. `cuda_graphs` (default: True on CUDA)
    captures each verify width in a CUDA graph; the first generate() of each width pays the capture.
    """

    def __init__(
        self,
        backbone,
        method: str = "vanilla",
        drafter=None,
        *,
        draft_backbone=None,
        tree=None,
        num_draft_tokens: int | None = None,
        typical: bool = False,
        max_cache_len: int = 2048,
        device=None,
        tree_nodes: int | None = None,
        head_accuracy: list[list[float]] | None = None,
        max_ngram: int = 3,
        cuda_graphs: bool | None = None,
        topk: int | None = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"unknown decoding method {method!r}: expected one of {list(METHODS)}")
        self.device = torch.device(device) if device is not None else backbone.device
        if self.device.type != backbone.device.type or (
            self.device.index is not None and self.device != backbone.device
        ):
            backbone.to(self.device)
        self.backbone, self.method, self.typical = backbone, method, typical
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.max_cache_len = max_cache_len
        self.runner = ModelRunner(backbone, max_cache_len, self.cuda_graphs)
        self.proposer: Proposer | None = self._make_proposer(
            drafter, draft_backbone, tree, num_draft_tokens, tree_nodes, head_accuracy, max_ngram, topk
        )
        self.eos_token_ids = _default_eos(backbone)
        self._sync = torch.cuda.synchronize if self.device.type == "cuda" else _no_sync

    def _make_proposer(self, drafter, draft_backbone, tree, k, tree_nodes, head_accuracy, max_ngram, topk):
        if self.method == "vanilla":
            return None
        if self.method == "medusa":
            from headstart.eval.engine.proposers.medusa import MedusaProposer

            if drafter is None:
                raise ValueError("method 'medusa' needs drafter= (MedusaHeads), e.g. from build_decoder()")
            drafter.to(self.device)
            if tree_nodes is None:
                tree_nodes = DEFAULT_TREE_NODES if self.device.type == "cuda" else CPU_TREE_NODES
            tree = _medusa_tree(tree, len(drafter.blocks), tree_nodes, head_accuracy)
            return MedusaProposer(drafter, tree, self.device)
        if self.method == "draft":
            from headstart.eval.engine.proposers.draft_model import DraftModelProposer, check_same_tokenizer

            if draft_backbone is None:
                raise ValueError("method 'draft' needs draft_backbone= (a Backbone with the same tokenizer)")
            check_same_tokenizer(self.backbone, draft_backbone)
            draft_backbone.to(self.device)
            return DraftModelProposer(
                draft_backbone,
                k or DRAFT_TOKENS,
                self.backbone.vocab_size,
                self.device,
                self.max_cache_len,
                self.cuda_graphs,
            )
        if self.method == "prompt_lookup":
            from headstart.eval.engine.proposers.prompt_lookup import PromptLookupProposer

            return PromptLookupProposer(k or DRAFT_TOKENS, self.device, max_ngram)
        if self.method in ("eagle", "eagle3"):  # EAGLE-1 or EAGLE-3 drafter, EAGLE-2 dynamic tree
            from headstart.eval.engine.proposers.eagle import EagleProposer

            if drafter is None:
                raise ValueError(
                    f"method {self.method!r} needs drafter= (an EagleDrafter), e.g. build_decoder()"
                )
            drafter.to(self.device)
            # target features are read through hooks, which graph replays skip
            self.runner.cuda_graphs = False
            depth, nodes, width = EAGLE_TREE if self.device.type == "cuda" else CPU_EAGLE_TREE
            return EagleProposer(
                drafter, self.backbone, self.device, k or depth, tree_nodes or nodes, topk or width
            )
        raise AssertionError(f"method {self.method!r} is in METHODS but has no proposer")

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
                if runner.cuda_graphs and draft.tree.size < proposer.width:  # fixed shapes: pad
                    verify_tree = draft.tree.padded(proposer.width)
                    ids = torch.cat([ids, ids.new_zeros(proposer.width - draft.tree.size)])
                hidden, logits = runner.step(ids, verify_tree)
                self._sync()
                t_verify = clock()
                tokens = ids[: draft.tree.size].tolist()
                path, bonus = self._accept(tokens, draft, logits[: draft.tree.size], sampling)
                runner.cache.accept(path)
                self._count_positions(stats, draft.tree, len(path) - 1)
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


def _default_eos(backbone) -> list[int]:
    ids = getattr(getattr(backbone.model, "generation_config", None), "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    tok_eos = getattr(backbone.tokenizer, "eos_token_id", None)
    return sorted(set(ids) | ({tok_eos} if tok_eos is not None else set()))


def _medusa_tree(tree, num_heads: int, tree_nodes: int | None, head_accuracy) -> Tree:
    if isinstance(tree, Tree):
        return tree
    if tree == "chain":
        return tree_from_paths([[0] * d for d in range(1, num_heads + 1)])
    if tree is None and head_accuracy is not None:
        return tree_from_accuracy(head_accuracy[:num_heads], tree_nodes or DEFAULT_TREE_NODES)
    if tree is None or tree == "default":
        return default_tree(num_heads, tree_nodes or DEFAULT_TREE_NODES)
    if isinstance(tree, str):
        raise ValueError(f"tree={tree!r}: expected a Tree, a list of paths, 'chain', 'default' or None")
    return tree_from_paths(tree)


def build_decoder(method: str, backbone, checkpoint_dir: str | None = None, **opts) -> Decoder:
    """A Decoder for `method`; loads the drafter (and its measured head accuracies, used for the tree unless
    `tree` is given) from a headstart checkpoint folder when the method needs one. method "draft" without
    `draft_backbone` takes the draft LM of a DistillSpec checkpoint, frozen, in the target's dtype. Other
    methods without a trained drafter ignore `checkpoint_dir`."""
    drafter = None
    if method == "draft" and opts.get("draft_backbone") is None and checkpoint_dir is not None:
        from headstart.models.backbone import Backbone
        from headstart.models.checkpoint import load_drafter

        distilled, meta = load_drafter(checkpoint_dir, backbone)
        if meta["method"] != "distillspec":
            raise ValueError(f"{checkpoint_dir} holds a {meta['method']!r} drafter, not a distillspec draft")
        draft = distilled.draft.to(backbone.dtype)  # served like the target (bf16 on a bf16 target)
        opts["draft_backbone"] = Backbone(draft, backbone.tokenizer, name=f"distillspec:{checkpoint_dir}")
    if method in ("medusa", "eagle", "eagle3"):
        from headstart.models.checkpoint import load_drafter

        if checkpoint_dir is None:
            raise ValueError(f"method {method!r} needs checkpoint_dir= (a drafter folder written by train/)")
        drafter, meta = load_drafter(checkpoint_dir, backbone)
        if meta["method"] != method and {meta["method"], method} != {"eagle", "eagle3"}:
            raise ValueError(f"{checkpoint_dir} holds a {meta['method']!r} drafter, not {method!r}")
        if method != "medusa":  # served in the target's dtype (bf16 on a bf16 target), like a draft model
            drafter = drafter.to_serving_dtype(backbone.dtype)
        if meta.get("head_topk_accuracy") and "head_accuracy" not in opts:
            opts["head_accuracy"] = meta["head_topk_accuracy"]
    return Decoder(backbone, method, drafter, **opts)
