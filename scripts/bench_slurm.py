#!/usr/bin/env python3
"""The Slurm benchmark's entry point: the code is benchmarks/slurm.py (``--help`` for the
flags)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/, this runner

from benchmarks.slurm import main

if __name__ == "__main__":
    sys.exit(main())
