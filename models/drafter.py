"""What the training loop, the checkpoint code and the decoder rely on in a drafter, instead of probing it with
`hasattr`. `DrafterBase` gives the defaults; a method overrides only what it uses.

    init_from_data(dataset) -> dict   once before training (EAGLE-3: the draft vocabulary from the labels)
    feature_cache() -> (layers, dtype) | None
                                      the backbone layers (and dtype) an offline feature cache must hold; None:
                                      the drafter reads no cached features
    checkpoint_meta() -> dict         saved beside the weights (DistillSpec: the draft's HF config)
    serving(backbone, meta, live)     the proposer options (by name) that serve this drafter
    int8_modules() -> [nn.Module]     the parts served with int8 weights on CPU (models/int8.py); [] = none
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import nn


@runtime_checkable
class Drafter(Protocol):
    def feature_cache(self) -> tuple[tuple[int, ...], str] | None: ...

    def init_from_data(self, dataset) -> dict: ...

    def checkpoint_meta(self) -> dict: ...

    def serving(self, backbone, meta: dict | None = None, live: bool = False) -> dict[str, Any]: ...

    def int8_modules(self) -> list[nn.Module]: ...


class DrafterBase(nn.Module):
    # True where the drafter starts from a trained model (a pretrained or pruned draft LM): training then
    # evaluates it once before the first step, and says so if training made it worse (train/loop.py)
    starts_trained: bool = False

    def feature_cache(self) -> tuple[tuple[int, ...], str] | None:
        return None

    def init_from_data(self, dataset) -> dict:
        return {}

    def checkpoint_meta(self) -> dict:
        return {}

    def serving(self, backbone, meta: dict | None = None, live: bool = False) -> dict[str, Any]:
        """The serving proposer's options by name (its typed config's fields, eval/engine/proposers/). `live`: the drafter is being trained (quick eval): serve it as it is, in its own
        dtype, without freezing it. `meta`: the checkpoint's config.json when loaded from one."""
        return {"drafter": self}

    def int8_modules(self) -> list[nn.Module]:
        """The submodules whose nn.Linear layers decoding may store in int8 (each called as a module, never
        read through `.weight`); none by default."""
        return []
