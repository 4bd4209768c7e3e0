"""headstart: train drafting heads for speculative decoding.

The code lives in the repository's top-level folders (models/, data/, train/, eval/, conf/), installed as
`headstart.models`, `headstart.data`, ... (see pyproject.toml).
"""

import os

# Read by OpenMP when torch loads, so only effective when headstart is imported first (tests, `python -m`);
# launch.sh exports it for the entry scripts. Why: eval/timing/harness.py.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
