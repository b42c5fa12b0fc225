"""Run each fault scenario under each launcher N times in a row; print the times from the
fault to the end of the job as a markdown table (the figures in docs/benchmarks.md).

    python tests/cluster/repeat_faults.py [--times 10] [--styles torchrun,mpirun]
        [--scenarios crash,hang,preempt]

SLURM must be running for the srun style (tests/cluster/services.sh start); a style
whose tools are missing is left out with the reason. Any failed run stops the loop
with its message: a flake is a failure.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fault_scenarios
from cluster_harness import SERVICES, tool_missing
from cluster_launchers import SLURM_ENV, STYLES

SCENARIOS = {"crash": fault_scenarios.crash, "hang": fault_scenarios.hang,
             "preempt": fault_scenarios.preempt}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--times", type=int, default=10)
    p.add_argument("--styles", default=",".join(STYLES))
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = p.parse_args()
    env = subprocess.run(["bash", str(SERVICES), "env"], capture_output=True, text=True,
                         check=True).stdout.split()
    for line in env:
        key, _, value = line.partition("=")
        SLURM_ENV[key] = value
    rows = []
    for name in args.styles.split(","):
        style = STYLES[name]
        missing = tool_missing(*style.tools)
        if missing:
            print(f"skipping {name}: {missing}", file=sys.stderr)
            continue
        for scenario in args.scenarios.split(","):
            times = []
            for i in range(args.times):
                with tempfile.TemporaryDirectory(prefix=f"{name}-{scenario}-") as tmp:
                    started = time.monotonic()
                    outcome = SCENARIOS[scenario](style, Path(tmp))
                    times.append(outcome.seconds)
                    print(f"{name} {scenario} #{i + 1}: {outcome.seconds:.2f}s to the end "
                          f"(run {time.monotonic() - started:.1f}s, exit {outcome.codes})",
                          file=sys.stderr, flush=True)
            rows.append((name, scenario, times))
    print("| launcher | scenario | runs | median s | min s | max s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, scenario, times in rows:
        print(f"| {name} | {scenario} | {len(times)} | {statistics.median(times):.2f} | "
              f"{min(times):.2f} | {max(times):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
