"""benchmarks/profile/ncu.py: the per-kernel table of docs/kernels.md, from the text of
Nsight Compute's details page (no GPU needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

PROFILE = Path(__file__).resolve().parents[2] / "benchmarks" / "profile"
sys.path.insert(0, str(PROFILE))
import ncu  # noqa: E402


def _launch(name: str, grid: int, block: int, us: str, dram: str, sm: str, achieved: str, registers: int) -> str:
    """One launch as ncu's details page prints it (the lines the table reads, and others)."""
    header = f"  void pulsar::<unnamed>::{name}<float, 3>(pulsar::RendererConfig, const int *) ({grid}, 1, 1)x"
    return f"""{header}({block}, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    DRAM Frequency                  Ghz         3.16
    DRAM Throughput                   %         {dram}
    Duration                         {us}
    L2 Cache Throughput               %        10.00
    Compute (SM) Throughput           %         {sm}
    Section: Scheduler Statistics
    Issued Warp Per Scheduler                        0.50
    Section: Launch Statistics
    Registers Per Thread             register/thread              {registers}
    Section: Occupancy
    Theoretical Occupancy                     %           50
    Achieved Occupancy                        %        {achieved}
"""


REPORT = "\n".join(
    [
        "==PROF== Connected to process 1",
        _launch("sort_kernel", 10, 256, "us         3.00", "20.00", "10.00", "40.00", 32),
        _launch("render_kernel", 4096, 256, "ms         1.50", "5.00", "70.00", "45.00", 64),
        _launch("sort_kernel", 20, 256, "us         1.00", "60.00", "30.00", "20.00", 40),
    ]
)


def test_launches_are_read_in_order_with_their_units():
    launches = ncu.parse_launches(REPORT)
    assert [launch.name for launch in launches] == ["sort_kernel", "render_kernel", "sort_kernel"]
    assert [launch.figures["us"] for launch in launches] == [3.0, 1500.0, 1.0]
    assert (launches[1].grid, launches[1].block) == (4096, 256)
    assert launches[2].figures["registers"] == 40


def test_the_table_merges_a_kernels_launches_weighted_by_time():
    table = ncu.kernel_table(ncu.parse_launches(REPORT)).splitlines()
    assert table[0].startswith("| kernel | grid x block | us |")
    # sort_kernel: 3 + 1 us; DRAM (20 * 3 + 60 * 1) / 4 = 30; SM (10 * 3 + 30 * 1) / 4 = 15;
    # achieved occupancy (40 * 3 + 20 * 1) / 4 = 35; the larger register count.
    assert table[2] == "| `sort_kernel` (x2) | 10/20 x 256 | 4.0 | 30.0 | 10.0 | 15.0 | 0.50 | 40 | 35 / 50 |"
    assert table[3] == "| `render_kernel` | 4096 x 256 | 1500.0 | 5.0 | 10.0 | 70.0 | 0.50 | 64 | 45 / 50 |"
    assert table[-1] == "3 launches, 1,504 us"


def test_a_report_without_launches_is_refused(tmp_path, capsys):
    empty = tmp_path / "ncu_W4.txt"
    empty.write_text("==PROF== Connected to process 1\n==ERROR== no kernels were profiled\n")
    with pytest.raises(SystemExit):
        ncu.main(["--table", str(empty)])
    assert "no kernel launches" in capsys.readouterr().err
