"""Stages 2-4: the accelerator, the devices and the cluster environment.

The rows come from the part registries at call time (``ctx.parts``). A registered
accelerator gets an ``accelerator/auto-<name>`` rule just before ``accelerator/auto-cpu``
and the ``devices/<name>-*`` rules of an indexed device kind; a registered cluster
environment with a detector gets a ``cluster/<name>`` rule just before
``cluster/external`` (see `interlock.connector.parts_registry` for why there).
"""

from __future__ import annotations

from collections.abc import Callable

from interlock.connector.limits import (
    MAX_DEVICES_PER_NODE,
    MAX_NUM_NODES,
    MAX_WORLD_SIZE,
    short_repr,
)
from interlock.connector.parts_registry import ENVIRONMENT_REGISTRY, PartTables
from interlock.connector.rules import (
    Action,
    Context,
    Decision,
    Predicate,
    Rule,
    Stage,
    always,
    devices_as_placed,
    refuse,
)
from interlock.connector.tables import (
    ACCELERATOR_CHOOSERS,
    DETECTION_VALUES,
    DETECTION_VARIABLE,
    EXTRA_DEVICES_FACT,
    INSTALL_HINTS,
    SLURM_INTERACTIVE_JOB_NAMES,
    AcceleratorRow,
    ClusterRow,
    external_launcher_detect,
    slurm_allocation,
    slurm_step,
)

# --------------------------------------------------------------------------- accelerator

_FACT_WORDS = {
    "cuda_devices": "CUDA devices",
    "mps_available": "Apple MPS devices",
    "xla_devices": "XLA devices",
}


def device_count(row: AcceleratorRow, ctx: Context) -> int | None:
    """Devices of this kind on the machine; None for the CPU (any number)."""
    if row.machine_fact is None:
        return None
    if row.machine_fact == EXTRA_DEVICES_FACT:
        return ctx.machine.extra_devices.get(row.name, 0)
    return int(getattr(ctx.machine, row.machine_fact))


def _missing_packages(row: AcceleratorRow, ctx: Context) -> tuple[str, ...]:
    return tuple(p for p in row.requires if p not in ctx.machine.packages)


def _available(name: str, ctx: Context) -> bool:
    row = ctx.parts.accelerators[name]
    return not _missing_packages(row, ctx) and device_count(row, ctx) != 0


def _available_names(ctx: Context) -> tuple[str, ...]:
    return tuple(n for n in ctx.parts.accelerator_names if _available(n, ctx))


def _fact(row: AcceleratorRow, ctx: Context) -> str:
    """The machine fact behind an accelerator's availability, in words."""
    if row.machine_fact is None:
        return "the CPU is always available"
    if isinstance(getattr(ctx.machine, row.machine_fact), bool):
        available = getattr(ctx.machine, row.machine_fact)
        return f"{_FACT_WORDS[row.machine_fact]} {'are' if available else 'are not'} available"
    words = _FACT_WORDS.get(row.machine_fact, f"{row.name} devices")
    return f"this machine has {device_count(row, ctx)} {words}"


def _explicit(ctx: Context) -> bool:
    return ctx.accelerator_input in ctx.parts.accelerators


def _refuse_missing(ctx: Context) -> str:
    row = ctx.parts.accelerators[ctx.accelerator_input]
    missing = _missing_packages(row, ctx)
    refuse(
        "missing-package",
        flag="accelerator",
        value=ctx.accelerator_flag,
        reason=f"the {row.name} accelerator needs {', '.join(missing)}, which is not "
        f"installed (install: {'; '.join(INSTALL_HINTS[p] for p in missing)}).",
        choices=_available_names(ctx),
    )


def _refuse_unavailable(ctx: Context) -> str:
    row = ctx.parts.accelerators[ctx.accelerator_input]
    refuse(
        "accelerator-unavailable",
        flag="accelerator",
        value=ctx.accelerator_flag,
        reason=f"{_fact(row, ctx)}.",
        choices=_available_names(ctx),
    )


def _choose_explicit(ctx: Context) -> str:
    ctx.accelerator = ctx.accelerator_input
    ctx.accelerator_reason = f"accelerator={ctx.accelerator_flag!r} was asked for"
    return f"{ctx.accelerator!r} was asked for and is available"


