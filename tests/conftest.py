"""Shared fixtures: a tiny random backbone (2-layer Llama, byte-level vocab of 259) that builds in well under
a second on CPU."""

from __future__ import annotations

import pytest
import torch

from headstart.models.backbone import Backbone, BackboneConfig, load_backbone


def tiny_backbone(seed: int = 0, dtype: str = "float32", **tiny) -> Backbone:
    return load_backbone(BackboneConfig(name="tiny", path="tiny", dtype=dtype, tiny={"seed": seed, **tiny}))


@pytest.fixture
def backbone() -> Backbone:
    return tiny_backbone()


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a test module (`pytestmark = pytest.mark.usefixtures("one_thread")`): on a shared
    2-core box, OpenMP's second thread mostly waits for a busy core and tiny matmuls crawl."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def made_runners(monkeypatch) -> list:
    """Every ModelRunner built while the test runs, in order (which were compiled, at what cache length)."""
    from headstart.eval.engine.runner import ModelRunner

    made, real = [], ModelRunner.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(ModelRunner, "__init__", spy)
    return made
