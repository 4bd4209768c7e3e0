"""vLLM's speculative-decoding counters -> tau and acceptance by draft position, comparable with DecodeStats.

vLLM counts, per request step that drafted (`LLM.get_metrics()`, cumulative since the engine started):
`vllm:spec_decode_num_drafts` (steps with a draft), `vllm:spec_decode_num_draft_tokens`,
`vllm:spec_decode_num_accepted_tokens` and the vector `vllm:spec_decode_num_accepted_tokens_per_pos` ([i] =
steps whose draft position i was accepted; a chain accepts position i only if 0..i-1 were). Every drafting
step also emits one token from the target (the bonus or the correction), so

    tau = (accepted + drafts) / drafts = 1 + accepted / drafts          rate_i = accepted_per_pos[i] / drafts

which is headstart's tau (tokens per target forward) and accepted_by_position / proposed_by_position for a
chain. Steps without a draft (an `ngram` or `suffix` proposer that found no match) are missing from those
counters, so that quotient is tau per drafting step, higher than tokens per forward. With the tokens each request
generated after its prefill (`emitted`, counted by the caller: the counters do not have it), every decode forward
counts: each emits its accepted drafts plus one token, so forwards = emitted - accepted. But vLLM counts a step's
accepted drafts before it cuts the request at its length limit or a stop token (v1 scheduler: the stats come
from the sampled ids, the cut after), so at a request's last step `accepted` can include tokens never emitted, and
emitted - accepted falls short of the forwards by them (a chain of 2 over 32 tokens: tau 2.63 for 2.38). Every
drafting step is a forward, so

    tau = emitted / max(emitted - accepted, drafts)

headstart's tau for any proposer: exact where every step drafts (Medusa, EAGLE, the plugin's hybrid); for an
`ngram` or `suffix` proposer it still misses the cut tokens where they outnumber its steps without a draft.
"""

from __future__ import annotations

PREFIX = "vllm:spec_decode_"


def spec_counters(metrics: list[dict]) -> dict:
    """The spec-decode counters out of `get_metrics()` rows, summed over label sets (engines)."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": []}
    names = {
        "num_drafts": "drafts",
        "num_draft_tokens": "draft_tokens",
        "num_accepted_tokens": "accepted",
        "num_accepted_tokens_per_pos": "accepted_per_pos",
    }
    for m in metrics:
        key = names.get(m["name"].removeprefix(PREFIX)) if m["name"].startswith(PREFIX) else None
        if key is None:
            continue
        if key == "accepted_per_pos":
            values = [int(v) for v in m["values"]]
            acc = out[key] + [0] * (len(values) - len(out[key]))
            out[key] = [a + (values[i] if i < len(values) else 0) for i, a in enumerate(acc)]
        else:
            out[key] += int(m["value"])
    return out


def delta(after: dict, before: dict) -> dict:
    """Counters accumulated between two snapshots."""
    n = max(len(after["accepted_per_pos"]), len(before["accepted_per_pos"]))
    pad = lambda v: v + [0] * (n - len(v))  # noqa: E731
    per_pos = [a - b for a, b in zip(pad(after["accepted_per_pos"]), pad(before["accepted_per_pos"]))]
    return {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")} | {
        "accepted_per_pos": per_pos
    }


def tau(c: dict) -> float:
    """Tokens per decode forward: emitted / max(emitted - accepted, drafts) when `emitted` was counted, else 1 +
    accepted / drafts (per drafting step); 1.0 when nothing was drafted (every token from the target alone)."""
    if c.get("emitted", 0) > 0:
        return c["emitted"] / max(c["emitted"] - c["accepted"], c["drafts"], 1)
    return 1.0 + c["accepted"] / c["drafts"] if c["drafts"] else 1.0


def position_rates(c: dict) -> list[float]:
    """[i] = fraction of drafting steps whose position i was accepted."""
    return [a / c["drafts"] if c["drafts"] else 0.0 for a in c["accepted_per_pos"]]
