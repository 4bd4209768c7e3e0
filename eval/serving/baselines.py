"""The serve check's yardstick: the drafter beside prompt lookup (no training at all) in both engines, overall
and per prompt category. vLLM's `ngram` proposer and headstart's `prompt_lookup` run the same n-gram search
(suffix n-grams of 1..3 tokens, 4 drafts), so a drafter is worth serving only where it beats them.

Per-category speedups come from per-prompt (tokens, seconds) at batch size 1: each engine's tokens/s over a
category's prompts divided by the same engine's plain decoding on them. Every engine is alive for the whole
check and the prompts are interleaved across them (eval/serving/side_by_side.py), so a burst of load slows them alike.
The check's prompts are few (default 8, `--n 22` = 2 per dev category): a category won or lost by at most 2% is
a tie, never a win (eval/report/wins.py, the eval stage's rule too). With two or more prompts a category, the
hybrid's categories are also judged beyond noise (`beyond_noise`: paired per-prompt rate ratios with intervals).
"""

from __future__ import annotations

from dataclasses import asdict

from headstart.eval.engine.proposers.prompt_lookup import DRAFT_TOKENS, MAX_NGRAM
from headstart.eval.report.wins import TIE, category_wins, paired_intervals

# vLLM's ngram proposer with the search of headstart's prompt lookup (eval/engine/proposers/prompt_lookup.py)
NGRAM_SPEC = {
    "method": "ngram",
    "num_speculative_tokens": DRAFT_TOKENS,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": MAX_NGRAM,
}
# vLLM's suffix decoding (Arctic Inference) with vLLM's defaults: it drafts up to its tree depth (24) where its
# suffix trees score a continuation likely enough, so no fixed K
SUFFIX_SPEC = {"method": "suffix"}


def rate(timed: list[tuple[int, float]], idx: list[int]) -> float:
    """tokens / seconds over the prompts `idx` of per-prompt (tokens, seconds)."""
    tokens, seconds = sum(timed[i][0] for i in idx), sum(timed[i][1] for i in idx)
    return tokens / seconds if seconds else 0.0


def speedups(
    timed: dict[str, list[tuple[int, float]]], plain: dict[str, str], categories: list[str]
) -> dict[str, dict[str, float]]:
    """{run: {"all" and each category: speedup}}: run `name`'s token rate over its engine's plain run
    (`plain[name]` names it) on the same prompts."""
    groups = {"all": list(range(len(categories)))}
    for i, c in enumerate(categories):
        groups.setdefault(c, []).append(i)
    ratio = lambda a, b: a / b if b else 0.0  # noqa: E731
    return {
        name: {g: ratio(rate(timed[name], idx), rate(timed[base], idx)) for g, idx in groups.items()}
        for name, base in plain.items()
    }


def compare(timed: dict, taus: dict, categories: list[str], drafter_layout: str) -> dict:
    """The report's `baselines` entry: speedups of the drafter (its first vLLM layout and ours), of prompt lookup
    in each engine and of whatever else ran (vLLM `suffix`, the hybrid of drafter and lookup), overall and by
    category, and the categories the drafter wins in each engine."""
    plain = {f"vllm:{drafter_layout}": "vllm:plain", "vllm:ngram": "vllm:plain", "ours:drafter": "ours:plain",
             "ours:prompt_lookup": "ours:plain"}  # fmt: skip
    plain |= {
        k: k.split(":")[0] + ":plain" for k in ("vllm:suffix", "vllm:hybrid", "ours:hybrid") if k in timed
    }
    sp = speedups(timed, plain, categories)
    by_category = lambda sp: {c: s for c, s in sp.items() if c != "all"}  # noqa: E731
    won = {
        "vllm": category_wins(by_category(sp[f"vllm:{drafter_layout}"]), sp["vllm:ngram"]),
        "ours": category_wins(by_category(sp["ours:drafter"]), sp["ours:prompt_lookup"]),
    }
    noise = None
    if "vllm:hybrid" in sp:  # the hybrid against the best other way to serve: drafter alone, ngram, suffix
        rivals = [f"vllm:{drafter_layout}", "vllm:ngram"] + (["vllm:suffix"] if "vllm:suffix" in sp else [])
        best = {g: max(sp[r][g] for r in rivals) for g in sp["vllm:hybrid"]}
        won["vllm_hybrid"] = category_wins(by_category(sp["vllm:hybrid"]), best)
        noise = beyond_noise(timed, "vllm:hybrid", rivals, categories)
    return {
        "ngram_spec": NGRAM_SPEC,
        "drafter_layout": drafter_layout,
        "speedup": sp,
        "tau": {k: v for k, v in taus.items() if k in sp or k.endswith(":plain")},
        "categories_won": {k: [w.won, w.of] for k, w in won.items()},
        "categories_tied": {k: w.tied for k, w in won.items()},
        "hybrid_beyond_noise": noise,
    }


