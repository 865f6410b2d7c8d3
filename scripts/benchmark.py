#!/usr/bin/env python3
"""The benchmark's entry point: the code is the benchmarks/ package (``--help`` for the flags;
``python -m benchmarks`` from the checkout is the same)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/, this runner

from benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
