#!/usr/bin/env python3
"""Benchmark driver from a checkout: ``python benchmarks/run.py [--workloads W3 ...]``.

A thin wrapper around ``pulsar_py.tools.bench.main`` (also ``python -m pulsar_py bench``); see
benchmarks/README.md. It builds nothing: it uses the installed pulsar_py, or the
checkout's own when that holds a built ``pulsar_py/_native`` module.
"""

import sys
from pathlib import Path

try:
    import pulsar_py.tools.bench as bench
except ImportError:
    # Not installed: fall back to the checkout (needs an in-place build of _native).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import pulsar_py.tools.bench as bench

if __name__ == "__main__":
    sys.exit(bench.main(sys.argv[1:]))