def _chooser_rule(chooser: str, name: str, doc: str | None = None) -> Rule:
    def then(ctx: Context) -> str:
        row = ctx.parts.accelerators[name]
        ctx.accelerator = name
        why = "always available" if row.machine_fact is None else (
            f"{_fact(row, ctx)}" + (f" and {', '.join(row.requires)} is installed"
                                    if row.requires else "")
        )
        ctx.accelerator_reason = f"accelerator={ctx.accelerator_flag!r} chose {name!r}: {why}"
        if chooser != "auto":
            ctx.note(f"accelerator={ctx.accelerator_flag!r} chose {name!r} ({why})")
        return f"{chooser!r} chose {name!r}: {why}"

    order = ", ".join(ACCELERATOR_CHOOSERS[chooser])
    return Rule(
        id=f"accelerator/{chooser}-{name}",
        doc=doc or f"accelerator='{chooser}' takes {name} when available (order: {order}).",
        when=lambda c: c.accelerator_input == chooser and _available(name, c),
        then=then,
    )


def _refuse_chooser(ctx: Context) -> str:
    facts = "; ".join(
        _fact(ctx.parts.accelerators[n], ctx)
        for n in ctx.parts.chooser_order(ctx.accelerator_input)
    )
    refuse(
        "accelerator-unavailable",
        flag="accelerator",
        value=ctx.accelerator_flag,
        reason=f"no device it can pick is present: {facts}.",
        choices=_available_names(ctx),
    )


def _registered_choosers(parts: PartTables) -> tuple[Rule, ...]:
    return tuple(
        _chooser_rule("auto", row.name, doc=f"accelerator='auto' takes the registered "
                      f"accelerator {row.name} when available (after the built-in device "
                      "kinds, before cpu).")
        for row in parts.added_accelerators
    )


ACCELERATOR_CHOICE = Decision(
    id="accelerator/choose",
    doc="Pick the accelerator: an explicit one must be present; 'auto' and 'gpu' pick "
    "by preference.",
    rules=(
        Rule(
            id="accelerator/explicit-missing-package",
            doc="An explicit accelerator whose package is not installed (xla without "
            "torch_xla).",
            when=lambda c: _explicit(c)
            and bool(_missing_packages(c.parts.accelerators[c.accelerator_input], c)),
            then=_refuse_missing,
            refuses="missing-package",
        ),
        Rule(
            id="accelerator/explicit-unavailable",
            doc="An explicit accelerator the machine has no device of.",
            when=lambda c: _explicit(c) and not _available(c.accelerator_input, c),
            then=_refuse_unavailable,
            refuses="accelerator-unavailable",
        ),
        Rule(
            id="accelerator/explicit",
            doc="An explicit accelerator that is present.",
            when=_explicit,
            then=_choose_explicit,
        ),
        *(
            _chooser_rule(chooser, name)
            for chooser, order in ACCELERATOR_CHOOSERS.items()
            for name in order
        ),
        Rule(
            id="accelerator/none-available",
            doc="'gpu' on a machine without MPS or CUDA.",
            when=always,
            then=_refuse_chooser,
            refuses="accelerator-unavailable",
        ),
    ),
    registered=_registered_choosers,
    registered_before="accelerator/auto-cpu",
)

ACCELERATOR_STAGE = Stage(
    name="accelerator",
    doc="Choose the accelerator from the flag and the machine.",
    decisions=(ACCELERATOR_CHOICE,),
)

# --------------------------------------------------------------------------- devices


def _place(ctx: Context, devices: tuple[str, ...]) -> None:
    ctx.parallel_devices = devices


def _indexed(name: str, ids: tuple[int, ...] | range) -> tuple[str, ...]:
    return tuple(f"{name}:{i}" for i in ids)


def _count(ctx: Context) -> int:
    return device_count(ctx.parts.accelerators[ctx.accelerator], ctx) or 0


def _on(name: str, *kinds: str) -> Predicate:
    return lambda c: c.accelerator == name and c.devices.kind in kinds


def _cpu_processes(ctx: Context) -> str:
    n = 1 if ctx.devices.kind == "auto" else ctx.devices.count
    _place(ctx, ("cpu",) * n)
    return f"{n} CPU process{'es' if n != 1 else ''}"


def _refuse_cpu_devices(ctx: Context) -> str:
    refuse(
        "invalid-devices",
        flag="devices",
        value=ctx.devices_flag,
        reason="on cpu, devices is the number of processes: an int > 0 or a digit string; "
        "-1 and device ids mean nothing there.",
        choices=("auto", "1", "2"),
    )


