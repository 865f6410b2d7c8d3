"""The runner's version (one place; the package and the envelope read it from here)."""

__version__ = "0.1.0"

DISTRIBUTION = "reproduction-runner"
"""The name it is installed by (``pip install reproduction-runner``); the command is ``runner``."""
