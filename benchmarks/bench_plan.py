"""Latency of ``interlock.plan()`` next to Lightning's ``_Connector``, plus import cost.

Both sides are timed in one process, on the same flag sets, round by round
(interlock, then Lightning, then interlock again ...) so that a slow stretch of the
machine hits both equally. Four things are measured for interlock:

* ``plan(..., machine=m)`` with one ``Machine.probe()`` snapshot taken before the loop,
  called repeatedly (so served from plan()'s memo after the first call);
* the same with the memo emptied before each call (every rule runs: the cold path);
* ``plan(..., machine=Machine.probe())``, probing the machine again on every call;
* ``plan(..., machine=m).build()`` where the Plan can build a Strategy, because
  ``_Connector`` does not stop at a plan: it instantiates the strategy, accelerator,
  precision plugin, cluster environment and launcher. This column is reported for
  context only; the target is about ``plan()``.

Lightning is constructed from scratch on every call, as ``Fabric(...)`` does.

The import figures come from fresh interpreters (``python -c ...``), run in an
interleaved order, with the median over the runs.

Lightning is a benchmark-only dependency: it is imported here, never by interlock.

Usage::

    python benchmarks/bench_plan.py --repeat 2000 --json bench.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

PLAN_SPEEDUP_TARGET = 25.0  # interlock median must be at least this many times faster
IMPORT_OVERHEAD_TARGET_MS = 150.0  # at most this much added on top of `import torch`


@dataclass(frozen=True)
class FlagSet:
    """One row of the benchmark: the same keyword arguments go to both libraries."""

    name: str
    flags: dict[str, Any]


FLAG_SETS: tuple[FlagSet, ...] = (
    FlagSet(
        "cpu x1, auto, 32-true",
        {"accelerator": "cpu", "devices": 1, "strategy": "auto", "precision": "32-true"},
    ),
    FlagSet(
        "cpu x2, ddp, bf16-mixed",
        {"accelerator": "cpu", "devices": 2, "strategy": "ddp", "precision": "bf16-mixed"},
    ),
    FlagSet(
        "cpu x4, ddp_spawn, 16-mixed",
        {"accelerator": "cpu", "devices": 4, "strategy": "ddp_spawn", "precision": "16-mixed"},
    ),
    FlagSet(
        "cpu x2, ddp, 32-true, 2 nodes",
        {
            "accelerator": "cpu",
            "devices": 2,
            "strategy": "ddp",
            "precision": "32-true",
            "num_nodes": 2,
        },
    ),
    FlagSet(
        "auto, auto, auto, 32-true",
        {"accelerator": "auto", "devices": "auto", "strategy": "auto", "precision": "32-true"},
    ),
)


# --------------------------------------------------------------------------- helpers


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in [0, 100])."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), math.ceil(q / 100.0 * len(sorted_values))))
    return sorted_values[rank - 1]


@dataclass
class Samples:
    """Per-call durations in nanoseconds for one (flag set, contender) pair."""

    ns: list[int] = field(default_factory=list)

    def summary_us(self) -> dict[str, float]:
        values = sorted(v / 1000.0 for v in self.ns)
        return {
            "median_us": statistics.median(values) if values else float("nan"),
            "p90_us": _percentile(values, 90),
            "min_us": values[0] if values else float("nan"),
            "calls": len(values),
        }


def _timed(fn: Callable[[], Any]) -> int:
    """Run fn once and return its wall time in ns; exceptions count as the call's outcome."""
    start = time.perf_counter_ns()
    with contextlib.suppress(Exception):  # a refusal is timed like any other answer
        fn()
    return time.perf_counter_ns() - start