def _cuda_auto_interactive(ctx: Context) -> str:
    _place(ctx, ("cuda:0",))
    ctx.note(
        f"devices='auto' in an interactive session uses 1 of {_count(ctx)} CUDA devices; "
        "pass devices=-1 (with strategy='ddp_notebook') to use them all"
    )
    return f"interactive session: 1 of {_count(ctx)} CUDA devices"


def _all_indexed(ctx: Context) -> str:
    n = _count(ctx)
    _place(ctx, _indexed(ctx.accelerator, range(n)))
    return f"all {n} {ctx.accelerator} devices"


def _count_indexed(ctx: Context) -> str:
    _place(ctx, _indexed(ctx.accelerator, range(ctx.devices.count)))
    return f"the first {ctx.devices.count} of {_count(ctx)} {ctx.accelerator} devices"


def _ids_indexed(ctx: Context) -> str:
    _place(ctx, _indexed(ctx.accelerator, ctx.devices.ids))
    return f"{ctx.accelerator} devices {', '.join(map(str, ctx.devices.ids))}"


def _device_choices(ctx: Context) -> tuple[str, ...]:
    n = _count(ctx)
    # every count up to 16, then the full one: a simulated host may have thousands
    counts = [*range(1, min(n, 16) + 1), *([n] if n > 16 else [])]
    return ("auto", "-1", *(str(i) for i in counts))


def _refuse_unavailable_devices(ctx: Context) -> str:
    n = _count(ctx)
    row = ctx.parts.accelerators[ctx.accelerator]
    asked = ctx.devices.describe()
    valid_ids = f"ids 0..{n - 1}" if n > 1 else "id 0"
    refuse(
        "devices-unavailable",
        flag="devices",
        value=ctx.devices_flag,
        reason=f"{asked} asked for, but {_fact(row, ctx)} ({valid_ids}).",
        choices=_device_choices(ctx),
    )


def _too_many(ctx: Context) -> bool:
    n = _count(ctx)
    if ctx.devices.kind == "count":
        return ctx.devices.count > n
    if ctx.devices.kind == "ids":
        return max(ctx.devices.ids) >= n
    return False


def _mps_one(ctx: Context) -> str:
    _place(ctx, ("mps:0",))
    return "the one MPS device"


def _mps_fits(ctx: Context) -> bool:
    d = ctx.devices
    return d.kind in ("auto", "all") or (d.kind == "count" and d.count == 1) or d.ids == (0,)


def _xla_fits_one(ctx: Context) -> bool:
    return ctx.devices.kind == "count" and ctx.devices.count == 1


def _xla_all(ctx: Context) -> bool:
    d = ctx.devices
    return d.kind in ("auto", "all") or (d.kind == "count" and d.count == _count(ctx))


def _xla_index(ctx: Context) -> bool:
    return ctx.devices.kind == "ids" and len(ctx.devices.ids) == 1 and not _too_many(ctx)


def _refuse_xla_devices(ctx: Context) -> str:
    n = _count(ctx)
    refuse(
        "invalid-devices",
        flag="devices",
        value=ctx.devices_flag,
        reason=f"xla runs on 1 device, on all {n}, or on one index [i]; "
        f"{ctx.devices.describe()} is none of these.",
        choices=("1", str(n), "-1", "[0]"),
    )


def _beyond_on(name: str) -> Predicate:
    return lambda c: c.accelerator == name and _too_many(c)


def _registered_device_rules(parts: PartTables) -> tuple[Rule, ...]:
    """A registered accelerator's devices are indexed and placed like CUDA's."""
    rules: list[Rule] = []
    for row in parts.added_accelerators:
        name = row.name
        rules += [
            Rule(
                id=f"devices/{name}-unavailable",
                doc=f"{name}: a count or id beyond the devices in "
                f"Machine.extra_devices[{name!r}].",
                when=_beyond_on(name),
                then=_refuse_unavailable_devices,
                refuses="devices-unavailable",
            ),
            Rule(id=f"devices/{name}-all", doc=f"{name}: 'auto' or -1 is every device.",
                 when=_on(name, "auto", "all"), then=_all_indexed),
            Rule(id=f"devices/{name}-count", doc=f"{name}: N is devices 0..N-1.",
                 when=_on(name, "count"), then=_count_indexed),
            Rule(id=f"devices/{name}-ids", doc=f"{name}: explicit ids.",
                 when=_on(name, "ids"), then=_ids_indexed),
        ]
    return tuple(rules)


