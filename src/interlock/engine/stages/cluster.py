"""Stage 4, cluster: detect the cluster environment and check the job's geometry
against it.

A registered cluster environment with a detector gets a ``cluster/<name>`` rule just
before ``cluster/external``, from the registry at call time (``parts``; see
`interlock.engine.registry` for why there). The geometry check also runs alone
for the runtime, through `check_geometry`.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from interlock.engine.limits import MAX_DEVICES_PER_NODE
from interlock.engine.machine import Machine
from interlock.engine.part_tables import PartTables
from interlock.engine.registry import current_parts
from interlock.engine.rules import (
    Decision,
    DevicesRequest,
    PlacedDraft,
    Rule,
    Stage,
    always,
    devices_as_placed,
    refuse,
    run_decision,
    run_stage,
)
from interlock.engine.runner import Step
from interlock.engine.stages.accelerator import devices_on
from interlock.engine.stages.devices import indexed
from interlock.engine.tables import (
    CLUSTER_ROWS,
    CLUSTERS,
    DETECTION_VALUES,
    DETECTION_VARIABLE,
    SLURM_INTERACTIVE_JOB_NAMES,
    ClusterRow,
    external_launcher_detect,
    slurm_allocation,
    slurm_step,
)
from interlock.engine.trace import TraceStep
from interlock.engine.written import NOT_WRITTEN, Written


class ClusterInput(NamedTuple):
    """What the cluster stage decides from.

    Attributes:
        machine: the machine planned for (its environment variables).
        parts: the registry's snapshot.
        accelerator: the chosen accelerator.
        devices: the devices request (``auto`` may follow the cluster's count).
        parallel_devices: the devices placed on one node.
        num_nodes: the node count.
        cluster_plugin: the cluster environment plugin given, if any.
    """

    machine: Machine
    parts: PartTables
    accelerator: str
    devices: DevicesRequest
    parallel_devices: tuple[str, ...]
    num_nodes: int
    cluster_plugin: object | None = None


class ClusterChoice(NamedTuple):
    """The cluster stage's result.

    Attributes:
        name: the cluster environment's name.
        external: whether the environment, not interlock, creates the processes.
        parallel_devices: the devices of one node (``auto`` follows the cluster).
    """

    name: str
    external: bool
    parallel_devices: tuple[str, ...]
    notes: tuple[str, ...]
    trace: tuple[TraceStep, ...]


@dataclass(slots=True, kw_only=True)
class ClusterDraft(PlacedDraft):
    """The cluster stage's draft."""

    OUTPUTS: ClassVar[frozenset[str]] = frozenset({
        "cluster", "cluster_row", "cluster_external", "parallel_devices",
    })

    machine: Machine
    parts: PartTables
    accelerator: str
    devices: DevicesRequest
    cluster_plugin: object | None = None
    devices_flag: object = None
    num_nodes_flag: object = None
    # decided
    cluster: str = ""
    cluster_row: ClusterRow | None = None
    cluster_external: bool = False


def _use_cluster(ctx: ClusterDraft, row: ClusterRow, *, detected: bool = True) -> None:
    ctx.cluster = row.name
    ctx.cluster_row = row
    ctx.cluster_external = row.external
    broken = ctx.parts.broken["environments"]
    if detected and broken:
        # never silent: a plugin environment that failed to load cannot be detected
        ctx.note(
            "cluster environments from "
            + "; ".join(f"the {ep.describe()}, which failed to load ({ep.error})"
                        for ep in broken)
            + f" were not tried; {row.name} was chosen without them"
        )


def _from_plugin(ctx: ClusterDraft) -> str:
    plugin = ctx.cluster_plugin
    name = str(getattr(plugin, "name", ""))
    ctx.cluster = name
    ctx.cluster_row = ctx.parts.environments.get(name)
    ctx.cluster_external = bool(getattr(plugin, "creates_processes_externally", False))
    return f"the cluster environment plugin {type(plugin).__name__} ({name!r}) is used as given"


def _xla_cluster(ctx: ClusterDraft) -> str:
    _use_cluster(ctx, ctx.parts.environments["xla"], detected=False)
    return "the xla accelerator runs under the XLA runtime's environment"


# ----- the switch that turns detection off


def _detection_value(ctx: ClusterDraft) -> str:
    return ctx.machine.environ.get(DETECTION_VARIABLE, "on").strip().lower() or "on"


def _refuse_detection_value(ctx: ClusterDraft) -> str:
    raw = ctx.machine.environ.get(DETECTION_VARIABLE, "")
    refuse(
        "invalid-environment",
        flag="environment",
        value=f"{DETECTION_VARIABLE}={raw}",
        reason=f"{DETECTION_VARIABLE} turns cluster detection on or off, and {raw!r} is "
        "neither.",
        choices=DETECTION_VALUES,
    )


def _detected_rows(ctx: ClusterDraft) -> tuple[str, ...]:
    env = ctx.machine.environ
    return tuple(r.name for r in ctx.parts.detection_order
                 if r.detect is not None and r.detect(env))


def _detection_off(ctx: ClusterDraft) -> str:
    _use_cluster(ctx, ctx.parts.environments["local"], detected=False)
    ignored = _detected_rows(ctx)
    what = (f"the variables of {', '.join(ignored)} are ignored" if ignored
            else "no cluster variables are read")
    ctx.note(f"cluster detection is off ({DETECTION_VARIABLE}=off): {what}, and interlock's "
             "launcher starts the processes")
    return f"{DETECTION_VARIABLE}=off"


# ----- launchers inside a SLURM job


def _slurm_job(ctx: ClusterDraft) -> str:
    env = ctx.machine.environ
    job = env.get("SLURM_JOB_ID")
    return f"SLURM job {job}" if job else "a SLURM job"


def _torchelastic_in_slurm(ctx: ClusterDraft) -> str:
    row = ctx.parts.environments["torchelastic"]
    _use_cluster(ctx, row)
    ctx.note(
        f"torchrun started this process inside {_slurm_job(ctx)}: ranks and geometry come "
        "from torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE), and the SLURM variables, "
        "which describe the tasks srun or sbatch started (torchrun's agents), are ignored"
    )
    return f"{row.description} inside a SLURM job: {row.detect_doc}"


def _slurm_tasks(ctx: ClusterDraft) -> str | None:
    """The number of tasks of this SLURM job step, as written (the step's own count first)."""
    env = ctx.machine.environ
    for name in ctx.parts.environments["slurm"].world_size_vars:
        if name in env:
            return env[name].strip()
    return None


def _external_in_slurm_step(ctx: ClusterDraft) -> bool:
    env = ctx.machine.environ
    return (
        slurm_step(env)
        and external_launcher_detect(env)
        and env["WORLD_SIZE"].strip() != _slurm_tasks(ctx)
    )


def _external_in_slurm(ctx: ClusterDraft) -> str:
    env = ctx.machine.environ
    row = ctx.parts.environments["external"]
    _use_cluster(ctx, row)
    ctx.note(
        f"srun started {_slurm_tasks(ctx) or 'its'} task(s) in {_slurm_job(ctx)}, but "
        f"WORLD_SIZE={env['WORLD_SIZE'].strip()}: a launcher inside the srun task started "
        "this process, so its variables (RANK, LOCAL_RANK, WORLD_SIZE) are used and the "
        "SLURM variables are ignored"
    )
    return f"{row.description}, inside a SLURM job step: {row.detect_doc}"


def _slurm_local(why: str) -> Callable[[ClusterDraft], str]:
    def then(ctx: ClusterDraft) -> str:
        _use_cluster(ctx, ctx.parts.environments["local"])
        ctx.note(f"{why}: interlock's launcher starts the processes, SLURM only allocated them")
        return why

    return then


def _slurm_single_task(ctx: ClusterDraft) -> bool:
    return (
        slurm_step(ctx.machine.environ)
        and _slurm_tasks(ctx) == "1"
        and ctx.num_nodes == 1
        and ctx.devices_per_node > 1
    )


def _stepless_starter(ctx: ClusterDraft) -> str:
    """What ran this process in a SLURM job without a job step."""
    return ("a batch script" if "SLURM_PROCID" in ctx.machine.environ
            else "an allocation's shell (salloc)")


def _slurm_without_step(ctx: ClusterDraft) -> str:
    _use_cluster(ctx, ctx.parts.environments["local"])
    ctx.note(
        f"{_slurm_job(ctx)} without a job step (SLURM_STEP_ID is not set): this process "
        f"was started by {_stepless_starter(ctx)}, not by srun, so SLURM started none of "
        "the other processes; interlock's launcher starts them on this node"
    )
    return f"{_slurm_job(ctx)}, but srun did not start this process"


def _refuse_slurm_without_step(ctx: ClusterDraft) -> str:
    refuse(
        "cluster-mismatch",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason=f"num_nodes={ctx.num_nodes} in {_slurm_job(ctx)}, but srun did not start "
        f"this process (SLURM_STEP_ID is not set: {_stepless_starter(ctx)} runs python "
        "directly), so nothing starts the processes of the other nodes and this node's "
        "would wait for them for ever. Start the script with srun (one task per device, for "
        "example `srun --ntasks-per-node=<devices> python train.py`), or plan one node.",
        choices=("1",),
    )


def _external_note(ctx: ClusterDraft) -> str:
    env = ctx.machine.environ
    return (
        f"RANK={env['RANK']}, LOCAL_RANK={env['LOCAL_RANK']} and WORLD_SIZE={env['WORLD_SIZE']} "
        "were exported by a launcher other than interlock's (the deepspeed command, an "
        "in-house launcher): it started the processes, so interlock starts none and this "
        f"process joins their world; if these variables mean something else here, set "
        f"{DETECTION_VARIABLE}=off"
    )


#: Detected clusters whose choice the plan explains in a note.
_DETECTION_NOTES: dict[str, Callable[[ClusterDraft], str]] = {"external": _external_note}


def _detect_rule(row: ClusterRow) -> Rule[ClusterDraft]:
    detect = row.detect
    if detect is None:
        raise RuntimeError(f"internal error: cluster row {row.name!r} has no detector")
    note = _DETECTION_NOTES.get(row.name)

    def then(ctx: ClusterDraft) -> str:
        _use_cluster(ctx, row)
        if note is not None:
            ctx.note(note(ctx))
        return f"{row.description}: {row.detect_doc}"

    return Rule(
        id=f"cluster/{row.name}",
        doc=f"{row.description}, detected when {row.detect_doc}.",
        when=lambda c: detect(c.machine.environ),
        then=then,
    )


def _local(ctx: ClusterDraft) -> str:
    _use_cluster(ctx, ctx.parts.environments["local"])
    return "no cluster environment detected"


def _interactive_name(ctx: ClusterDraft) -> bool:
    return ctx.machine.environ.get("SLURM_JOB_NAME") in SLURM_INTERACTIVE_JOB_NAMES


def _registered_detectors(parts: PartTables) -> tuple[Rule[ClusterDraft], ...]:
    return tuple(_detect_rule(row) for row in parts.added_environments
                 if row.detect is not None)


_TORCHELASTIC = _detect_rule(CLUSTER_ROWS["torchelastic"])

CLUSTER_CHOICE = Decision(
    id="cluster/detect",
    doc="Choose the cluster environment: a plugin wins, then the detectors in table order. "
    "A launcher that started this process wins over the allocation around it.",
    rules=(
        Rule(
            id="cluster/plugin",
            doc="A cluster environment plugin is used as given.",
            when=lambda c: c.cluster_plugin is not None,
            then=_from_plugin,
        ),
        Rule(
            id="cluster/detection-invalid",
            doc=f"{DETECTION_VARIABLE} is set to something other than 'on' or 'off'.",
            when=lambda c: _detection_value(c) not in DETECTION_VALUES,
            then=_refuse_detection_value,
            refuses="invalid-environment",
        ),
        Rule(
            id="cluster/xla",
            doc="The xla accelerator runs under the XLA environment.",
            when=lambda c: c.accelerator == "xla",
            then=_xla_cluster,
        ),
        Rule(
            id="cluster/detection-off",
            doc=f"{DETECTION_VARIABLE}=off: every cluster variable is ignored and interlock's "
            "launcher starts the processes (noted, with the clusters it ignored).",
            when=lambda c: _detection_value(c) == "off",
            then=_detection_off,
        ),
        Rule(
            id="cluster/torchelastic-in-slurm",
            doc="torchrun inside a SLURM job: torchelastic, and the SLURM variables are "
            "ignored (noted).",
            when=lambda c: _TORCHELASTIC.when(c) and slurm_allocation(c.machine.environ),
            then=_torchelastic_in_slurm,
        ),
        _TORCHELASTIC,
        Rule(
            id="cluster/external-in-slurm",
            doc="Inside an srun task, RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and "
            "MASTER_PORT describe another world than srun's tasks: the launcher in the task "
            "started this process, so the external environment is used (noted).",
            when=_external_in_slurm_step,
            then=_external_in_slurm,
        ),
        Rule(
            id="cluster/slurm-single-task",
            doc="A one-task srun step asked for several devices on one node is treated as "
            "local: interlock's launcher starts the processes (noted).",
            when=_slurm_single_task,
            then=_slurm_local("SLURM job step with a single task"),
        ),
        *(_detect_rule(row) for row in CLUSTERS if row.detect is not None
          and row.name != "torchelastic"),
        Rule(
            id="cluster/slurm-without-step-multinode",
            doc="A SLURM allocation whose process srun did not start (a batch script or "
            "salloc's shell running python directly), asked for more than one node: only "
            "this node's processes could start, and they would wait for the others for "
            "ever. Refused: start the script with srun, or plan one node.",
            when=lambda c: (slurm_allocation(c.machine.environ)
                            and not slurm_step(c.machine.environ) and c.num_nodes > 1),
            then=_refuse_slurm_without_step,
            refuses="cluster-mismatch",
        ),
        Rule(
            id="cluster/slurm-interactive",
            doc="An interactive SLURM allocation (salloc; job name 'bash' or 'interactive') "
            "whose process srun did not start is treated as local (noted).",
            when=lambda c: slurm_allocation(c.machine.environ) and _interactive_name(c),
            then=_slurm_local("interactive SLURM allocation without an srun step"),
        ),
        Rule(
            id="cluster/slurm-without-step",
            doc="A SLURM allocation whose process srun did not start (a batch script or "
            "salloc's shell running python directly, no SLURM_STEP_ID) is treated as local "
            "(noted).",
            when=lambda c: slurm_allocation(c.machine.environ),
            then=_slurm_without_step,
        ),
        Rule(id="cluster/local", doc="Nothing else matched.", when=always, then=_local),
    ),
    registered=_registered_detectors,
    registered_before="cluster/external",
)


def _counts(raw: str) -> int:
    """A process count as SLURM and the launchers write it: ``"4"``, or SLURM's per-node
    list ``"2(x3)"`` / ``"2(x2),2"`` when every node has the same count."""
    counts: set[str] = set()
    for item in raw.strip().split(","):
        head, paren, repeat = item.strip().partition("(")
        if paren and not (repeat.startswith("x") and repeat.endswith(")")
                          and repeat[1:-1].isascii() and repeat[1:-1].isdigit()):
            raise ValueError(raw)
        if not (head.isascii() and head.isdigit()):
            raise ValueError(raw)
        counts.add(head)
    if len(counts) != 1:
        raise ValueError(raw)  # nodes with different counts: a heterogeneous layout
    return int(counts.pop())


def _read(ctx: ClusterDraft, names: tuple[str, ...]) -> tuple[str, int] | None:
    """The first of ``names`` that is set, with its value; None when none is set.

    Raises:
        ValueError: the value (named by the exception's message) is not a count.
    """
    for name in names:
        raw = ctx.machine.environ.get(name)
        if raw is None:
            continue
        try:
            return name, _counts(raw)
        except ValueError:
            raise ValueError(name) from None
    return None


def _bad_variable(ctx: ClusterDraft) -> str | None:
    row = ctx.cluster_row
    if row is None or not ctx.cluster_external:
        return None
    for names in (row.world_size_vars, row.local_size_vars, row.nodes_vars,
                  row.local_rank_vars):
        try:
            _read(ctx, names)
        except ValueError as exc:
            return str(exc)
    return None


def _refuse_bad_variable(ctx: ClusterDraft) -> str:
    name = _bad_variable(ctx) or ""
    refuse(
        "invalid-environment",
        flag="environment",
        value=f"{name}={ctx.machine.environ.get(name)}",
        reason=f"{ctx.cluster} was detected, but {name}={ctx.machine.environ.get(name)!r} "
        "is not a process count (heterogeneous layouts are not supported).",
    )


def _external_row(ctx: ClusterDraft) -> ClusterRow | None:
    return ctx.cluster_row if ctx.cluster_external else None


def _per_node(ctx: ClusterDraft, row: ClusterRow) -> tuple[str, int] | None:
    """The processes per node the cluster started, and where that number comes from.

    A per-node figure larger than the processes started allows (SLURM_NTASKS_PER_NODE=2
    with SLURM_NTASKS=1: a partly filled allocation) counts slots, not processes; then
    the total over the nodes is what was started, and no device is made up.
    """
    found = _read(ctx, row.local_size_vars)
    if found is None:
        return ("one process per node", 1) if row.one_process_per_node else None
    world = _read(ctx, row.world_size_vars)
    nodes_found = _read(ctx, row.nodes_vars)
    nodes = nodes_found[1] if nodes_found is not None else ctx.num_nodes
    if world is None or nodes < 1 or found[1] * nodes <= world[1]:
        return found
    if world[1] % nodes:
        return None  # uneven: the total process count is refused instead
    per_node = world[1] // nodes
    return (f"{world[0]}={world[1]} over {nodes} node{'s' if nodes != 1 else ''}; "
            f"{found[0]}={found[1]} counts slots, not processes started", per_node)


def _per_node_mismatch(ctx: ClusterDraft) -> tuple[str, int] | None:
    row = _external_row(ctx)
    if row is None:
        return None
    found = _per_node(ctx, row)
    return found if found is not None and found[1] != ctx.devices_per_node else None


def _adoptable_per_node(ctx: ClusterDraft) -> int | None:
    """The cluster's processes per node when devices was left on auto and that many
    devices exist here (any count on cpu, where devices counts processes); else None."""
    if ctx.devices.kind != "auto" or _bad_variable(ctx) is not None:
        # an explicit devices value is the user's (a mismatch is refused), and an
        # unreadable variable is refused by the check that follows
        return None
    found = _per_node_mismatch(ctx)
    if found is None or found[1] < 1:
        return None
    available = (MAX_DEVICES_PER_NODE if ctx.accelerator == "cpu"
                 else devices_on(ctx.accelerator, ctx.parts, ctx.machine))
    return found[1] if found[1] <= available else None


def _follow_cluster(ctx: ClusterDraft) -> str:
    name, value = _per_node_mismatch(ctx) or ("", 0)
    source = name if " " in name else f"{name}={value}"
    before = ctx.devices_per_node
    if ctx.accelerator == "cpu":
        ctx.parallel_devices = ("cpu",) * value
    else:
        ctx.parallel_devices = indexed(ctx.accelerator, range(value))
    ctx.note(
        f"devices='auto' follows {ctx.cluster}: {value} process{'es' if value != 1 else ''} "
        f"per node ({source}) instead of the {before} that auto places on this machine"
    )
    return f"devices='auto' takes the cluster's {value} per node ({source})"


def _refuse_per_node(ctx: ClusterDraft) -> str:
    name, value = _per_node_mismatch(ctx) or ("", 0)
    source = name if " " in name else f"{name}={value}"
    refuse(
        "cluster-mismatch",
        flag="devices",
        value=ctx.devices_flag,
        reason=f"{ctx.cluster} starts {value} process{'es' if value != 1 else ''} per node "
        f"({source}) but devices={ctx.devices_flag!r} places {ctx.devices_per_node} per "
        "node; the two must agree.",
        choices=(str(value),),
    )


def _nodes_mismatch(ctx: ClusterDraft) -> tuple[str, int] | None:
    row = _external_row(ctx)
    found = _read(ctx, row.nodes_vars) if row is not None else None
    return found if found is not None and found[1] != ctx.num_nodes else None


def _refuse_nodes(ctx: ClusterDraft) -> str:
    name, value = _nodes_mismatch(ctx) or ("", 0)
    refuse(
        "cluster-mismatch",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason=f"{ctx.cluster} runs the job on {value} node{'s' if value != 1 else ''} "
        f"({name}={value}) but num_nodes={ctx.num_nodes}; the two must agree.",
        choices=(str(value),),
    )


def _world_mismatch(ctx: ClusterDraft) -> tuple[str, int] | None:
    row = _external_row(ctx)
    found = _read(ctx, row.world_size_vars) if row is not None else None
    return found if found is not None and found[1] != ctx.world_size else None


def _refuse_world(ctx: ClusterDraft) -> str:
    name, value = _world_mismatch(ctx) or ("", 0)
    per_node, rest = divmod(value, ctx.num_nodes)
    refuse(
        "cluster-mismatch",
        flag="devices",
        value=ctx.devices_flag,
        reason=f"{ctx.cluster} started {value} process{'es' if value != 1 else ''} in all "
        f"({name}={value}) but devices={ctx.devices_flag!r} x num_nodes={ctx.num_nodes} "
        f"makes {ctx.world_size}; the two must agree.",
        choices=(str(per_node),) if rest == 0 and per_node > 0 else (),
    )


def _local_rank_beyond(ctx: ClusterDraft) -> tuple[str, int] | None:
    row = _external_row(ctx)
    found = _read(ctx, row.local_rank_vars) if row is not None else None
    return found if found is not None and found[1] >= ctx.devices_per_node else None


def _refuse_local_rank(ctx: ClusterDraft) -> str:
    name, value = _local_rank_beyond(ctx) or ("", 0)
    n = ctx.devices_per_node
    refuse(
        "cluster-mismatch",
        flag="devices",
        value=ctx.devices_flag,
        reason=f"{ctx.cluster} gave this process local rank {value} ({name}={value}) but "
        f"devices={ctx.devices_flag!r} places {n} process{'es' if n != 1 else ''} per node "
        f"(local ranks 0..{n - 1}), so there is no device for it: the launcher started at "
        f"least {value + 1} processes on this node. Set devices to the processes per node "
        "and num_nodes to the nodes, as the launcher was told.",
    )


def _consistent(ctx: ClusterDraft) -> str:
    if not ctx.cluster_external:
        return f"{ctx.cluster}: the processes will be created by interlock"
    return f"{ctx.cluster} agrees with {ctx.devices_per_node} device(s) x {ctx.num_nodes} node(s)"


CLUSTER_CHECK = Decision(
    id="cluster/check",
    doc="An external cluster's geometry must match devices x num_nodes, checked before any "
    "process group is made.",
    rules=(
        Rule(
            id="cluster/unreadable-variable",
            doc="A count or local-rank variable of the detected cluster is not a number "
            "(or lists nodes with different counts).",
            when=lambda c: _bad_variable(c) is not None,
            then=_refuse_bad_variable,
            refuses="invalid-environment",
        ),
        Rule(
            id="cluster/processes-per-node-mismatch",
            doc="The per-node process count (LOCAL_WORLD_SIZE, SLURM_STEP_TASKS_PER_NODE or "
            "SLURM_NTASKS_PER_NODE, OMPI_COMM_WORLD_LOCAL_SIZE; Kubeflow: 1) differs from the "
            "devices per node. A per-node count above what the total allows counts slots: "
            "the total over the nodes is used instead.",
            when=lambda c: _per_node_mismatch(c) is not None,
            then=_refuse_per_node,
            refuses="cluster-mismatch",
        ),
        Rule(
            id="cluster/nodes-mismatch",
            doc="The node count (GROUP_WORLD_SIZE, SLURM_STEP_NUM_NODES or SLURM_NNODES) "
            "differs from num_nodes.",
            when=lambda c: _nodes_mismatch(c) is not None,
            then=_refuse_nodes,
            refuses="cluster-mismatch",
        ),
        Rule(
            id="cluster/world-size-mismatch",
            doc="The total process count (WORLD_SIZE, SLURM_STEP_NUM_TASKS or SLURM_NTASKS, "
            "JSM_NAMESPACE_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE) differs from devices x "
            "num_nodes.",
            when=lambda c: _world_mismatch(c) is not None,
            then=_refuse_world,
            refuses="cluster-mismatch",
        ),
        Rule(
            id="cluster/local-rank-out-of-range",
            doc="This process's local rank (LOCAL_RANK, SLURM_LOCALID, "
            "JSM_NAMESPACE_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK) is not below the devices "
            "per node: there is no device for it.",
            when=lambda c: _local_rank_beyond(c) is not None,
            then=_refuse_local_rank,
            refuses="cluster-mismatch",
        ),
        Rule(id="cluster/consistent", doc="Otherwise.", when=always, then=_consistent),
    ),
)

CLUSTER_DEVICES: Decision[ClusterDraft] = Decision(
    id="cluster/auto-devices",
    doc="devices='auto' takes the per-node process count of a cluster that started the "
    "processes; a devices value the user wrote is checked as written.",
    rules=(
        Rule(
            id="cluster/auto-devices-follow-cluster",
            doc="devices was left on auto and an external cluster started a different "
            "number of processes per node that this machine has devices for (any number on "
            "cpu): devices takes the cluster's count, with a note (torchrun "
            "--nproc_per_node=1 on an 8-GPU host uses cuda:0).",
            when=lambda c: _adoptable_per_node(c) is not None,
            then=_follow_cluster,
        ),
        Rule(
            id="cluster/devices-as-placed",
            doc="Otherwise the devices stay as the devices stage placed them.",
            when=always,
            then=devices_as_placed,
        ),
    ),
)

CLUSTER_STAGE = Stage(
    name="cluster",
    doc="Detect the cluster environment and check the job's geometry against the flags.",
    decisions=(CLUSTER_CHOICE, CLUSTER_DEVICES, CLUSTER_CHECK),
)


def choose_cluster(inputs: ClusterInput, written: Written = NOT_WRITTEN) -> ClusterChoice:
    """The cluster stage; ``written`` holds the flags as written, to quote.

    Raises:
        ResolutionError: a cluster variable is unreadable, or the cluster's geometry
            differs from the flags'.
    """
    draft = ClusterDraft(machine=inputs.machine, parts=inputs.parts,
                         accelerator=inputs.accelerator, devices=inputs.devices,
                         parallel_devices=inputs.parallel_devices, num_nodes=inputs.num_nodes,
                         cluster_plugin=inputs.cluster_plugin, devices_flag=written.devices,
                         num_nodes_flag=written.num_nodes)
    trace = run_stage(CLUSTER_STAGE, draft, inputs.parts)
    return ClusterChoice(name=draft.cluster, external=draft.cluster_external,
                         parallel_devices=draft.parallel_devices, notes=tuple(draft.notes),
                         trace=trace)


def check_geometry(
    name: str, devices_per_node: int, num_nodes: int, environ: Mapping[str, str]
) -> None:
    """Refuse a job whose geometry (from the variables of the cluster environment
    ``name``, built-in or registered) differs from a strategy's settled geometry: the
    ``cluster/check`` decision alone, for the runtime.

    Raises:
        ResolutionError: ``cluster-mismatch`` or ``invalid-environment``.
    """
    parts = current_parts()
    row = parts.environments.get(name)
    if row is None:
        return  # an environment nobody registered: nothing the tables know to check
    machine = Machine(environ={k: environ[k] for k in parts.environment_variables
                               if k in environ})
    # the strategy's devices are settled: a count, never auto (which would follow the
    # cluster instead of being checked against it)
    draft = ClusterDraft(
        machine=machine, parts=parts, accelerator="cpu",
        devices=DevicesRequest(kind="count", count=devices_per_node),
        parallel_devices=("cpu",) * devices_per_node, num_nodes=num_nodes,
        devices_flag=devices_per_node, num_nodes_flag=num_nodes,
        cluster=row.name, cluster_row=row, cluster_external=row.external,
    )
    run_decision(CLUSTER_STAGE.name, CLUSTER_CHECK, draft, parts, [])


STEP = Step("cluster", choose_cluster, ClusterInput,
            writes={"name": "cluster", "external": "cluster_external",
                    "parallel_devices": "parallel_devices"})
