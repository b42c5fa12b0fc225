"""What the compatibility pages show: every cell computed by `plan()` on the machine
profile of its table, with the evidence a conformance report adds (the tables, the
environments' table, and the constants that fix which profiles and columns they use)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from interlock.engine.builtin import BUILTIN_STRATEGIES
from interlock.engine.errors import ResolutionError
from interlock.engine.planner import DevicesFlag, Plan, plan
from interlock.engine.registry import registered
from interlock.engine.specs import StrategySpec
from interlock.engine.tables import ACCELERATORS, PRECISIONS, AcceleratorRow
from interlock.matrix import parallelism as par
from interlock.matrix.profiles import PROFILES, Profile, profile_named
from interlock.matrix.reports import Evidence, Verification

DOCS_DIR = Path("docs")
MARKDOWN_PATH = DOCS_DIR / "compatibility.md"
HTML_PATH = DOCS_DIR / "compatibility.html"

#: The machine profile each accelerator's table is computed on. cuda uses the profile
#: with deepspeed and transformer_engine installed, so those rows show what the
#: strategy supports rather than a missing package.
ACCELERATOR_PROFILES: Mapping[str, str] = {
    "cpu": "cpu-extras",
    "cuda": "cuda-8-extras",
    "mps": "mps",
    "xla": "tpu-v4-8",
}

#: The conformance runner that exercises each accelerator (mps has none yet, so its
#: cells can only be declared).
RUNNER_FOR_ACCELERATOR: Mapping[str, str] = MappingProxyType(
    {row.name: row.runner for row in ACCELERATORS if row.runner is not None}
)


def builtin_accelerators() -> tuple[str, ...]:
    """The accelerators the committed documents cover: the built-in ones, read from the
    registry (a third-party row installed here must not change the documents)."""
    return tuple(row.name for row in ACCELERATORS)


def builtin_precisions() -> tuple[str, ...]:
    """The precisions the committed documents cover: the built-in ones, in table order."""
    return tuple(row.name for row in PRECISIONS)

#: Launch environments in table order (each is a profile's ``environment`` field).
ENVIRONMENTS: tuple[str, ...] = ("local", "notebook", "torchrun", "slurm", "no-fork")

#: The launch environments a conformance run exercises. The driver resolves each
#: strategy on the machine it runs on and starts the ranks with the strategy's own
#: launcher, from a script, without a notebook, torchrun or SLURM around it: that is
#: the "local" environment and nothing else. The other columns can only be declared.
EXERCISED_ENVIRONMENTS: frozenset[str] = frozenset({"local"})

#: (devices per node, num_nodes) per environment: its profile's job. A one-device
#: strategy (``max_devices == 1``) is asked for 1 device instead.
ENVIRONMENT_GEOMETRY: Mapping[str, tuple[int, int]] = {
    p.environment: p.job for p in PROFILES if p.environment}

ENVIRONMENT_PRECISION = "32-true"

#: Longest line the Markdown page may have. Prose is wrapped well below it; table lines
#: cannot wrap, so their cells are kept short enough to stay under it.
MAX_MARKDOWN_LINE = 240
PROSE_WIDTH = 100

#: In a note shared by several strategies, this stands for each row's strategy name.
STRATEGY_PLACEHOLDER = "{strategy}"

#: Short column headers (in the HTML page the full name is the hover title).
HEADER_ABBREVIATIONS: Mapping[str, str] = {
    "transformer-engine": "te",
    "transformer-engine-float16": "te-float16",
}


@dataclass(frozen=True, slots=True)
class Outcome:
    """One cell: a plan or a refusal, with what the renderers show of it.

    Attributes:
        ok: whether `plan()` succeeded.
        launcher: for a resolved cell, the plan's launcher (None: in process).
        code: for a refusal, its stable code.
        reason: for a refusal, the full reason.
        evidence: for a verified cell, the report that verifies it (for a launch
            environment cell, narrowed to the one world size the cell stands for).
    """

    ok: bool
    launcher: str | None = None
    code: str = ""
    reason: str = ""
    evidence: Evidence | None = None

    @property
    def verified(self) -> bool:
        return self.evidence is not None


@dataclass(frozen=True, slots=True)
class Grid:
    """Strategies (rows) x columns of outcomes, as both renderers lay them out.

    Attributes:
        anchor: prefix of the note anchors in the HTML page (unique per page).
        columns: the column headers.
        across: how a row refused in every column is described ("all precisions").
        rows: each shown strategy with one outcome per column.
    """

    anchor: str
    columns: tuple[str, ...]
    across: str
    rows: tuple[tuple[StrategySpec, tuple[Outcome, ...]], ...]


@dataclass(frozen=True, slots=True)
class AcceleratorTable:
    """Strategies x precisions on one accelerator's profile."""

    accelerator: str
    profile: Profile
    runner: str | None
    devices: tuple[DevicesFlag, ...]  # the devices flag of each row, in row order
    grid: Grid


@dataclass(frozen=True, slots=True)
class EnvironmentTable:
    """Strategies x launch environments at one precision."""

    profiles: tuple[Profile, ...]
    grid: Grid