DEVICES_CHOICE = Decision(
    id="devices/place",
    doc="Turn the devices flag into the devices of one node for the chosen accelerator.",
    rules=(
        Rule(
            id="devices/cpu-processes",
            doc="cpu: 'auto' is 1 process; a count N is N processes.",
            when=_on("cpu", "auto", "count"),
            then=_cpu_processes,
        ),
        Rule(
            id="devices/cpu-refused",
            doc="cpu: -1 and id lists are refused (a CPU has no device ids).",
            when=lambda c: c.accelerator == "cpu",
            then=_refuse_cpu_devices,
            refuses="invalid-devices",
        ),
        Rule(
            id="devices/cuda-auto-interactive",
            doc="cuda, 'auto', interactive session, several GPUs: 1 device (noted).",
            when=lambda c: c.accelerator == "cuda" and c.devices.kind == "auto"
            and c.machine.interactive and c.machine.cuda_devices > 1,
            then=_cuda_auto_interactive,
        ),
        Rule(
            id="devices/cuda-unavailable",
            doc="cuda: a count or id beyond the visible devices.",
            when=lambda c: c.accelerator == "cuda" and _too_many(c),
            then=_refuse_unavailable_devices,
            refuses="devices-unavailable",
        ),
        Rule(
            id="devices/cuda-all",
            doc="cuda: 'auto' or -1 is every visible device.",
            when=_on("cuda", "auto", "all"),
            then=_all_indexed,
        ),
        Rule(
            id="devices/cuda-count",
            doc="cuda: N is devices 0..N-1.",
            when=_on("cuda", "count"),
            then=_count_indexed,
        ),
        Rule(
            id="devices/cuda-ids",
            doc="cuda: explicit ids.",
            when=_on("cuda", "ids"),
            then=_ids_indexed,
        ),
        Rule(
            id="devices/mps-one",
            doc="mps: 'auto', -1, 1 or [0] is the one device.",
            when=lambda c: c.accelerator == "mps" and _mps_fits(c),
            then=_mps_one,
        ),
        Rule(
            id="devices/mps-unavailable",
            doc="mps: anything more than its one device.",
            when=lambda c: c.accelerator == "mps",
            then=_refuse_unavailable_devices,
            refuses="devices-unavailable",
        ),
        Rule(
            id="devices/xla-one",
            doc="xla: 1 is the first device.",
            when=lambda c: c.accelerator == "xla" and _xla_fits_one(c),
            then=_count_indexed,
        ),
        Rule(
            id="devices/xla-all",
            doc="xla: 'auto', -1 or the full count is every device.",
            when=lambda c: c.accelerator == "xla" and _xla_all(c),
            then=_all_indexed,
        ),
        Rule(
            id="devices/xla-index",
            doc="xla: [i] is the one device i.",
            when=lambda c: c.accelerator == "xla" and _xla_index(c),
            then=_ids_indexed,
        ),
        Rule(
            id="devices/xla-unavailable",
            doc="xla: a count or index beyond the devices.",
            when=lambda c: c.accelerator == "xla" and _too_many(c),
            then=_refuse_unavailable_devices,
            refuses="devices-unavailable",
        ),
        Rule(
            id="devices/xla-refused",
            doc="xla: other counts and several ids.",
            when=always,
            then=_refuse_xla_devices,
            refuses="invalid-devices",
        ),
    ),
    registered=_registered_device_rules,
    registered_before="devices/mps-one",
)



def _refuse_per_node_limit(ctx: Context) -> str:
    refuse(
        "invalid-devices",
        flag="devices",
        value=ctx.devices_flag,
        reason=f"the strategy instance was given {ctx.devices_per_node} devices per node, "
        f"beyond the bound of {MAX_DEVICES_PER_NODE} "
        "(interlock.connector.limits.MAX_DEVICES_PER_NODE).",
        choices=("auto", "1"),
    )


def _world_beyond_limit(ctx: Context) -> bool:
    return ctx.num_nodes > MAX_NUM_NODES or ctx.world_size > MAX_WORLD_SIZE


