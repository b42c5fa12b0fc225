"""`Strategy` and `ParallelStrategy`: the API a framework drives.

A strategy owns its accelerator, precision, checkpoint IO, cluster environment,
launcher and collective, and calls them directly. The hierarchy is flat: concrete
strategies derive from one of these two classes and from nothing concrete.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer

from interlock.engine.registry import registered
from interlock.engine.tables import LauncherRow
from interlock.strategies import checkpointing
from interlock.strategies.accelerators import Accelerator
from interlock.strategies.collectives import Collective, ReduceOp
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.init_context import empty_init_context, parameters_on_meta
from interlock.strategies.io import CheckpointIO
from interlock.strategies.launchers import Launcher, launcher_for
from interlock.strategies.launchers import history as launch_history
from interlock.strategies.launchers.base import report_failure
from interlock.strategies.module_wrapper import (
    StrategyModule,
    keeping_ties,
    move_to_device,
    unwrap,
)
from interlock.strategies.parts import PART_OBJECTS, Parts
from interlock.strategies.precision import Precision
from interlock.strategies.restarts import (
    ATTEMPT_ENV,
    RestartPolicy,
    restart_attempt,
    run_with_restarts,
)
from interlock.strategies.sharding import clip_grad_norm, has_meta_tensors, make_storage_private

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.utils.data import DataLoader

    from interlock.engine.planner import Plan
    from interlock.strategies.dataloading import StrategyDataLoader

T = TypeVar("T")
S = TypeVar("S", bound="Strategy")

class Strategy(ABC):
    """Where and how a model trains: one device, or many processes.

    Every part is optional at construction: what is not given is filled in from the
    Plan when the strategy is resolved (``interlock.resolve(strategy=instance, ...)``),
    and a part given here and through a flag too is refused as conflicting. A strategy
    built by hand and never resolved completes itself the same way, with no flags, on
    the first use of a part it was not given (:meth:`complete_by_hand`).

    Attributes:
        plan: the Plan this strategy was completed from (None until it is).
    """

    #: Internal, not for users: the engine (:func:`interlock.plan`) reads it to recognise
    #: a strategy instance passed as ``strategy=`` without importing the runtime.
    interlock_part_kind: ClassVar[str] = "strategy"
    #: the registry name this class serves by default
    registry_name: ClassVar[str]
    #: Internal, not for users: whether ``empty_init=True`` builds on the meta device,
    #: the strategy allocating only each rank's shards when it wraps the module. Read by
    #: :meth:`module_init_context` and :meth:`module_to_device`; sharded strategies
    #: (FSDP, model parallel) set it to True.
    materializes_meta: ClassVar[bool] = False

    def __init__(
        self,
        *,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        cluster_environment: ClusterEnvironment | None = None,
    ) -> None:
        # parts not given come from the plan in complete(), or are made on first use
        self._accelerator = accelerator
        self._precision = precision
        self._checkpoint_io = checkpoint_io
        self._cluster_environment = cluster_environment
        # what the user passed; the engine refuses a flag that sets the same part
        self._given: dict[str, object] = {
            name: part for name in PART_OBJECTS
            if (part := getattr(self, f"_{name}")) is not None
        }
        self._parts: Parts | None = None
        self._launcher: Launcher | None = None
        self.plan: Plan | None = None
        # loaders set up in this attempt (each shuffles apart from the ones before)
        self._loader_setups = 0

    @classmethod
    def from_plan(cls: type[S], plan: Plan) -> S:
        """A new strategy of this class, as ``plan`` describes it: the constructor gets
        the registry row's ``options`` as keyword arguments, then every part it was not
        given comes from the plan (:meth:`complete`).

        This is how the builder makes a strategy whose row names this class as its
        factory; subclasses inherit it and rarely need more.

        Raises:
            ResolutionError: ``unknown-option`` for an option key the class refuses
                (see :meth:`_check_options`).
        """
        options: dict[str, Any] = dict(plan.spec.options)
        cls._check_options(options, plan.strategy)
        strategy = cls(**options)
        strategy.complete(plan)
        return strategy

    @classmethod  # noqa: B027 - optional hook
    def _check_options(cls, options: Mapping[str, object], strategy: str) -> None:
        """Refuse option keys the constructor would not take, naming ``strategy``.

        The builder has already checked the keys against the constructor's keyword
        parameters; a constructor taking ``**kwargs`` checks its extras here (DDP
        against DistributedDataParallel's parameters).
        """

    @property
    def name(self) -> str:
        """The registry name this instance stands for (its plan's, once it has one)."""
        return self.plan.strategy if self.plan is not None else self.registry_name

    def given_parts(self) -> dict[str, object]:
        """The parts passed to the constructor, by flag name.

        Internal, not for users: the engine (:func:`interlock.plan`) calls it on a
        strategy instance passed as ``strategy=``, to refuse a flag that sets one of
        these parts again.
        """
        return dict(self._given)

    def complete(self, plan: Plan) -> None:
        """Take every part not given at construction from ``plan``, and keep the plan.

        Called again with another plan, it replaces what the previous plan filled in
        and keeps what the constructor was given.

        Internal, not for users: the builder (:func:`interlock.resolve`,
        :meth:`interlock.Plan.build`) calls it on a strategy instance given to the plan,
        and :meth:`from_plan` on the instance it creates. Complete an instance with
        ``interlock.resolve(strategy=instance, ...)``.
        """
        parts = Parts.from_plan(plan)
        for name in PART_OBJECTS:
            if name not in self._given:
                setattr(self, f"_{name}", getattr(parts, name))
        self._parts = parts
        self.plan = plan
        self._place(parts)
        self._launcher = None  # made again, for the new plan, on first use

    def complete_by_hand(self) -> None:
        """Complete a strategy built by hand that no plan completed yet, as
        ``interlock.resolve(strategy=self)`` would: through ``interlock.plan(strategy=self)``
        on this machine, which takes the parts, devices and nodes it was given and
        chooses the rest. The properties of the parts call it on first use, so a strategy
        built by hand has no defaults of its own. Does nothing once it has a plan.

        Raises:
            ResolutionError: the engine refuses the strategy as given on this machine (its
                devices are not here, a package it needs is missing, it is not
                registered), with the reason and what would work.
            RuntimeError: the class asked for a part while the engine was planning it
                (its ``name`` or ``given_parts`` read a part the plan is to give).
        """
        if self.plan is not None:
            return
        if getattr(self, "_planning", False):
            raise RuntimeError(
                f"{type(self).__name__} asked for one of its parts while the engine was "
                "planning it: `name` and `given_parts()` are read to make the plan, so they "
                "must not read the accelerator, precision, checkpoint IO, cluster "
                "environment, launcher or layout the plan is to give")
        from interlock.engine.planner import plan

        self._planning = True
        try:
            planned = plan(strategy=self)
        finally:
            self._planning = False
        self.complete(planned)

    def _place(self, parts: Parts) -> None:  # noqa: B027 - optional hook
        """Take devices and nodes from ``parts`` where the constructor did not give them."""

    def _launcher_name(self) -> str | None:
        """The launcher table's name for how this strategy's processes are created: its
        plan's (a strategy built by hand is completed first)."""
        if self._parts is None:
            self.complete_by_hand()
        assert self._parts is not None
        return self._parts.launcher

    def _launcher_row(self) -> str | LauncherRow | None:
        """What :meth:`_make_launcher` makes: the plan's launcher row
        (`interlock.Plan.rows`), or its name where the registry no longer has it."""
        name = self._launcher_name()
        if self.plan is not None and name is not None and name == self.plan.launcher:
            found: LauncherRow | None = self.plan.rows.get("launchers")
            return found if found is not None else name
        return name

    def _make_launcher(self) -> Launcher | None:
        """The launcher :meth:`_launcher_name` names, for this strategy's one process
        (:class:`~interlock.strategies.parallel.ParallelStrategy` gives its own count)."""
        row = self._launcher_row()
        if row is None:
            return None
        return launcher_for(row, num_processes=1, num_nodes=1,
                            cluster=self.cluster_environment,
                            device_type=self.root_device.type)

    def _explain_failure(self, exc: BaseException) -> BaseException | None:
        """A clearer error for ``exc`` raised in a rank, when the strategy knows its
        cause (a peer that already returned); None keeps ``exc``."""
        return None

    def _announce_failure(self, exc: BaseException) -> int | None:
        """Called in a rank whose launched function raised ``exc`` (before teardown):
        tell the peers, and return the peer whose exit this rank should wait for
        before its own, when a peer failed first and this rank's launcher names
        whichever process exits first; None exits at once."""
        return None

    def _announce_return(self) -> None:  # noqa: B027 - optional hook
        """Called in each rank when the launched function returned (before teardown):
        multi-process strategies tell their peers, which are then not left waiting
        in a collective this rank will never join (see ``strategies/uneven.py``)."""

    # ----------------------------------------------------------------- parts

    @property
    def accelerator(self) -> Accelerator:
        """The accelerator that sets up and tears down this process's device: as given,
        else as planned."""
        if self._accelerator is None:
            self.complete_by_hand()
        assert self._accelerator is not None
        return self._accelerator

    @property
    def precision(self) -> Precision:
        """The precision plugin: module and data conversion, autocast, backward and the
        optimizer step: as given, else as planned."""
        if self._precision is None:
            self.complete_by_hand()
        assert self._precision is not None
        return self._precision

    @property
    def checkpoint_io(self) -> CheckpointIO:
        """How checkpoint files are written and read: as given, else as planned (the
        accelerator row's checkpoint IO)."""
        if self._checkpoint_io is None:
            self.complete_by_hand()
        assert self._checkpoint_io is not None
        return self._checkpoint_io

    @property
    def launcher(self) -> Launcher | None:
        """How processes are created; None when the strategy runs in the caller."""
        if self._launcher is None:
            self._launcher = self._make_launcher()
        return self._launcher

    @property
    def cluster_environment(self) -> ClusterEnvironment:
        """Where ranks and the rendezvous address come from: as given, else as planned
        (detected from this process's environment)."""
        if self._cluster_environment is None:
            self.complete_by_hand()
        assert self._cluster_environment is not None
        return self._cluster_environment

    @property
    @abstractmethod
    def collective(self) -> Collective:
        """The cross-process operations, called directly by the strategy."""

    # ----------------------------------------------------------------- where am I

    @property
    @abstractmethod
    def root_device(self) -> torch.device:
        """This process's device."""

    @property
    def global_rank(self) -> int:
        """This process's rank among all the job's processes (0 for a single process)."""
        return 0

    @property
    def local_rank(self) -> int:
        """This process's rank among the processes on its node."""
        return 0

    @property
    def node_rank(self) -> int:
        """The index of the node this process runs on."""
        return 0

    @property
    def world_size(self) -> int:
        """How many processes the job has, over all nodes."""
        return 1

    @property
    def is_global_zero(self) -> bool:
        """Whether this process is global rank 0 (the one that writes checkpoints)."""
        return self.global_rank == 0

    @property
    def data_parallel_size(self) -> int:
        """How many different batches one step sees (ranks that share a batch, as
        tensor-parallel ranks do, count once): what a distributed sampler's
        ``num_replicas`` should be."""
        return self.world_size

    @property
    def data_parallel_rank(self) -> int:
        """Which of the :attr:`data_parallel_size` batches this rank takes."""
        return self.global_rank

    # ----------------------------------------------------------------- lifecycle

    def launch(self, fn: Callable[..., T], *args: Any, max_restarts: int = 0,
               restart_policy: RestartPolicy | None = None, **kwargs: Any) -> T:
        """Start the processes, set each up, run ``fn(strategy, *args, **kwargs)`` in
        every one, tear each down, and return rank 0's result.

        Args:
            max_restarts: when a rank fails, stop every rank and start them all again,
                up to this many times (``fn`` runs again from the top in every rank, so
                a function that resumes from its last checkpoint continues where it
                stopped); see :mod:`interlock.strategies.restarts` for what is
                restarted and what is not. 0, the default, raises at the first failure.
            restart_policy: the budget and the back-off between restarts, instead of
                ``max_restarts`` (waits of 1 s, doubling, at most 60 s by default).

        Raises:
            RankFailedError: a rank failed and no restart was asked for.
            RestartsExhaustedError: every attempt failed; it lists each one's cause.
        """
        if restart_policy is None:
            restart_policy = RestartPolicy(max_restarts=max_restarts)
        elif max_restarts:
            raise ValueError("give max_restarts or restart_policy, not both")
        elif not isinstance(restart_policy, RestartPolicy):
            raise TypeError(f"restart_policy must be a RestartPolicy, got "
                            f"{type(restart_policy).__name__}")
        index = launch_history.begin()
        if launch_history.is_script_child() and index < launch_history.target():
            # a rank re-run by the script launcher for a later launch: this one was
            # rank 0's earlier launch, served by its own processes; replay its outcome
            replayed: T = launch_history.replay(index)
            return replayed
        try:
            result = self._launch_with_restarts(fn, args, kwargs, restart_policy)
        except BaseException as exc:
            launch_history.finish(index, ("raised", exc))
            raise
        launch_history.finish(index, ("returned", result))
        return result

    def _launch_with_restarts(self, fn: Callable[..., T], args: tuple[Any, ...],
                              kwargs: dict[str, Any], policy: RestartPolicy) -> T:
        launcher = self.launcher
        if launch_history.is_script_child():
            # a rank the script launcher started: rank 0 runs the attempts and starts
            # this process again for each; it runs the one it was started for
            if launcher is None:
                return _run_attempt(restart_attempt(), self, fn, args, kwargs)
            child: T = launcher.launch(_run_attempt, restart_attempt(), self, fn, args,
                                       kwargs)
            return child
        if launcher is None:
            return run_with_restarts(
                lambda attempt: _run_attempt(attempt, self, fn, args, kwargs),
                policy, in_process=True)
        row = registered(LauncherRow).get(launcher.name)
        if not (row is not None and row.restarts):
            if policy.max_restarts:
                warnings.warn(
                    f"launch(max_restarts={policy.max_restarts}) cannot restart ranks "
                    f"through the {launcher.name!r} launcher: "
                    f"{row.on_failure if row is not None else 'not a registered launcher'}",
                    RuntimeWarning, stacklevel=3)
            # one run, and no attempt number of ours: under torchrun its own count
            # (TORCHELASTIC_RESTART_COUNT) is what restart_attempt() must read
            once: T = launcher.launch(_run_worker, self, fn, args, kwargs)
            return once
        def attempt_once(attempt: int) -> T:
            result: T = launcher.launch(_run_attempt, attempt, self, fn, args, kwargs)
            return result

        return run_with_restarts(attempt_once, policy, in_process=False)

    @abstractmethod
    def setup_environment(self) -> None:
        """Bind the device and create the process group (in the current process)."""

    def teardown(self) -> None:
        """Release everything `setup_environment` created; safe to call twice."""
        if self._precision is not None:
            self._precision.teardown()
        if self._accelerator is not None:
            self._accelerator.teardown()
        if self._checkpoint_io is not None:
            self._checkpoint_io.teardown()

    # ----------------------------------------------------------------- modules

    def setup_module(self, module: nn.Module) -> StrategyModule:
        """Move, convert and (for parallel strategies) wrap ``module``.

        The result's forward runs under the precision's forward context with input
        and output conversion; its state dict is the original module's.
        """
        check_module("setup_module", module)
        module = keeping_ties(
            module, lambda m: self.module_to_device(self.precision.convert_module(m)))
        if self.world_size > 1:
            make_storage_private(module)
        return StrategyModule(self.wrap_module(module), module, self.precision)

    def wrap_module(self, module: nn.Module) -> nn.Module:
        """Extension point: wrap ``module`` for this strategy; returns it unchanged here.

        Override it to put the module in a parallel wrapper. :meth:`setup_module` calls
        it in every rank after :meth:`setup_environment`, with the module already
        converted to the precision and on the root device (or on the meta device, for
        a strategy with ``materializes_meta``), and runs forward through what it
        returns. The original module's state-dict keys must still describe the
        parameters after wrapping; checkpoints are taken from the original module.
        """
        return module

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Prepare an optimizer created over the set-up module's parameters."""
        if not _is_optimizer(optimizer):
            raise TypeError("setup_optimizer() prepares a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        return optimizer

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: Sequence[Optimizer]
    ) -> tuple[StrategyModule, list[Optimizer]]:
        """Set up a module and the optimizers over its (set-up) parameters together.

        Strategies that must see both at once (DeepSpeed builds one engine from them)
        override this; elsewhere it is :meth:`setup_module` then :meth:`setup_optimizer`.
        Sharding replaces a module's parameters with new (sharded) ones: an optimizer
        created over the old ones, and not stepped yet, is re-pointed at the new ones
        in place (its parameter groups are updated), so the object the caller holds,
        and any learning-rate scheduler created over it, keep working.

        Raises:
            ValueError: for an optimizer that already has state and whose parameters
                the setup replaced (create it after :meth:`setup_module` instead).
        """
        check_module("setup_module_and_optimizers", module)
        check_optimizers("setup_module_and_optimizers", optimizers)
        names = {id(p): n for n, p in unwrap(module).named_parameters()}
        wrapped = self.setup_module(module)
        current = self._parameters_by_name(wrapped)
        partial = not self.holds_every_parameter
        return wrapped, [self.setup_optimizer(_rebind(o, names, current, partial))
                         for o in optimizers]

    def _parameters_by_name(self, module: StrategyModule) -> dict[str, nn.Parameter]:
        """The parameters of a set-up module, keyed by the name each had in the module
        given to :meth:`setup_module`."""
        return dict(unwrap(module).named_parameters())

    @property
    def holds_every_parameter(self) -> bool:
        """Whether the module this rank sets up keeps every parameter of the one given
        (sharded or not); False where a rank holds only part of the model's layers (a
        pipeline stage), whose optimizer then steps only those."""
        return True

    def module_to_device(self, module: nn.Module) -> nn.Module:
        """Move ``module`` to the root device (:meth:`setup_module` does this); a module
        on the meta device stays there when the strategy allocates its shards itself
        (:attr:`materializes_meta`)."""
        if self.materializes_meta and has_meta_tensors(module):
            return module  # its shards are allocated when it is wrapped
        return keeping_ties(module, lambda m: m.to(self.root_device))

    def batch_to_device(self, batch: Any) -> Any:
        """``batch`` with every tensor (nested in lists, tuples, dicts) on the root device."""
        return move_to_device(batch, self.root_device)

    @contextlib.contextmanager
    def tensor_init_context(self) -> Iterator[None]:
        """New tensors are created on the root device, in the precision's dtype."""
        with self.root_device, self.precision.tensor_init_context():
            yield

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """Build a module on the root device in the precision's dtype.

        With ``empty_init=True`` the parameters are not initialised (load them from a
        checkpoint), and sharded strategies (:attr:`materializes_meta`) put them on
        the meta device: no memory until :meth:`setup_module` allocates each rank's
        shards and runs every submodule's ``reset_parameters()``. Buffers are always
        built for real, with the values the module's ``__init__`` gives them, because
        buffers registered with ``persistent=False`` are not in a checkpoint.
        """
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.root_device)
            stack.enter_context(self.precision.module_init_context())
            if empty_init and self.materializes_meta:
                stack.enter_context(parameters_on_meta())
            elif empty_init:
                stack.enter_context(empty_init_context())
            yield

    # ----------------------------------------------------------------- steps

    def backward(self, loss: torch.Tensor, module: nn.Module | None = None, *args: Any,
                 **kwargs: Any) -> None:
        """Backpropagate ``loss`` through the precision plugin (scaled first when the
        precision uses a grad scaler, as ``16-mixed`` does).

        Args:
            loss: the tensor to backpropagate, usually a scalar loss.
            module: the set-up module the loss came from. Some strategies and precision
                plugins need it; pass it always and the same loop works with every
                strategy.
            *args: passed on to ``loss.backward``.
            **kwargs: passed on to ``loss.backward``.
        """
        self.precision.backward(loss, module, *args, **kwargs)

    def forward_backward(self, module: nn.Module, inputs: Any, target: Any,
                         loss_fn: Callable[[Any, Any], torch.Tensor]) -> torch.Tensor:
        """One training step's forward and backward: ``loss_fn(module(inputs), target)``
        backpropagated through :meth:`backward`; returns the loss, detached.

        The same call works for every strategy: under pipeline parallel
        (`ModelParallelStrategy` with pp > 1) forward and backward cannot be separated,
        and the pipeline schedule runs both over micro-batches.
        """
        loss = loss_fn(module(inputs), target)
        self.backward(loss, module)
        return loss.detach()

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step ``optimizer`` through the precision plugin; with a grad scaler
        (``16-mixed``) a step whose gradients hold inf or NaN is skipped.

        Args:
            optimizer: an optimizer returned by :meth:`setup_optimizer` (or
                :meth:`setup_module_and_optimizers`).
            **kwargs: passed on to ``optimizer.step``.

        Returns:
            What ``optimizer.step`` returned (None for a skipped step).
        """
        return self.precision.optimizer_step(optimizer, **kwargs)

    def clip_gradients_norm(self, module: nn.Module, optimizer: Optimizer, max_norm: float,
                            norm_type: float = 2.0) -> torch.Tensor:
        """Clip the total norm of the gradients ``optimizer`` steps, over the parameters
        of ``module``; returns the norm before clipping.

        Only that optimizer's parameters are measured and clipped (they are the ones
        unscaled first under ``16-mixed``): with one optimizer per submodule, clip once
        per optimizer, and each clip sees only its own gradients.

        Args:
            module: the set-up module whose parameters the optimizer steps.
            optimizer: the optimizer whose gradients are clipped.
            max_norm: the largest total norm allowed.
            norm_type: the p of the p-norm (``float("inf")`` for the max norm).

        Raises:
            ValueError: for a ``max_norm`` that is not a positive finite number, a
                ``norm_type`` that is not positive, or an optimizer that steps none of
                the module's parameters.
        """
        _check_positive("max_norm", max_norm)
        if not isinstance(norm_type, (int, float)) or isinstance(norm_type, bool) or not (
                norm_type > 0):  # inf is allowed: the max norm
            raise ValueError(f"clip_gradients_norm(norm_type={norm_type!r}): expected a "
                             "positive number, or float('inf') for the max norm")
        params = _owned_parameters(module, optimizer)
        self.precision.unscale_gradients(optimizer)
        # the whole model's norm, over every kind of gradient, shard and stage
        return clip_grad_norm(params, max_norm, norm_type, device=self.root_device,
                              stages=self._pipeline_group())

    def _pipeline_group(self) -> ProcessGroup | None:
        """The group of ranks that hold the model's pipeline stages (each a different
        part of the parameters), over which a gradient norm is combined; None where
        every rank holds every layer."""
        return None

    def clip_gradients_value(self, module: nn.Module, optimizer: Optimizer,
                             clip_value: float) -> None:
        """Clamp each gradient ``optimizer`` steps (over the parameters of ``module``)
        to ``[-clip_value, clip_value]``, unscaled first under ``16-mixed``."""
        _check_positive("clip_value", clip_value)
        params = _owned_parameters(module, optimizer)
        self.precision.unscale_gradients(optimizer)
        torch.nn.utils.clip_grad_value_(params, clip_value)

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Skip gradient synchronisation in backward (gradient accumulation).

        Args:
            module: the set-up module whose backward passes run inside the context.
            enabled: False makes the context do nothing (for the micro-batch that ends
                an accumulation window).
        """
        yield

    # ----------------------------------------------------------------- collectives

    def all_reduce(self, tensor: torch.Tensor, reduce_op: ReduceOp = "mean") -> torch.Tensor:
        """``tensor`` reduced over every rank, on every rank (``tensor`` is not changed).

        Args:
            tensor: this rank's contribution.
            reduce_op: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.
        """
        return self.collective.all_reduce(tensor, reduce_op)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's tensor, shape ``(world_size, *tensor.shape)``."""
        return self.collective.all_gather(tensor)

    def broadcast(self, obj: T, src: int = 0) -> T:
        """Rank ``src``'s picklable object (tensors included) on every rank."""
        if isinstance(obj, torch.Tensor):
            result: Any = self.collective.broadcast(obj, src)
            return result  # type: ignore[no-any-return]
        return self.collective.broadcast_object(obj, src)  # type: ignore[no-any-return]

    def barrier(self) -> None:
        """Wait until every rank has reached this call."""
        self.collective.barrier()

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Combine one boolean per rank: all of them (``all=True``) or any of them."""
        votes = torch.tensor(int(bool(decision)), device=self.root_device)
        total = int(self.collective.all_reduce(votes, "sum").item())
        return total == self.world_size if all else total > 0

    # ----------------------------------------------------------------- data

    def setup_dataloader(self, loader: DataLoader[Any], *, move_to_device: bool = True,
                         evaluation: bool = False) -> StrategyDataLoader:
        """``loader`` for this rank: sharded over the data-parallel ranks, keeping its
        batch size, drop_last, shuffling and workers; each iteration is the next epoch.

        Training gives every rank the same number of batches (the order padded by
        repetition, or its tail dropped with ``drop_last``); ``evaluation=True`` gives
        every sample exactly once, so ranks may differ by a batch (no collectives per
        batch then). A single process keeps the loader as it is. Call it on every rank
        in the same order: the ranks agree on a shuffle seed. Batches go through
        :meth:`batch_to_device` unless ``move_to_device=False``. The rules for custom
        samplers, IterableDatasets and workers: :mod:`interlock.strategies.dataloading`.
        """
        from interlock.strategies.dataloading import setup_dataloader

        return setup_dataloader(self, loader, move_to_device=move_to_device,
                                evaluation=evaluation)

    def setup_dataloaders(self, *loaders: DataLoader[Any], move_to_device: bool = True,
                          evaluation: bool = False) -> tuple[StrategyDataLoader, ...]:
        """:meth:`setup_dataloader` for each of ``loaders``, in order."""
        if not loaders:
            raise ValueError("setup_dataloaders needs at least one DataLoader")
        return tuple(self.setup_dataloader(loader, move_to_device=move_to_device,
                                           evaluation=evaluation) for loader in loaders)

    # ----------------------------------------------------------------- output

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print(*args, **kwargs)`` on global rank 0 only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    # ----------------------------------------------------------------- checkpoints

    def save_checkpoint(self, path: str | Path, state: Mapping[str, Any]) -> None:
        """Save modules, optimizers, the precision's state and plain values (rank 0
        writes one file, atomically; every rank waits for it)."""
        checkpointing.save_unsharded(self, path, state)

    def load_checkpoint(self, path: str | Path, state: dict[str, Any],
                        *, weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
        """Restore modules and optimizers of ``state`` in place, set its plain values,
        and return the checkpoint entries ``state`` did not name.

        ``path`` is a checkpoint file, or a distributed checkpoint directory (as sharded
        strategies write), which is resharded into this strategy's modules.

        The load is all or nothing: a file that does not match the digest written with
        it (unless ``verify=False``), lacks an entry, or does not fit the modules and
        optimizers given (keys, shapes, dtypes) is refused with
        :class:`CheckpointLoadError` before anything changes, and a restore that fails
        half-way is rolled back before the error is raised.
        """
        load = (checkpointing.load_distributed if checkpointing.is_distributed_checkpoint(path)
                else checkpointing.load_unsharded)
        return load(self, path, state, weights_only=weights_only, verify=verify)


def _rebind(optimizer: Optimizer, names: dict[int, str],
            current: dict[str, nn.Parameter], partial: bool = False) -> Optimizer:
    """``optimizer`` itself, its parameter groups pointing at the set-up module's
    parameters (nothing changes when they are the same ones)."""
    groups = optimizer.param_groups
    if all(current.get(names.get(id(p), "")) is p for g in groups for p in g["params"]):
        return optimizer
    if optimizer.state:
        raise ValueError(
            f"{type(optimizer).__name__} already has state for parameters that the strategy "
            "replaced when it set up the module; create the optimizer after setup_module"
        )
    missing = [p for g in groups for p in g["params"]
               if id(p) not in names or not (partial or names[id(p)] in current)]
    if missing:
        raise ValueError(
            f"{type(optimizer).__name__} steps {len(missing)} tensor(s) that are not "
            "parameters of the module being set up"
        )
    # In place, not a new optimizer: schedulers, hooks and the caller's references all
    # hold this object. It has no state yet, so only the groups name the parameters.
    # the lists themselves, not new ones: some optimizers (LBFGS) keep a reference.
    # Where this rank holds part of the layers (``partial``), a parameter the set-up
    # module no longer has lives on other ranks: this rank does not step it.
    for group in groups:
        group["params"][:] = [current[names[id(p)]] for p in group["params"]
                              if names[id(p)] in current]
    return optimizer


def check_module(method: str, module: object) -> None:
    """Refuse what is not a torch module before anything is moved or wrapped."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"{method}() sets up a torch.nn.Module, got {type(module).__name__}")


