"""Soak: inject many random faults into real training and count what survives.

Run as ``python tests/soak/soak_faults.py --runs 20`` (or ``nox -s soak``); pytest does
not collect it. Each run trains interlock's fault workload
(:mod:`interlock.conformance.faults`: 8 AdamW steps, a checkpoint every 2) on a
strategy at world size 2 with ``launch(max_restarts=1)`` and one fault, drawn from a
seeded generator: its kind (mostly a SIGKILL mid-training or mid-save, sometimes an
exception inside ``backward``), its rank and its step. Each run's final parameters and
optimizer state are compared bit for bit with one uninterrupted run's.

It prints each fault and a summary, and writes the summary as JSON: faults injected,
survived (finished, equal to the uninterrupted run), lost (finished, but the final
state differs), failed (did not finish), and the seconds from the fault to the
restarted attempt training again (median, max).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import interlock
from interlock.conformance import faults
from interlock.strategies.restarts import RestartPolicy

#: kind -> weight: the soak draws the kinds of crash a long job meets most often
KINDS: dict[str, float] = {"kill": 4, "kill_during_save": 4, "raise_in_backward": 2}
WORLD_SIZE = 2


def _strategy(name: str) -> Any:
    strategy: Any = interlock.resolve(accelerator="cpu", devices=WORLD_SIZE, strategy=name,
                                      precision="32-true")
    strategy.timeout = datetime.timedelta(seconds=60)
    return strategy


def draw(rng: random.Random) -> faults.Fault:
    return faults.Fault(kind=rng.choices(list(KINDS), list(KINDS.values()))[0],
                        rank=rng.randrange(WORLD_SIZE), step=rng.randrange(faults.STEPS))


def soak(runs: int, seed: int, strategy: str, workdir: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    print(f"soak: {runs} runs on {strategy} at world size {WORLD_SIZE}, seed {seed}",
          flush=True)
    reference_dir = workdir / "reference"
    faults.prepare(reference_dir)
    want = faults.final_state(_strategy(strategy).launch(faults.train, str(reference_dir)))
    results: list[dict[str, Any]] = []
    for index in range(runs):
        fault = draw(rng)
        directory = workdir / f"run-{index:03d}"
        faults.prepare(directory)
        started = time.monotonic()
        entry: dict[str, Any] = {"run": index, "kind": fault.kind, "rank": fault.rank,
                                 "step": fault.step}
        try:
            result = _strategy(strategy).launch(
                faults.train, str(directory), fault,
                restart_policy=RestartPolicy(max_restarts=1, backoff_s=0))
        except Exception as error:
            entry.update(outcome="failed", detail=f"{type(error).__name__}: "
                         f"{str(error).splitlines()[0][:300]}")
        else:
            wrong = faults.differences(faults.final_state(result), want)
            record = faults.outcome(directory)
            entry.update(outcome="lost" if wrong else "survived",
                         detail="; ".join(wrong[:4]),
                         notes=faults.restart_problems(fault, result, record),
                         resumed_from=result.get("resumed_from"),
                         where=(record.fault or {}).get("where"),
                         recovery_s=record.recovery_s)
        entry["wall_s"] = round(time.monotonic() - started, 2)
        results.append(entry)
        recovery = entry.get("recovery_s")
        print(f"  run {index:2d}: {fault.kind:<17} rank {fault.rank} step {fault.step}: "
              f"{entry['outcome']}"
              + (f", resumed from step {entry['resumed_from']} "
                 f"{recovery:.2f} s after the fault" if recovery is not None else "")
              + (f" ({entry['detail']})" if entry.get("detail") else ""), flush=True)
    recoveries = [r["recovery_s"] for r in results if r.get("recovery_s") is not None]
    count = {k: sum(r["outcome"] == k for r in results) for k in ("survived", "lost", "failed")}
    return {
        "strategy": strategy, "world_size": WORLD_SIZE, "seed": seed, "runs": runs,
        "injected": sum(r.get("where") is not None or r["outcome"] == "failed"
                        for r in results),
        **count,
        "recovery_s": {"median": round(statistics.median(recoveries), 2) if recoveries
                       else None, "max": round(max(recoveries), 2) if recoveries else None},
        "by_kind": {kind: sum(r["kind"] == kind for r in results) for kind in KINDS},
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count()},
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the faults drawn (default: a random one, printed)")
    parser.add_argument("--strategy", default="ddp_fork")
    parser.add_argument("--out", type=Path, default=Path("soak-faults.json"),
                        help="where the JSON summary goes")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="for the runs' checkpoints (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    with tempfile.TemporaryDirectory(prefix="interlock-soak-") as scratch:
        summary = soak(args.runs, seed, args.strategy, args.workdir or Path(scratch))
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    recovery = summary["recovery_s"]
    print(f"soak: {summary['injected']} faults injected, {summary['survived']} survived, "
          f"{summary['lost']} lost, {summary['failed']} failed; fault to training resumed: "
          f"median {recovery['median']} s, max {recovery['max']} s (seed {seed}); "
          f"written to {args.out}")
    return 0 if summary["survived"] == summary["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