@dataclass(frozen=True, slots=True)
class Compatibility:
    """Everything both documents show."""

    accelerators: tuple[AcceleratorTable, ...]
    environments: EnvironmentTable
    presets: tuple[StrategySpec, ...]
    #: the parallelism section (see `interlock.matrix.parallelism`): the built-in
    #: strategies it covers, whatever ``specs`` the rest covers
    parallelism: tuple[par.Table, ...] = ()


def _resolve(accelerator: str, devices: DevicesFlag, strategy: str, precision: str,
             num_nodes: int, profile: Profile) -> tuple[Outcome, Plan | None]:
    try:
        result = plan(accelerator=accelerator, devices=devices, strategy=strategy,
                      precision=precision, num_nodes=num_nodes, machine=profile.machine)
    except ResolutionError as error:
        return Outcome(ok=False, code=error.code, reason=error.reason), None
    return Outcome(ok=True, launcher=result.launcher), result


def one_device(spec: StrategySpec, accelerator: str | None = None) -> bool:
    """Whether the strategy (or the accelerator, when given) takes one device per node."""
    limits = [spec.max_devices]
    if accelerator is not None:
        limits.append(registered(AcceleratorRow)[accelerator].max_devices)
    return 1 in limits


def table_devices(spec: StrategySpec, accelerator: str) -> DevicesFlag:
    """The devices flag a strategy's cells use on an accelerator.

    1 when the strategy or the accelerator allows one device per node (so that mps
    rows say what the strategy does there rather than that a Mac has one GPU),
    "auto" on xla (a TPU host's devices come as a set), 2 otherwise.
    """
    if one_device(spec, accelerator):
        return 1
    return "auto" if accelerator == "xla" else 2


def environment_devices(spec: StrategySpec, environment: str) -> int:
    """The devices flag a strategy's cell uses in a launch environment: 1 for a
    one-device strategy, else the environment's devices per node."""
    return 1 if one_device(spec) else ENVIRONMENT_GEOMETRY[environment][0]


def builtin_specs() -> tuple[StrategySpec, ...]:
    """The strategies the committed docs cover: the built-in ones, in registry order."""
    return BUILTIN_STRATEGIES


def _environment_evidence(spec: StrategySpec, environment: str, result: Plan,
                          verification: Verification) -> Evidence | None:
    """The newest evidence verifying a resolved launch-environment cell, or None.

    Only an exercised environment (see EXERCISED_ENVIRONMENTS) on one node qualifies,
    and only a report that launched the strategy at exactly the cell's world size."""
    if environment not in EXERCISED_ENVIRONMENTS or result.num_nodes != 1:
        return None
    runner = RUNNER_FOR_ACCELERATOR.get(result.accelerator)
    if runner is None:
        return None
    for evidence in verification.get((spec.name, runner, result.precision), ()):
        if result.world_size in evidence.world_sizes:
            return replace(evidence, world_sizes=(result.world_size,))
    return None


def compute(specs: Iterable[StrategySpec] | None = None,
            verification: Verification = MappingProxyType({})) -> Compatibility:
    """Resolve every cell of both documents.

    Args:
        specs: the strategies to cover, each registered (None: the built-in ones).
        verification: the cells conformance reports verify (see :func:`merge_reports`).
    """
    chosen = tuple(builtin_specs() if specs is None else specs)
    rows_specs = tuple(s for s in chosen if s.variant_of is None)
    presets = tuple(s for s in chosen if s.variant_of is not None)

    tables = []
    precisions = builtin_precisions()
    for accelerator in builtin_accelerators():
        profile = profile_named(ACCELERATOR_PROFILES[accelerator])
        runner = RUNNER_FOR_ACCELERATOR.get(accelerator)
        rows = []
        devices_used = []
        for spec in rows_specs:
            devices = table_devices(spec, accelerator)
            cells = []
            for precision in precisions:
                outcome, _ = _resolve(accelerator, devices, spec.name, precision, 1, profile)
                found = () if runner is None else verification.get((spec.name, runner,
                                                                    precision), ())
                if outcome.ok and found:
                    outcome = replace(outcome, evidence=found[0])
                cells.append(outcome)
            rows.append((spec, tuple(cells)))
            devices_used.append(devices)
        grid = Grid(anchor=accelerator, columns=precisions, across="all precisions",
                    rows=tuple(rows))
        tables.append(AcceleratorTable(accelerator=accelerator, profile=profile,
                                       runner=runner, devices=tuple(devices_used),
                                       grid=grid))

    by_environment = {p.environment: p for p in PROFILES if p.environment}
    env_profiles = tuple(by_environment[e] for e in ENVIRONMENTS)
    env_rows = []
    for spec in rows_specs:
        cells = []
        for environment, profile in zip(ENVIRONMENTS, env_profiles, strict=True):
            nodes = ENVIRONMENT_GEOMETRY[environment][1]
            outcome, result = _resolve("auto", environment_devices(spec, environment),
                                       spec.name, ENVIRONMENT_PRECISION, nodes, profile)
            if result is not None:
                outcome = replace(outcome, evidence=_environment_evidence(
                    spec, environment, result, verification))
            cells.append(outcome)
        env_rows.append((spec, tuple(cells)))
    env_grid = Grid(anchor="env", columns=ENVIRONMENTS, across="all environments",
                    rows=tuple(env_rows))
    return Compatibility(
        accelerators=tuple(tables),
        environments=EnvironmentTable(profiles=env_profiles, grid=env_grid),
        presets=presets,
        parallelism=par.compute(),
    )
