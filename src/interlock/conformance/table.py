"""The table of conformance checks: one row per check, and nothing else lists them.

A row says where its check runs and with which function, what a strategy, precision or
world size must offer for it to apply, and what passing it guarantees. The cases, the
driver (rank checks and launch checks), the pytest items and the table in
``docs/conformance.md`` (``python -m interlock.conformance.docs``) all read these rows.
Check ids are public: test ids, skip and xfail files and reports name them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Literal

from interlock.conformance import checks, launch_checks, memory_checks, mesh_checks, recipes
from interlock.conformance.checks import RankContext
from interlock.conformance.declaration import check_declaration
from interlock.conformance.launch_checks import LaunchContext
from interlock.engine.parallelism import DIM_DOCS, DIMS, FLATTENED
from interlock.engine.registry import current_parts


@dataclass(frozen=True, slots=True, kw_only=True)
class InPytest:
    """Runs in the pytest process, once per (strategy, runner), launching nothing.

    Attributes:
        run: called with the strategy's name and the runner's.
    """

    run: Callable[[str, str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class InRanks:
    """Runs inside every rank of the launch, on the strategy the launch set up.

    Attributes:
        run: called in every rank.
        when: ``"each precision"`` (once per precision, the strategy re-completed for
            each), ``"once"`` (once per launch) or ``"last"`` (once per launch, after
            every other rank check and with no barrier after it: it ends the strategy).
        then_in_driver: the launching process's half of the check, run after the
            launch; what it raises fails the ranks' records of the check.
    """

    run: Callable[[RankContext], None]
    when: Literal["each precision", "once", "last"]
    then_in_driver: Callable[[LaunchContext], None] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InDriver:
    """Runs in the launching process, after the launch that ran the rank checks.

    Attributes:
        run: called once per launch; it may launch the strategy again.
    """

    run: Callable[[LaunchContext], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorldSizes:
    """The world sizes a check runs at.

    Attributes:
        least: the fewest ranks.
        most: the most ranks, or None for no bound.
        why: the skip reason at any other world size.
    """

    least: int = 1
    most: int | None = None
    why: str

    def admit(self, world_size: int) -> bool:
        """Whether the check runs at ``world_size``."""
        return world_size >= self.least and (self.most is None or world_size <= self.most)


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One conformance check.

    Attributes:
        id: stable name, part of every test id and report record.
        runs: where the check runs, and its function.
        capability: what the strategy must declare (``StrategySpec.capabilities``) for
            the check to apply.
        dimension: the dimension of parallelism the strategy must declare
            (``StrategySpec.parallel_dims``) for the check to apply.
        loss_scaler: whether it applies only to precisions with a loss scaler (a rank
            check that runs for each precision).
        world_sizes: the world sizes it runs at, when not every one.
        guarantees: what passing it means (Markdown, one line: docs/conformance.md).
        why: why a strategy must (Markdown, one line: docs/conformance.md).
        own_launch: a launch check that needs nothing of the main launch (only fresh
            strategies it resolves itself): it runs from a second driver, beside the
            main one, with the other checks of its kind.
    """

    id: str
    runs: InPytest | InRanks | InDriver
    capability: str | None = None
    dimension: str | None = None
    loss_scaler: bool = False
    world_sizes: WorldSizes | None = None
    guarantees: str
    why: str
    own_launch: bool = False

    def __post_init__(self) -> None:
        if self.loss_scaler and not self.per_precision:
            raise ValueError(f"check {self.id!r}: only a check that runs for each precision "
                             "can depend on the precision's loss scaler")
        if self.own_launch and not isinstance(self.runs, InDriver):
            raise ValueError(f"check {self.id!r}: only a launch check can run from a "
                             "driver of its own")
        if isinstance(self.runs, InPytest) and (self.capability or self.world_sizes
                                                or self.dimension):
            raise ValueError(f"check {self.id!r}: a check that launches nothing cannot be "
                             "gated by capability or world size")

    @property
    def per_precision(self) -> bool:
        """Whether it runs, and is reported, once per precision."""
        return isinstance(self.runs, InRanks) and self.runs.when == "each precision"


