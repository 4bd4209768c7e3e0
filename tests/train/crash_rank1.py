"""train/medusa.py, except that rank 1 raises in its second training step (for the no-hang test)."""

import os
import runpy
from pathlib import Path

import headstart.train.loop as loop

_real = loop.forward_loss
_calls = {"n": 0}


def crashing_forward_loss(*args, **kwargs):
    _calls["n"] += 1
    if os.environ.get("RANK") == "1" and _calls["n"] == 2:
        raise RuntimeError("injected crash on rank 1")
    return _real(*args, **kwargs)


loop.forward_loss = crashing_forward_loss

runpy.run_path(str(Path(__file__).resolve().parents[2] / "train" / "medusa.py"), run_name="__main__")
