"""A few greedy decodes of the drafter as it is now: what training measures every N steps
(`train.quick_eval_every`) and the sim-vs-measured analysis reads. No vanilla timing, no rounds: the eval stage
(eval/scoring/) does those. `summarize_turns` is shared with the stage's scoring."""

from __future__ import annotations

import time

import torch

from headstart.eval.engine.decoder import Decoder
from headstart.eval.engine.device import sync
from headstart.eval.engine.proposers import proposer_config
from headstart.eval.errors import EvalError
from headstart.models import registry
from headstart.models.backbone import eos_token_ids


def add_lists(a: list, b: list) -> list:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def summarize_turns(turns: list[dict]) -> dict:
    """Sum a prompt's turns into plain numbers (JSON-friendly)."""
    s = {
        "new_tokens": 0,
        "step_tokens": 0,
        "target_forwards": 0,
        "wall_s": 0.0,
        "accepted_by_position": [],
        "proposed_by_position": [],
        "time_s": {},
        "step_latency_s": [],
        "accepted_per_step": [],  # tokens each step emitted: per-token latency = step latency / this
    }
    for turn in turns:
        st = turn["stats"]
        s["new_tokens"] += st.new_tokens
        s["step_tokens"] += sum(st.accepted_per_step)  # new_tokens minus the prefill's token
        s["target_forwards"] += st.target_forwards
        s["wall_s"] += turn["wall_s"]
        s["accepted_by_position"] = add_lists(s["accepted_by_position"], list(st.accepted_by_position))
        s["proposed_by_position"] = add_lists(s["proposed_by_position"], list(st.proposed_by_position))
        for k, v in st.time_s.items():
            s["time_s"][k] = s["time_s"].get(k, 0.0) + v
        s["step_latency_s"] += list(st.step_latency_s)
        s["accepted_per_step"] += list(st.accepted_per_step)
    return s


def ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


@torch.no_grad()
def quick_eval(
    backbone, drafter, method: str, prompts: list[list[int]], max_new_tokens: int, **decoder_opts
) -> dict:
    """Greedy-decode token-id prompts with the drafter as it is now (training calls this every N steps).
    `method` is the drafter's training method (a registry name); its proposer serves the drafter as it is
    (`serving(live=True)`: a DistillSpec draft LM in its own dtype, fp32 while training, not frozen).

    Returns tau, accept_by_position (share of steps accepting draft position i), acceptance_rate_by_position,
    new_tokens, target_forwards, tokens_per_s. The drafter's train/eval mode is restored afterwards."""
    if not prompts:
        raise EvalError("quick_eval needs at least one prompt")
    was_training = drafter.training if drafter is not None else False
    if drafter is not None:
        drafter.eval()
    try:
        # default cache: the longest prompt + answer, plus room for one step's verify tree
        cache = decoder_opts.pop("max_cache_len", max(len(p) for p in prompts) + max_new_tokens + 256)
        if drafter is None:  # a training-free method (vanilla, prompt_lookup) by its decoding name
            served, proposer = {}, method
        else:
            served = {k: v for k, v in drafter.serving(backbone, live=True).items() if v is not None}
            proposer = registry.proposer_of(method)
        config = proposer_config(proposer, **{**served, **decoder_opts})
        decoder = Decoder(backbone, config, max_cache_len=cache)
        eos = eos_token_ids(backbone)
        runs = []
        for ids in prompts:
            sync(backbone.device)
            start = time.perf_counter()
            out = decoder.generate(list(ids), max_new_tokens, temperature=0.0, eos_token_ids=eos)
            sync(backbone.device)
            runs.append({"tokens": out.tokens, "stats": out.stats, "wall_s": time.perf_counter() - start})
    finally:
        if drafter is not None:
            drafter.train(was_training)
    s = summarize_turns(runs)
    fwd = s["target_forwards"]
    return {
        "tau": ratio(s["step_tokens"], fwd),
        "accept_by_position": [a / fwd if fwd else 0.0 for a in s["accepted_by_position"]],
        "acceptance_rate_by_position": [
            a / p if p else 0.0 for a, p in zip(s["accepted_by_position"], s["proposed_by_position"])
        ],
        "new_tokens": s["new_tokens"],
        "target_forwards": fwd,
        "tokens_per_s": _rate(s["new_tokens"], s["wall_s"]),
    }