def skip_reason(check: Check, *, capabilities: frozenset[str], precision: str | None,
                world_size: int, parallel_dims: frozenset[str] = frozenset()) -> str | None:
    """Why ``check`` does not apply to a strategy declaring ``capabilities`` and
    ``parallel_dims`` at ``world_size`` (and ``precision``, for a check run once per
    precision), or None when it does. The one place gating is decided, in the ranks and
    in the driver."""
    if check.capability is not None and check.capability not in capabilities:
        return f"the strategy does not declare {check.capability!r}"
    if check.dimension is not None and check.dimension not in parallel_dims:
        return (f"the strategy does not declare the {check.dimension!r} dimension "
                "(StrategySpec.parallel_dims)")
    if (check.loss_scaler and precision is not None
            and not current_parts().precisions[precision].scaler):
        return f"{precision} uses no loss scaler"
    if check.world_sizes is not None and not check.world_sizes.admit(world_size):
        return check.world_sizes.why
    return None


#: at least two ranks: a check about one rank's failure needs another that survives it
TWO_OR_MORE = WorldSizes(least=2, why="needs at least 2 ranks")

#: the mesh checks run once per strategy, from the world size 2 launch (each starts
#: its own 4 ranks)
MESH_RUN = WorldSizes(least=2, most=2, why="runs from the world size 2 launch, starting "
                      f"{mesh_checks.MESH_WORLD_SIZE} ranks of its own")

