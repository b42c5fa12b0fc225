"""The tables: every fact about what works with what, written once.

These are the built-in rows. Every kind of row (precisions, accelerators, cluster
environments, launchers, ...) lives in the one registry, like the strategies: the rows
below are its built-in entries, and third-party rows join them through
:mod:`interlock.engine.registry` (``interlock.register(row)``, or an entry point).
The engine's rules read the registry at call time, never the tuples here; the module
constants derived from them (``PRECISION_NAMES``, ``ACCELERATOR_ROWS``, ...) describe
the built-in rows only. Strategy rows live in
:mod:`interlock.engine.builtin`.

Each row names its implementation as a lazy ``"package.module:Class"`` string
(``factory``), imported by the runtime and never by the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType


def _freeze(row: object, *, sets: tuple[str, ...], tuples: tuple[str, ...]) -> None:
    """Store a row's set and sequence fields as frozensets and tuples, so a row written
    with a set or a list stays hashable and immutable. Other values are left for
    registration to refuse with a precise message."""
    for name in sets:
        value = getattr(row, name)
        if isinstance(value, (set, list, tuple)):
            object.__setattr__(row, name, frozenset(value))
    for name in tuples:
        value = getattr(row, name)
        if isinstance(value, list):
            object.__setattr__(row, name, tuple(value))


#: Multiprocessing start methods the engine knows about (`Machine.start_methods`,
#: `LauncherRow.start_method`).
START_METHODS: tuple[str, ...] = ("fork", "spawn", "forkserver")


# --------------------------------------------------------------------------- precisions


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionRow:
    """A canonical precision.

    Attributes:
        name: canonical name, e.g. ``"bf16-mixed"``.
        param_dtype: dtype the parameters are stored in.
        compute_dtype: dtype the forward pass computes in.
        scaler: whether a gradient scaler is used.
        plugin: the precision plugin family that implements it (``true``, ``double``,
            ``half``, ``mixed``, ``transformer_engine``).
        requires: optional packages it needs.
        description: one line for the docs.
        output_dtype: dtype of the floating outputs a set-up module hands back:
            ``"default"`` is the caller's default dtype (float32 unless changed), so a
            loss against float32 targets works unchanged; ``64-true`` keeps float64,
            or the loss and every gradient would carry float32 rounding.
        factory: ``"package.module:Class"`` of the precision plugin class that
            implements it (for a built-in row, its plugin family's class).
        accelerators: accelerators it runs on beyond those whose own row lists it
            (built-in rows leave this empty: the accelerator rows list them).
        strategies: strategies that take it beyond those whose own row lists it;
            each must build its precision from this row (no ``precision_plugin`` of
            its own). Built-in rows leave this empty.
        state_tensors: tensors of each parameter's size, in the parameters' dtype,
            that the precision keeps in the optimizer's state beside the optimizer's own
            (a Kahan compensation buffer: 1), for the memory estimate. Built-in rows
            keep none.
    """

    name: str
    param_dtype: str
    compute_dtype: str
    scaler: bool
    plugin: str
    requires: tuple[str, ...] = ()
    description: str
    output_dtype: str = "default"
    factory: str
    accelerators: frozenset[str] = frozenset()
    strategies: frozenset[str] = frozenset()
    state_tensors: int = 0

    def __post_init__(self) -> None:
        _freeze(self, sets=("accelerators", "strategies"), tuples=("requires",))


PRECISIONS: tuple[PrecisionRow, ...] = (
    PrecisionRow(
        name="64-true", param_dtype="float64", compute_dtype="float64", scaler=False,
        plugin="double",
        output_dtype="float64",
        factory="interlock.strategies.precision.double:DoublePrecision",
        description="double precision parameters and compute",
    ),
    PrecisionRow(
        name="32-true", param_dtype="float32", compute_dtype="float32", scaler=False,
        plugin="true",
        factory="interlock.strategies.precision.base:Precision",
        description="full single precision (the default)",
    ),
    PrecisionRow(
        name="16-true", param_dtype="float16", compute_dtype="float16", scaler=False,
        plugin="half",
        factory="interlock.strategies.precision.half:HalfPrecision",
        description="parameters and compute in float16, no scaler",
    ),
    PrecisionRow(
        name="bf16-true", param_dtype="bfloat16", compute_dtype="bfloat16", scaler=False,
        plugin="half",
        factory="interlock.strategies.precision.half:HalfPrecision",
        description="parameters and compute in bfloat16",
    ),
    PrecisionRow(
        name="16-mixed", param_dtype="float32", compute_dtype="float16", scaler=True,
        plugin="mixed",
        factory="interlock.strategies.precision.mixed:MixedPrecision",
        description="float32 parameters, float16 autocast, gradient scaler",
    ),
    PrecisionRow(
        name="bf16-mixed", param_dtype="float32", compute_dtype="bfloat16", scaler=False,
        plugin="mixed",
        factory="interlock.strategies.precision.mixed:MixedPrecision",
        description="float32 parameters, bfloat16 autocast",
    ),
    PrecisionRow(
        name="transformer-engine", param_dtype="bfloat16", compute_dtype="float8",
        plugin="transformer_engine",
        factory="interlock.strategies.precision.transformer_engine:TransformerEnginePrecision",
        scaler=False, requires=("transformer_engine",),
        description="NVIDIA Transformer Engine FP8 layers, bfloat16 elsewhere",
    ),
    PrecisionRow(
        name="transformer-engine-float16", param_dtype="float16", compute_dtype="float8",
        plugin="transformer_engine",
        factory="interlock.strategies.precision.transformer_engine:TransformerEnginePrecision",
        scaler=False, requires=("transformer_engine",),
        description="NVIDIA Transformer Engine FP8 layers, float16 elsewhere",
    ),
)

PRECISION_NAMES: tuple[str, ...] = tuple(row.name for row in PRECISIONS)
PRECISION_ROWS: Mapping[str, PrecisionRow] = MappingProxyType({r.name: r for r in PRECISIONS})

#: The six precisions that are plain PyTorch numerics (no extra package).
NUMERIC_PRECISIONS: frozenset[str] = frozenset(
    ("64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed")
)

#: What a strategy that shards its parameters trains in (FSDP2, DeepSpeed's ZeRO): the
#: numeric precisions but float64, which their collectives and policies leave out.
SHARDED_PRECISIONS: tuple[str, ...] = ("32-true", "16-true", "bf16-true", "16-mixed",
                                       "bf16-mixed")
#: What model_parallel (tensor parallel, pipelines) trains in: the sharded ones but
#: 16-mixed, whose gradient scaler a pipeline cannot drive (`PIPELINE_PRECISION_REASON`).
TENSOR_PARALLEL_PRECISIONS: tuple[str, ...] = ("32-true", "16-true", "bf16-true",
                                               "bf16-mixed")
#: What XLA devices train in: the true precisions but float64 (no autocast and no loss
#: scaler on XLA).
XLA_PRECISIONS: tuple[str, ...] = ("32-true", "16-true", "bf16-true")

#: Legacy spellings and what they mean. Keys are matched by exact type: the int 16
#: and the string "16" are aliases, the float 16.0 and the bool True are not.
LEGACY_PRECISIONS: Mapping[int | str, str] = MappingProxyType(
    {
        16: "16-mixed",
        "16": "16-mixed",
        "bf16": "bf16-mixed",
        32: "32-true",
        "32": "32-true",
        64: "64-true",
        "64": "64-true",
    }
)

DEFAULT_PRECISION = "32-true"

# --------------------------------------------------------------------------- accelerators


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorRow:
    """An accelerator kind.

    Attributes:
        name: canonical name, also the torch device type.
        machine_fact: the :class:`Machine` attribute that counts its devices, or
            None for the CPU (always present, any number of processes).
        precisions: precisions this accelerator can compute in.
        requires: optional packages needed to use it.
        max_devices: devices per node at most, when fixed by the hardware kind.
        backend: the torch.distributed backend its processes use.
        runner: the conformance runner that exercises it, if any.
        description: one line for the docs.
        factory: ``"package.module:Class"`` of its Accelerator class.
        strategies: strategies that run on it, beyond those whose own row lists it
            (built-in rows leave this empty: the strategy rows list them).
        checkpoint_io: the checkpoint IO row its strategies save through unless a
            checkpoint IO plugin is given.
        device_count: a registered accelerator's device counter,
            ``"package.module:function"``: called with no arguments, it returns how many
            devices of this kind the host has, without starting their runtime
            (``"torch.xpu:device_count"``, say). `Machine.probe` calls it once per
            process. None: the devices are counted only where a `Machine` says so.

        memory_reserve: bytes of each device's memory its runtime keeps for itself (the
            CUDA context, the collective library's buffers), which a plan's memory
            estimate does not count as usable; for the CPU, what each rank's process
            keeps of host memory (the interpreter, torch's libraries).

    A registered (third-party) accelerator counts its devices in
    ``Machine.extra_devices`` under its name: its ``machine_fact`` is
    ``"extra_devices"``.
    """

    name: str
    machine_fact: str | None
    precisions: frozenset[str]
    backend: str
    runner: str | None = None
    requires: tuple[str, ...] = ()
    max_devices: int | None = None
    description: str
    factory: str
    strategies: frozenset[str] = frozenset()
    checkpoint_io: str = "torch"
    device_count: str | None = None
    memory_reserve: int = 1 << 30

    def __post_init__(self) -> None:
        _freeze(self, sets=("precisions", "strategies"), tuples=("requires",))


#: The Machine field that counts a registered accelerator's devices, by its name (the
#: ``machine_fact`` of every registered accelerator row).
EXTRA_DEVICES_FACT = "extra_devices"

ACCELERATORS: tuple[AcceleratorRow, ...] = (
    AcceleratorRow(
        name="cpu", machine_fact=None, precisions=NUMERIC_PRECISIONS, backend="gloo",
        factory="interlock.strategies.accelerators.cpu:CPUAccelerator",
        runner="cpu",
        description="CPU processes; gloo for collectives",
        memory_reserve=512 << 20,
    ),
    AcceleratorRow(
        name="cuda", machine_fact="cuda_devices", backend="nccl", runner="cuda",
        factory="interlock.strategies.accelerators.cuda:CUDAAccelerator",
        precisions=frozenset(PRECISION_NAMES),
        description="NVIDIA (or ROCm) GPUs; nccl for collectives",
    ),
    AcceleratorRow(
        name="mps", machine_fact="mps_available", max_devices=1, backend="gloo",
        factory="interlock.strategies.accelerators.mps:MPSAccelerator",
        precisions=NUMERIC_PRECISIONS - {"64-true"},
        description="Apple silicon GPU through Metal (one device, no float64)",
    ),
    AcceleratorRow(
        name="xla", machine_fact="xla_devices", requires=("torch_xla",), backend="xla",
        factory="interlock.strategies.accelerators.xla:XLAAccelerator", checkpoint_io="xla",
        runner="tpu",
        precisions=frozenset(XLA_PRECISIONS),
        description="TPU cores (or other PJRT devices) through torch_xla",
    ),
)

ACCELERATOR_NAMES: tuple[str, ...] = tuple(row.name for row in ACCELERATORS)
ACCELERATOR_ROWS: Mapping[str, AcceleratorRow] = MappingProxyType(
    {r.name: r for r in ACCELERATORS}
)

#: Input names that pick among accelerators, in order of preference.
ACCELERATOR_CHOOSERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "auto": ("xla", "mps", "cuda", "cpu"),
        "gpu": ("mps", "cuda"),
    }
)

#: Input names that are plain aliases of one accelerator.
ACCELERATOR_ALIASES: Mapping[str, str] = MappingProxyType({"tpu": "xla"})


def accelerator_inputs(accelerators: Iterable[str]) -> tuple[str, ...]:
    """Every value the accelerator flag accepts with these accelerators: ``auto``, each
    name, the other choosers (``gpu``) and the aliases (``tpu``)."""
    return ("auto", *accelerators, *(c for c in ACCELERATOR_CHOOSERS if c != "auto"),
            *ACCELERATOR_ALIASES)


#: the accelerator flag's values with the built-in accelerators
ACCELERATOR_INPUTS: tuple[str, ...] = accelerator_inputs(ACCELERATOR_NAMES)

# --------------------------------------------------------------------------- launchers


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointIORow:
    """A checkpoint IO: how a strategy's checkpoints are written and read.

    Attributes:
        name: canonical name (a Plan's ``checkpoint_io``).
        factory: ``"package.module:Class"`` of its CheckpointIO class, constructed with
            no arguments.
        requires: optional packages needed to use it.
        description: one line for the docs.

    An accelerator row names the one its strategies use by default
    (``AcceleratorRow.checkpoint_io``); a checkpoint IO plugin replaces it.
    """

    name: str
    factory: str
    requires: tuple[str, ...] = ()
    description: str

    def __post_init__(self) -> None:
        _freeze(self, sets=(), tuples=("requires",))


CHECKPOINT_IOS: tuple[CheckpointIORow, ...] = (
    CheckpointIORow(
        name="torch", factory="interlock.strategies.io.torch_io:TorchCheckpointIO",
        description="torch.save and torch.load, written atomically",
    ),
    CheckpointIORow(
        name="xla", factory="interlock.strategies.io.xla_io:XLACheckpointIO",
        requires=("torch_xla",),
        description="the torch format, with XLA tensors moved to the CPU first",
    ),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LauncherRow:
    """How a strategy's processes come into being.

    Attributes:
        name: launcher name as it appears in a Plan.
        start_method: the multiprocessing start method it needs, if any.
        interactive: whether it can start processes from a REPL or notebook.
        launches_single: whether it starts a process even for one device
            (spawn-style launchers do; the script launcher runs in place).
        description: one line for the docs.
        factory: ``"package.module:Class"`` of its Launcher class.
        restarts: whether ``Strategy.launch(..., max_restarts=N)`` can restart the
            job's processes through it (every rank stopped, the group rebuilt, the
            function run again); a launcher that did not start the processes cannot.
        on_failure: what happens when a rank fails, for the plan's explanation.
        environment: the cluster environment the ranks it starts run in, when that is
            not the one around the launching process: a launcher that places ranks on a
            cluster of its own (Ray's nodes, say) names that cluster's environment row,
            and a plan that uses the launcher names it as its ``cluster_environment``.
            None (the built-in launchers): the ranks run where the launching process is.
        placement: for a launcher with an ``environment``, how a job's devices and
            nodes map onto what it places ranks on, in words, quoted in the plan's
            trace: called as ``placement(accelerator=..., devices_per_node=...,
            num_nodes=...)`` at plan time, so it must be cheap and import nothing heavy.
        strategies: strategies that run under it (chosen with ``launcher=``) beyond
            those whose own row lists it (`StrategySpec.launchers`); it reaches their
            presets that keep the strategy's launcher choice open too. Built-in rows
            leave this empty.
        requires: optional packages it needs; a plan that uses it needs them too
            (``missing-package`` otherwise).
    """

    name: str
    start_method: str | None
    interactive: bool
    launches_single: bool
    description: str
    factory: str
    restarts: bool = False
    on_failure: str = "the launcher stops every rank and launch() raises, naming the rank"
    environment: str | None = None
    placement: Callable[..., str] | None = None
    strategies: frozenset[str] = frozenset()
    requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _freeze(self, sets=("strategies",), tuples=("requires",))


#: The default back-off between restarts of a failed job (``Strategy.launch(...,
#: max_restarts=N)``): the first wait, the factor each later wait grows by, the longest.
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_FACTOR = 2.0
RESTART_MAX_BACKOFF_S = 60.0

#: what a failing rank does under a launcher whose process only watches the ranks
_WATCHED_RANKS_FAIL = (
    "every rank is stopped and launch() raises naming the first failure; with "
    "launch(max_restarts=N) every rank is restarted instead (this process only watches, "
    "so any rank may die)"
)

LAUNCHERS: tuple[LauncherRow, ...] = (
    LauncherRow(
        name="subprocess", start_method=None, interactive=False, launches_single=False,
        factory="interlock.strategies.launchers.subprocess_script:SubprocessScriptLauncher",
        description="re-runs the user's script once per extra local rank",
        restarts=True,
        on_failure=(
            "every rank is stopped and launch() raises naming the first failure; with "
            "launch(max_restarts=N) the ranks are restarted instead (rank 0 is this "
            "process: its own death ends the job)"
        ),
    ),
    *(
        LauncherRow(
            name=method, start_method=method, interactive=method == "fork",
            launches_single=True,
            factory="interlock.strategies.launchers.multiprocessing:MultiProcessingLauncher",
            description=f"torch.multiprocessing with the {method} start method",
            restarts=True,
            on_failure=_WATCHED_RANKS_FAIL,
        )
        for method in ("spawn", "fork", "forkserver")
    ),
    LauncherRow(
        name="xla", start_method="fork", interactive=True, launches_single=False,
        factory="interlock.strategies.launchers.xla:XLALauncher",
        description="torch_xla's multiprocessing launcher",
        restarts=False,
        on_failure=(
            "torch_xla stops every rank and launch() raises; restarts are not offered "
            "through torch_xla's launcher"
        ),
    ),
    LauncherRow(
        name="external", start_method=None, interactive=True, launches_single=False,
        factory="interlock.strategies.launchers.external:ExternalLauncher",
        description="processes were created by torchrun, srun, mpirun, jsrun or Kubeflow",
        restarts=False,
        on_failure=(
            "the launcher that started the processes decides: torchrun --max-restarts "
            "restarts them all, SLURM requeues a job whose ranks stop on a PreemptionGuard; "
            "launch(max_restarts=N) does not restart here"
        ),
    ),
)

LAUNCHER_ROWS: Mapping[str, LauncherRow] = MappingProxyType({r.name: r for r in LAUNCHERS})

# --------------------------------------------------------------------------- clusters

#: Exported by interlock's own launchers to the processes they start ("host:port" of the
#: rendezvous store); a process that has it was started by interlock, not by someone else.
RENDEZVOUS_VARIABLE = "INTERLOCK_RENDEZVOUS"

#: "off" turns cluster detection off: every cluster variable is ignored and interlock's
#: own launcher starts the processes ("on", the default, detects).
DETECTION_VARIABLE = "INTERLOCK_CLUSTER_DETECTION"
DETECTION_VALUES: tuple[str, ...] = ("on", "off")

#: Variables srun exports to the tasks of a job step (and only there): their presence
#: means srun started this process. salloc's shell and a batch script have none.
SLURM_STEP_VARIABLES: tuple[str, ...] = ("SLURM_STEP_ID", "SLURM_STEPID")

#: What a generic launcher exports to each process it starts (torch's env:// names).
EXTERNAL_LAUNCHER_VARIABLES: tuple[str, ...] = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
)
#: Where such a launcher puts the node's rank, in the order they are looked for
#: (torchrun's, the common one, deepspeed's).
EXTERNAL_NODE_RANK_VARIABLES: tuple[str, ...] = ("GROUP_RANK", "NODE_RANK", "CROSS_RANK")


def slurm_step(env: Mapping[str, str]) -> bool:
    """Whether srun started this process (a SLURM job step)."""
    return any(name in env for name in SLURM_STEP_VARIABLES)


def slurm_allocation(env: Mapping[str, str]) -> bool:
    """Whether this process runs inside a SLURM allocation (salloc, sbatch or srun)."""
    return "SLURM_JOB_ID" in env or "SLURM_NTASKS" in env


def _slurm_detect(env: Mapping[str, str]) -> bool:
    return "SLURM_NTASKS" in env and slurm_step(env)


#: What an MPI launcher exports to every rank: world size, global rank, local rank and
#: local size, from Open MPI and from PMI-based MPIs (MPICH, Intel MPI: Hydra exports
#: PMI_* and MPI_LOCAL*), in that order
OPEN_MPI_VARIABLES: tuple[str, str, str, str] = (
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)
PMI_VARIABLES: tuple[str, str, str, str] = (
    "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
)


def _mpi_detect(env: Mapping[str, str]) -> bool:
    for name in (OPEN_MPI_VARIABLES[0], PMI_VARIABLES[0]):
        value = env.get(name, "").strip()
        if value.isascii() and value.isdigit() and int(value) > 1:
            return True
    return False


def external_launcher_detect(env: Mapping[str, str]) -> bool:
    """torch's standard variables, exported by a launcher other than interlock's."""
    return all(name in env for name in EXTERNAL_LAUNCHER_VARIABLES) and (
        RENDEZVOUS_VARIABLE not in env
    )


def _all_of(*names: str) -> Callable[[Mapping[str, str]], bool]:
    def detect(env: Mapping[str, str]) -> bool:
        return all(name in env for name in names)

    return detect


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterRow:
    """A cluster environment: how it is detected and what it says about the job.

    Attributes:
        name: name as it appears in a Plan.
        detect: predicate over the environment, or None when chosen otherwise.
        detect_doc: the detection predicate in words, for the docs.
        external: whether processes are created by the cluster's own launcher.
        variables: every variable it reads (probing keeps only these).
        world_size_vars: variables holding the total process count (first present wins).
        local_size_vars: variables holding the processes per node.
        nodes_vars: variables holding the number of nodes.
        local_rank_vars: variables holding this process's rank on its node.
        one_process_per_node: the cluster always starts one process per node.
        description: one line for the docs.
        factory: ``"package.module:Class"`` of its ClusterEnvironment class.
    """

    name: str
    detect: Callable[[Mapping[str, str]], bool] | None
    detect_doc: str
    external: bool
    variables: tuple[str, ...] = ()
    world_size_vars: tuple[str, ...] = ()
    local_size_vars: tuple[str, ...] = ()
    nodes_vars: tuple[str, ...] = ()
    local_rank_vars: tuple[str, ...] = ()
    one_process_per_node: bool = False
    description: str
    factory: str

    def __post_init__(self) -> None:
        _freeze(self, sets=(), tuples=("variables", "world_size_vars", "local_size_vars",
                                       "nodes_vars", "local_rank_vars"))


#: In detection order: the first row whose predicate holds is the environment.
#: ``xla`` and ``local`` are not detected from variables (see the cluster stage).
CLUSTERS: tuple[ClusterRow, ...] = (
    ClusterRow(
        name="torchelastic", detect=_all_of("TORCHELASTIC_RUN_ID"),
        factory="interlock.strategies.environments.torchelastic:TorchElasticEnvironment",
        detect_doc="TORCHELASTIC_RUN_ID is set", external=True,
        variables=(
            "TORCHELASTIC_RUN_ID", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
            "RANK", "LOCAL_RANK", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        ),
        world_size_vars=("WORLD_SIZE",), local_size_vars=("LOCAL_WORLD_SIZE",),
        nodes_vars=("GROUP_WORLD_SIZE",), local_rank_vars=("LOCAL_RANK",),
        description="torchrun / TorchElastic",
    ),
    ClusterRow(
        name="slurm", detect=_slurm_detect,
        factory="interlock.strategies.environments.slurm:SLURMEnvironment",
        detect_doc="SLURM_NTASKS is set and srun started the process (SLURM_STEP_ID or "
        "SLURM_STEPID is set)",
        external=True,
        variables=(
            "SLURM_NTASKS", "SLURM_JOB_NAME", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES",
            "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID",
            "SLURM_NODELIST", *SLURM_STEP_VARIABLES, "SLURM_STEP_NUM_TASKS",
            "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_NODES",
        ),
        # the step's own counts first: srun may run fewer tasks than the allocation has
        world_size_vars=("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
        local_size_vars=("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"),
        nodes_vars=("SLURM_STEP_NUM_NODES", "SLURM_NNODES"),
        local_rank_vars=("SLURM_LOCALID",),
        description="SLURM job step started with srun",
    ),
    ClusterRow(
        name="kubeflow",
        factory="interlock.strategies.environments.kubeflow:KubeflowEnvironment",
        detect=_all_of("KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"),
        detect_doc="KUBERNETES_PORT, MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK are set",
        external=True,
        variables=("KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"),
        world_size_vars=("WORLD_SIZE",), one_process_per_node=True,
        description="Kubeflow PyTorchJob (one process per pod)",
    ),
    ClusterRow(
        name="lsf",
        factory="interlock.strategies.environments.lsf:LSFEnvironment",
        detect=_all_of(
            "LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE"
        ),
        detect_doc="LSB_JOBID, LSB_DJOB_RANKFILE, JSM_NAMESPACE_LOCAL_RANK and "
        "JSM_NAMESPACE_SIZE are set",
        external=True,
        variables=(
            "LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK",
            "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK",
        ),
        world_size_vars=("JSM_NAMESPACE_SIZE",), local_rank_vars=("JSM_NAMESPACE_LOCAL_RANK",),
        description="IBM Spectrum LSF job started with jsrun",
    ),
    ClusterRow(
        name="mpi", detect=_mpi_detect,
        factory="interlock.strategies.environments.mpi:MPIEnvironment",
        detect_doc="OMPI_COMM_WORLD_SIZE or PMI_SIZE is greater than 1",
        external=True,
        variables=(*OPEN_MPI_VARIABLES, *PMI_VARIABLES),
        world_size_vars=(OPEN_MPI_VARIABLES[0], PMI_VARIABLES[0]),
        local_size_vars=(OPEN_MPI_VARIABLES[3], PMI_VARIABLES[3]),
        local_rank_vars=(OPEN_MPI_VARIABLES[2], PMI_VARIABLES[2]),
        description="mpirun / mpiexec (Open MPI or a PMI-based MPI); mpi4py not needed",
    ),
    ClusterRow(
        name="external", detect=external_launcher_detect,
        factory="interlock.strategies.environments.external:ExternalLauncherEnvironment",
        detect_doc="RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set and "
        f"{RENDEZVOUS_VARIABLE} is not",
        external=True,
        variables=(
            *EXTERNAL_LAUNCHER_VARIABLES, "LOCAL_WORLD_SIZE", "LOCAL_SIZE",
            *EXTERNAL_NODE_RANK_VARIABLES, "GROUP_WORLD_SIZE", "CROSS_SIZE", RENDEZVOUS_VARIABLE,
        ),
        world_size_vars=("WORLD_SIZE",), local_size_vars=("LOCAL_WORLD_SIZE", "LOCAL_SIZE"),
        nodes_vars=("GROUP_WORLD_SIZE", "CROSS_SIZE"), local_rank_vars=("LOCAL_RANK",),
        description="another launcher exporting torch's standard variables (the deepspeed "
        "command, in-house launchers)",
    ),
    ClusterRow(
        name="xla", detect=None, detect_doc="the accelerator is xla", external=False,
        factory="interlock.strategies.environments.xla:XLAEnvironment",
        description="torch_xla runtime (PJRT) on a TPU host",
    ),
    ClusterRow(
        name="local", detect=None, detect_doc="nothing else matched", external=False,
        factory="interlock.strategies.environments.local:LocalEnvironment",
        description="a plain machine; interlock's launcher creates the processes",
    ),
)

CLUSTER_NAMES: tuple[str, ...] = tuple(row.name for row in CLUSTERS)
CLUSTER_ROWS: Mapping[str, ClusterRow] = MappingProxyType({r.name: r for r in CLUSTERS})

#: SLURM job names that mean an interactive allocation rather than an srun step.
SLURM_INTERACTIVE_JOB_NAMES: tuple[str, ...] = ("bash", "interactive")

#: Every environment variable the engine reads; Machine.probe() keeps only these.
ENVIRONMENT_VARIABLES: tuple[str, ...] = tuple(
    dict.fromkeys((*(name for row in CLUSTERS for name in row.variables), DETECTION_VARIABLE))
)

# --------------------------------------------------------------------------- packages

@dataclass(frozen=True, slots=True, kw_only=True)
class PackageRow:
    """An optional package whose presence changes what the engine may choose.

    Attributes:
        name: the importable module name (what ``Machine.packages`` lists).
        install: how to install it, quoted in missing-package errors.
    """

    name: str
    install: str


PACKAGES: tuple[PackageRow, ...] = (
    PackageRow(name="torch_xla",
               install="pip install 'torch_xla[tpu]' (matching your torch version)"),
    PackageRow(name="deepspeed", install="pip install deepspeed"),
    PackageRow(name="transformer_engine", install="pip install transformer_engine[pytorch]"),
    PackageRow(name="bitsandbytes", install="pip install bitsandbytes"),
)

#: The optional packages the engine knows, in the package table's order.
OPTIONAL_PACKAGES: tuple[str, ...] = tuple(row.name for row in PACKAGES)

#: How to install each optional package, for missing-package errors.
INSTALL_HINTS: Mapping[str, str] = MappingProxyType({row.name: row.install for row in PACKAGES})

#: precision plugin families that belong to a strategy rather than to a precision: a
#: strategy row naming one gets that family's plugin for every precision it supports
STRATEGY_PRECISION_PLUGINS: tuple[str, ...] = ("fsdp", "deepspeed", "xla")

#: why each strategy family with a precision plugin of its own can or cannot take a
#: registered precision (a `PrecisionRow` naming such a strategy): None where the
#: family wraps the precision's own plugin (FSDP sets its policy around it)
REGISTERED_PRECISION_REFUSALS: Mapping[str, str | None] = MappingProxyType({
    "fsdp": None,
    "deepspeed": "DeepSpeed's engine casts, scales and steps by its own config, so no "
    "precision plugin takes part in its optimizer step",
    "xla": "the XLA plugin sets torch_xla's dtypes itself",
})

# --------------------------------------------------------------------------- strategy names


@dataclass(frozen=True, slots=True, kw_only=True)
class WithdrawnName:
    """A strategy name other tools accept that interlock refuses on purpose."""

    name: str
    replacement: str
    reason: str


WITHDRAWN_STRATEGIES: tuple[WithdrawnName, ...] = (
    WithdrawnName(
        name="dp", replacement="ddp",
        reason="DataParallel runs one process with a thread per GPU and PyTorch "
        "recommends DistributedDataParallel instead",
    ),
    WithdrawnName(
        name="ddp2", replacement="ddp",
        reason="ddp2 was removed upstream; ddp covers its use",
    ),
    WithdrawnName(
        name="ddp_sharded", replacement="fsdp",
        reason="FairScale's sharded DDP is unmaintained; FSDP2 shards natively",
    ),
    WithdrawnName(
        name="fsdp_native", replacement="fsdp",
        reason="'fsdp' is the native implementation (FSDP2)",
    ),
    WithdrawnName(
        name="horovod", replacement="ddp",
        reason="Horovod is not built in; register it as a third-party strategy",
    ),
)

WITHDRAWN_ROWS: Mapping[str, WithdrawnName] = MappingProxyType(
    {r.name: r for r in WITHDRAWN_STRATEGIES}
)


# --------------------------------------------------------------------------- parallelism

#: older strategy options that set a degree of parallelism, and the dimension each now
#: means (`ModelParallelStrategy(data_parallel_size=..., tensor_parallel_size=...)`);
#: the engine translates them into the ``parallelism=`` flag, with a note
LEGACY_DEGREE_OPTIONS: Mapping[str, str] = MappingProxyType({
    "data_parallel_size": "dp_shard",
    "tensor_parallel_size": "tp",
})

#: the accelerators torch's context parallel runs on, and why the others are refused
CONTEXT_PARALLEL_ACCELERATORS: frozenset[str] = frozenset({"cuda"})
CONTEXT_PARALLEL_REASON = (
    "torch's context parallel (torch.distributed.tensor.experimental.context_parallel) "
    "shards only the CUDA attention kernels (flash, memory-efficient, cuDNN); on the CPU "
    "scaled dot-product attention runs aten._scaled_dot_product_flash_attention_for_cpu, "
    "which has no sharding strategy (torch 2.13: causal attention fails in forward, any "
    "attention in backward)"
)

#: the precisions a pipeline schedule (torch.distributed.pipelining) trains in, and why
#: the others are refused
PIPELINE_PRECISIONS: frozenset[str] = frozenset({"32-true", "bf16-true", "bf16-mixed",
                                                 "16-true"})
PIPELINE_PRECISION_REASON = (
    "the pipeline schedule runs backward itself and the loss exists only on the last "
    "stage, so a gradient scaler (16-mixed) scales nothing on the other stages, and an "
    "overflow found on one stage does not skip the step on the others (measured with "
    "torch 2.13: the stages diverge)"
)
