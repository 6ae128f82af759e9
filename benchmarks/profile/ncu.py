#!/usr/bin/env python3
"""Nsight Compute on the kernels of one forward+backward of a workload.

    python benchmarks/profile/ncu.py W4 [W1 ...] [--build DIR] [--out DIR] [--source] [--sass]

For each workload, runs ``ncu`` on this script's ``--step`` mode, which warms up
untraced and then opens the profiler (cudaProfilerStart, so ncu runs with
--profile-from-start off) around one forward+backward. The kernels whose names match
--kernel-regex (default: the render kernels) are profiled with the sections given
(default: speed of light, warp states, instruction statistics, occupancy, scheduler,
launch); the report goes to OUT/ncu_<W>.txt and its key lines are printed.

  --source     also Nsight Compute's per-instruction counters (executed instructions,
               active lanes, stall samples): the SASS view of each kernel matching a
               --source-kernels regex, as CSV in OUT/sass_<W>_<regex>.csv, and its hot
               instructions (executed at least --hot times as often as the most
               executed one) printed.
  --sass       the SASS of the kernels matching --kernel-regex in the build's native
               module (cuobjdump), in OUT/sass.txt with an index of the kernels.
  --hotspots CSV  print the hot instructions of an exported CSV and exit.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

import harness
import torch

SECTIONS = ["SpeedOfLight", "WarpStateStats", "InstructionStats", "Occupancy", "SchedulerStats", "LaunchStats"]
ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")  # an instruction's address in cuobjdump's listing
KEY_LINES = re.compile(
    r"render_|Duration|Issued Ipc|Issue Slots Busy|Active Warps|No Eligible|"
    r"Executed Instructions  |Registers|Achieved Occ|Avg. Active Threads|Avg. Not Predicated"
)


def step_mode(workload: str, build: Optional[str]) -> None:
    """One forward+backward inside cudaProfilerStart/Stop, after an untraced warm-up."""
    harness.use_build(build)
    case = harness.Case(harness.WORKLOADS[workload], torch.device("cuda"))
    for _ in range(3):
        case.step()
    torch.cuda.synchronize()
    case.reset()
    torch.cuda.profiler.start()
    case.forward_backward()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def hotspots(path: str, fraction: float) -> None:
    """The instructions of an exported SASS view executed at least ``fraction`` times as
    often as the most executed one, in address order, with stall samples and lanes."""
    rows = list(csv.reader(open(path, newline="")))
    at = next((i for i, r in enumerate(rows) if "Instructions Executed" in r), None)
    if at is None:
        print(f"{path}: no 'Instructions Executed' column")
        return
    header, data = rows[at], [r for r in rows[at + 1 :] if len(r) == len(rows[at])]

    def column(*names: str) -> Optional[int]:
        return next((header.index(n) for n in names if n in header), None)

    executed = column("Instructions Executed")
    samples = column("Warp Stall Sampling (All Samples)", "Warp Stall Sampling (All Cycles)")
    lanes = column("Avg. Predicated-On Threads Executed", "Avg. Threads Executed")
    source = column("Source")
    counts = [int(float(r[executed] or 0)) for r in data]
    if not counts:
        print(f"{path}: no instructions")
        return
    top = max(counts)
    total_samples = sum(int(float(r[samples] or 0)) for r in data) if samples is not None else 0
    print(
        f"{path}: {sum(counts) / 1e6:.1f} M warp instructions, {total_samples} stall samples, {len(data)} instructions"
    )
    print("  index  executed  samples  lanes  instruction")
    for i, (row, count) in enumerate(zip(data, counts)):
        if count >= fraction * top:
            sample = row[samples] if samples is not None else "-"
            lane = row[lanes] if lanes is not None else "-"
            text = row[source].strip() if source is not None else ""
            print(f"  {i:5d} {count / 1e6:8.2f}M {sample:>8s} {lane:>6s}  {text}")


def dump_sass(build: Optional[str], regex: str, out: Path) -> Optional[Path]:
    """The SASS of the native module's kernels whose demangled names match ``regex``,
    in one file (OUT/sass.txt) that starts with an index: line, instructions, name."""
    harness.use_build(build)
    import pulsar_py._native as native

    listing = subprocess.run(["cuobjdump", "-sass", native.__file__], capture_output=True, text=True)
    if listing.returncode != 0:
        print(f"cuobjdump failed: {listing.stderr[-500:]}")
        return None
    chunks = [c for c in re.split(r"\n(?=\s*Function : )", listing.stdout) if re.match(r"\s*Function : ", c)]
    mangled = [re.match(r"\s*Function : (\S+)", c).group(1) for c in chunks]
    demangled = mangled
    if shutil.which("cu++filt"):
        names = subprocess.run(["cu++filt"], input="\n".join(mangled), capture_output=True, text=True)
        if names.returncode == 0 and len(names.stdout.splitlines()) == len(mangled):
            demangled = names.stdout.splitlines()
    pattern = re.compile(regex)
    chosen = [(name, chunk) for name, chunk in zip(demangled, chunks) if pattern.search(name)]
    index, body, line = [], [], len(chosen) + 2
    for name, chunk in chosen:
        instructions = len(ADDRESS.findall(chunk))
        index.append(f"{line:8d} {instructions:6d}  {name}")
        body.append(chunk.rstrip("\n"))
        line += chunk.rstrip("\n").count("\n") + 1
    path = out / "sass.txt"
    path.write_text(
        "\n".join([f"{len(chosen)} kernels matching {regex!r}: line, instructions, name", *index, *body]) + "\n"
    )
    print(f"SASS of {len(chosen)} kernels: {path}")
    return path


def profile_workload(workload: str, args: argparse.Namespace, out: Path) -> None:
    step = [sys.executable, str(Path(__file__).resolve()), "--step", workload] + (
        ["--build", args.build] if args.build else []
    )
    ncu = [
        args.ncu,
        "--profile-from-start",
        "off",
        "--clock-control",
        "none",
        "--kernel-name",
        f"regex:{args.kernel_regex}",
    ]
    for section in args.sections.split(","):
        ncu += ["--section", section.strip()]
    if not args.source:
        with open(out / f"ncu_{workload}.txt", "w") as log:
            subprocess.run(ncu + step, stdout=log, stderr=subprocess.STDOUT)
        text = (out / f"ncu_{workload}.txt").read_text(errors="replace")
        print(f"{workload}: {out / f'ncu_{workload}.txt'}")
        print("\n".join(line for line in text.splitlines() if KEY_LINES.search(line))[:20000])
        return
    report = out / f"ncu_{workload}"
    ncu += ["--section", "SourceCounters", "--import-source", "yes", "-o", str(report), "-f"]
    with open(out / f"ncu_{workload}.log", "w") as log:
        subprocess.run(ncu + step, stdout=log, stderr=subprocess.STDOUT)
    details = subprocess.run(
        [args.ncu, "--import", f"{report}.ncu-rep", "--page", "details"], capture_output=True, text=True
    )
    (out / f"ncu_{workload}.txt").write_text(details.stdout + details.stderr)
    print(f"{workload}: {out / f'ncu_{workload}.txt'}, {report}.ncu-rep")
    print("\n".join(line for line in details.stdout.splitlines() if KEY_LINES.search(line))[:20000])
    for kernel in args.source_kernels.split(","):
        csv_path = out / f"sass_{workload}_{re.sub(r'[^A-Za-z0-9_]+', '_', kernel)}.csv"
        with open(csv_path, "w") as f:
            subprocess.run(
                [
                    args.ncu,
                    "--import",
                    f"{report}.ncu-rep",
                    "--kernel-name",
                    f"regex:{kernel}",
                    "--page",
                    "source",
                    "--csv",
                    "--print-source",
                    "sass",
                ],
                stdout=f,
                stderr=subprocess.DEVNULL,
            )
        hotspots(str(csv_path), args.hot)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="benchmarks/profile/ncu.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*", default=["W4"], help="W1 ... W6 (default W4)")
    parser.add_argument("--build", default=None, help="folder holding the pulsar_py to profile (default: installed)")
    parser.add_argument("--out", default=None, help="folder for the reports (default $OUT, else ./ncu_out)")
    parser.add_argument("--kernel-regex", default="render_", help="kernels to profile (default render_)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated ncu sections")
    parser.add_argument("--source", action="store_true", help="per-instruction counters, exported as CSV")
    parser.add_argument(
        "--source-kernels",
        default="render_forward,render_backward",
        help="comma-separated regexes, one CSV each (default render_forward,render_backward)",
    )
    parser.add_argument("--hot", type=float, default=0.3, help="hot-instruction threshold (default 0.3)")
    parser.add_argument("--sass", action="store_true", help="dump the SASS of the matching kernels")
    parser.add_argument("--hotspots", default=None, metavar="CSV", help="print the hot instructions of a CSV")
    parser.add_argument("--ncu", default="ncu", help="the ncu executable (default ncu)")
    parser.add_argument("--step", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        step_mode(args.step, args.build)
        return 0
    if args.hotspots:
        hotspots(args.hotspots, args.hot)
        return 0
    try:
        workloads: List[str] = [w.name for w in harness.parse_workloads(" ".join(args.workloads))]
    except ValueError as exc:
        parser.error(str(exc))
    out = Path(args.out or os.environ.get("OUT") or "ncu_out")
    out.mkdir(parents=True, exist_ok=True)
    if args.sass:
        dump_sass(args.build, args.kernel_regex, out)
    if shutil.which(args.ncu) is None:
        parser.error(f"{args.ncu}: not found (install Nsight Compute or pass --ncu PATH)")
    for workload in workloads:
        profile_workload(workload, args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