#: Every check of the suite, in report order (rank checks run in this order too).
CHECKS: tuple[Check, ...] = (
    Check(
        id="declaration", runs=InPytest(run=check_declaration),
        guarantees="the `StrategySpec` is well-formed; the class implements the Strategy "
        "API and its overrides accept the base methods' parameters; the objects a built "
        "strategy returns have the declared types (checked with typeguard); `plan()` "
        "accepts every declared (accelerator, precision) on the runner and refuses "
        "undeclared precisions; the factory takes every key of the spec's `options`. An "
        "entry point that failed to load fails here, under its own name",
        why="a table that lies is worse than none"),
    Check(
        id="lifecycle", runs=InRanks(run=checks.check_lifecycle, when="once"),
        guarantees="ranks 0..W-1 each run exactly once, in distinct processes; only rank "
        "0 is global zero; `world_size`, `local_rank`, `node_rank` agree with the cluster "
        "environment; `root_device` is on the runner's accelerator (and distinct per rank "
        "off the CPU)",
        why="frameworks index data and devices by these"),
    Check(
        id="collectives", runs=InRanks(run=checks.check_collectives, when="once"),
        guarantees="`all_reduce` (sum, mean, max, min) on float, int, scalar and "
        "non-contiguous tensors; `all_gather` in rank order; `broadcast` of tensors and "
        "objects; `barrier`; `reduce_boolean_decision` — all equal a single-process "
        "reference, on the root device, inputs unchanged",
        why="metrics and early stopping are built on them"),
    Check(
        id="training_parity",
        runs=InRanks(run=checks.check_training_parity, when="each precision"),
        guarantees="3 SGD-with-momentum steps (or the spec's `parity_steps`) on each "
        "rank's share of the batches equal as many steps of one plain process on the full "
        "batches (`assert_close`; float32's tolerance for `32-true`, half precision's "
        "otherwise, widened by the spec's `parity_tolerance`)",
        why="the only check that catches \"sums instead of averages\""),
    Check(
        id="accumulation_parity", capability="accumulation",
        runs=InRanks(run=checks.check_accumulation_parity, when="each precision"),
        guarantees="2 steps (or the spec's `parity_steps`) of 2 micro-batches under "
        "`no_backward_sync`, then a synchronised backward, equal the large batches",
        why="gradient accumulation must not change the maths"),
    Check(
        id="precision_dtypes",
        runs=InRanks(run=checks.check_precision_dtypes, when="each precision"),
        guarantees="stored parameters, first-layer activations and gradients have the "
        "precision's dtypes (a strategy declaring `engine_gradients` must instead leave "
        "`.grad` empty); outputs come back in the precision table's output dtype (the "
        "caller's default dtype; float64 for `64-true`)",
        why="mixed precision that silently runs in float32 is a bug, and so is `64-true` "
        "that hands back float32"),
    Check(
        id="scaler_skip", loss_scaler=True,
        runs=InRanks(run=checks.check_scaler_skip, when="each precision"),
        guarantees="an inf loss on the last rank makes *every* rank skip the step and "
        "halve the scale; the next step is taken",
        why="a rank that steps while another skips diverges for ever"),
    Check(
        id="checkpoint_round_trip",
        runs=InRanks(run=checks.check_checkpoint_round_trip, when="each precision"),
        guarantees="save, then load into a freshly completed strategy with a new model and "
        "optimizer, restores parameters, optimizer state, the precision's state (the "
        "scaler) and plain values bit for bit",
        why="resuming must continue, not restart"),
    Check(
        id="init_contexts",
        runs=InRanks(run=checks.check_init_contexts, when="each precision"),
        guarantees="`module_init_context(empty_init=False/True)` then `setup_module`, and "
        "`tensor_init_context`, give the root device (CPU memory for a strategy declaring "
        "`parameter_offload`) and the precision's dtype; under empty init a "
        "non-persistent buffer keeps the value `__init__` computed",
        why="large models are built in place"),
    Check(
        id="launch_arguments",
        runs=InRanks(run=checks.check_launch_arguments, when="once",
                     then_in_driver=launch_checks.check_caller_module),
        guarantees="a module passed to `launch()` as an argument, not built in the ranks, "
        "trains on private parameters in every rank: 3 steps (or the spec's "
        "`parity_steps`) equal one plain process; the caller's module is left out of "
        "shared memory, and unchanged when no rank runs in the calling process (the script "
        "launcher's rank 0 trains the caller's object, as any function call would)",
        why="torch's multiprocessing pickler shares CPU tensors: every rank would step one "
        "set of parameters"),
    Check(
        id="same_start", runs=InRanks(run=checks.check_same_start, when="once"),
        guarantees="ranks that build the model from different seeds hold rank 0's weights "
        "after `setup_module`",
        why="per-rank seeding must not give each rank (or each shard) its own model"),
    Check(
        id="lr_scheduler", runs=InRanks(run=checks.check_lr_scheduler, when="once"),
        guarantees="a scheduler created over an optimizer before "
        "`setup_module_and_optimizers` drives the optimizer the strategy steps",
        why="an optimizer rebuilt behind the user's back leaves the scheduler stepping "
        "nothing"),
    Check(
        id="clipping", capability="clipping",
        runs=InRanks(run=checks.check_clipping, when="each precision"),
        guarantees="with one optimizer per submodule, `clip_gradients_norm` for each "
        "optimizer returns the norm of that optimizer's unscaled gradients only, equal to "
        "one plain process's",
        why="clipping all gradients per optimizer lets still-scaled gradients zero another "
        "layer's update"),
    Check(
        id="recipe_parity",
        runs=InRanks(run=recipes.check_recipe_parity, when="each precision"),
        guarantees="a training loop with every feature on at once (tied embeddings, "
        "LayerNorm, a buffer; AdamW with weight decay under a warm-up schedule; 2 "
        "micro-batches under `no_backward_sync` and active clipping where declared; a "
        f"shuffled `setup_dataloader` over {recipes.SAMPLES} samples, "
        f"{recipes.EPOCHS} epochs) equals the same loop in one plain process on the "
        "batches the ranks read, parameters and clipping norms; every epoch reads every "
        "sample, in a new order",
        why="features right alone are wrong together: clipping that sees one shard, "
        "accumulation divided twice, tied weights that come apart"),
    Check(
        id="memory",
        runs=InRanks(run=memory_checks.check_memory, when="each precision"),
        guarantees="after one AdamW step on an MLP of about 16,000 parameters, the largest "
        "rank's parameter, gradient and optimizer-state storages (local shards, padding "
        "included; parameters and optimizer state alone for a strategy declaring "
        f"`engine_gradients`) are within {memory_checks.TOLERANCE:.0%} of its plan's "
        "`memory.model_state_bytes` (`plan(model=model_shape(net), optimizer='adamw')`), "
        "and what the strategy allocates itself where it can be seen (DDP's gradient "
        "buckets, the parameters FSDP gathers) is within the plan's `buffer_bytes`",
        why="a plan that says a model fits must be right about what each rank holds: a "
        "strategy that keeps full state where its row says it shards runs out of memory "
        "only at scale"),
    Check(
        id="interrupted_save",
        runs=InRanks(run=checks.check_interrupted_save, when="once"),
        world_sizes=WorldSizes(least=1, most=1, why="runs at world size 1, where a failing "
                               "save cannot strand ranks waiting in its barrier"),
        guarantees="a save that fails midway leaves the previous checkpoint loadable and "
        "unchanged",
        why="a crash while saving must not cost the last good state"),
    Check(
        id="data_loading", runs=InRanks(run=checks.check_data_loading, when="once"),
        guarantees="`setup_dataloader` shares a dataset out over the data-parallel ranks: "
        "for training every rank gets the same number of batches (equal to `len()`) and "
        "together they cover the dataset; with `evaluation=True` each sample is seen "
        "exactly once; ranks of one replica get the same batches; batches arrive on the "
        "root device",
        why="uneven or overlapping shards bias the gradient and double-count metrics"),
    Check(
        id="rank_zero_print", runs=InRanks(run=checks.check_rank_zero_print, when="once"),
        guarantees="`strategy.print` writes on global rank 0 only",
        why="logs written W times hide the one that matters"),
    Check(
        id="load_refusal", runs=InRanks(run=checks.check_load_refusal, when="once"),
        guarantees="`load_checkpoint` asked for an entry the checkpoint lacks raises "
        "before restoring anything: parameters, optimizer state and plain values are left "
        "as they were",
        why="a half-restored state trains on silently"),
    Check(
        id="teardown", runs=InRanks(run=checks.check_teardown, when="last"),
        guarantees="`teardown()` releases the process group `setup_environment` created "
        "and is safe to call twice (the launcher then calls it once more)",
        why="frameworks call teardown from several places (errors, callbacks, exit)"),
    Check(
        id="launch_result", runs=InDriver(run=launch_checks.check_launch_result),
        guarantees="`launch` returns rank 0's result (every rank returns a different "
        "value)",
        why="the result is how a notebook gets its trained model back"),
    Check(
        id="relaunch", runs=InDriver(run=launch_checks.check_relaunch),
        guarantees="after `launch` returns, the launching process has no process group, "
        "no changed environment variable, no surviving worker; a second `launch` works",
        why="notebooks and sweeps launch many times"),
    Check(
        id="failure_propagation", world_sizes=TWO_OR_MORE,
        runs=InDriver(run=launch_checks.check_failure_propagation),
        guarantees="a rank that raises makes `launch` raise within "
        f"{launch_checks.FAILURE_BOUND_S:.0f} s, naming that rank and its exception, with "
        "no worker left alive",
        why="a dead rank must not leave the others hanging"),
    Check(
        id="collective_timeout", capability="timeout", world_sizes=TWO_OR_MORE,
        runs=InDriver(run=launch_checks.check_collective_timeout),
        guarantees="with the strategy's `timeout` set short "
        f"({launch_checks.SETUP_MARGIN:.0f}x the main launch's slowest rank setup, "
        f"{launch_checks.MIN_TIMEOUT_S:.0f} to {launch_checks.TIMEOUT_S:.0f} s), a rank "
        "that never reaches a barrier turns into an error within that timeout plus "
        f"{launch_checks.FAILURE_BOUND_S:.0f} s (all ranks got past setup first)",
        why="a hang is the worst failure mode"),
    Check(
        id="resharding", capability="resharding",
        world_sizes=WorldSizes(least=2, most=2,
                               why="runs with world size 2 (saves at 2, loads at 1)"),
        runs=InDriver(run=launch_checks.check_resharding),
        guarantees="a checkpoint saved at world size 2 loads at world size 1 with the same "
        "parameters and optimizer state; nothing brought back by `launch` is a failure",
        why="jobs are resumed on other allocations"),
    *(
        Check(
            id=f"survives_{kind}", capability="elastic", world_sizes=TWO_OR_MORE,
            runs=InDriver(run=partial(launch_checks.check_survives, kind)), own_launch=True,
            guarantees=f"{what}; with `launch(max_restarts=1)` the job restarts exactly "
            "once, resumes from its last complete checkpoint, and ends with parameters and "
            "AdamW state equal bit for bit to an uninterrupted run (8 steps, `32-true`, a "
            "checkpoint every 2), no worker left alive",
            why=why)
        for kind, what, why in (
            ("kill",
             "the last rank is killed by SIGKILL at step 5",
             "nodes and processes die (OOM killer, preemption, hardware)"),
            ("raise_in_backward",
             "the last rank raises inside `backward` at step 5, while the others "
             "wait in the gradient's collective",
             "a restart must not keep a half-synchronised step"),
            ("hang",
             "the last rank never reaches step 5's collectives; the others' "
             "process-group timeout (needs `timeout` too; "
             f"{launch_checks.SETUP_MARGIN:.0f}x the main launch's slowest rank setup, "
             f"{launch_checks.MIN_TIMEOUT_S:.0f} to {launch_checks.TIMEOUT_S:.0f} s) "
             "ends the attempt",
             "a hang costs the whole allocation until someone notices"),
            ("kill_during_save",
             "a rank is killed by SIGKILL inside the save of step 4, after writing and "
             "before renaming (rank 0, the writer of a full checkpoint, where the "
             "launching process only watches; the last rank under the script "
             "launcher), so the run resumes from step 2's checkpoint",
             "a crash while saving must not cost the last good checkpoint"),
        )
    ),
    Check(
        id="recipe_resume", capability="elastic", world_sizes=TWO_OR_MORE,
        runs=InDriver(run=recipes.check_recipe_resume), own_launch=True,
        guarantees="the recipe loop with dropout, checkpointed by a `CheckpointManager` "
        f"every {recipes.SAVE_EVERY} steps (the first mid-epoch), with the last rank "
        f"raising inside `backward` at step {recipes.FAULT_STEP} and "
        "`launch(max_restarts=1)`: the restarted attempt resumes mid-epoch and ends with "
        "parameters, AdamW state, the schedule and the batches read equal bit for bit to "
        "an undisturbed run (`32-true`)",
        why="a restart that changes the data order or the dropout masks trains another "
        "model, silently"),
    *(
        Check(
            id=f"mesh_{dim}", dimension=dim, world_sizes=MESH_RUN,
            runs=InDriver(run=mesh_checks.MESH_CHECKS[dim]),
            guarantees=f"with `parallelism=` {dim} 2 x dp_shard 2 (x dp_replicate 2 "
            f"without dp_shard; {dim} 4 alone) on {mesh_checks.MESH_WORLD_SIZE} ranks "
            f"({DIM_DOCS[dim]}): every rank's mesh coordinates, flattened groups "
            f"({', '.join(f'`{group}`' for group in FLATTENED)}) and data shard follow the "
            "layout; "
            f"{mesh_checks.MESH_STEPS} steps through `forward_backward` equal one plain "
            "process, and so does the recipe (AdamW, warm-up, accumulation, active "
            "clipping, a shuffled loader; untied under pp); the checkpoint saved under the "
            "layout loads at world size 1 unchanged; what each rank holds after an AdamW "
            "step is the layout's plan's, as the `memory` check says (not under cp, whose "
            "sharding group is the `parallelize_fn`'s choice). A layout `plan()` refuses "
            "on the runner is skipped with its reason",
            why="a layout that trains on the wrong ranks or shards looks fine until the "
            "loss curve does not")
        for dim in DIMS
    ),
)

CHECK_IDS: tuple[str, ...] = tuple(c.id for c in CHECKS)
CHECKS_BY_ID: Mapping[str, Check] = MappingProxyType({c.id: c for c in CHECKS})