def beyond_noise(timed: dict, name: str, rivals: list[str], categories: list[str]) -> dict | None:
    """Where run `name` is slower or faster than each rival beyond noise (eval/report/wins.py
    `paired_intervals`: per-prompt rate ratios, 95% intervals pooled over categories): {"behind": {category:
    [rivals whose interval lies wholly above it]}, "ahead": [categories where it is faster than every rival
    beyond noise], "of": categories, "intervals": {rival: {category: interval}}}; None with one prompt a
    category."""
    rate = lambda key: [tokens / seconds for tokens, seconds in timed[key]]  # noqa: E731
    intervals = {r: paired_intervals(rate(name), rate(r), categories) for r in rivals}
    if any(v is None for v in intervals.values()):
        return None
    groups = list(dict.fromkeys(categories))
    behind = {c: [r for r in rivals if intervals[r][c].high < 1] for c in groups}
    return {
        "behind": {c: rs for c, rs in behind.items() if rs},
        "ahead": [c for c in groups if all(intervals[r][c].low > 1 for r in rivals)],
        "of": len(groups),
        "intervals": {r: {c: asdict(i) for c, i in v.items()} for r, v in intervals.items()},
    }


def to_markdown(b: dict) -> list[str]:
    """report.md lines for the `baselines` entry."""
    d = f"vllm:{b['drafter_layout']}"
    cols = [(d, "drafter, vLLM"), ("vllm:ngram", "ngram, vLLM"), ("vllm:suffix", "suffix, vLLM"),
            ("vllm:hybrid", "drafter + lookup, vLLM"), ("ours:drafter", "drafter, ours"),
            ("ours:prompt_lookup", "prompt lookup, ours"), ("ours:hybrid", "drafter + lookup, ours")]  # fmt: skip
    cols = [(k, label) for k, label in cols if k in b["speedup"]]
    sp, tau = b["speedup"], b["tau"]
    lines = [
        "",
        "## Against prompt lookup (no training), same prompts",
        "",
        f"vLLM `ngram` ({b['ngram_spec']['num_speculative_tokens']} drafts, n-grams "
        f"{b['ngram_spec']['prompt_lookup_min']}..{b['ngram_spec']['prompt_lookup_max']}) and headstart's "
        "prompt lookup (the same search). Speedup over the same engine's plain decoding.",
        "",
        "| | " + " | ".join(label for _, label in cols) + " |",
        "|---|" + "---|" * len(cols),
        "| tau | " + " | ".join(f"{tau[k]:.2f}" for k, _ in cols) + " |",
    ]
    for g in sp[d]:
        lines.append(f"| {g} | " + " | ".join(f"{sp[k][g]:.2f}x" for k, _ in cols) + " |")
    (wv, n), (wo, _) = b["categories_won"]["vllm"], b["categories_won"]["ours"]
    lines += [
        "",
        f"Drafter faster than prompt lookup (by more than {TIE:.0%}; closer is a tie): {wv}/{n} categories in "
        f"vLLM, {wo}/{n} in headstart's decoder.",
    ]
    if "vllm_hybrid" in b["categories_won"]:
        wh, _ = b["categories_won"]["vllm_hybrid"]
        lines.append(
            f"Drafter + lookup in vLLM faster than the best of the others (by more than {TIE:.0%}): {wh}/{n} categories."
        )
        lines += noise_lines(b.get("hybrid_beyond_noise"))
    return lines


def noise_lines(noise: dict | None) -> list[str]:
    """The hybrid's categories won or lost beyond noise, in words."""
    if noise is None:
        return [
            "Beyond noise: not judged (one prompt a category leaves no spread to tell noise from a loss; "
            "`--per-category 2` or more)."
        ]
    behind = "; ".join(
        f"{c} (behind {', '.join(r.split(':', 1)[1] for r in rs)})" for c, rs in noise["behind"].items()
    )
    return [
        f"Beyond noise (per-prompt rate ratios, 95% intervals pooled over categories): faster than every other "
        f"in {len(noise['ahead'])}/{noise['of']} categories; slower than one of them in "
        f"{len(noise['behind'])}/{noise['of']}" + (f": {behind}." if behind else ".")
    ]
