"""The process that runs inside the vLLM virtual environment (`.venv-vllm`); headstart drives it by subprocess.

It imports only the standard library and vllm: vLLM pins its own torch / transformers, so headstart is not
installed there and this file is run by path (`.venv-vllm/bin/python headstart/vllm_worker.py SPEC.json`).
SPEC.json holds the `vllm.LLM` arguments. Requests come one JSON object a line on stdin, each answered by one
JSON line on the protocol stream (the original stdout; vLLM's own logging and prints go to stderr):

    {"op": "generate", "prompts": [[ids]], "max_tokens": n, "temperature": t, "seeds": [s], "stop_token_ids": [..]}
        -> {"outputs": [{"token_ids": [..], "finish_reason": "stop" | "length"}], "time_s": wall seconds}
    {"op": "metrics"}  -> {"metrics": [{"name": ..., "kind": "counter" | "gauge" | "vector", "value" | "values"}]}
    {"op": "quit"}

The first line written is {"ready": true, "startup_s": ...} or {"error": "..."}. End of stdin (the parent died,
even by kill -9) ends the worker.

The worker dies with its parent, and takes vLLM's processes (EngineCore, its workers) with it: the parent
starts it as the leader of its own process group, the kernel sends it SIGTERM when the parent dies
(PR_SET_PDEATHSIG: a trainer killed mid-generate, e.g. by a scheduler's preemption, whose worker would
otherwise not read stdin again), and on SIGTERM or SIGINT it kills its whole group. Without this, the engine
processes stayed orphaned, holding a core and GBs of memory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """SIGTERM to this process when the parent dies (Linux; elsewhere end of stdin still ends the worker)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _end_group(signum, frame) -> None:
    """Kill the process group this worker leads (vLLM's EngineCore and workers included), then itself."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(os.getpgid(0), signal.SIGTERM)  # a chance to release GPU memory cleanly
        time.sleep(1.0)
    finally:
        os.killpg(os.getpgid(0), signal.SIGKILL)  # includes this process


def kill_group_on_signal() -> None:
    if os.getpgid(0) != os.getpid():  # not a group leader (run by hand): never kill the caller's group
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _end_group)


def _protocol_stream():
    """Keep the real stdout for replies; everything else printing to fd 1 (vLLM, its subprocesses) -> stderr."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _metrics(llm) -> list[dict]:
    rows = []
    for m in llm.get_metrics():
        row = {"name": m.name, "kind": type(m).__name__.lower()}
        if hasattr(m, "values"):
            row["values"] = list(m.values)
        elif hasattr(m, "value"):
            row["value"] = m.value
        else:
            continue  # histograms: not needed
        rows.append(row)
    return rows


def _generate(llm, req: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    seeds = req.get("seeds") or [None] * len(req["prompts"])
    params = [
        SamplingParams(
            max_tokens=req["max_tokens"],
            temperature=req.get("temperature", 0.0),
            top_p=1.0,
            top_k=0,
            seed=seed,
            stop_token_ids=req.get("stop_token_ids") or None,
            detokenize=False,
        )
        for seed in seeds
    ]
    prompts = [TokensPrompt(prompt_token_ids=p) for p in req["prompts"]]
    t0 = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    outputs = [
        {"token_ids": list(r.outputs[0].token_ids), "finish_reason": r.outputs[0].finish_reason}
        for r in results
    ]
    return {"outputs": outputs, "time_s": wall}


def main(spec_path: str) -> None:
    kill_group_on_signal()
    die_with_parent()
    out = _protocol_stream()
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    t0 = time.perf_counter()
    try:
        from vllm import LLM

        llm = LLM(**spec)
    except Exception as e:  # noqa: BLE001 - any start failure is reported, not raised
        traceback.print_exc()
        out.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        return
    kill_group_on_signal()  # again: in case vLLM installed handlers of its own while starting
    out.write(json.dumps({"ready": True, "startup_s": time.perf_counter() - t0}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req["op"] == "quit":
            break
        try:
            reply = _generate(llm, req) if req["op"] == "generate" else {"metrics": _metrics(llm)}
        except Exception as e:  # noqa: BLE001 - the parent decides; the traceback goes to the log
            traceback.print_exc()
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":  # the engine spawns processes: nothing may run on import
    main(sys.argv[1])
