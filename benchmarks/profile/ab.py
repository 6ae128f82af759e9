#!/usr/bin/env python3
"""A/B of two or more builds of pulsar_py on the standard workloads: forward and
forward+backward times, alternating between the builds on one machine.

    python benchmarks/profile/ab.py --builds /tmp/a /tmp/b --workloads W1,W2,W3,W4,W5,W6 \\
        --rounds 3 --repeats 20 --json out/ab.json

Each build folder holds a ``pulsar_py`` package with its built native module: a
``pip install --no-deps --target DIR`` of any revision, or a copy of an installed
package. Every round runs each build once, in build order (A, B, A, B, ...), each in a
fresh process that imports pulsar_py from its folder only and times every workload:
``repeats`` calls after warm-up, forward and forward+backward. A build's figure is the
median over rounds of its round medians; the table gives it per workload with the ratio
of each later build to the first (B/A < 1: B is faster); on CUDA a second table gives the
host's part of the same calls (from the call to its return). The timing code is this tool's,
and it uses only the public API of the pulsar_py it imports, so builds whose Python
packages differ are timed by the same harness. See benchmarks/profile/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import harness
import torch

MODES = ("fwd", "fwd+bwd")
# The host's part of the same CUDA calls: from the call to its return, the device perhaps
# still working (an eager call's count read-back waits for its binning). Steadier than
# the event span on hosts whose scheduling moves from process to process, and what a
# change of host code changes.
HOST_MODES = ("fwd host", "fwd+bwd host")
PROGRESS = "ab-progress: "  # marks the child's progress lines among its other output


# ----------------------------------------------------------------------------------------
# The child: one build, one round


def run_child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Time every workload of ``spec`` with the pulsar_py of ``spec['build']``."""
    if spec.get("cpus"):
        # Every child on the same cores: the host's share of a call can depend on which
        # core (and how far from the GPU) the process lands on, a spread that may exceed
        # the differences an A/B looks for.
        os.sched_setaffinity(0, spec["cpus"])
    harness.use_build(spec["build"])
    device = torch.device(spec["device"])
    grads = harness.parse_grads(spec["grads"])
    attrs = harness.parse_attrs(spec["set"])
    result: Dict[str, Any] = {"build": harness.build_description(), "workloads": {}}
    for name in spec["workloads"]:
        workload = harness.WORKLOADS[name]
        variants = [("eager", False)] + ([("compiled", True)] if name in spec["compile"] else [])
        entry: Dict[str, Any] = {}
        for variant, compiled in variants:
            case = harness.Case(
                workload, device, grads, attrs, compiled=compiled, compile_backend=spec["compile_backend"]
            )
            record: Dict[str, Any] = {}
            cuda = device.type == "cuda"
            if cuda and spec.get("fixed_capacity"):
                record["fixed_capacity"] = case.fix_instance_capacity()
            fwd_host: List[float] = []
            fwd_bwd_host: List[float] = []
            record["fwd"] = harness.time_calls(
                device, case.forward, lambda: None, spec["warmup_fwd"], spec["repeats"], fwd_host
            )
            if cuda:
                record["fwd host"] = fwd_host
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            record["fwd+bwd"] = harness.time_calls(
                device, case.forward_backward, case.reset, spec["warmup_fwd_bwd"], spec["repeats"], fwd_bwd_host
            )
            if cuda:
                record["fwd+bwd host"] = fwd_bwd_host
                torch.cuda.synchronize(device)
                record["allocator_peak_fwd_bwd_mib"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
            if compiled:  # the compiled call must render what the renderer renders
                with torch.no_grad():
                    eager = harness.RenderCall(case.renderer)(*case.inputs[:3], case.inputs[4], case.inputs[3])
                record["max_abs_difference_to_eager"] = float((case.forward() - eager).abs().max())
            if spec["kernels"] and device.type == "cuda":
                record["kernels"] = harness.kernel_times(case.step, device, spec["kernel_steps"])
            entry[variant] = record
            del case
        result["workloads"][name] = entry
        print(f"{PROGRESS}{name} done", file=sys.stderr, flush=True)
    return result


# ----------------------------------------------------------------------------------------
# Summary of the rounds


def summarise(
    runs: Dict[str, List[Dict[str, Any]]],
    labels: Sequence[str],
    workloads: Sequence[str],
    modes: Sequence[str] = MODES,
) -> List[Dict[str, Any]]:
    """Rows of the table: one per (workload, variant), with for each of ``modes`` and
    build the round medians (median of that round's repeats), their median, and the ratio
    of each build's median to the first build's. ``runs[label]``: the child results of
    that build, one per round (a failed round holds an 'error' and is skipped; a round
    without a mode's times counts as none)."""
    rows = []
    for workload in workloads:
        variants: List[str] = []
        for label in labels:
            for run in runs.get(label, []):
                for variant in run.get("workloads", {}).get(workload, {}):
                    if variant not in variants:
                        variants.append(variant)
        for variant in variants:
            row: Dict[str, Any] = {"workload": workload, "variant": variant}
            for mode in modes:
                per_build: Dict[str, Any] = {}
                for label in labels:
                    rounds = [
                        harness.median(run["workloads"][workload][variant].get(mode, []))
                        for run in runs.get(label, [])
                        if variant in run.get("workloads", {}).get(workload, {})
                    ]
                    rounds = [r for r in rounds if r is not None]
                    per_build[label] = {"round_medians_ms": rounds, "median_ms": harness.median(rounds)}
                first = per_build[labels[0]]["median_ms"]
                first_rounds = per_build[labels[0]]["round_medians_ms"]
                for label in labels[1:]:
                    value = per_build[label]["median_ms"]
                    per_build[label][f"ratio_to_{labels[0]}"] = None if value is None or not first else value / first
                    # Round by round (the builds ran one after the other in each): in how
                    # many rounds this build was the faster of the pair.
                    pairs = list(zip(first_rounds, per_build[label]["round_medians_ms"]))
                    per_build[label][f"rounds_faster_than_{labels[0]}"] = [sum(b < a for a, b in pairs), len(pairs)]
                row[mode] = per_build
            rows.append(row)
    return rows


def summarise_kernels(
    runs: Dict[str, List[Dict[str, Any]]], labels: Sequence[str], workload: str
) -> Dict[str, Dict[str, Optional[float]]]:
    """{kernel: {label: median over rounds of its ms per forward+backward}} (a kernel a
    round did not run counts 0 in that round)."""
    names: List[str] = []
    per_round: Dict[str, List[Dict[str, Any]]] = {}
    for label in labels:
        per_round[label] = [
            run["workloads"][workload]["eager"].get("kernels", {})
            for run in runs.get(label, [])
            if workload in run.get("workloads", {})
        ]
        for kernels in per_round[label]:
            names += [k for k in kernels if k not in names]
    table = {}
    for name in names:
        table[name] = {
            label: harness.median([k[name][0] if name in k else 0.0 for k in per_round[label]]) for label in labels
        }
    return table


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _align(header: List[str], lines: List[List[str]]) -> str:
    widths = [
        max(len(header[i]), *(len(line[i]) for line in lines)) if lines else len(header[i]) for i in range(len(header))
    ]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(line.rstrip() for line in out)


def format_table(rows: List[Dict[str, Any]], labels: Sequence[str], modes: Sequence[str] = MODES) -> str:
    """Per mode: each build's median ms, then each later build's ratio to the first and, in
    brackets, the rounds in which it was the faster of the two (the builds' completed
    rounds paired in the order they ran)."""
    header = ["workload"]
    for mode in modes:
        header += [f"{label} {mode} ms" for label in labels]
        header += [f"{label}/{labels[0]} {mode}" for label in labels[1:]]
    lines = []
    for row in rows:
        name = row["workload"] + ("" if row["variant"] == "eager" else f" {row['variant']}")
        line = [name]
        for mode in modes:
            per_build = row[mode]
            line += [_fmt(per_build[label]["median_ms"], 3) for label in labels]
            for label in labels[1:]:
                faster, paired = per_build[label][f"rounds_faster_than_{labels[0]}"]
                line.append(
                    _fmt(per_build[label][f"ratio_to_{labels[0]}"], 3) + (f" [{faster}/{paired}]" if paired else "")
                )
        lines.append(line)
    return _align(header, lines)


def format_kernel_table(table: Dict[str, Dict[str, Optional[float]]], labels: Sequence[str]) -> str:
    """Kernel ms per forward+backward of each build, largest first, with a sum row."""
    header = ["kernel"] + [f"{label} ms" for label in labels] + [f"{label}/{labels[0]}" for label in labels[1:]]
    order = sorted(table, key=lambda k: -max(v or 0.0 for v in table[k].values()))
    totals = {label: sum(table[k][label] or 0.0 for k in table) for label in labels}
    lines = []
    for name, values in [(k, table[k]) for k in order] + [("sum", totals)]:
        first = values[labels[0]]
        lines.append(
            [name[:60]]
            + [_fmt(values[label], 3) for label in labels]
            + [_fmt(values[label] / first if first and values[label] is not None else None, 3) for label in labels[1:]]
        )
    return _align(header, lines)


# ----------------------------------------------------------------------------------------
# The parent


def _one_round(build: str, spec: Dict[str, Any], quiet: bool) -> Dict[str, Any]:
    """Run one child for ``build``; its result, or {'error': ...}."""
    with tempfile.TemporaryDirectory() as folder:
        spec_path, out_path = Path(folder, "spec.json"), Path(folder, "result.json")
        spec_path.write_text(json.dumps(dict(spec, build=build)))
        # The child runs in an empty folder so that no pulsar_py in the current folder
        # can shadow the build's.
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path), str(out_path)],
            cwd=folder,
            env=harness.child_env(build),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0 or not out_path.exists():
            tail = (done.stderr or done.stdout)[-3000:]
            print(f"  {build}: the child failed (exit {done.returncode}):\n{tail}", file=sys.stderr)
            return {"error": f"exit {done.returncode}: {tail[-500:]}"}
        if not quiet:  # the child's progress; its warnings only when it fails
            for line in done.stderr.splitlines():
                if line.startswith(PROGRESS):
                    print("  " + line[len(PROGRESS) :], file=sys.stderr)
        return json.loads(out_path.read_text())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="benchmarks/profile/ab.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--builds",
        nargs="+",
        required=True,
        metavar="DIR",
        help="two or more folders, each holding a built pulsar_py package",
    )
    parser.add_argument("--labels", default=None, help="comma-separated names of the builds (default A, B, C ...)")
    parser.add_argument("--workloads", default="W3,W4", help="comma-separated, e.g. W1,W2,W3 (default W3,W4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every build once (default 3)")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed calls per round and mode (default 20 on CUDA, 5 on the CPU)"
    )
    parser.add_argument("--warmup-fwd", type=int, default=None, help="untimed forwards (default 3 CUDA, 1 CPU)")
    parser.add_argument(
        "--warmup-fwd-bwd", type=int, default=None, help="untimed forward+backwards (default 10 CUDA, 1 CPU)"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--grads",
        default="all",
        help="inputs whose gradients the backward computes: all, or some of pos,col,rad,opacity,cam (default all)",
    )
    parser.add_argument(
        "--compile",
        default="",
        metavar="WORKLOADS",
        help="also time these workloads through torch.compile of a module that calls the "
        "renderer (rows '<W> compiled'), e.g. --compile W3",
    )
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument(
        "--kernels", action="store_true", help="also the CUPTI kernel times of each forward+backward (CUDA), per build"
    )
    parser.add_argument("--kernel-steps", type=int, default=10, help="steps profiled per round for --kernels")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a renderer attribute in every build (repeatable); a build without it fails",
    )
    parser.add_argument(
        "--fixed-capacity",
        action="store_true",
        help="CUDA: fix each renderer's instance capacity at what three steps taught it before "
        "timing, so that no call reads its instance count back: the host table is then the "
        "host's own work (builds without a capacity time as they are)",
    )
    parser.add_argument(
        "--same-native",
        action="store_true",
        help="the builds share one native module (an A/B of the Python package alone); "
        "without it, folders carrying the same module are refused",
    )
    parser.add_argument(
        "--cpus",
        default="",
        metavar="LIST",
        help="run every child on these CPU cores, e.g. 2,3 (default: wherever the OS puts it)",
    )
    parser.add_argument("--json", dest="json_path", default=None, help="write every figure here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        spec = json.loads(Path(argv[1]).read_text())
        Path(argv[2]).write_text(json.dumps(run_child(spec)))
        return 0
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        workloads = [w.name for w in harness.parse_workloads(args.workloads)]
        compiled = [w.name for w in harness.parse_workloads(args.compile)] if args.compile.strip() else []
        harness.parse_grads(args.grads)
        harness.parse_attrs(args.set)
        digests = harness.check_builds(args.builds, same_native=args.same_native)
    except ValueError as exc:
        parser.error(str(exc))
    missing = [w for w in compiled if w not in workloads]
    if missing:
        parser.error(f"--compile {','.join(missing)}: not among --workloads")
    labels = (
        [s.strip() for s in args.labels.split(",")]
        if args.labels
        else [chr(ord("A") + i) for i in range(len(args.builds))]
    )
    if len(labels) != len(args.builds) or len(set(labels)) != len(labels):
        parser.error(f"--labels: expected {len(args.builds)} distinct names, got {args.labels!r}")
    if args.rounds < 1 or (args.repeats is not None and args.repeats < 1):
        parser.error("--rounds and --repeats must be at least 1")
    cuda = torch.device(args.device).type == "cuda"
    if args.kernels and not cuda:
        parser.error("--kernels needs --device cuda")
    try:
        cpus = sorted({int(c) for c in args.cpus.split(",") if c.strip()})
    except ValueError:
        parser.error(f"--cpus: expected comma-separated core numbers, got {args.cpus!r}")
    if cpus and not set(cpus) <= os.sched_getaffinity(0):
        parser.error(
            f"--cpus: cores {sorted(set(cpus) - os.sched_getaffinity(0))} are not available here "
            f"(available: {sorted(os.sched_getaffinity(0))})"
        )
    spec = dict(
        device=args.device,
        cpus=cpus,
        workloads=workloads,
        compile=compiled,
        compile_backend=args.compile_backend,
        repeats=args.repeats or (20 if cuda else 5),
        warmup_fwd=args.warmup_fwd if args.warmup_fwd is not None else (3 if cuda else 1),
        warmup_fwd_bwd=args.warmup_fwd_bwd if args.warmup_fwd_bwd is not None else (10 if cuda else 1),
        grads=args.grads,
        set=args.set,
        fixed_capacity=args.fixed_capacity,
        kernels=args.kernels,
        kernel_steps=args.kernel_steps,
    )

    runs: Dict[str, List[Dict[str, Any]]] = {label: [] for label in labels}
    for r in range(args.rounds):
        for label, build in zip(labels, args.builds):
            if not args.quiet:
                print(f"round {r + 1}/{args.rounds}, {label}: {build}", file=sys.stderr, flush=True)
            runs[label].append(_one_round(build, spec, args.quiet))
    good = {label: [run for run in runs[label] if "error" not in run] for label in labels}
    rows = summarise(good, labels, workloads)

    print(
        f"median over {args.rounds} rounds of each round's median of {spec['repeats']} calls "
        f"({args.device}); ratios below 1: faster than {labels[0]}"
    )
    for label, build in zip(labels, args.builds):
        version = next((run["build"].get("version") for run in good[label]), None)
        failed = len(runs[label]) - len(good[label])
        print(f"  {label}: {build} (pulsar_py {version})" + (f", {failed} round(s) failed" if failed else ""))
    print(format_table(rows, labels))
    host_rows = summarise(good, labels, workloads, HOST_MODES) if cuda else []
    if host_rows:
        print("\nhost ms per call (from the call to its return), the same calls")
        print(format_table(host_rows, labels, HOST_MODES))
    kernel_tables = {}
    if args.kernels:
        for workload in workloads:
            kernel_tables[workload] = summarise_kernels(good, labels, workload)
            print(f"\n{workload}: kernel ms per forward+backward (median over rounds)")
            print(format_kernel_table(kernel_tables[workload], labels))
    if args.json_path:
        report = dict(
            device=torch.cuda.get_device_name(args.device)
            if cuda
            else f"{platform.machine()} CPU, {os.cpu_count()} cores",
            driver=harness.driver_version() if cuda else None,
            torch=torch.__version__ + (f", CUDA {torch.version.cuda}" if torch.version.cuda else ""),
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            command=shlex.join(["python", "benchmarks/profile/ab.py", *argv]),
            settings=dict(spec, rounds=args.rounds),
            builds=[
                dict(
                    label=label,
                    folder=build,
                    native_sha256=digest,
                    description=next((run["build"] for run in good[label]), None),
                    failed_rounds=[run["error"] for run in runs[label] if "error" in run],
                )
                for label, build, digest in zip(labels, args.builds, digests)
            ],
            rows=rows,
            host_rows=host_rows or None,
            kernels=kernel_tables or None,
            rounds=good,
        )
        folder = os.path.dirname(args.json_path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json_path}")
    return 0 if all(good[label] for label in labels) else 1


if __name__ == "__main__":
    sys.exit(main())
