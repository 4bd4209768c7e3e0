"""Measure a speculative decoder against vanilla decoding on the same prompts, in the same process.

Speedup is measured as in Spec-Bench (Xia et al. 2024, "Unlocking Efficiency in Large Language Model Inference"):
vanilla and speculative decoding through the same `Decoder` code path on the same prompts, after a warm-up. How
(eval/scoring/measure.py): turn by turn, back to back, in rounds; speedup = the median of the per-turn rate ratios, with
its 95% CI (eval/timing/harness.py), checked against the step costs (eval/timing/bounds.py). `speedup_of_totals` keeps
Spec-Bench's ratio of total rates (over the timed rounds when a compiled first pass is dropped).
tau (mean tokens emitted per target forward after the prefill, bonus token included; the decoder's
`DecodeStats.tau`, so vanilla is exactly 1) = sum(accepted_per_step) / target forwards, summed over prompts.

The cheap in-process version training calls every N steps is `eval/engine/quick.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from headstart.eval.engine.device import sync
from headstart.eval.engine.quick import add_lists
from headstart.eval.engine.quick import ratio as _ratio
from headstart.eval.errors import EvalError
from headstart.eval.stage.prompts import Prompt, chat_ids
from headstart.eval.timing.harness import summarize
from headstart.models.backbone import eos_token_ids


@dataclass
class GenOpts:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_cache_len: int = 2048


def check_fits(n_prompt: int, opts: GenOpts, where: str) -> None:
    if n_prompt + opts.max_new_tokens > opts.max_cache_len:
        raise EvalError(
            f"{where}: {n_prompt} prompt tokens + max_new_tokens={opts.max_new_tokens} exceed the KV cache "
            f"(max_cache_len={opts.max_cache_len}). Fix: raise max_cache_len, lower max_new_tokens, or drop the prompt"
        )


def decode_turn(decoder, ids: list[int], opts: GenOpts, seed: int, eos: list[int], device) -> dict:
    """One timed generate() -> {tokens, stats (DecodeStats), wall_s}."""
    sync(device)
    start = time.perf_counter()
    out = decoder.generate(
        ids, opts.max_new_tokens, temperature=opts.temperature, top_p=opts.top_p, seed=seed, eos_token_ids=eos
    )
    sync(device)
    return {"tokens": list(out.tokens), "stats": out.stats, "wall_s": time.perf_counter() - start}


def answer(decoder, backbone, prompt: Prompt, opts: GenOpts, seed: int) -> list[dict]:
    """Answer every turn of `prompt`; each answer becomes the assistant message before the next user turn.
    Returns one dict per turn: tokens, stats (DecodeStats), wall_s."""
    tok, eos, device = backbone.tokenizer, eos_token_ids(backbone), backbone.device
    messages: list[dict[str, str]] = []
    turns = []
    for t, user in enumerate(prompt.turns):
        messages.append({"role": "user", "content": user})
        ids = chat_ids(tok, messages)
        check_fits(len(ids), opts, f"prompt {prompt.question_id!r} turn {t + 1}")
        turns.append(decode_turn(decoder, ids, opts, seed + t, eos, device))
        messages.append(
            {"role": "assistant", "content": tok.decode(turns[-1]["tokens"], skip_special_tokens=True)}
        )
    return turns


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def _percentile_ms(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q) * 1000) if values else None


def token_latencies(step_latency_s: list[float], accepted_per_step: list[int]) -> list[float]:
    """Per-token latency: a step's latency shared by the tokens it emitted, one value per token (a step that
    emitted 3 tokens in 30 ms gives three 10 ms tokens), so percentiles weigh tokens, not steps."""
    return [s / n for s, n in zip(step_latency_s, accepted_per_step) for _ in range(n) if n]


def _tps(records: list[dict], side: str) -> float:
    """Tokens per second of one side ("vanilla" | "spec") over records: total tokens / total wall time."""
    return _rate(sum(r[side]["new_tokens"] for r in records), sum(r[side]["wall_s"] for r in records))


def tau_of(records: list[dict]) -> float | None:
    return _ratio(
        sum(r["spec"]["step_tokens"] for r in records), sum(r["spec"]["target_forwards"] for r in records)
    )


# a compiled eval's first pass compiled each graph as a decode first reached it: its times are dropped and the
# rounds timed again (eval/scoring/measure.py); its records still give tau, outputs and latencies
FIRST_PASS_DROPPED = "dropped: it compiled the graphs"


def first_pass_dropped(timing: dict | None) -> bool:
    return bool(timing) and timing.get("first_pass") == FIRST_PASS_DROPPED


def _timed_tps(timing: dict, prompts: set[int] | None = None) -> dict[str, float] | None:
    """Tokens per second of each side over the timed rounds (of the units of `prompts`, all: None); None when
    the report has no per-unit totals."""
    units = [u for u in timing["units"] if prompts is None or u["prompt"] in prompts]
    if not units or any("timed" not in u for u in units):
        return None
    return {
        side: _rate(sum(u["timed"][side][0] for u in units), sum(u["timed"][side][1] for u in units))
        for side in ("vanilla", "spec")
    }


def _speedup(records: list[dict]) -> float | None:
    return _ratio(_tps(records, "spec"), _tps(records, "vanilla"))


def _unit_ratios(records: list[dict], timing: dict | None) -> list[tuple[int, float]]:
    """(record index, spec/vanilla rate ratio) per timed pair; without a timing report, one per record."""
    if timing is not None:
        return [(u["prompt"], x) for u in timing["units"] for x in u["ratios"]]
    return [(i, x) for i, r in enumerate(records) if (x := _speedup([r])) is not None]


def aggregate(records: list[dict], greedy: bool, timing: dict | None = None) -> dict:
    """Records (and the timing report) of `score_prompts` -> the report's metrics. speedup = median of the
    per-turn, per-round ratios (eval/timing/harness.py) with its 95% CI and IQR; tau and acceptance are totals over
    the first pass. A flagged speedup (timing["flags"]) is reported but never ranks a checkpoint."""
    fwd = sum(r["spec"]["target_forwards"] for r in records)
    accepted, proposed, times = [], [], {}
    for r in records:
        accepted = add_lists(accepted, r["spec"]["accepted_by_position"])
        proposed = add_lists(proposed, r["spec"]["proposed_by_position"])
        for k, t in r["spec"]["time_s"].items():
            times[k] = times.get(k, 0.0) + t
    total = times.get("total") or sum(t for k, t in times.items() if k != "total")
    ratios = _unit_ratios(records, timing)
    spread = summarize([x for _, x in ratios])
    tau, speedup = tau_of(records), spread["median"]
    rounds_only = first_pass_dropped(timing)  # then rates come from the timed rounds, not the first pass

    def tps(indices: set[int]) -> dict[str, float]:
        timed = _timed_tps(timing, indices) if rounds_only else None
        sub = [records[i] for i in sorted(indices)]
        return timed or {"vanilla": _tps(sub, "vanilla"), "spec": _tps(sub, "spec")}

    categories = {}
    for name in sorted({r["category"] for r in records}):
        indices = {i for i, r in enumerate(records) if r["category"] == name}
        sub = [records[i] for i in sorted(indices)]
        categories[name] = {
            "tau": tau_of(sub),
            "speedup": summarize([x for i, x in ratios if i in indices])["median"],
            "n": len(sub),
            "tokens_per_s": tps(indices),
        }

    def latency(side: str, per_token: bool = False) -> dict:
        steps = [(r[side]["step_latency_s"], r[side].get("accepted_per_step", [])) for r in records]
        if per_token:
            values = [x for lat, acc in steps for x in token_latencies(lat, acc)]
        else:
            values = [x for lat, _ in steps for x in lat]
        return {"p50": _percentile_ms(values, 50), "p99": _percentile_ms(values, 99)}

    rates = tps(set(range(len(records))))
    return {
        "tau": tau,
        "speedup": speedup,  # median over interleaved pairs, robust to load that hits a few of them
        "speedup_ci": spread["ci"],  # 95%, distribution-free
        "speedup_iqr": spread["iqr"],
        "speedup_pairs": spread["n"],
        # Spec-Bench's ratio of total rates: over the timed rounds where a compiled first pass was dropped (its
        # times hold the compilations), else over the first pass
        "speedup_of_totals": _ratio(rates["spec"], rates["vanilla"]),
        "speedup_flags": list(timing["flags"]) if timing else [],  # non-empty: never used to rank
        "predicted_speedup": timing["predicted_speedup"] if timing else None,
        "efficiency": _ratio(speedup, tau) if speedup is not None else None,  # speedup per accepted token
        "tokens_per_s": rates,
        "new_tokens": {side: sum(r[side]["new_tokens"] for r in records) for side in ("vanilla", "spec")},
        "target_forwards": fwd,
        # share of all steps in which draft position i was accepted (1 + their sum = tau, up to EOS cuts) ...
        "acceptance_by_position": [a / fwd if fwd else 0.0 for a in accepted],
        # ... and the acceptance rate given a draft existed at position i
        "acceptance_rate_by_position": [a / p if p else 0.0 for a, p in zip(accepted, proposed)],
        "categories": categories,
        "greedy_matches_vanilla": sum(r["match"] for r in records) / len(records)
        if greedy and records
        else None,
        "time_s": times,
        "time_split": {k: t / total for k, t in times.items() if k != "total" and total},
        "step_latency_ms": latency("spec"),
        "vanilla_step_latency_ms": latency("vanilla"),
        # per emitted token after the first (the prefill's token is the time to first token, not in here)
        "token_latency_ms": latency("spec", per_token=True),
        "vanilla_token_latency_ms": latency("vanilla", per_token=True),
    }
