"""A drafter's `decoding.json`: the decoding settings the tuner (eval/tuning/) chose, one record per condition
it was tuned under, so that a greedy eval, a sampled eval, a CPU and a GPU each keep their own choice instead of
the last one overwriting the others.

The file is `{"format": 2, "records": [record, ...]}`. A record is what the tuner writes (the decoder's options,
vLLM's K, costs, acceptance) with `conditions`: temperature class (greedy / sampled), device and its name, dtype,
CPU threads, how the drafter's layers were stored (native / int8), the weights' signature, plus the record's
`version` and `lookup_tokens` (the prompt-lookup branch it was chosen for). Two records with the same of these
are the same condition: writing one replaces the other; any other record is kept. A file written before
(a single record at the top level) reads as a list of that one record and is rewritten in this format on the
next write.

Readers that serve the drafter (exports, the serve check, bench-decode) pick the record for their use with
`pick` (greedy or sampled, on a device) and say which record they used (`Picked.note`).

A drafter the tuner never ran on (trained by an experiment config, whose run has no eval stage) still gets the
hybrid's lookup rule the serve check tunes: it is kept as a rule record (`rule_record`: kind "lookup_rule",
its conditions, the rule, no decoder settings), which `pick` never returns and `latest_rule` reads, so the next
serve check and the export reuse it instead of tuning it again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from headstart.atomic import write_json

log = logging.getLogger(__name__)
DECODING_NAME = "decoding.json"
FORMAT = 2  # 2: {"format", "records": [...]}; a bare record at the top level is the first format
# what makes two records the same condition (besides version and lookup_tokens)
CONDITION_KEYS = (
    "temperature",
    "device",
    "device_name",
    "dtype",
    "threads",
    "draft_weights",
    "weights",
    "compiled",
    "workload",
)
GREEDY, SAMPLED, UNKNOWN = (
    "greedy",
    "sampled",
    "unknown",
)  # UNKNOWN: a record written before the class was kept


def temperature_class(temperature: float) -> str:
    return GREEDY if temperature == 0 else SAMPLED


def condition_of(record: dict) -> tuple:
    """The condition a record was tuned under: its version, lookup branch and `CONDITION_KEYS`."""
    c = {"draft_weights": "native", "temperature": UNKNOWN, "compiled": False, **record.get("conditions", {})}
    return (record.get("version"), record.get("lookup_tokens", 0), *(c.get(k) for k in CONDITION_KEYS))


def describe_workload(workload) -> str:
    """(context tokens, share) pairs (eval/tuning/workload.py) as a phrase; none: the probe's own lengths."""
    return ", ".join(f"{n} tokens {s:.0%}" for n, s in workload) or "the probe's median sequence"


def describe(record: dict) -> str:
    """One line naming the condition a record was tuned under (for reports, cards and logs)."""
    c = {"temperature": UNKNOWN, "draft_weights": "native", **record.get("conditions", {})}
    where = f"{c.get('device')}" + (f" ({c['device_name']})" if c.get("device_name") else "")
    threads = f", {c['threads']} threads" if c.get("threads") else ""
    branch = f", lookup branch up to {record['lookup_tokens']}" if record.get("lookup_tokens") else ""
    branch += ", compiled steps" if c.get("compiled") else ""
    branch += f", steps priced at {describe_workload(c['workload'])}" if c.get("workload") else ""
    temp = c["temperature"] if c["temperature"] != UNKNOWN else "temperature not recorded"
    return (
        f"{temp}, {where}, {c.get('dtype')}{threads}, {c['draft_weights']} drafter{branch}, "
        f"v{record.get('version')}"
    )


def branch_tokens(record: dict | None, allowed: int) -> int:
    """The lookup branch's length to decode with: the one a record's tuner chose with its tree (never more than
    `allowed`, the eval's lookup_tokens), else `allowed` (no record, or one from before the length was tuned)."""
    return min(record.get("branch_tokens", allowed), allowed) if record else allowed


RULE_RECORD = "lookup_rule"  # a record's kind: a lookup rule tuned without decoder settings (`rule_record`)


def _records_of(data) -> list[dict]:
    if isinstance(data, dict) and isinstance(data.get("records"), list):
        return [r for r in data["records"] if isinstance(r, dict) and ("decoder" in r or is_rule_record(r))]
    if isinstance(data, dict) and "decoder" in data:  # the first format: one record, migrated on reading
        return [data]
    return []


