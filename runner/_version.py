"""The runner's version (one place; the package and the envelope read it from here)."""

__version__ = "0.1.0"
