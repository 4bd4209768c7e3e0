"""Self-distillation regeneration through vLLM (`data.regen.engine=vllm`), a drop-in for the HF `generate` path.

The rows, the rendered prompts (token ids, chat template applied here), the stop ids and the sampling settings
are data/selfdistill.py's; only the engine differs. vLLM batches the chunk of prompts itself (continuous
batching), samples each row with its own seed (so results do not depend on chunk boundaries, which move when a
run resumes), and stops on the same ids. vLLM drops a stop token from its output, so it is put back when the
request finished on one: `decode_reply` then sees the same ids the HF path returns.
"""

from __future__ import annotations

from headstart.data.config import DataError, RegenConfig
from headstart.vllm_runner import VllmEngine, VllmError, batch_env, engine_spec, on_gpu, served_model

DTYPE_NAMES = {"torch.bfloat16": "bfloat16", "torch.float16": "float16", "torch.float32": "float32"}


def with_stop_token(token_ids: list[int], finish_reason: str, stop: set[int]) -> list[int]:
    """vLLM's output for a request that ended on a stop id, with that id appended when vLLM left it out."""
    if finish_reason == "stop" and (not token_ids or token_ids[-1] not in stop):
        return [*token_ids, min(stop)]
    return token_ids


class VllmRegen:
    """A vLLM engine serving the backbone for the length of one regeneration (a context manager)."""

    def __init__(self, backbone, regen: RegenConfig, max_length: int) -> None:
        model = served_model(backbone)
        if model is None:
            raise DataError(
                f"data.regen.engine=vllm needs a backbone loaded from a folder or Hub id, not the in-memory "
                f"{backbone.name!r}. Fix: data.regen.engine=hf"
            )
        self.regen = regen
        # a prompt is < max_length tokens (longer ones are skipped before generation): room for the reply
        try:
            # Seeded sampling on CPU with a prefill split over two steps kills vLLM's engine (it rewinds the
            # request's generator with `set_offset`, which a CPU generator lacks: "CPU Generator does not use
            # offset"); a wide batch of sampled rows splits one as soon as the KV cache holds it. Unsplit
            # prefills wait for the next step instead.
            split = {"enable_chunked_prefill": False} if regen.temperature > 0 and not on_gpu() else {}
            spec = engine_spec(  # eager on CPU: compiling buys a batch job nothing there (engine_spec)
                model,
                DTYPE_NAMES[str(backbone.dtype)],  # the backbone's, resolved from backbone.dtype (auto)
                max_length + regen.max_new_tokens,
                eager_default=not on_gpu(),
                **split,
            )
            self.engine = VllmEngine(spec, env=batch_env())
        except VllmError as e:  # one line naming the fix, like every data error (train/cli.py)
            raise DataError(f"data.regen.engine=vllm: {e}") from e

    def generate(
        self, prompts: list[list[int]], stop: set[int], _batch_seed: int, row_seeds: list[int]
    ) -> list[list[int]]:
        try:
            reply = self.engine.generate(
                prompts,
                self.regen.max_new_tokens,
                self.regen.temperature,
                seeds=row_seeds if self.regen.temperature > 0 else None,
                stop_token_ids=sorted(stop),
            )
        except VllmError as e:  # finished chunks are on disk: rerunning resumes after them
            raise DataError(f"data.regen.engine=vllm: {e}. Rerun to resume") from e
        return [with_stop_token(o["token_ids"], o["finish_reason"], stop) for o in reply["outputs"]]

    def __enter__(self) -> VllmRegen:
        return self

    def __exit__(self, *exc) -> None:
        self.engine.close()
