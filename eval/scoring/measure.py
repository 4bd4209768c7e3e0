"""Score speculative decoders (the drafter and training-free baselines) against vanilla decoding on a prompt set:
every side decodes every turn back to back (the order rotating, each side continuing its own conversation), the
turns are re-timed in rounds until every median ratio is pinned down (eval/timing/harness.py), and each figure is checked
against the step costs (eval/timing/bounds.py). Vanilla runs once for all sides. The CPU thread count is chosen for the
run (`choose_threads`) and restored afterwards.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from headstart.eval.engine.quick import summarize_turns
from headstart.eval.scoring.score import (
    FIRST_PASS_DROPPED,
    GenOpts,
    answer,
    check_fits,
    decode_turn,
    tau_of,
)
from headstart.eval.stage.prompts import Prompt, chat_ids
from headstart.eval.timing.bounds import check, predict, step_costs, verify_shape
from headstart.eval.timing.harness import (
    Interleaved,
    Sample,
    TimingConfig,
    choose_threads,
    conditions,
    finish_conditions,
)
from headstart.models.backbone import eos_token_ids


def _sample(turn: dict) -> Sample:
    st = turn["stats"]
    return Sample(len(turn["tokens"]), turn["wall_s"], st.target_forwards + 1, dict(st.time_s))


def score_prompts(
    vanilla,
    specs: dict,
    backbone,
    prompts: list[Prompt],
    opts: GenOpts,
    warmup: int = 1,
    on_prompt=None,
    timing: TimingConfig | None = None,
) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """Vanilla and every speculative decoder in `specs` ({name: decoder}: the drafter, training-free
    baselines) turn by turn, the order rotating (eval/timing/harness.py), each side continuing its own conversation;
    then the turns re-timed in rounds until every median ratio is pinned down, and each figure checked
    against the step costs (eval/timing/bounds.py). Vanilla runs once for all of them, in the same rounds, so the
    drafter and the baselines are measured side by side against one reference. -> per name: one record per
    prompt (vanilla's and that side's tokens and stats of the first pass, under "vanilla" / "spec") and its
    timing report (ratios per unit, costs, checks, conditions)."""
    if not specs or "vanilla" in specs:
        raise ValueError(
            f"score_prompts: speculative decoders other than vanilla expected, got {list(specs)}"
        )
    timing = timing or TimingConfig()
    threads_before = torch.get_num_threads()
    try:  # the thread count is this eval's choice; the caller's is restored afterwards
        threads = choose_threads(timing.threads) if backbone.device.type == "cpu" else None
        return _score(vanilla, specs, backbone, prompts, opts, warmup, on_prompt, timing, threads)
    finally:
        torch.set_num_threads(threads_before)


def _score(
    vanilla, specs, backbone, prompts, opts, warmup, on_prompt, timing, threads
) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    cond = conditions(backbone.device, str(backbone.dtype).removeprefix("torch."))
    decoders = {"vanilla": vanilla, **specs}
    for p in prompts[:warmup]:  # untimed: kernels, allocator and caches warm on every path
        short = replace(opts, max_new_tokens=min(opts.max_new_tokens, 16))
        for dec in decoders.values():
            answer(dec, backbone, Prompt(p.question_id, p.category, p.turns[:1]), short, opts.seed)
    timer = Interleaved(list(decoders), "vanilla", timing)
    units, records = _first_pass(decoders, timer, backbone, prompts, opts, on_prompt)
    eos, device = eos_token_ids(backbone), backbone.device
    first_pass = "timed"
    if any(dec.runner.compiled for dec in decoders.values()):
        # the first pass compiled each (width, cache bucket) as a decode first reached it, inside its timing:
        # its times are dropped and round 0 is timed again over graphs that are all built
        timer.samples.clear()
        first_pass = FIRST_PASS_DROPPED

    def rerun(side: str, u: int) -> Sample:
        unit = units[u]
        return _sample(decode_turn(decoders[side], unit["ids"][side], opts, unit["seed"], eos, device))

    timer.run(rerun, len(units))
    context = sorted(units, key=lambda u: len(u["ids"]["vanilla"]))[len(units) // 2]["ids"]["vanilla"]
    context = (context * 2)[: len(context) + opts.max_new_tokens // 2]  # a mid-answer cache length
    shapes = {side: verify_shape(dec) for side, dec in decoders.items()}
    for attempt in range(2):  # a figure that fails a check is re-measured once (every side), then flagged
        compiled = {side: dec.runner.compiles(shapes[side][0]) for side, dec in decoders.items()}
        cache_len = max(dec.max_cache_len for dec in decoders.values())  # the compiled graphs' shape
        costs = step_costs(backbone, shapes, context, timing.cost_reps, compiled, cache_len)
        figures = {name: _figure(timer, name, costs, records[name], timing) for name in specs}
        if not any(f[3]["flags"] for f in figures.values()) or attempt:
            break
        rnd = timer.n_rounds()  # one more round of every unit, its outliers re-timed
        for u in range(len(units)):
            timer.time_unit(rerun, u, rnd)
        timer.retime_outliers(rerun, time.perf_counter() + timing.budget_s)
        timer.rounds = timer.n_rounds()
    unit_of = {u: (x["prompt"], x["turn"]) for u, x in enumerate(units)}
    done = {**finish_conditions(cond), "threads_chosen": threads}
    reports = {}
    for name, (pair, pair_costs, pred, checks) in figures.items():
        reports[name] = {
            **pair.report(),
            "units": [
                {"prompt": p, "turn": t, "ratios": pair.ratios("spec", {u}), "timed": pair.totals(u)}
                for u, (p, t) in unit_of.items()
            ],
            "step_ms": {k: 1000 * c for k, c in pair_costs.items()},
            "verify_width": shapes[name][0],
            "sides": list(decoders),  # every decoder timed in these rounds
            "first_pass": first_pass,
            **pred,
            **checks,
            "conditions": done,
        }
    return records, reports


def _figure(timer: Interleaved, name: str, costs: dict, records: list[dict], timing: TimingConfig) -> tuple:
    """Side `name` against vanilla: (the timed pair, its step costs, the predicted speedup, the checks)."""
    pair = timer.pair(name, "spec")  # vanilla and this side, this side named "spec"
    pair_costs = {"vanilla": costs["vanilla"], "spec": costs[name]}
    pred = predict(pair, pair_costs)
    speedup = pair.summary("spec")["median"]
    outliers = len(pair.outliers) / len(pair.samples)
    checks = check(speedup, tau_of(records), pair_costs, pred, outliers, timing.bound_tol)
    return pair, pair_costs, pred, checks


def _first_pass(
    decoders: dict, timer: Interleaved, backbone, prompts: list[Prompt], opts: GenOpts, on_prompt
) -> tuple[list[dict], dict[str, list[dict]]]:
    """Every turn of every prompt decoded once by every side, the order rotating, each side continuing its own
    conversation. -> the timing units (prompt, turn, each side's ids, seed) and per speculative side one record
    per prompt (vanilla's and its tokens and stats, whether they match, its answers)."""
    tok, eos, device = backbone.tokenizer, eos_token_ids(backbone), backbone.device
    units: list[dict] = []
    records: dict[str, list[dict]] = {name: [] for name in decoders if name != "vanilla"}
    for i, p in enumerate(prompts):
        seed = opts.seed + 1000 * i
        messages: dict[str, list] = {side: [] for side in decoders}
        turns: dict[str, list] = {side: [] for side in decoders}
        for t, user in enumerate(p.turns):
            ids = {}
            for side in decoders:
                messages[side].append({"role": "user", "content": user})
                ids[side] = chat_ids(tok, messages[side])
                check_fits(len(ids[side]), opts, f"prompt {p.question_id!r} turn {t + 1}")
            units.append({"prompt": i, "turn": t, "ids": ids, "seed": seed + t})
            for side in timer.order(len(units) - 1, 0):
                turns[side].append(decode_turn(decoders[side], ids[side], opts, seed + t, eos, device))
            timer.add(len(units) - 1, 0, {side: _sample(turns[side][-1]) for side in decoders})
            for side in decoders:
                text = tok.decode(turns[side][-1]["tokens"], skip_special_tokens=True)
                messages[side].append({"role": "assistant", "content": text})
        v = turns["vanilla"]
        for name, recs in records.items():
            s = turns[name]
            recs.append(
                {
                    "question_id": p.question_id,
                    "category": p.category,
                    "match": all(a["tokens"] == b["tokens"] for a, b in zip(v, s)),
                    "vanilla": summarize_turns(v),
                    "spec": summarize_turns(s),
                    "answers": [tok.decode(t["tokens"], skip_special_tokens=True) for t in s],
                }
            )
        if on_prompt is not None:
            on_prompt(i + 1, len(prompts))
    return units, records