def _outcome(fn: Callable[[], Any], describe: Callable[[Any], str]) -> str:
    try:
        return describe(fn())
    except Exception as exc:  # shown to the reader, never hidden
        code = getattr(exc, "code", None)
        label = f"{type(exc).__name__}({code})" if code else type(exc).__name__
        return f"refused: {label}: {str(exc).splitlines()[0][:120]}"


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-call warnings and INFO lines while timing.

    Lightning prints "Using bfloat16 Automatic Mixed Precision (AMP)" through its
    ``rank_zero_info`` logger on every mixed-precision construction and warns through
    ``warnings.warn`` when it rewrites a flag. Muting both makes Lightning slightly
    faster than a default run, which only works against interlock's ratio.
    """
    logger = _lightning_info_logger()
    old_level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(old_level)


def _quietly(fn: Callable[[], Any]) -> Any:
    with _quiet_lightning():
        return fn()


def _lightning_info_logger() -> logging.Logger:
    """The logger behind Lightning's ``rank_zero_info``.

    ``lightning_utilities`` keeps it as a module global that each Lightning package
    reassigns when imported; ``import lightning.fabric.connector`` imports the whole
    ``lightning`` package, so it ends up as ``lightning.pytorch``'s logger.
    """
    import lightning_utilities.core.rank_zero as rank_zero_module

    logger: logging.Logger = rank_zero_module.log
    return logger


class _RecordLogs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname}: {record.getMessage()}")


def _observe_lightning(build: Callable[[], Any]) -> dict[str, Any]:
    """Un-timed constructions that record what Lightning does besides answering."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    def call() -> None:
        with contextlib.suppress(Exception):  # the outcome is reported elsewhere
            build()

    logger = _lightning_info_logger()
    handler = _RecordLogs()
    logger.addHandler(handler)
    old_propagate = logger.propagate
    logger.propagate = False
    env_before = dict(os.environ)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
    finally:
        logger.removeHandler(handler)
        logger.propagate = old_propagate
    env_after = dict(os.environ)

    # Lightning's warnings and INFO lines only fire while rank_zero_only.rank == 0, so the
    # write to that global is checked separately, with a sentinel, after the pass above.
    rank_before = getattr(rank_zero_only, "rank", None)
    rank_zero_only.rank = -1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call()
        rank_written = getattr(rank_zero_only, "rank", None) != -1
    finally:
        rank_zero_only.rank = rank_before

    changed = sorted(
        k for k in set(env_before) | set(env_after) if env_before.get(k) != env_after.get(k)
    )
    return {
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
        "log_lines": handler.messages,
        "env_changed": changed,
        "writes_rank_zero_only_rank": rank_written,
    }


# --------------------------------------------------------------------------- contenders


def _describe_plan(plan: Any) -> str:
    parts = []
    for attr in ("accelerator", "strategy", "precision", "world_size", "launcher"):
        value = getattr(plan, attr, "?")
        value = getattr(value, "value", value)  # enums read better by value
        parts.append(f"{attr}={value}")
    devices = getattr(plan, "parallel_devices", None)
    if devices is not None:
        with contextlib.suppress(TypeError):
            parts.append(f"devices={len(devices)}")
    return " ".join(parts)


def _describe_connector(conn: Any) -> str:
    strategy = conn.strategy
    launcher = getattr(strategy, "launcher", None)
    precision = getattr(conn.precision, "precision", None) or type(conn.precision).__name__
    start_method = getattr(strategy, "_start_method", None)
    launcher_name = type(launcher).__name__ if launcher is not None else "None"
    if start_method:
        launcher_name += f"({start_method})"
    return (
        f"accelerator={type(conn.accelerator).__name__} strategy={type(strategy).__name__} "
        f"precision={precision} world_size={getattr(strategy, 'world_size', 1)} "
        f"launcher={launcher_name} "
        f"devices={len(getattr(strategy, 'parallel_devices', None) or [1])}"
    )


def _plan_builds(interlock: Any, machine: Any, flags: dict[str, Any]) -> tuple[bool, str]:
    """Whether ``Plan.build()`` exists and succeeds here (without timing it)."""
    try:
        plan = interlock.plan(**flags, machine=machine)
    except Exception as exc:
        return False, f"plan refused: {type(exc).__name__}"
    build = getattr(plan, "build", None)
    if build is None:
        return False, "Plan has no build()"
    try:
        build()
    except Exception as exc:
        first_line = str(exc).splitlines()[0][:80] if str(exc) else ""
        return False, f"build() raised {type(exc).__name__}: {first_line}"
    return True, ""


