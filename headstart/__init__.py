"""headstart: train drafting heads for speculative decoding.

The code lives in the repository's top-level folders (models/, data/, train/, eval/, conf/), installed as
`headstart.models`, `headstart.data`, ... (see pyproject.toml).
"""

__version__ = "0.1.0"
