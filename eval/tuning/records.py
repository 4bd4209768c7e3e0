"""The tuner's records in a checkpoint's decoding.json (models/decoding.py): the conditions a choice is valid
for, reusing the record of this eval's condition or tuning and adding one, and the report's `decoding` entry.

A condition is the temperature class (greedy / sampled), device (a CPU by its model and kernels' ISA), dtype, the
CPU threads the settings were chosen for (`tuner.threads`: a setting, by default torch's count, i.e.
OMP_NUM_THREADS or the machine's cores, never the cores free at start, so a busy machine at start neither changes
the tree nor hides the record an idle one wrote), how the drafter's layers are stored, the weights, the lookup
branch and whether the verify steps run compiled. Each condition keeps its own record: a temperature-1 eval never
replaces the greedy eval's tree.
"""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass

import torch

from headstart.eval.tuning.prompts import ProbePrompts, normalise
from headstart.eval.tuning.speed_model import speedup_at
from headstart.eval.tuning.tuner import GREEDY, PLAIN, VERSION, TunerConfig, Use, decide_speedup, tune
from headstart.hardware import capabilities, cpu_model
from headstart.models.checkpoint import LoadedDrafter, weights_signature
from headstart.models.decoding import (
    condition_of,
    describe,
    read_decodings,
    temperature_class,
    write_decoding,
)
from headstart.models.int8 import weights_of

log = logging.getLogger("headstart.eval")


def device_name(dev: torch.device) -> str:
    """The GPU's name, or the CPU's model and the ISA its kernels run at ('AMD EPYC, AVX2'): a record priced on
    one CPU's kernels is not reused on another's (a drafter folder copied between machines, kernels capped)."""
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"{cpu_model()}, {capabilities('cpu').isa or platform.machine()}"


def planned_threads(cfg: TunerConfig) -> int:
    """The CPU threads the settings are chosen for: tuner.threads, else torch's intra-op count (OMP_NUM_THREADS
    when set, else the machine's cores), never lowered for the cores busy at start (harness.choose_threads is
    the timing's policy, not the tree's)."""
    return cfg.threads or torch.get_num_threads()


def conditions(backbone, loaded: LoadedDrafter, use: Use = GREEDY, threads: int | None = None) -> dict:
    """What a record is valid for: the temperature class, device, dtype, CPU threads (`threads`; None: torch's
    count now), the weights it was measured on, how the drafter's layers were stored (int8 / native:
    models/int8.py; the draft costs differ), whether the verify steps run compiled, and at which context lengths."""
    dev = backbone.device
    return {
        "temperature": temperature_class(use.temperature),
        "device": dev.type,
        "device_name": device_name(dev),
        "dtype": str(backbone.dtype).removeprefix("torch."),
        "draft_weights": weights_of(loaded.drafter),
        "threads": (threads or torch.get_num_threads()) if dev.type == "cpu" else None,
        "torch": torch.__version__,
        "weights": weights_signature(loaded.path) if loaded.path else None,
        "compiled": use.compiled,
        # the context lengths steps were priced at, with their shares (eval/tuning/workload.py); None: the probe's
        "workload": [[n, share] for n, share in use.workload] or None,
    }


def matches(
    record: dict, backbone, loaded: LoadedDrafter, use: Use = GREEDY, threads: int | None = None
) -> bool:
    """Whether `record` was tuned under this condition (models/decoding.py `condition_of`: one definition)."""
    now = {
        "version": VERSION,
        "lookup_tokens": use.lookup_tokens,
        "conditions": conditions(backbone, loaded, use, threads),
    }
    return condition_of(record) == condition_of(now)


@dataclass
class Tuned:
    """The record the eval decodes with, whether it was reused from decoding.json or tuned now, and which
    record it is (models/decoding.py `describe`)."""

    record: dict
    reused: bool
    name: str

    @property
    def plain(self) -> bool:
        return self.record.get("choice") == PLAIN


def _tuned_on_scored(record: dict, scored_texts: set[str]) -> bool:
    """A record whose probe decoded some of the prompts this eval scores (never reused for it)."""
    return any(normalise(t) in scored_texts for t in record.get("tuning_prompts", {}).get("texts", []))


def load_or_tune(method: str, backbone, loaded: LoadedDrafter, probe: ProbePrompts, cfg: TunerConfig,
                 use: Use = GREEDY, scored_texts: set[str] = frozenset(), keep: bool = True) -> Tuned | None:  # fmt: skip
    """The checkpoint's record for this condition (mode auto) unless it was tuned on prompts in
    `scored_texts` (normalised), else a fresh tuning on `probe`'s prompts, added to decoding.json (a read-only
    folder: kept in memory, with a warning; keep=False: neither read nor written there, the caller writes it).
    CPU: under `planned_threads(cfg)`."""
    if cfg.mode == "off":
        return None
    before, threads = torch.get_num_threads(), planned_threads(cfg)
    try:
        if backbone.device.type == "cpu":
            torch.set_num_threads(threads)
        ckpt = loaded.path if keep else None
        old = read_decodings(ckpt) if ckpt else []
        mine = [r for r in old if matches(r, backbone, loaded, use, threads)]
        if mine and cfg.mode == "auto" and not _tuned_on_scored(mine[-1], scored_texts):
            record, name = redecide(mine[-1], cfg.min_gain), describe(mine[-1])
            log.info(
                "decoding settings from %s/decoding.json (%s): %s", ckpt, name, record["decoder_summary"]
            )
            if record["choice"] != mine[-1]["choice"]:
                _log_choice(record)
            return Tuned(record, True, name)
        log.info("tuning decoding settings for %s on %s (%s, %d threads)",
                 ckpt or "the drafter", backbone.device, method, threads)  # fmt: skip
        record = tune(method, backbone, loaded, probe.ids, cfg, use)
        if record is None:
            return None
        record["conditions"] = conditions(backbone, loaded, use, threads)
        record["tuning_prompts"] = {"file": probe.file, "texts": probe.texts}
        record["vllm"] = measured_k(old, record) or record["vllm"]
        _save(ckpt, record)
        _log_choice(record)
        return Tuned(record, False, describe(record))
    finally:
        torch.set_num_threads(before)