def bench_flag_set(
    fs: FlagSet, repeat: int, warmup: int, interlock: Any, connector_cls: Any, machine: Any
) -> dict[str, Any]:
    flags = fs.flags

    def il_cached() -> Any:
        return interlock.plan(**flags, machine=machine)

    def il_cold() -> Any:
        # The memo is emptied first, so every rule runs; emptying a one-entry dict
        # costs well under 0.1 us and is included.
        clear_cache()
        return interlock.plan(**flags, machine=machine)

    def il_probed() -> Any:
        return interlock.plan(**flags, machine=interlock.Machine.probe())

    def il_build() -> Any:
        return interlock.plan(**flags, machine=machine).build()

    def lightning() -> Any:
        return connector_cls(**flags)

    can_build, build_note = _plan_builds(interlock, machine, flags)
    from interlock.engine.planner import clear_cache

    contenders: dict[str, Callable[[], Any]] = {
        "interlock": il_cached,
        "interlock cold": il_cold,
        "interlock+probe": il_probed,
    }
    if can_build:
        contenders["interlock+build"] = il_build
    contenders["lightning"] = lightning

    result: dict[str, Any] = {
        "name": fs.name,
        "flags": flags,
        "interlock_outcome": _outcome(il_cached, _describe_plan),
        "lightning_outcome": _quietly(lambda: _outcome(lightning, _describe_connector)),
        "lightning_side_effects": _observe_lightning(lightning),
        "build_note": build_note,
    }

    samples = {name: Samples() for name in contenders}
    with _quiet_lightning():
        for _ in range(warmup):
            for fn in contenders.values():
                _timed(fn)
        gc.collect()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # as timeit does; collected between flag sets instead
        try:
            for _ in range(repeat):
                for name, fn in contenders.items():
                    samples[name].ns.append(_timed(fn))
        finally:
            if gc_was_enabled:
                gc.enable()
        gc.collect()

    result["timings"] = {name: s.summary_us() for name, s in samples.items()}
    lightning_median = result["timings"]["lightning"]["median_us"]
    for name in contenders:
        if name != "lightning":
            result["timings"][name]["speedup_vs_lightning"] = (
                lightning_median / result["timings"][name]["median_us"]
            )
    return result


# --------------------------------------------------------------------------- imports


IMPORT_SNIPPETS: dict[str, str] = {
    "python -c pass": "pass",
    "import torch": "import torch",
    "import torch, interlock": "import torch, interlock",
    "import interlock": "import interlock",
}


_IMPORT_AFTER_TORCH = (
    "import time, torch; t = time.perf_counter_ns(); import interlock; "
    "print(time.perf_counter_ns() - t)"
)
_HEAVY_MODULES = (
    "import json, sys, interlock; "
    "print(json.dumps(sorted({'torch', 'lightning', 'numpy'} & set(sys.modules))))"
)


def _run_once(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000.0


def bench_imports(runs: int) -> dict[str, Any]:
    """Median wall time of fresh interpreters, the snippets interleaved run by run."""
    for code in IMPORT_SNIPPETS.values():  # warm the OS file cache once
        _run_once(code)
    times: dict[str, list[float]] = {label: [] for label in IMPORT_SNIPPETS}
    for _ in range(runs):
        for label, code in IMPORT_SNIPPETS.items():
            times[label].append(_run_once(code))
    medians = {label: statistics.median(v) for label, v in times.items()}
    # The same question asked inside one interpreter, which leaves out the run-to-run
    # noise of importing torch (tens of milliseconds on a 2-core machine).
    inside = []
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-c", _IMPORT_AFTER_TORCH],
            check=True,
            capture_output=True,
            text=True,
        )
        inside.append(int(proc.stdout.strip().splitlines()[-1]) / 1e6)
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            _HEAVY_MODULES,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return {
        "runs": runs,
        "samples_ms": times,
        "median_ms": medians,
        "added_on_top_of_torch_ms": medians["import torch, interlock"] - medians["import torch"],
        "import_interlock_after_torch_in_process_ms": statistics.median(inside),
        "import_interlock_after_torch_in_process_samples_ms": inside,
        "interlock_alone_minus_bare_python_ms": medians["import interlock"]
        - medians["python -c pass"],
        "heavy_modules_pulled_in_by_import_interlock": json.loads(
            probe.stdout.strip().splitlines()[-1]
        ),
    }


