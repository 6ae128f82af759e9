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
  --table REPORT  print the per-kernel table of a report (OUT/ncu_<W>.txt) and exit.

Each profiled workload's report is also summarised as the per-kernel table of
docs/kernels.md: one row per kernel, its launches merged (times summed, the other
figures weighted by time), in the order the kernels first ran. The table needs the
SpeedOfLight, Occupancy, LaunchStats and SchedulerStats sections (in the defaults).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import harness
import torch

SECTIONS = ["SpeedOfLight", "WarpStateStats", "InstructionStats", "Occupancy", "SchedulerStats", "LaunchStats"]
ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")  # an instruction's address in cuobjdump's listing
KEY_LINES = re.compile(
    r"render_|Duration|Issued Ipc|Issue Slots Busy|Active Warps|No Eligible|"
    r"Executed Instructions  |Registers|Achieved Occ|Avg. Active Threads|Avg. Not Predicated"
)


# The table's figures: (field, the metric's name in ncu's details page).
TABLE_METRICS = (
    ("us", "Duration"),
    ("dram", "DRAM Throughput"),
    ("l2", "L2 Cache Throughput"),
    ("sm", "Compute (SM) Throughput"),
    ("issued", "Issued Warp Per Scheduler"),
    ("registers", "Registers Per Thread"),
    ("achieved", "Achieved Occupancy"),
    ("theoretical", "Theoretical Occupancy"),
)
# A launch's header in the details page: "  void ns::name<...>(args) (grid)x(block), Context ..."
LAUNCH = re.compile(r"^  (?:void )?(\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
TIME_UNITS = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


@dataclass
class Launch:
    """One kernel launch of a details page: its short name, grid and block sizes (threads
    and blocks over all dimensions) and the TABLE_METRICS found (duration in us)."""

    name: str
    grid: int
    block: int
    figures: Dict[str, float] = field(default_factory=dict)


def parse_launches(text: str) -> List[Launch]:
    """The launches of an ncu details page (``ncu --page details``, its default text
    output), in order. A kernel's short name drops its namespaces, template arguments and
    parameters."""
    launches: List[Launch] = []
    for line in text.splitlines():
        header = LAUNCH.match(line)
        if header:
            full = header.group(1).replace("<unnamed>::", "").replace("(anonymous namespace)::", "")
            name = re.split(r"[<(]", full)[0].split("::")[-1]
            sizes = [int(header.group(i)) for i in range(2, 8)]
            launches.append(Launch(name, sizes[0] * sizes[1] * sizes[2], sizes[3] * sizes[4] * sizes[5]))
            continue
        if not launches:
            continue
        words = line.split()
        for key, metric in TABLE_METRICS:
            if key in launches[-1].figures or not line.strip().startswith(metric + " ") or len(words) < 2:
                continue
            try:
                value = float(words[-1].replace(",", ""))
            except ValueError:
                continue
            if key == "us":
                value *= TIME_UNITS.get(words[-2], 1.0)
            launches[-1].figures[key] = value
    return launches


def kernel_table(launches: Sequence[Launch]) -> str:
    """The per-kernel markdown table of docs/kernels.md: one row per kernel name in the
    order of first launch, "(xN)" for N launches, their times summed, the other figures
    weighted by time (registers and theoretical occupancy: the largest), "-" where the
    report lacks a figure; then a line with the launches and the total time."""
    rows: Dict[str, List[Launch]] = {}
    for launch in launches:
        rows.setdefault(launch.name, []).append(launch)
    lines = [
        "| kernel | grid x block | us | DRAM % | L2 % | SM % | issued / cycle | registers | occupancy % |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def weighted(group: List[Launch], key: str, digits: int) -> str:
        have = [g for g in group if key in g.figures and "us" in g.figures]
        weight = sum(g.figures["us"] for g in have)
        if not have or weight <= 0:
            return "-"
        return f"{sum(g.figures[key] * g.figures['us'] for g in have) / weight:.{digits}f}"

    def largest(group: List[Launch], key: str) -> str:
        values = [g.figures[key] for g in group if key in g.figures]
        return f"{max(values):.0f}" if values else "-"

    for name, group in rows.items():
        count = f" (x{len(group)})" if len(group) > 1 else ""
        grids = "/".join(str(g) for g in sorted({launch.grid for launch in group}))
        blocks = "/".join(str(b) for b in sorted({launch.block for launch in group}))
        time = sum(g.figures.get("us", 0.0) for g in group)
        cells = [
            f"`{name}`{count}",
            f"{grids} x {blocks}",
            f"{time:.1f}",
            weighted(group, "dram", 1),
            weighted(group, "l2", 1),
            weighted(group, "sm", 1),
            weighted(group, "issued", 2),
            largest(group, "registers"),
            f"{weighted(group, 'achieved', 0)} / {largest(group, 'theoretical')}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    total = sum(g.figures.get("us", 0.0) for g in launches)
    lines.append(f"{len(launches)} launches, {total:,.0f} us")
    return "\n".join(lines)


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
        print(kernel_table(parse_launches(text)))
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
    parser.add_argument("--table", default=None, metavar="REPORT", help="print the per-kernel table of a report")
    parser.add_argument("--ncu", default="ncu", help="the ncu executable (default ncu)")
    parser.add_argument("--step", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        step_mode(args.step, args.build)
        return 0
    if args.hotspots:
        hotspots(args.hotspots, args.hot)
        return 0
    if args.table:
        launches = parse_launches(Path(args.table).read_text(errors="replace"))
        if not launches:
            parser.error(f"--table {args.table}: no kernel launches in it (expected ncu's details page)")
        print(kernel_table(launches))
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