def redecide(record: dict, min_gain: float) -> dict:
    """A reused record's choice under this eval's `tuner.min_gain` (its prediction is kept, the decision is the
    setting's): the record itself when unchanged, else a copy with the new choice."""
    if record.get("min_gain") == min_gain or "speedup" not in record.get("predicted", {}):
        return record
    choice, reason = decide_speedup(record["predicted"]["speedup"], record["decoder_summary"], min_gain)
    return record | {"choice": choice, "choice_reason": reason, "min_gain": min_gain}


def _save(ckpt, record: dict) -> None:
    if not ckpt:
        return
    try:
        write_decoding(ckpt, record)
    except OSError as e:
        log.warning("could not write %s/decoding.json (%s): the choice is used but not saved", ckpt, e)


def _log_choice(record: dict) -> None:
    c = record["conditions"]
    if record["choice"] == PLAIN:  # the one line that says speculation does not pay here
        log.warning("speculation does not pay on %s (%s, %s threads): %s; plain decoding chosen",
                    c["device_name"], c["dtype"], c["threads"], record["choice_reason"])  # fmt: skip
        return
    log.info("tuned: %s, vLLM K=%d, predicted speedup %.3fx (%.1fs)", record["decoder_summary"],
             record["vllm"]["num_speculative_tokens"], record["predicted"]["speedup"], record["seconds"])  # fmt: skip


def measured_k(old: list[dict], record: dict) -> dict | None:
    """The K vLLM itself chose (eval/serving/k_sweep.py) in an earlier record, when it was measured for the same
    weights on the same device, with the new tuner prediction under `tuner`; None otherwise."""
    now = record["conditions"]
    for r in reversed(old):
        v = r.get("vllm", {})
        if v.get("source") == "vllm" and (v.get("weights"), v.get("device_name")) == (
            now["weights"],
            now["device_name"],
        ):
            return {**v, "tuner": record["vllm"]}
    return None


def decoding_report(settings: dict, report: dict, new_tokens: float, tol: float = 0.10) -> dict:
    """The report's `decoding` entry: the settings used and their source (tuner / user / default), the
    prompt-lookup branch when on (its size, how often it was used); with the tuner's, the record used (which
    condition, reused or tuned now, on which prompts), the choice (speculate / plain), its predicted speedup
    (steady state, and at this run's mean answer length with the measured prefill) beside the measured one,
    their ratio, and a flag when they differ by more than `tol`."""
    out = {"source": settings["source"], "options": settings["options"]}
    if settings.get("draft_weights"):  # int8 / native (models/int8.py)
        out["draft_weights"] = settings["draft_weights"]
    if settings.get("lookup_branch"):  # the user's, on the tree (eval/engine/proposers/lookup_branch.py)
        out["lookup_branch"] = settings["lookup_branch"]
    tuned: Tuned | None = settings["tuner"]
    if settings.get("lookahead"):  # its W, N, G and how its branches did (eval/engine/proposers/lookahead.py)
        out["lookahead"] = settings["lookahead"]
    if tuned is None:
        return out
    rec = tuned.record
    return out | _tuner_entry(tuned) | _prediction(rec, report, new_tokens, tol, tuned.plain)


def _tuner_entry(tuned: Tuned) -> dict:
    rec = tuned.record
    return {
        "options": {} if tuned.plain else rec["decoder_summary"],
        **({"declined_options": rec["decoder_summary"]} if tuned.plain else {}),
        "record": tuned.name,
        "reused": tuned.reused,
        "choice": rec.get("choice"),
        "choice_reason": rec.get("choice_reason"),
        "tuning_prompts": {"file": rec["tuning_prompts"]["file"], "n": len(rec["tuning_prompts"]["texts"])},
        "planned_threads": rec["conditions"].get("threads"),
        "vllm_num_speculative_tokens": rec["vllm"]["num_speculative_tokens"],
        "vllm_k_source": rec["vllm"].get(
            "source", "tuner"
        ),  # "vllm": measured in vLLM (eval/serving/k_sweep.py)
        "acceptance_source": rec["acceptance"]["source"],
        "tuned_for_lookup": rec.get("lookup_tokens", 0),
    }


def _prediction(rec: dict, report: dict, new_tokens: float, tol: float, plain: bool) -> dict:
    """Predicted speedup at this run's answer length beside the measured one (plain decoding: 1 by
    construction, the turned-down setting's prediction kept under `predicted_speedup_best_setting`)."""
    pred = rec["predicted"]
    at_run = 1.0 if plain else speedup_at(pred["speedup"], pred["prefill_vanilla_steps"], new_tokens)
    measured = report.get("speedup")
    ratio = measured / at_run if measured and at_run else None
    return {
        "predicted_tau": 1.0 if plain else pred["tokens_per_step"],
        "measured_tau": report.get("tau"),
        "predicted_speedup_steady": 1.0 if plain else pred["speedup"],
        "predicted_speedup": at_run,
        "measured_speedup": measured,
        "ratio": ratio,
        "flag": None
        if ratio is None or abs(ratio - 1) <= tol
        else f"measured/predicted = {ratio:.3f} (off by > {tol:.0%})",
    } | ({"predicted_speedup_best_setting": pred["speedup"]} if plain else {})