def _refuse_world_limit(ctx: Context) -> str:
    per_node = ctx.devices_per_node
    if ctx.num_nodes > MAX_NUM_NODES:
        why = (f"{short_repr(ctx.num_nodes)} nodes is beyond the bound of {MAX_NUM_NODES} "
               "(interlock.connector.limits.MAX_NUM_NODES)")
    else:
        why = (f"{per_node} device{'s' if per_node != 1 else ''} per node x "
               f"{ctx.num_nodes} nodes makes a world size of {ctx.world_size}, beyond the "
               f"bound of {MAX_WORLD_SIZE} (interlock.connector.limits.MAX_WORLD_SIZE)")
    refuse(
        "invalid-num-nodes",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason=f"{why}; no job has run that many processes.",
        choices=(str(min(MAX_NUM_NODES, MAX_WORLD_SIZE // max(per_node, 1))),),
    )


DEVICES_LIMITS = Decision(
    id="devices/limits",
    doc="The placed geometry must stay within the bounds of interlock.connector.limits. "
    "The flags are bounded when parsed; this catches the product devices x nodes, and the "
    "parts a strategy instance brought.",
    rules=(
        Rule(
            id="devices/per-node-beyond-limit",
            doc=f"More than {MAX_DEVICES_PER_NODE} devices per node (only a strategy "
            "instance's own devices can place that many).",
            when=lambda c: c.devices_per_node > MAX_DEVICES_PER_NODE,
            then=_refuse_per_node_limit,
            refuses="invalid-devices",
        ),
        Rule(
            id="devices/world-size-beyond-limit",
            doc=f"devices x num_nodes above {MAX_WORLD_SIZE}, or more than {MAX_NUM_NODES} "
            "nodes from a strategy instance.",
            when=_world_beyond_limit,
            then=_refuse_world_limit,
            refuses="invalid-num-nodes",
        ),
        Rule(
            id="devices/within-limits",
            doc="Otherwise.",
            when=always,
            then=lambda c: f"world size {c.world_size} is within the bound of "
            f"{MAX_WORLD_SIZE}",
        ),
    ),
)

DEVICES_STAGE = Stage(
    name="devices",
    doc="Place the processes of one node on devices, within the bounds on the geometry.",
    decisions=(DEVICES_CHOICE, DEVICES_LIMITS),
)

# --------------------------------------------------------------------------- cluster


#: The built-in cluster environments, for the rules written for them by name.
_BUILTIN: dict[str, ClusterRow] = {row.name: row for row in ENVIRONMENT_REGISTRY.builtin}


def _use_cluster(ctx: Context, row: ClusterRow, *, detected: bool = True) -> None:
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


def _from_plugin(ctx: Context) -> str:
    plugin = ctx.plugins.cluster_environment
    name = str(getattr(plugin, "name", ""))
    ctx.cluster = name
    ctx.cluster_row = ctx.parts.environments.get(name)
    ctx.cluster_external = bool(getattr(plugin, "creates_processes_externally", False))
    return f"the cluster environment plugin {type(plugin).__name__} ({name!r}) is used as given"


def _xla_cluster(ctx: Context) -> str:
    _use_cluster(ctx, ctx.parts.environments["xla"], detected=False)
    return "the xla accelerator runs under the XLA runtime's environment"


# ----- the switch that turns detection off


def _detection_value(ctx: Context) -> str:
    return ctx.machine.environ.get(DETECTION_VARIABLE, "on").strip().lower() or "on"


def _refuse_detection_value(ctx: Context) -> str:
    raw = ctx.machine.environ.get(DETECTION_VARIABLE, "")
    refuse(
        "invalid-environment",
        flag="environment",
        value=f"{DETECTION_VARIABLE}={raw}",
        reason=f"{DETECTION_VARIABLE} turns cluster detection on or off, and {raw!r} is "
        "neither.",
        choices=DETECTION_VALUES,
    )


def _detected_rows(ctx: Context) -> tuple[str, ...]:
    env = ctx.machine.environ
    return tuple(r.name for r in ctx.parts.detection_order
                 if r.detect is not None and r.detect(env))


def _detection_off(ctx: Context) -> str:
    _use_cluster(ctx, ctx.parts.environments["local"], detected=False)
    ignored = _detected_rows(ctx)
    what = (f"the variables of {', '.join(ignored)} are ignored" if ignored
            else "no cluster variables are read")
    ctx.note(f"cluster detection is off ({DETECTION_VARIABLE}=off): {what}, and interlock's "
             "launcher starts the processes")
    return f"{DETECTION_VARIABLE}=off"


# ----- launchers inside a SLURM job


def cluster_detect(row: ClusterRow, ctx: Context) -> bool:
    """Whether ``row``'s detector holds on the context's machine."""
    return row.detect is not None and row.detect(ctx.machine.environ)


def _slurm_job(ctx: Context) -> str:
    env = ctx.machine.environ
    job = env.get("SLURM_JOB_ID")
    return f"SLURM job {job}" if job else "a SLURM job"


def _torchelastic_in_slurm(ctx: Context) -> str:
    row = ctx.parts.environments["torchelastic"]
    _use_cluster(ctx, row)
    ctx.note(
        f"torchrun started this process inside {_slurm_job(ctx)}: ranks and geometry come "
        "from torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE), and the SLURM variables, "
        "which describe the tasks srun or sbatch started (torchrun's agents), are ignored"
    )
    return f"{row.description} inside a SLURM job: {row.detect_doc}"


def _slurm_tasks(ctx: Context) -> str | None:
    """The number of tasks of this SLURM job step, as written (the step's own count first)."""
    env = ctx.machine.environ
    for name in ctx.parts.environments["slurm"].world_size_vars:
        if name in env:
            return env[name].strip()
    return None


def _external_in_slurm_step(ctx: Context) -> bool:
    env = ctx.machine.environ
    return (
        slurm_step(env)
        and external_launcher_detect(env)
        and env["WORLD_SIZE"].strip() != _slurm_tasks(ctx)
    )


def _external_in_slurm(ctx: Context) -> str:
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


def _slurm_local(why: str) -> Action:
    def then(ctx: Context) -> str:
        _use_cluster(ctx, ctx.parts.environments["local"])
        ctx.note(f"{why}: interlock's launcher starts the processes, SLURM only allocated them")
        return why

    return then


def _slurm_single_task(ctx: Context) -> bool:
    return (
        slurm_step(ctx.machine.environ)
        and _slurm_tasks(ctx) == "1"
        and ctx.num_nodes == 1
        and ctx.devices_per_node > 1
    )


def _slurm_without_step(ctx: Context) -> str:
    _use_cluster(ctx, ctx.parts.environments["local"])
    env = ctx.machine.environ
    where = ("a batch script" if "SLURM_PROCID" in env
             else "an allocation's shell (salloc)")
    ctx.note(
        f"{_slurm_job(ctx)} without a job step (SLURM_STEP_ID is not set): this process "
        f"was started by {where}, not by srun, so SLURM started none of the other "
        "processes; interlock's launcher starts them on this node"
    )
    return f"{_slurm_job(ctx)}, but srun did not start this process"


def _external_note(ctx: Context) -> str:
    env = ctx.machine.environ
    return (
        f"RANK={env['RANK']}, LOCAL_RANK={env['LOCAL_RANK']} and WORLD_SIZE={env['WORLD_SIZE']} "
        "were exported by a launcher other than interlock's (the deepspeed command, an "
        "in-house launcher): it started the processes, so interlock starts none and this "
        f"process joins their world; if these variables mean something else here, set "
        f"{DETECTION_VARIABLE}=off"
    )


#: Detected clusters whose choice the plan explains in a note.
_DETECTION_NOTES: dict[str, Callable[[Context], str]] = {"external": _external_note}


def _detect_rule(row: ClusterRow) -> Rule:
    detect = row.detect
    if detect is None:
        raise RuntimeError(f"internal error: cluster row {row.name!r} has no detector")
    note = _DETECTION_NOTES.get(row.name)

    def then(ctx: Context) -> str:
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


def _local(ctx: Context) -> str:
    _use_cluster(ctx, ctx.parts.environments["local"])
    return "no cluster environment detected"


def _interactive_name(ctx: Context) -> bool:
    return ctx.machine.environ.get("SLURM_JOB_NAME") in SLURM_INTERACTIVE_JOB_NAMES


def _registered_detectors(parts: PartTables) -> tuple[Rule, ...]:
    return tuple(_detect_rule(row) for row in parts.added_environments
                 if row.detect is not None)


CLUSTER_CHOICE = Decision(
    id="cluster/detect",
    doc="Choose the cluster environment: a plugin wins, then the detectors in table order. "
    "A launcher that started this process wins over the allocation around it.",
    rules=(
        Rule(
            id="cluster/plugin",
            doc="A cluster environment plugin is used as given.",
            when=lambda c: c.plugins.cluster_environment is not None,
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
            when=lambda c: cluster_detect(_BUILTIN["torchelastic"], c)
            and slurm_allocation(c.machine.environ),
            then=_torchelastic_in_slurm,
        ),
        _detect_rule(_BUILTIN["torchelastic"]),
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
        *(_detect_rule(row) for row in ENVIRONMENT_REGISTRY.builtin if row.detect is not None
          and row.name != "torchelastic"),
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


def _read(ctx: Context, names: tuple[str, ...]) -> tuple[str, int] | None:
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


def _bad_variable(ctx: Context) -> str | None:
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


def _refuse_bad_variable(ctx: Context) -> str:
    name = _bad_variable(ctx) or ""
    refuse(
        "invalid-environment",
        flag="environment",
        value=f"{name}={ctx.machine.environ.get(name)}",
        reason=f"{ctx.cluster} was detected, but {name}={ctx.machine.environ.get(name)!r} "
        "is not a process count (heterogeneous layouts are not supported).",
    )


def _external_row(ctx: Context) -> ClusterRow | None:
    return ctx.cluster_row if ctx.cluster_external else None


def _per_node(ctx: Context, row: ClusterRow) -> tuple[str, int] | None:
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


def _per_node_mismatch(ctx: Context) -> tuple[str, int] | None:
    row = _external_row(ctx)
    if row is None:
        return None
    found = _per_node(ctx, row)
    return found if found is not None and found[1] != ctx.devices_per_node else None


def _adoptable_per_node(ctx: Context) -> int | None:
    """The cluster's processes per node when devices was left on auto and that many
    devices exist here (any count on cpu, where devices counts processes); else None."""
    if ctx.devices.kind != "auto" or _bad_variable(ctx) is not None:
        # an explicit devices value is the user's (a mismatch is refused), and an
        # unreadable variable is refused by the check that follows
        return None
    found = _per_node_mismatch(ctx)
    if found is None or found[1] < 1:
        return None
    available = MAX_DEVICES_PER_NODE if ctx.accelerator == "cpu" else _count(ctx)
    return found[1] if found[1] <= available else None


def _follow_cluster(ctx: Context) -> str:
    name, value = _per_node_mismatch(ctx) or ("", 0)
    source = name if " " in name else f"{name}={value}"
    before = ctx.devices_per_node
    if ctx.accelerator == "cpu":
        _place(ctx, ("cpu",) * value)
    else:
        _place(ctx, _indexed(ctx.accelerator, range(value)))
    ctx.note(
        f"devices='auto' follows {ctx.cluster}: {value} process{'es' if value != 1 else ''} "
        f"per node ({source}) instead of the {before} that auto places on this machine"
    )
    return f"devices='auto' takes the cluster's {value} per node ({source})"


def _refuse_per_node(ctx: Context) -> str:
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


def _nodes_mismatch(ctx: Context) -> tuple[str, int] | None:
    row = _external_row(ctx)
    found = _read(ctx, row.nodes_vars) if row is not None else None
    return found if found is not None and found[1] != ctx.num_nodes else None


def _refuse_nodes(ctx: Context) -> str:
    name, value = _nodes_mismatch(ctx) or ("", 0)
    refuse(
        "cluster-mismatch",
        flag="num_nodes",
        value=ctx.num_nodes_flag,
        reason=f"{ctx.cluster} runs the job on {value} node{'s' if value != 1 else ''} "
        f"({name}={value}) but num_nodes={ctx.num_nodes}; the two must agree.",
        choices=(str(value),),
    )


def _world_mismatch(ctx: Context) -> tuple[str, int] | None:
    row = _external_row(ctx)
    found = _read(ctx, row.world_size_vars) if row is not None else None
    return found if found is not None and found[1] != ctx.world_size else None


def _refuse_world(ctx: Context) -> str:
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


def _local_rank_beyond(ctx: Context) -> tuple[str, int] | None:
    row = _external_row(ctx)
    found = _read(ctx, row.local_rank_vars) if row is not None else None
    return found if found is not None and found[1] >= ctx.devices_per_node else None


def _refuse_local_rank(ctx: Context) -> str:
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


def _consistent(ctx: Context) -> str:
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

CLUSTER_DEVICES = Decision(
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
