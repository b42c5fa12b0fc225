"""Cold ``interlock.plan()``: one revision against another, in one run.

"Cold" means nothing is remembered: the plan memo is emptied and the machine probed
again before every call, so every rule of every stage runs. A refactoring of the
engine must not make this slower. Both revisions are measured on the same machine in
the same run, round by round (before, after, before, ...), each round in a fresh
interpreter, so that a slow stretch of the machine hits both alike.

Each round reports, for its revision:

* ``import``: seconds to ``import interlock`` in a fresh interpreter (torch-free);
* ``first``: the first ``plan()`` of the process (the machine probed, every table and
  rule module loaded on demand);
* ``cold``: the median of ``--calls`` further calls over a fixed set of flags, each
  with the memo emptied and ``machine=Machine.probe()``;
* with ``--per-flags``, for each flag set alone: the best of nine ``timeit`` repeats of
  1,000 cold calls (the memo emptied, one probed machine reused), in µs a call. Steadier
  than ``cold`` on a noisy machine, and it shows a refusal apart from the plans that
  resolve.

Usage::

    python benchmarks/bench_cold_plan.py --before <git revision> [--after <revision>]
        [--rounds 9] [--calls 200] [--per-flags] [--json out.json]

Without ``--after`` the working tree is the "after" side. Revisions are exported with
``git archive`` into a temporary folder; nothing in the checkout changes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: The flag sets every call cycles through: defaults, explicit DDP, sharding with a
#: mixed precision, a refusal (refusals run the same stages and then raise).
PROBE = r"""
import json, statistics, sys, time, timeit
t0 = time.perf_counter()
import interlock
imported = time.perf_counter() - t0
try:
    from interlock.engine.planner import clear_cache
except ImportError:  # a revision from before interlock.engine
    try:
        from interlock.connector.planner import clear_cache
    except ImportError:  # one that moved it
        clear_cache = interlock.clear_cache
FLAGS = [
    {},
    {"accelerator": "cpu", "devices": 2, "strategy": "ddp"},
    {"accelerator": "cpu", "devices": 2, "strategy": "fsdp", "precision": "bf16-mixed"},
    {"accelerator": "cpu", "devices": 4, "strategy": "ddp_spawn", "num_nodes": 2},
    {"accelerator": "cuda", "devices": 2},
]
def one(flags, machine=None):
    clear_cache()
    try:
        interlock.plan(**flags, machine=machine or interlock.Machine.probe())
    except interlock.ResolutionError:
        pass
t0 = time.perf_counter()
one(FLAGS[0])
first = time.perf_counter() - t0
calls = int(sys.argv[1])
times = []
for i in range(calls):
    t0 = time.perf_counter()
    one(FLAGS[i % len(FLAGS)])
    times.append(time.perf_counter() - t0)
result = {"import": imported, "first": first, "cold": statistics.median(times)}
if sys.argv[2] == "1":
    machine = interlock.Machine.probe()
    for i, flags in enumerate(FLAGS):
        best = min(timeit.repeat(lambda: one(flags, machine), number=1000, repeat=9))
        result[f"flags{i}"] = best / 1000
print(json.dumps(result))
"""

#: what each flag set of ``--per-flags`` is, in the table
FLAG_LABELS = ("defaults", "cpu, 2 devices, ddp", "cpu, 2 devices, fsdp, bf16-mixed",
               "cpu, 4 devices, ddp_spawn, 2 nodes",
               "cuda on a machine without it (refused)")


def export(revision: str, into: Path) -> Path:
    """The ``src`` folder of ``revision``, unpacked under ``into``."""
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", revision, "src"], stdout=out,
                       check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return into / "src"


def measure(src: Path, calls: int, per_flags: bool = False) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(src))
    proc = subprocess.run([sys.executable, "-c", PROBE, str(calls), str(int(per_flags))],
                          env=env,
                          capture_output=True, text=True, check=True, cwd=src.parent)
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision measured as 'before'")
    parser.add_argument("--after", help="git revision measured as 'after' (default: the "
                        "working tree)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--per-flags", action="store_true",
                        help="also time each flag set alone (best of nine timeit repeats "
                        "of 1,000 calls; about 10 s more a round and side)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    for revision in (args.before, args.after):
        if revision is not None and subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet",
                 f"{revision}^{{commit}}"], capture_output=True, check=False).returncode:
            parser.error(f"{revision!r} is not a commit of this repository")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json {args.json}: no folder {args.json.parent}")
    with tempfile.TemporaryDirectory(prefix="bench-cold-plan-") as tmp:
        sides: dict[str, Path] = {}
        for label, revision in (("before", args.before), ("after", args.after)):
            if revision is None:
                sides[label] = ROOT / "src"
            else:
                folder = Path(tmp, label)
                folder.mkdir()
                sides[label] = export(revision, folder)
        runs: dict[str, list[dict[str, float]]] = {label: [] for label in sides}
        for _ in range(args.rounds):
            for label, src in sides.items():
                runs[label].append(measure(src, args.calls, args.per_flags))
    summary: dict[str, Any] = {
        "before": args.before, "after": args.after or "working tree",
        "rounds": args.rounds, "calls": args.calls, "python": sys.version.split()[0],
        "results": {},
    }
    print(f"{'':8}{'import (ms)':>14}{'first plan (ms)':>18}{'cold plan (µs)':>17}")
    for label, values in runs.items():
        med = {key: statistics.median(v[key] for v in values) for key in values[0]}
        summary["results"][label] = med
        print(f"{label:8}{med['import'] * 1e3:>14.1f}{med['first'] * 1e3:>18.1f}"
              f"{med['cold'] * 1e6:>17.0f}")
    if args.per_flags:
        print("\nper flag set, µs a call (median over rounds of the best of nine repeats):")
        for i, what in enumerate(FLAG_LABELS):
            print(f"  {what:<42}" + "".join(
                f"{label} {summary['results'][label][f'flags{i}'] * 1e6:7.1f}   "
                for label in runs))
    if len(runs) == 2:
        # each round measured both sides back to back: the ratio within a round is
        # steadier than either side's median on a machine whose speed drifts
        for key in ("import", "cold"):
            ratios = [a[key] / b[key] for b, a in zip(runs["before"], runs["after"],
                                                         strict=True)]
            low, mid, high = min(ratios), statistics.median(ratios), max(ratios)
            summary["results"][f"{key}_ratio"] = {"min": low, "median": mid, "max": high}
            print(f"after/before, {key}: median {mid:.2f} (rounds {low:.2f} to {high:.2f})")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