def read_decodings(path: str | Path) -> list[dict]:
    """Every record in the folder's decoding.json (oldest first); [] when absent, or unreadable (saying so: the
    tuner runs again or the hand-set defaults are used)."""
    file = Path(path) / DECODING_NAME
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        log.warning("%s is unreadable (%s): its tuned settings are not used; rerun the tuner", file, e)
        return []
    records = _records_of(data)
    if not records:
        log.warning("%s holds no decoder settings: they are not used; rerun the tuner", file)
    return records


def write_decodings(path: str | Path, records: list[dict]) -> Path:
    """Write decoding.json atomically (a temporary sibling renamed over it: readers see the old or the new)."""
    return write_json(Path(path) / DECODING_NAME, {"format": FORMAT, "records": records})


def write_decoding(path: str | Path, record: dict) -> Path:
    """Add `record` to the folder's decoding.json: it replaces the record of the same condition, and records
    measured on other weights are dropped (no eval can match them again); every other record stays."""
    weights = record.get("conditions", {}).get("weights")
    key = condition_of(record)
    kept = [
        r
        for r in read_decodings(path)
        if condition_of(r) != key
        and (weights is None or r.get("conditions", {}).get("weights") in (None, weights))
    ]
    return write_decodings(path, kept + [record])


@dataclass
class Picked:
    """The record chosen for a use, whether it was tuned for exactly that use, and a sentence saying which."""

    record: dict
    exact: bool
    note: str


def pick(
    records: list[dict], greedy: bool = True, device: str | None = None, compiled: bool | None = None
) -> Picked | None:
    """The record for decoding greedily (or sampled) on `device` (a device type: cpu, cuda; None: any): the
    newest of that temperature class on that device, else the nearest (same class first, then same device,
    then a record whose class was not recorded), said in `note`; with `compiled` given, among those the ones
    priced for that decoder (compiled or eager steps) first. None when there is no record."""
    records = [r for r in records if not is_rule_record(r)]  # they hold no decoder settings
    if not records:
        return None
    want = GREEDY if greedy else SAMPLED

    def score(i: int) -> tuple:
        c = {"temperature": UNKNOWN, **records[i].get("conditions", {})}
        same_dev = device is None or c.get("device") == device
        same_kernels = compiled is None or bool(c.get("compiled")) == compiled
        return (c["temperature"] == want, same_dev, c["temperature"] == UNKNOWN, same_kernels, i)

    best = max(range(len(records)), key=score)
    record = records[best]
    exact = score(best)[:2] == (True, True)
    use = f"{want}" + (f" on {device}" if device else "")
    note = f"decoding.json record for {use}: {describe(record)}"
    if not exact:
        note = f"no decoding.json record for {use}; using the nearest: {describe(record)}"
    return Picked(record, exact, note)


def read_decoding(path: str | Path, greedy: bool = True, device: str | None = None) -> dict | None:
    """The record `pick` chooses for this use from the folder's decoding.json, None without one."""
    picked = pick(read_decodings(path), greedy, device)
    return picked.record if picked else None


def is_rule_record(record: dict) -> bool:
    return record.get("kind") == RULE_RECORD


def rule_record(rule: dict, device: str, device_name: str, dtype: str, weights: str | None) -> dict:
    """A greedy lookup rule (eval/tuning/lookup_rule.py) tuned for `weights` on a device, kept without decoder
    settings: the serve check's, for a drafter with no tuner record. Written by `write_decoding`, it replaces
    the rule record of the same condition."""
    conditions = {"temperature": GREEDY, "device": device, "device_name": device_name, "dtype": dtype}
    return {"kind": RULE_RECORD, "conditions": conditions | {"weights": weights}, "lookup_rule": rule}


def latest_rule(records: list[dict], device: str | None, weights: str | None) -> dict | None:
    """The newest lookup rule any record of `weights` on `device` (None: any) keeps (a rule record's, or a tuner record's:
    a newer tuning of the tree does not carry the rule, whose decodes depend on the weights and the tuning prompts
    only; its k, prompts and answer length are checked where it is reused), else None."""
    for older in reversed(records):
        c = older.get("conditions", {})
        if older.get("lookup_rule") and device in (None, c.get("device")) and c.get("weights") == weights:
            return older["lookup_rule"]
    return None


