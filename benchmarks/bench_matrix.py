"""Time to resolve every cell of the matrix, in one process on one core.

Compares the staged evaluation (each stage run once per distinct input, on the
engine's own rules) with calling ``plan()`` per cell, measured on a sample and scaled
to the whole matrix. Target: at least 100,000 cells in at most 5 s.

    python benchmarks/bench_matrix.py [--runs 3] [--sample 20000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import interlock
from interlock import ResolutionError
from interlock.matrix import FLAG_SPACE, PROFILES, evaluate
from interlock.matrix.evaluate import show

TARGET_CELLS = 100_000
TARGET_SECONDS = 5.0


def staged() -> tuple[int, float]:
    started = time.perf_counter()
    cells = sum(1 for profile in PROFILES for _ in evaluate(profile))
    return cells, time.perf_counter() - started


def per_cell(sample: int, seed: int = 0) -> float:
    """Seconds per cell when each cell calls plan() with the memo emptied."""
    from interlock.engine.planner import clear_cache

    rng = random.Random(seed)
    values = {
        "accelerator": FLAG_SPACE.accelerators,
        "devices": FLAG_SPACE.devices,
        "strategy": FLAG_SPACE.strategies(),
        "precision": FLAG_SPACE.precisions,
        "num_nodes": FLAG_SPACE.num_nodes,
    }
    cells = [({k: rng.choice(v) for k, v in values.items()}, rng.choice(PROFILES).machine)
             for _ in range(sample)]
    started = time.perf_counter()
    for flags, machine in cells:
        clear_cache()
        try:
            interlock.plan(machine=machine, **flags)
        except ResolutionError:
            pass
    return (time.perf_counter() - started) / sample


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sample", type=int, default=20_000)
    args = parser.parse_args()
    runs = [staged() for _ in range(args.runs)]
    cells = runs[0][0]
    seconds = statistics.median(s for _, s in runs)
    plan_each = per_cell(args.sample)
    print(f"profiles: {len(PROFILES)}; cells: {cells} "
          f"(devices {', '.join(show(d) for d in FLAG_SPACE.devices)})")
    print(f"staged evaluation: {seconds:.2f} s median of {args.runs} "
          f"({min(s for _, s in runs):.2f}-{max(s for _, s in runs):.2f}), "
          f"{cells / seconds:,.0f} cells/s")
    print(f"plan() per cell (memo emptied, {args.sample} sampled cells): "
          f"{plan_each * 1e6:.1f} us/cell, {plan_each * cells:.1f} s for the whole matrix")
    met = cells >= TARGET_CELLS and seconds <= TARGET_SECONDS
    print(f"target (>= {TARGET_CELLS:,} cells in <= {TARGET_SECONDS:g} s): "
          f"{'MET' if met else 'MISSED'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
