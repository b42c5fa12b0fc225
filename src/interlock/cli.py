"""The `interlock` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from interlock.conformance.options import RUNNER_CHOICES
from interlock.engine.errors import ResolutionError
from interlock.engine.limits import MAX_DEVICES_PER_NODE, short_repr
from interlock.engine.machine import OPTIONAL_PACKAGES, START_METHODS, Machine
from interlock.engine.memory import parse_bytes
from interlock.engine.model import ModelShape
from interlock.engine.parallelism import DIMS
from interlock.engine.planner import plan
from interlock.engine.registration import RegistrationError
from interlock.engine.registry import registered
from interlock.engine.tables import PackageRow

SIMULATE_HELP = (
    "simulate a machine instead of probing this one: comma-separated tokens "
    "cuda=N, mps, xla=N (implies torch_xla installed), pkg=NAME (an optional package: "
    f"{', '.join(OPTIONAL_PACKAGES)} or a registered one), memory=SIZE (of one device, "
    "e.g. 80GiB), host-memory=SIZE, interactive, nofork, cpu (nothing extra)"
)


#: the subcommands, in the order the help lists them
COMMANDS: tuple[str, ...] = ("plan", "matrix", "doctor", "conformance", "env")

#: the install line that brings what ``interlock conformance`` runs on (pytest), said
#: when it is missing
CONFORMANCE_INSTALL = "pip install 'interlock[conformance]'"


class UsageError(ValueError):
    """A command-line value that cannot be used."""


def parse_simulate(text: str) -> Machine:
    """Build a Machine from ``cuda=8,mps,xla=8,interactive,nofork,pkg=deepspeed``."""
    cuda = xla = 0
    mps = interactive = False
    methods = list(START_METHODS)
    packages: set[str] = set()
    memory: dict[str, int | None] = {"device_memory": None, "host_memory": None}
    for raw in text.split(","):
        token = raw.strip().lower()
        key, _, value = token.partition("=")
        if key in ("memory", "host-memory"):
            try:
                memory["device_memory" if key == "memory" else "host_memory"] = \
                    parse_bytes(value)
            except ValueError as error:
                raise UsageError(f"--simulate {key}=: {error}") from None
        elif key in ("cuda", "xla"):
            if not (value.isascii() and value.isdigit()):
                raise UsageError(f"--simulate {key}= needs a device count, got "
                                 f"{short_repr(token)}")
            # compared as digits first: int() of a 5,000-digit string is refused
            digits = value.lstrip("0") or "0"
            if (len(digits) > len(str(MAX_DEVICES_PER_NODE))
                    or int(digits) > MAX_DEVICES_PER_NODE):
                raise UsageError(
                    f"--simulate {key}= is at most {MAX_DEVICES_PER_NODE} devices (no host "
                    f"has more; see interlock.engine.limits), got {short_repr(value)}"
                )
            if key == "cuda":
                cuda = int(digits)
            else:
                xla = int(digits)
                packages.add("torch_xla")
        elif key == "pkg" and value in registered(PackageRow):
            packages.add(value)
        elif key == "pkg":
            raise UsageError(
                f"--simulate pkg={value!r} is not an optional package interlock consults; "
                f"known: {', '.join(registered(PackageRow))}"
            )
        elif token == "mps":
            mps = True
        elif token == "interactive":
            interactive = True
        elif token == "nofork":
            methods = [m for m in methods if m != "fork"]
        elif token in ("cpu", ""):
            continue
        else:
            raise UsageError(f"--simulate token {short_repr(token)} is unknown. "
                             f"{SIMULATE_HELP}")
    return Machine(
        cuda_devices=cuda,
        mps_available=mps,
        xla_devices=xla,
        interactive=interactive,
        start_methods=tuple(methods),
        packages=frozenset(packages),
        device_memory=memory["device_memory"],
        host_memory=memory["host_memory"],
    )


_COUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([kmbt]?)\s*$")
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_count(option: str, text: str) -> int:
    """A parameter count: ``7e9``, ``7B``, ``350M``, ``1.3b``, ``124000``.

    Raises:
        UsageError: naming the option, when ``text`` is not a count.
    """
    found = _COUNT.match(text.lower()) if len(text) < 64 else None
    if found is None:
        raise UsageError(f"{option} {short_repr(text)}: expected a count such as 7e9, 7B, "
                         "350M or 124000")
    return round(float(found.group(1)) * _COUNT_UNITS[found.group(2)])


def _model(args: argparse.Namespace) -> ModelShape | None:
    """The model shape the plan options describe, or None without --model-parameters."""
    if args.model_parameters is None:
        for option in ("largest_unit", "activation_bytes_per_sample"):
            if getattr(args, option) is not None:
                raise UsageError(f"--{option.replace('_', '-')} describes the model: give "
                                 "--model-parameters too")
        return None
    try:
        return ModelShape(
            parameters=parse_count("--model-parameters", args.model_parameters),
            dtype=args.model_dtype,
            largest_unit=(None if args.largest_unit is None
                          else parse_count("--largest-unit", args.largest_unit)),
            tensor_parallel=(0 if args.tensor_parallel_parameters is None else parse_count(
                "--tensor-parallel-parameters", args.tensor_parallel_parameters)),
            activation_bytes_per_sample=(None if args.activation_bytes_per_sample is None
                                         else parse_bytes(args.activation_bytes_per_sample)),
        )
    except ValueError as error:
        raise UsageError(str(error)) from None


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def _machine(args: argparse.Namespace) -> Machine:
    base = parse_simulate(args.simulate) if args.simulate is not None else Machine.probe()
    env = parse_env(args.env)
    if not env:
        return base
    return dataclasses.replace(base, environ={**base.environ, **env})


def cmd_plan(args: argparse.Namespace) -> int:
    machine = _machine(args)
    try:
        result = plan(
            accelerator=args.accelerator,
            devices=args.devices,
            strategy=args.strategy,
            precision=args.precision,
            num_nodes=args.num_nodes,
            machine=machine,
            parallelism=args.parallelism,
            model=_model(args),
            optimizer=args.optimizer,
            micro_batch_size=args.micro_batch_size,
            launcher=args.launcher,
        )
    except ResolutionError as error:
        if args.json:
            print(json.dumps({"error": error.to_dict(), "machine": machine.to_dict()}, indent=2))
        else:
            print(f"error: {error}", file=sys.stderr)
            print(f"machine: {machine.describe()}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"plan": result.to_dict(), "machine": machine.to_dict()}, indent=2))
    else:
        print(result.explain())
        print(f"Machine: {machine.describe()}")
    return 0


def check_output(option: str, output: str | None) -> None:
    """Refuse, before any work, an output path where no file can be written.

    Raises:
        UsageError: naming the option, the path and why.
    """
    if output is None:
        return
    from interlock.output_files import unwritable_reason

    problem = unwritable_reason(output)
    if problem is not None:
        raise UsageError(f"{option} {output!r}: {problem}")


def _write(text: str, output: str | None, option: str = "--output") -> None:
    """To stdout, or to a file whole or not at all (a temporary file renamed into
    place); ``output`` was checked with :func:`check_output` first."""
    if output is None:
        sys.stdout.write(text)
        return
    from interlock.output_files import write_text

    try:
        path = write_text(output, text)
    except OSError as error:  # the disk filled up, or the directory changed since
        reason = error.strerror or str(error)
        raise UsageError(f"{option} {output!r}: cannot be written: {reason}") from None
    print(f"wrote {path}", file=sys.stderr)


def cmd_matrix(args: argparse.Namespace) -> int:
    check_output("--output", args.output)  # before the (long) evaluation, not after
    from interlock.matrix import PROFILES, evaluate, profile_named

    if args.diff is not None:
        return _matrix_diff(args)
    if args.format == "text":
        raise UsageError("--format text is the form of --diff; the matrix itself is md, "
                         "html, csv, json or lock")
    if args.format is None:
        args.format = "md"
    if args.profiles:
        width = max(len(p.name) for p in PROFILES)
        for p in PROFILES:
            print(f"{p.name:<{width}}  {p.description}")
        return 0
    if args.format in ("lock", "md", "html") and args.profile is not None:
        raise UsageError("--profile applies to --format csv and json (the cell dump); " + (
            "a lock holds every profile" if args.format == "lock"
            else "the md and html pages cover their own profiles"))
    if args.format == "lock":
        from interlock.matrix import lock

        _write(lock.render(), args.output)
        return 0
    if args.format in ("md", "html"):
        from interlock.matrix import compat

        _write(compat.render_markdown() if args.format == "md" else compat.render_html(),
               args.output)
        return 0
    try:
        profiles = PROFILES if args.profile is None else (profile_named(args.profile),)
    except ValueError as error:
        raise UsageError(str(error)) from None
    fields = ("profile", "accelerator", "devices", "strategy", "precision", "num_nodes")
    if args.format == "csv":
        import csv
        import io

        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow((*fields, "outcome"))
        for profile in profiles:
            for cell, outcome in evaluate(profile):
                writer.writerow((*(getattr(cell, f) for f in fields), outcome))
        _write(buffer.getvalue(), args.output)
        return 0
    rows = [
        {**{f: getattr(cell, f) for f in fields}, "outcome": outcome}
        for profile in profiles for cell, outcome in evaluate(profile)
    ]
    _write(json.dumps(rows) + "\n", args.output)
    return 0


def _matrix_diff(args: argparse.Namespace) -> int:
    """``interlock matrix --diff OLD [NEW]``: 0 when no cell changed, 1 when one did."""
    from interlock.matrix.diff import LockFileError, run_diff

    if args.profile is not None or args.profiles:
        raise UsageError("--diff compares whole locks: --profile and --profiles do not "
                         "apply to it")
    fmt = args.format or "text"
    if fmt not in ("text", "json"):
        raise UsageError(f"--diff writes text or json, not {fmt}")
    old, *rest = args.diff
    if len(rest) > 1:
        raise UsageError(f"--diff takes OLD_LOCK and at most one NEW_LOCK; got "
                         f"{len(args.diff)} paths")
    try:
        code, text = run_diff(old, rest[0] if rest else None, fmt)
    except LockFileError as error:
        raise UsageError(str(error)) from None
    _write(text if text.endswith("\n") else text + "\n", args.output)
    return code


def cmd_doctor(args: argparse.Namespace) -> int:
    from interlock.matrix.doctor import doctor_report

    print(doctor_report())
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from interlock.envreport import env_report

    print(env_report(), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="interlock",
        description="Resolve training flags into a validated distributed setup.",
    )
    # not required=True: argparse would then say "arguments are required: command"
    # for `interlock --bogus` instead of naming the option (main() checks both)
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("plan", help="resolve flags into a plan and explain it")
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--devices", default="auto")
    p.add_argument("--strategy", default="auto")
    p.add_argument("--launcher", default="auto",
                   help="how the processes start: a launcher the strategy runs under "
                   "(subprocess, spawn, fork, forkserver for ddp, or a registered one); "
                   "default: the strategy's own")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument(
        "--parallelism", default=None, metavar="DIM=DEGREE,...",
        help="degrees of parallelism, e.g. dp_replicate=2,dp_shard=2 (dimensions: "
        f"{', '.join(DIMS)}; a degree is an int or auto); default: the strategy's own",
    )
    p.add_argument("--simulate", metavar="SPEC", help=SIMULATE_HELP)
    p.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE",
        help="add an environment variable to the machine (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    sizing = p.add_argument_group(
        "memory", "size the model to have the plan say what each rank holds, and refuse "
        "what does not fit (docs/memory.md)")
    sizing.add_argument("--model-parameters", metavar="COUNT",
                        help="trainable parameters: 7e9, 7B, 350M")
    sizing.add_argument("--model-dtype", default="float32",
                        help="the dtype the parameters are created in (default float32)")
    sizing.add_argument("--largest-unit", metavar="COUNT",
                        help="parameters FSDP gathers at once (its largest unit)")
    sizing.add_argument("--tensor-parallel-parameters", metavar="COUNT",
                        help="parameters in the weights a tensor-parallel plan splits")
    sizing.add_argument("--activation-bytes-per-sample", metavar="SIZE",
                        help="activations one sample keeps for backward, e.g. 2GiB")
    sizing.add_argument("--optimizer", default=None,
                        help="sgd, sgd_momentum, adam, adamw (assumed), adagrad, rmsprop, "
                        "rmsprop_momentum or a registered one")
    sizing.add_argument("--micro-batch-size", type=int, default=None, metavar="N",
                        help="samples per rank per forward, for the activations")
    p.set_defaults(func=cmd_plan)

    m = sub.add_parser("matrix", help="the compatibility matrix: pages, or every cell")
    m.add_argument("--profile", help="only this machine profile (csv, json)")
    m.add_argument("--format", choices=("md", "html", "csv", "json", "lock", "text"),
                   default=None,
                   help="md (default), html: the compatibility pages; csv, json: every "
                   "cell; lock: this version's lock file, to --diff against after an "
                   "upgrade; with --diff: text (default) or json")
    m.add_argument("--output", metavar="PATH", help="write here instead of stdout")
    m.add_argument("--profiles", action="store_true", help="list the machine profiles")
    m.add_argument("--diff", nargs="+", metavar="LOCK",
                   help="OLD_LOCK [NEW_LOCK]: the cells whose outcome changed between two "
                   "lock files (NEW: what this interlock decides), grouped by rule and "
                   "reason; exit 0 when none did, 1 when some did")
    m.set_defaults(func=cmd_matrix)

    d = sub.add_parser("doctor", help="what this machine can run, and why not the rest")
    d.set_defaults(func=cmd_doctor)

    c = sub.add_parser("conformance", help="run the conformance suite against strategies",
                       description="Run the conformance suite (through pytest) and print "
                       "a summary; extra arguments after -- go to pytest.")
    c.add_argument("--strategy", action="append", metavar="NAME",
                   help="a registered strategy (repeatable), or 'all' (required unless "
                   "--compare)")
    c.add_argument("--compare", nargs=2, metavar=("OLD_REPORT", "NEW_REPORT"),
                   help="compare two reports instead of running the suite: a scorecard "
                   "per strategy and runner and what changed; exit 1 on a regression "
                   "or a cell no longer verified")
    c.add_argument("--runner", default="auto", choices=RUNNER_CHOICES,
                   help="auto: every runner this machine has; a runner named here that "
                   "the machine lacks fails the run (see --allow-missing-runner)")
    c.add_argument("--world-sizes", default="1,2", metavar="N,M")
    c.add_argument("--precisions", metavar="P,Q", help="only these declared precisions")
    c.add_argument("--report", metavar="PATH", help="write the JSON report here")
    c.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import a module that registers strategies (repeatable)")
    c.add_argument("--skips-file", metavar="PATH")
    c.add_argument("--xfails-file", metavar="PATH")
    c.add_argument("--workers", type=int, default=0,
                   help="run N launches at once, the costliest first (0: one at a time)")
    c.add_argument("--checks", metavar="ID,...",
                   help="run only these checks while iterating; the report is then "
                   "partial and verifies no cell")
    c.add_argument("--allow-missing-runner", action="store_true",
                   help="a requested runner this machine lacks, or a strategy with "
                   "nothing to check here (a missing package), is reported instead of "
                   "failing the run")
    c.add_argument("--keep-workdir", action="store_true",
                   help="keep the temporary directory with the drivers' logs")
    c.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    c.set_defaults(func=cmd_conformance)

    e = sub.add_parser("env", help="versions, machine, default plan and cluster variables "
                       "as Markdown, to paste into a bug report",
                       description="Print the interlock, torch, Python and optional "
                       "package versions, what this machine has, the plan of the default "
                       "flags (or why there is none) and the cluster variables set here, "
                       "as Markdown; values of variables whose names look secret "
                       "(TOKEN, KEY, PASSWORD, ...) are left out.")
    e.set_defaults(func=cmd_env)
    return parser


def cmd_conformance(args: argparse.Namespace) -> int:
    """``pytest --pyargs interlock.conformance`` with the suite's options, under the
    suite's own pytest settings wherever it is started: the options are checked first
    (a bad one is a one-line usage error), and no project configuration
    (``pytest.ini``, ``pyproject.toml``, ``PYTEST_ADDOPTS``) reaches the run."""
    import importlib.util
    import os
    import tempfile

    if args.compare is not None:
        return _compare_reports(args)
    if not args.strategy:
        raise UsageError("--strategy NAME is required (repeatable, or 'all'); or compare "
                         "two reports with --compare OLD_REPORT NEW_REPORT")
    if importlib.util.find_spec("pytest") is None:
        raise UsageError("the conformance suite runs on pytest, which is not installed "
                         f"here: {CONFORMANCE_INSTALL}")
    import pytest

    from interlock.conformance.options import PYTEST_OPTIONS, OptionError, validate

    given = {"strategies": args.strategy, "runner": args.runner,
             "world_sizes": args.world_sizes, "precisions": args.precisions,
             "imports": args.imports, "skips_file": args.skips_file,
             "xfails_file": args.xfails_file, "report": args.report,
             "allow_missing": args.allow_missing_runner, "keep_workdir": args.keep_workdir,
             "workers": args.workers, "checks": args.checks}
    try:
        validate(**given)
    except OptionError as error:
        raise UsageError(str(error)) from None
    with tempfile.TemporaryDirectory(prefix="interlock-suite-config-") as config_dir:
        # an empty configuration file of the suite's own: pytest then reads no project
        # configuration, and its root directory is not the project's
        ini = Path(config_dir, "pytest.ini")
        ini.write_text("[pytest]\n")
        argv = ["--pyargs", "interlock.conformance", "-q", "-c", str(ini),
                "--rootdir", config_dir, "-p", "no:cacheprovider", "-p", "no:typeguard",
                # this command imported interlock before pytest marks the installed
                # distribution's modules for assertion rewriting; the suite asserts
                # through its own helpers, so the warning says nothing a user can act on
                "-W", "ignore::pytest.PytestAssertRewriteWarning",
                "-o", "python_files=test_*.py"]
        for name, option in PYTEST_OPTIONS:  # each as validated; files made absolute
            value = given[name]
            for one in value if isinstance(value, list) else [value]:
                if one is True:
                    argv.append(option)
                elif one not in (None, False, 0, ""):
                    argv += [option, str(Path(one).absolute()) if name in (
                        "skips_file", "xfails_file", "report") else str(one)]
        if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
            argv += ["-p", "_interlock_conformance_pytest"]
        addopts = os.environ.pop("PYTEST_ADDOPTS", None)
        try:
            return int(pytest.main(argv + list(args.pytest_args)))
        finally:
            if addopts is not None:
                os.environ["PYTEST_ADDOPTS"] = addopts


def _compare_reports(args: argparse.Namespace) -> int:
    """``interlock conformance --compare OLD NEW``: runs nothing, needs no pytest."""
    from interlock.conformance.compare import ReportFileError, run_compare

    given = [flag for flag, value in (("--strategy", args.strategy),
                                      ("--report", args.report),
                                      ("--precisions", args.precisions)) if value]
    if given or args.pytest_args:
        raise UsageError(f"--compare reads two reports and runs nothing: "
                         f"{', '.join(given) or ' '.join(args.pytest_args)} does not apply")
    try:
        code, text = run_compare(*args.compare)
    except ReportFileError as error:
        raise UsageError(str(error)) from None
    print(text, end="" if text.endswith("\n") else "\n")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named first: `interlock --bogus` is about --bogus, not the command
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:
        parser.error(f"the following arguments are required: command (one of "
                     f"{', '.join(COMMANDS)})")
    try:
        code: int = args.func(args)
    except (UsageError, RegistrationError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