def served_rule(record: dict | None, k: int) -> dict | None:
    """A record's hybrid rule (eval/tuning/lookup_rule.py) for a drafter chain of k, completed for serving:
    {"source": "ngram", "min_match", "k", "lookup_tokens", "max_tokens", "drafter_floor"} (max_tokens None: chains
    of lookup_tokens; drafter_floor None: min_match for every request) or {"source": "suffix", "min_score", "k",
    "lookup_tokens"} (suffix decoding's draft of up to lookup_tokens); None when there is none for k or the drafter
    alone was best."""
    rule = (record or {}).get("lookup_rule") or {}
    if rule.get("k") != k:
        return None
    if rule.get("source") == "suffix":
        return {
            "source": "suffix",
            "min_score": rule["min_score"],
            "k": k,
            "lookup_tokens": rule["lookup_tokens"],
        }
    if rule.get("min_match") is None:
        return None
    return {
        "source": "ngram",
        "min_match": rule["min_match"],
        "k": k,
        "lookup_tokens": rule.get("lookup_tokens", k),
        "max_tokens": rule.get("max_tokens"),
        "drafter_floor": rule.get("drafter_floor"),
    }


def describe_rule(rule: dict) -> str:
    """When a served rule verifies the lookup chain instead of the drafter's, in words."""
    keeps = f"; the drafter keeps its first {rule['k']}" if plugin_serving(rule)[0] > rule["k"] else ""
    if rule.get("source") == "suffix":
        return (
            f"where suffix decoding (the prompt's and earlier replies' suffix trees) drafts up to "
            f"{rule['lookup_tokens']} tokens scoring at least {rule['min_score']:g}{keeps}"
        )
    grows = f", or as long as its match up to {rule['max_tokens']}" if rule.get("max_tokens") else ""
    weak = (
        f", or 1 once the request's drafter averages under {rule['drafter_floor']:g} accepted drafts a step"
        if rule.get("drafter_floor")
        else ""
    )
    return (
        f"where the context's longest earlier n-gram match has at least {rule['min_match']} tokens{weak} (a "
        f"lookup chain of {rule['lookup_tokens']}{grows}{keeps})"
    )


def lookup_options(rule: dict) -> dict:
    """headstart's decoder options (eval/engine/decoder.py) that run a served rule, as the plugin does."""
    if rule.get("source") == "suffix":
        return {"lookup_tokens": rule["lookup_tokens"], "lookup_min_score": rule["min_score"]}
    return {
        "lookup_tokens": rule["lookup_tokens"],
        "lookup_min_match": rule["min_match"],
        "lookup_max_tokens": rule.get("max_tokens"),
        "lookup_drafter_floor": rule.get("drafter_floor"),
    }


def plugin_serving(rule: dict) -> tuple[int, dict]:
    """How vLLM serves a rule with headstart's lookup plugin (eval/serving/vllm_plugin.py): its
    num_speculative_tokens (the longest chain) and additional config (the drafter keeps its first k when a
    lookup chain is longer; a chain growing with its match is lookup_tokens long at least, and n-grams are
    searched as long as it may grow; suffix decoding drafts up to num_speculative_tokens)."""
    most = rule.get("max_tokens")
    served = max(rule["k"], rule["lookup_tokens"], most or 0)
    extra = {"drafter_tokens": rule["k"]} if served > rule["k"] else {}
    if rule.get("source") == "suffix":
        return served, {"headstart_lookup": {"source": "suffix", "min_score": rule["min_score"], **extra}}
    if most:
        extra |= {"lookup_tokens": rule["lookup_tokens"], "max_ngram": most}
    if rule.get("drafter_floor"):
        extra |= {"drafter_floor": rule["drafter_floor"]}
    return served, {"headstart_lookup": {"min_match": rule["min_match"], **extra}}


# vLLM methods whose drafter's greedy draft can skip the full-vocabulary logits (vLLM 0.32's EAGLE proposers)
LOCAL_ARGMAX_METHODS = ("eagle", "eagle3")


def hybrid_speculative_config(spec: dict, rule: dict) -> dict:
    """The speculative_config that serves layout config `spec` with headstart's lookup plugin running `rule`:
    num_speculative_tokens the longest chain (`plugin_serving`), and for an EAGLE drafter vLLM's
    `use_local_argmax_reduction` (the plugin's vLLM has it): each draft is the argmax over the drafter's own
    vocabulary, mapped to the target's, the same token without scattering the logits over the target's
    vocabulary first (measured in vLLM's CPU build on the EAGLE-3 experiment: 1.20 -> 0.87 ms a draft)."""
    return spec | {"num_speculative_tokens": plugin_serving(rule)[0]} | local_argmax(spec)


def local_argmax(spec: dict) -> dict:
    """vLLM's use_local_argmax_reduction for a speculative_config whose drafter has it, else nothing."""
    return {"use_local_argmax_reduction": True} if spec.get("method") in LOCAL_ARGMAX_METHODS else {}