def check_optimizers(method: str, optimizers: object) -> None:
    """Refuse what is not a list of torch optimizers (one optimizer alone included:
    the call takes a list)."""
    if isinstance(optimizers, Optimizer):
        raise TypeError(f"{method}() takes a list of optimizers: pass [optimizer]")
    if not isinstance(optimizers, (list, tuple)):
        raise TypeError(f"{method}() takes a list of torch.optim.Optimizer, got "
                        f"{type(optimizers).__name__}")
    for place, optimizer in enumerate(optimizers):
        if not _is_optimizer(optimizer):
            raise TypeError(f"{method}(): optimizer {place} is a {type(optimizer).__name__}, "
                            "not a torch.optim.Optimizer")


def _is_optimizer(value: object) -> bool:
    # a torch Optimizer, or one that works like it (param_groups, step)
    return isinstance(value, Optimizer) or (
        hasattr(value, "param_groups") and callable(getattr(value, "step", None)))


def _check_positive(name: str, value: object) -> None:
    """Refuse a clipping bound that is not a positive finite number: a negative one
    would flip the gradients' sign, a NaN would turn them into NaN."""
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name}={value!r}: expected a positive finite number")


def _owned_parameters(module: nn.Module, optimizer: Optimizer) -> list[nn.Parameter]:
    """The parameters of ``module`` that ``optimizer`` steps, in the module's order."""
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"expected the torch.optim.Optimizer whose gradients to clip, got "
                        f"{type(optimizer).__name__}")
    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    params = [p for p in unwrap(module).parameters() if id(p) in owned]
    if not params:
        raise ValueError(
            f"{type(optimizer).__name__} steps none of the parameters of the module given "
            "to clip: pass the set-up module and an optimizer over its parameters (set "
            "them up together with setup_module_and_optimizers)"
        )
    return params


