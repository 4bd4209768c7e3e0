"""vLLM's Medusa heads reading the root token too (`method.root_token`): the model class headstart's vLLM plugin
registers as `HeadstartRootMedusaModel` (models/export/medusa.py writes that architecture and `root_proj.weight`).

The heads' input is the target's hidden state plus `root_proj` of the target's embedding of the token sampled
after it, as in headstart's decoder (models/medusa.py); the plugin's MedusaProposer.propose adds it (the sampled
tokens and the target's embedding are the model runner's, not the model's). Imported by vLLM only (lazily,
through the registry), so this module may import vLLM at its top.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.model_executor.models.medusa import Medusa

from headstart.models.export.medusa import ROOT_WEIGHT


class RootMedusa(Medusa):
    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        if vllm_config.scheduler_config.async_scheduling:
            raise ValueError(
                "these Medusa heads read the token each step samples (method.root_token), which asynchronous "
                "scheduling hands them too late. Fix: --no-async-scheduling"
            )
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        size = self.config.hidden_size
        self.root_proj = nn.Linear(size, size, bias=False)

    def load_weights(self, weights) -> set[str]:
        rest, found = [], False
        for name, tensor in weights:
            if name == ROOT_WEIGHT:
                self.root_proj.weight.data.copy_(tensor)
                found = True
            else:
                rest.append((name, tensor))
        if not found:
            raise ValueError(
                f"a {type(self).__name__} checkpoint without {ROOT_WEIGHT}: not an export of root-token heads. "
                "Fix: re-export it with `./launch.sh export --layout vllm`"
            )
        return super().load_weights(rest) | {ROOT_WEIGHT}

    def read_root(self, hidden: torch.Tensor, root_embeddings: torch.Tensor) -> torch.Tensor:
        """hidden (rows, H), root_embeddings (rows, H) the target's embedding of each row's root -> the heads'
        input (headstart's MedusaHeads.read_root)."""
        return hidden + self.root_proj(root_embeddings.to(self.root_proj.weight.dtype))
