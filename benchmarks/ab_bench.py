"""A/B of the benchmark itself: the driver's forward and forward + backward medians for
two or more copies of the package, run alternately on one lent machine (the host's
speed moves W3 and W4 by 30 % between machines; within one machine, runs agree to a few
per cent). Each DIR holds a pulsar_py folder with its built _native module.

Usage: python3 benchmarks/ab_bench.py [--python-only] A_DIR B_DIR [C_DIR ...] -- W3 W4 [--rounds 2] [--repeats 40]
Prints, per workload and build, the median over rounds of the driver's medians.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ab_builds import builds_and_rest

RUN = Path(__file__).resolve().parent / "run.py"


def one_run(package: str, workloads: list, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "bench.json"
        env = dict(os.environ, PYTHONPATH=os.path.abspath(package))
        done = subprocess.run([sys.executable, str(RUN), "--device", "cuda", "--workloads", ",".join(workloads),
                               "--repeats", str(repeats), "--quiet", "--json", str(out)],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-3000:])
            return {}
        rows = json.loads(out.read_text())["results"]
        return {r["workload"]: (r["fwd_ms"], r["fwd_bwd_ms"]) for r in rows}


def main() -> None:
    packages, labels, rest = builds_and_rest(sys.argv[1:])
    rounds, repeats = 2, 40
    if "--rounds" in rest:
        rounds = int(rest.pop(rest.index("--rounds") + 1))
        rest.remove("--rounds")
    if "--repeats" in rest:
        repeats = int(rest.pop(rest.index("--repeats") + 1))
        rest.remove("--repeats")
    workloads = rest or ["W3", "W4"]
    figures = {}  # (label, workload) -> [(fwd, fwd_bwd)]
    for _ in range(rounds):
        for label, package in zip(labels, packages):
            for workload, pair in one_run(package, workloads, repeats).items():
                figures.setdefault((label, workload), []).append(pair)
    print(f"fwd / fwd+bwd ms, median over {rounds} rounds of the driver's medians of {repeats}")
    for label, package in zip(labels, packages):
        print(f"  {label}: {package}")
    for workload in workloads:
        cells = []
        for label in labels:
            runs = figures.get((label, workload), [])
            if runs:
                cells.append(f"{label} {statistics.median(r[0] for r in runs):6.2f} / "
                             f"{statistics.median(r[1] for r in runs):6.2f}")
        print(f"  {workload}: " + "   ".join(cells))


if __name__ == "__main__":
    main()
