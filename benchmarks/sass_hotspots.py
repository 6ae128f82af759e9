"""The hot instructions of one render kernel, from a CSV that device_ncu_source.sh exports
(Nsight Compute's source page, SASS view): executed warp instructions, stall samples and
active lanes per instruction, in address order, for the instructions executed at least
`fraction` times as often as the most executed one.

Usage: python3 benchmarks/sass_hotspots.py sass_W1_forward.csv [fraction, default 0.3]
"""
import csv
import sys


def main(path: str, fraction: float) -> None:
    rows = list(csv.reader(open(path)))
    header, data = rows[1], rows[2:]
    executed = header.index("Instructions Executed")
    samples = header.index("Warp Stall Sampling (All Samples)")
    lanes = header.index("Avg. Predicated-On Threads Executed")
    counts = [int(r[executed]) for r in data]
    print(f"{sum(counts) / 1e6:.1f} M warp instructions, {sum(int(r[samples]) for r in data)} stall samples, "
          f"{len(data)} instructions")
    print("index  executed  samples  lanes  instruction")
    top = max(counts)
    for i, (row, count) in enumerate(zip(data, counts)):
        if count >= fraction * top:
            print(f"{i:5d} {count / 1e6:8.2f}M {int(row[samples]):8d} {float(row[lanes]):6.1f}  {row[1].strip()}")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.3)