def importtime_report(top: int = 12) -> list[tuple[int, int, str]]:
    """The slowest interlock modules under ``-X importtime`` (cumulative microseconds)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import torch, interlock"],
        check=True,
        capture_output=True,
        text=True,
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        self_us, cumulative_us, name = (
            part.strip() for part in line[len("import time:") :].split("|")
        )
        if name.strip().startswith("interlock") and self_us.isdigit():
            rows.append((int(self_us), int(cumulative_us), name))
    rows.sort(key=lambda r: r[1], reverse=True)
    return rows[:top]


# --------------------------------------------------------------------------- report


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def environment_info() -> dict[str, Any]:
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": _version("torch"),
        "lightning": _version("lightning"),
        "interlock": _version("interlock"),
    }


def render(
    results: list[dict[str, Any]], imports: dict[str, Any] | None, info: dict[str, Any]
) -> str:
    from tabulate import tabulate

    out = []
    out.append(
        "Environment: " + ", ".join(f"{k}={v}" for k, v in info.items() if k not in ("argv",))
    )
    out.append("")
    out.append("What each side resolved the flags to:")
    rows = []
    for r in results:
        rows.append([r["name"], "interlock", r["interlock_outcome"]])
        rows.append(["", "lightning", r["lightning_outcome"]])
    out.append(tabulate(rows, headers=["flags", "library", "outcome"], tablefmt="github"))
    out.append("")
    out.append(
        "Lightning's side effects per construction (observed once per flag set, not while timing):"
    )
    rows = []
    for r in results:
        fx = r["lightning_side_effects"]
        rows.append(
            [
                r["name"],
                "; ".join(fx["warnings"]) or "-",
                "; ".join(fx["log_lines"]) or "-",
                ", ".join(fx["env_changed"]) or "-",
                "yes" if fx["writes_rank_zero_only_rank"] else "no",
            ]
        )
    out.append(
        tabulate(
            rows,
            headers=[
                "flags",
                "warnings",
                "log lines",
                "env vars changed",
                "sets rank_zero_only.rank",
            ],
            tablefmt="github",
        )
    )
    out.append("")
    out.append(
        "Per-call latency in microseconds (target: interlock.plan() >= "
        f"{PLAN_SPEEDUP_TARGET:g}x faster than _Connector at the median, machine probed once):"
    )
    rows = []
    met_all = True
    footnote = False
    for r in results:
        t = r["timings"]
        lt = t["lightning"]
        for name in ("interlock", "interlock cold", "interlock+probe", "interlock+build"):
            if name not in t:
                continue
            ratio = t[name]["speedup_vs_lightning"]
            verdict = ""
            if name in ("interlock", "interlock cold"):
                verdict = "met" if ratio >= PLAN_SPEEDUP_TARGET else "MISSED"
                if name == "interlock":
                    met_all &= ratio >= PLAN_SPEEDUP_TARGET
                if r["interlock_outcome"].startswith("refused") != r[
                    "lightning_outcome"
                ].startswith("refused"):
                    verdict += " (*)"
                    footnote = True
            rows.append(
                [
                    r["name"] if name == "interlock" else "",
                    {
                        "interlock": "plan(machine=m), repeated (memoised)",
                        "interlock cold": "plan(machine=m), memo emptied first",
                        "interlock+probe": "plan(machine=Machine.probe())",
                        "interlock+build": "plan(machine=m).build()",
                    }[name],
                    f"{t[name]['median_us']:.1f}",
                    f"{t[name]['p90_us']:.1f}",
                    f"{lt['median_us']:.1f}",
                    f"{lt['p90_us']:.1f}",
                    f"{ratio:.1f}x",
                    verdict,
                ]
            )
        if r["build_note"]:
            rows.append(["", f"plan().build(): n/a ({r['build_note']})", "", "", "", "", "", ""])
    out.append(
        tabulate(
            rows,
            headers=[
                "flags",
                "interlock call",
                "interlock median",
                "interlock p90",
                "_Connector median",
                "_Connector p90",
                "speedup",
                f">= {PLAN_SPEEDUP_TARGET:g}x",
            ],
            tablefmt="github",
            disable_numparse=True,
        )
    )
    if footnote:
        out.append(
            "(*) one side refused these flags and the other built something, so this row "
            "times a refusal against a construction; see the outcome table above."
        )
    out.append(
        f"Timer overhead (perf_counter_ns pair around an empty call), included in every figure: "
        f"{info.get('timer_overhead_us', float('nan')):.2f} us median."
    )
    out.append("")
    out.append(
        f"plan() latency target ({PLAN_SPEEDUP_TARGET:g}x at the median): "
        f"{'MET' if met_all else 'MISSED'}"
    )

    if imports is not None:
        out.append("")
        out.append(
            f"Import time, fresh interpreter, median of {imports['runs']} runs (milliseconds):"
        )
        rows = [[label, f"{ms:.0f}"] for label, ms in imports["median_ms"].items()]
        out.append(
            tabulate(
                rows, headers=["command", "median ms"], tablefmt="github", disable_numparse=True
            )
        )
        added = imports["added_on_top_of_torch_ms"]
        inside = imports["import_interlock_after_torch_in_process_ms"]
        verdict = "MET" if max(added, inside) <= IMPORT_OVERHEAD_TARGET_MS else "MISSED"
        out.append(
            f"`import interlock` adds {added:.0f} ms on top of `import torch` as the "
            f"difference of the two medians above, and {inside:.1f} ms timed inside the "
            f"interpreter right after `import torch` (median of {imports['runs']}); "
            f"target: at most {IMPORT_OVERHEAD_TARGET_MS:g} ms: {verdict}"
        )
        spread = sorted(imports["samples_ms"]["import torch"])
        out.append(
            f"(`import torch` alone ranged {spread[0]:.0f}-{spread[-1]:.0f} ms over the runs, "
            "so the difference of medians carries that much noise.)"
        )
        heavy = imports["heavy_modules_pulled_in_by_import_interlock"]
        out.append(
            f"`import interlock` alone costs "
            f"{imports['interlock_alone_minus_bare_python_ms']:.0f} ms over a bare interpreter; "
            f"heavy modules it pulls in: {heavy or 'none'}"
        )
        if "importtime" in imports:
            out.append("")
            out.append("Slowest interlock modules under -X importtime (after torch is imported):")
            out.append(
                tabulate(
                    imports["importtime"],
                    headers=["self us", "cumulative us", "module"],
                    tablefmt="github",
                )
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat", type=int, default=2000, help="timed calls per flag set and contender"
    )
    parser.add_argument(
        "--warmup", type=int, default=50, help="untimed calls per flag set and contender first"
    )
    parser.add_argument(
        "--import-runs", type=int, default=15, help="fresh interpreters per import snippet (>= 7)"
    )
    parser.add_argument(
        "--skip-imports", action="store_true", help="only time plan() and _Connector"
    )
    parser.add_argument(
        "--importtime", action="store_true", help="also list interlock's slowest modules"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    if args.import_runs < 7:
        parser.error("--import-runs must be at least 7")

    # Lightning reads LT_ACCELERATOR, LT_DEVICES, ... and would then answer other flags.
    lt_vars = sorted(k for k in os.environ if k.startswith("LT_"))
    if lt_vars:
        print(
            f"warning: {', '.join(lt_vars)} set; Lightning reads these and overrides the flags",
            file=sys.stderr,
        )

    try:
        import interlock
    except ImportError as exc:
        parser.exit(
            2, f"cannot import interlock ({exc}); install it with `pip install -e . --no-deps`\n"
        )
    import torch  # noqa: F401 - imported first so the Lightning figures below exclude it

    env_before = dict(os.environ)
    start = time.perf_counter()
    try:
        from lightning.fabric.connector import _Connector
    except ImportError as exc:
        parser.exit(2, f"cannot import lightning ({exc}); see benchmarks/README.md\n")
    lightning_import_s = time.perf_counter() - start
    lightning_import_env = sorted(k for k in os.environ if env_before.get(k) != os.environ[k])

    machine = interlock.Machine.probe()
    results = [
        bench_flag_set(fs, args.repeat, args.warmup, interlock, _Connector, machine)
        for fs in FLAG_SETS
    ]
    imports = None
    if not args.skip_imports:
        imports = bench_imports(args.import_runs)
        if args.importtime:
            imports["importtime"] = importtime_report()

    info = environment_info()
    info["timer_overhead_us"] = round(
        statistics.median(_timed(lambda: None) for _ in range(10_000)) / 1000.0, 3
    )
    info["repeat"] = args.repeat
    info["lightning_import_after_torch_ms"] = round(lightning_import_s * 1000)
    info["env_vars_set_by_importing_lightning"] = lightning_import_env or "none"
    print(render(results, imports, info))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(
                {"environment": info, "plan": results, "imports": imports},
                fh,
                indent=2,
                default=str,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
