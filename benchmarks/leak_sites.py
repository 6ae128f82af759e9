"""Where do Python allocations that survive 1000 small renderer calls come from?
(tracemalloc snapshot difference; a diagnostic for tests/test_lifecycle.py)."""
import gc
import sys
import tracemalloc
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pulsar_py import Renderer  # noqa: E402
from test_lifecycle import varying_calls  # noqa: E402

call = varying_calls(Renderer(8, 6, n_channels=2, n_track=3, num_threads=1))

for i in range(3000):
    call(i)
tracemalloc.start(12)
gc.collect()
before = tracemalloc.take_snapshot()
for i in range(3000, 4000):
    call(i)
gc.collect()
after = tracemalloc.take_snapshot()
for stat in after.compare_to(before, "traceback")[:6]:
    print(stat)
    for line in stat.traceback.format()[-12:]:
        print("   ", line)