def _run_attempt(attempt: int, strategy: Strategy, fn: Callable[..., T],
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    """:func:`_run_worker` in attempt ``attempt`` of a launch (a worker started by the
    forkserver does not inherit the launching process's environment, so it is set here)."""
    os.environ[ATTEMPT_ENV] = str(attempt)
    return _run_worker(strategy, fn, args, kwargs)


def _run_worker(strategy: Strategy, fn: Callable[..., T], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> T:
    """What every process runs: set up, call the user's function, tear down.

    Rank 0 of the script launcher (and a single process) runs every attempt and every
    launch in the calling process: what the strategy counts per run starts again here,
    so an attempt computes what a fresh process would."""
    strategy._loader_setups = 0
    cause: int | None = None
    try:
        strategy.setup_environment()
        result = fn(strategy, *args, **kwargs)
        strategy._announce_return()
        return result
    except BaseException as exc:
        # Record when and what failed now, before teardown closes connections and makes
        # the peers fail too: the launcher names the earliest failure, and a slow
        # teardown must not keep this record from it.
        explained = strategy._explain_failure(exc)
        report_failure(explained if explained is not None else exc)
        cause = strategy._announce_failure(exc)
        if explained is not None:
            raise explained from exc
        raise
    finally:
        _teardown_fully(strategy)
        if cause is not None:
            _let_the_cause_exit_first(strategy.global_rank, cause)


#: Seconds a rank whose collective broke because a peer failed first waits, under a
#: launcher that names the first process to exit, before it exits too. Such a launcher
#: (mpirun, srun) stops the other processes as soon as the first exits, so the wait
#: ends early in practice; it only has to outlast the failed peer's own teardown.
CAUSE_EXIT_WAIT_S = 5.0


def _let_the_cause_exit_first(rank: int, cause: int) -> None:
    """Wait so that the launcher sees rank ``cause``, which failed first, exit before
    this rank, whose failure followed from it, and names ``cause`` as the failed one."""
    print(f"interlock: rank {rank} failed after rank {cause} did; waiting up to "
          f"{CAUSE_EXIT_WAIT_S:.0f}s for rank {cause} to exit first, so that the launcher "
          "names it", file=sys.stderr, flush=True)
    time.sleep(CAUSE_EXIT_WAIT_S)


def _teardown_fully(strategy: Strategy) -> None:
    """``strategy.teardown()``, finished even when an interrupt cuts it short.

    A launcher interrupts rank 0 from a thread (a ``KeyboardInterrupt``) as soon as
    another rank dies; that interrupt can land while rank 0 is already tearing down
    after the failure. A teardown stopped half-way would leave the process group in
    place, and the restarted attempt would reuse it, talking to the dead rank. So the
    teardown runs again (it is safe to call twice) before the interrupt goes on."""
    try:
        strategy.teardown()
    except KeyboardInterrupt:
        strategy.teardown()
        raise
