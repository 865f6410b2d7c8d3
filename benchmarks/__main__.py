"""``python -m benchmarks``: the same as scripts/benchmark.py."""

import sys

from benchmarks.cli import main

sys.exit(main())
