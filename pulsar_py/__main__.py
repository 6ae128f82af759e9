"""``python -m pulsar_py``: the command line of pulsar_py.tools.cli."""

import sys

from .tools.cli import main

sys.exit(main(prog="python -m pulsar_py"))
