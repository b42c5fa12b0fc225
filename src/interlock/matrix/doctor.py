"""`interlock doctor`: what this machine can run, asked of the engine itself.

Every line comes from `plan()` on one `Machine` snapshot (probed, or given to simulate
another machine), so the report never disagrees with what `resolve()` would do.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from interlock.engine.errors import ResolutionError
from interlock.engine.machine import Machine
from interlock.engine.memory import format_bytes
from interlock.engine.planner import DevicesFlag, Plan, plan
from interlock.engine.registration import EntryPointStatus
from interlock.engine.registry import KINDS, current_parts, entry_points, registered
from interlock.engine.specs import StrategySpec
from interlock.matrix.profiles import PROFILES, profile_named

OK = "yes"
NO = "no "

#: The strategies whose precisions the report lists, by the name they have on most
#: accelerators; an accelerator they do not support gets their declared substitute.
PRECISION_PROBES: tuple[str, ...] = ("single_device", "ddp")


def _try(machine: Machine, accelerator: str, devices: DevicesFlag, strategy: str = "auto",
         precision: str = "32-true") -> Plan | ResolutionError:
    try:
        return plan(accelerator=accelerator, devices=devices, strategy=strategy,
                    precision=precision, machine=machine)
    except ResolutionError as error:
        return error


def _refusal(error: ResolutionError) -> str:
    return f"[{error.code}] {error.reason}"


def _devices_for(spec: StrategySpec) -> DevicesFlag:
    # "auto" would place every device and refuse a one-device strategy for that alone.
    return 1 if spec.max_devices == 1 else "auto"


def _placed(result: Plan) -> str:
    launcher = result.launcher or "in-process"
    return (f"{result.devices} x {result.accelerator} x {result.num_nodes} node(s), "
            f"launcher {launcher}, cluster {result.cluster_environment}")


def usable_accelerators(machine: Machine) -> dict[str, Plan | ResolutionError]:
    """Per accelerator (built-in and registered), the default plan with
    devices="auto", or why there is none."""
    return {a: _try(machine, a, "auto") for a in current_parts().accelerator_names}


def runners(machine: Machine) -> dict[str, str | None]:
    """Per conformance runner, None when this machine can run it, else why not: a
    runner is available where the engine resolves its accelerator (the accelerator
    table names each accelerator's runner)."""
    found: dict[str, str | None] = {}
    for row in current_parts().accelerators.values():
        if row.runner is None:
            continue
        tried = _try(machine, row.name, "auto")
        found[row.runner] = None if isinstance(tried, Plan) else _refusal(tried)
    return found


def _precision_lines(machine: Machine, accelerator: str,
                     specs: Mapping[str, StrategySpec]) -> list[str]:
    lines = []
    for wanted in PRECISION_PROBES:
        spec = specs.get(wanted)
        if spec is None:  # pragma: no cover - built-in rows cannot be unregistered
            continue
        name = spec.substitutes.get(accelerator, wanted)
        shown = name if name == wanted else f"{name} (stands in for {wanted} here)"
        target = specs[name]
        accepted, refused = [], []
        first_refusal: ResolutionError | None = None
        for precision in current_parts().precision_names:
            result = _try(machine, accelerator, _devices_for(target), name, precision)
            if isinstance(result, Plan):
                accepted.append(precision)
            else:
                refused.append(f"{precision} [{result.code}]")
                first_refusal = first_refusal or result
        if not accepted and first_refusal is not None:
            lines.append(f"  {shown}: none ({_refusal(first_refusal)})")
            continue
        lines.append(f"  {shown}: {', '.join(accepted)}")
        if refused:
            lines.append(f"    refused: {', '.join(refused)}")
    return lines


def _runtime_missing(spec: StrategySpec) -> str | None:
    """Why the strategy's factory cannot be imported here, or None when it can."""
    from interlock.strategies.build import load_factory

    try:
        load_factory(spec)
    except ImportError as error:
        return str(error.__cause__ or error)
    return None


def entry_point_lines() -> list[str]:
    """One line per installed strategy entry point: what it registered, or why it
    failed to load (its strategies are then refused with that error)."""
    return _status_lines(entry_points("strategies"), "no strategies")


def _status_lines(found: Sequence[EntryPointStatus], nothing: str) -> list[str]:
    if not found:
        return ["  none installed"]
    lines = []
    for ep in found:
        if ep.error is None:
            lines.append(f"  {OK} {ep.describe()}: {', '.join(ep.names) or nothing}")
        else:
            lines.append(f"  {NO} {ep.describe()} failed to load: {ep.error}")
    return lines


def part_entry_point_lines() -> list[str]:
    """Per part kind with installed entry points (``interlock.precisions``, ...), one
    line per entry point: the rows it registered, or why it failed to load. Empty when
    no package provides parts."""
    lines: list[str] = []
    for kind, registry in KINDS.items():
        found = entry_points(kind)
        if found and kind != "strategies":
            noun = registry.noun[:1].upper() + registry.noun[1:]  # "Checkpoint IO"
            lines += ["", f"{noun} entry points ({registry.group}):"]
            lines += _status_lines(found, f"no {registry.plural}")
    return lines


def memory_lines(machine: Machine) -> list[str]:
    """What the memory estimate (``plan(model=...)``) checks plans against here."""
    device = ("not known: nothing is refused for a device's memory" if
              machine.device_memory is None else
              f"{format_bytes(machine.device_memory)} per device (the smallest, as NVML "
              "reports it)")
    host = ("not known" if machine.host_memory is None else
            f"{format_bytes(machine.host_memory)} (physical memory, or the control "
            "group's limit when lower)")
    return [f"  device: {device}", f"  host:   {host}"]


def doctor_report(machine: Machine | None = None) -> str:
    """A readable report of what ``machine`` (default: this one, probed) can run.

    Lists the machine's facts, each accelerator and whether it is usable, for each
    usable accelerator the strategies that resolve (and why the others do not) and the
    precisions of the single-device and ddp strategies, the third-party strategy entry
    points (a broken one with its error), then the conformance runners this machine can
    host.
    """
    if machine is None:
        machine = Machine.probe()
    specs = registered(StrategySpec)
    rows = [s for s in specs.values() if s.variant_of is None]
    width = max(len(s.name) for s in rows)
    out = ["interlock doctor", "", f"Machine: {machine.describe()}", "", "Memory:",
           *memory_lines(machine), "", "Accelerators:"]
    usable = usable_accelerators(machine)
    for accelerator, result in usable.items():
        if isinstance(result, Plan):
            out.append(f"  {OK} {accelerator:<5} devices='auto' gives {_placed(result)}")
        else:
            out.append(f"  {NO} {accelerator:<5} {_refusal(result)}")
    for accelerator, result in usable.items():
        if not isinstance(result, Plan):
            continue
        out += ["", f"Strategies on {accelerator} (devices='auto', or 1 for one-device "
                "strategies; precision 32-true):"]
        for spec in rows:
            tried = _try(machine, accelerator, _devices_for(spec), spec.name)
            missing = _runtime_missing(spec) if isinstance(tried, Plan) else None
            if isinstance(tried, Plan) and missing is not None:
                out.append(f"  {NO} {spec.name:<{width}}  planned ({_placed(tried)}), but "
                           f"its implementation cannot be imported: {missing}")
            elif isinstance(tried, Plan):
                out.append(f"  {OK} {spec.name:<{width}}  {_placed(tried)}")
            else:
                out.append(f"  {NO} {spec.name:<{width}}  {_refusal(tried)}")
        out += ["", f"Precisions on {accelerator}:"]
        out += _precision_lines(machine, accelerator, specs)
    out += ["", "Strategy entry points (interlock.strategies):"]
    out += entry_point_lines()
    out += part_entry_point_lines()
    out += ["", "Conformance runners:"]
    for runner, why_not in runners(machine).items():
        if why_not is None:
            out.append(f"  {OK} {runner:<5} available")
        else:
            out.append(f"  {NO} {runner:<5} {why_not}")
    out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the doctor report for this machine, or for a named machine profile."""
    parser = argparse.ArgumentParser(
        prog="interlock doctor",
        description="Show what this machine can run, as the engine sees it.",
    )
    parser.add_argument(
        "--profile", metavar="NAME",
        help="report on a named machine profile instead of this machine: "
        + ", ".join(p.name for p in PROFILES),
    )
    args = parser.parse_args(argv)
    try:
        machine = profile_named(args.profile).machine if args.profile else None
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(doctor_report(machine), end="")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
