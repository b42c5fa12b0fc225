"""`Strategy` and `ParallelStrategy`: the API a framework drives.

A strategy owns its accelerator, precision, checkpoint IO, cluster environment,
launcher and collective, and calls them directly. The hierarchy is flat: concrete
strategies derive from one of these two classes and from nothing concrete.
"""

from __future__ import annotations

import contextlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from torch import nn
from torch.optim import Optimizer

from interlock.strategies import checkpointing
from interlock.strategies.accelerators import Accelerator
from interlock.strategies.collectives import Collective, ReduceOp
from interlock.strategies.environments import ClusterEnvironment, LocalEnvironment
from interlock.strategies.init_context import empty_init_context
from interlock.strategies.io import CheckpointIO, CheckpointLoadError, TorchCheckpointIO
from interlock.strategies.launchers import Launcher
from interlock.strategies.launchers.base import report_failure
from interlock.strategies.module_wrapper import StrategyModule, move_to_device, unwrap
from interlock.strategies.parts import parts_from_plan
from interlock.strategies.precision import Precision
from interlock.strategies.sharding import has_meta_tensors, total_norm

if TYPE_CHECKING:
    from interlock.connector.planner import Plan

T = TypeVar("T")

#: Checkpoint key under which the precision's state (the grad scaler's) travels.
PRECISION_KEY = checkpointing.PRECISION_KEY



class Strategy(ABC):
    """Where and how a model trains: one device, or many processes.

    Every part is optional at construction: what is not given is filled in from the
    Plan when the strategy is resolved (``interlock.resolve(strategy=instance, ...)``),
    and a part given here and through a flag too is refused as conflicting.

    Attributes:
        plan: the Plan this strategy was completed from (None when built by hand).
    """

    #: lets the engine recognise instances without importing the runtime
    interlock_part_kind: ClassVar[str] = "strategy"
    #: the registry name this class serves by default
    registry_name: ClassVar[str]
    #: whether ``empty_init=True`` builds on the meta device, the strategy allocating
    #: only each rank's shards when it wraps the module (sharded strategies)
    materializes_meta: ClassVar[bool] = False

    def __init__(
        self,
        *,
        accelerator: Accelerator | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        cluster_environment: ClusterEnvironment | None = None,
    ) -> None:
        # what the user passed; the engine refuses a flag that sets the same part
        self._given: dict[str, object] = {
            name: part for name, part in (
                ("accelerator", accelerator), ("precision", precision),
                ("checkpoint_io", checkpoint_io), ("cluster_environment", cluster_environment),
            ) if part is not None
        }
        # parts not given are made on first use, or come from the plan in complete()
        self._accelerator = accelerator
        self._precision = precision
        self._checkpoint_io = checkpoint_io
        self._cluster = cluster_environment
        self._launcher: Launcher | None = None
        self.plan: Plan | None = None

    @property
    def name(self) -> str:
        """The registry name this instance stands for (its plan's, once it has one)."""
        return self.plan.strategy if self.plan is not None else self.registry_name

    def given_parts(self) -> dict[str, object]:
        """The parts passed to the constructor (the engine checks them against flags)."""
        return dict(self._given)

    def complete(self, plan: Plan) -> None:
        """Fill in every part not given at construction from ``plan``, and keep it.

        Called again with another plan, it replaces what the previous plan filled in
        and keeps what the constructor was given.
        """
        for name, part in parts_from_plan(plan).items():
            if name not in self._given:
                setattr(self, "_cluster" if name == "cluster_environment" else f"_{name}",
                        part)
        self._place(plan)
        self.plan = plan
        self._launcher = None  # derived again from the new parts on first use

    def _place(self, plan: Plan) -> None:  # noqa: B027 - optional hook
        """Take devices and nodes from ``plan`` where the constructor did not give them."""

    def _make_launcher(self) -> Launcher | None:
        """The launcher for the current parts; None runs in the calling process."""
        return None

    # ----------------------------------------------------------------- parts

    @property
    def accelerator(self) -> Accelerator:
        if self._accelerator is None:
            raise RuntimeError(
                f"{type(self).__name__} has no accelerator yet: pass one, or build it with "
                "interlock.resolve(strategy=<this instance>, ...)"
            )
        return self._accelerator

    @property
    def precision(self) -> Precision:
        if self._precision is None:
            self._precision = Precision()
        return self._precision

    @property
    def checkpoint_io(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io = TorchCheckpointIO()
        return self._checkpoint_io

    @property
    def launcher(self) -> Launcher | None:
        """How processes are created; None when the strategy runs in the caller."""
        if self._launcher is None:
            self._launcher = self._make_launcher()
        return self._launcher

    @property
    def cluster_environment(self) -> ClusterEnvironment:
        """Where ranks and the rendezvous address come from."""
        if self._cluster is None:
            self._cluster = LocalEnvironment()
        return self._cluster

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
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_global_zero(self) -> bool:
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

    def launch(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Start the processes, set each up, run ``fn(strategy, *args, **kwargs)`` in
        every one, tear each down, and return rank 0's result."""
        launcher = self.launcher
        if launcher is None:
            return _run_worker(self, fn, args, kwargs)
        result: T = launcher.launch(_run_worker, self, fn, args, kwargs)
        return result

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
        module = self.module_to_device(self.precision.convert_module(module))
        return StrategyModule(self.wrap_module(module), module, self.precision)

    def wrap_module(self, module: nn.Module) -> nn.Module:
        return module

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Prepare an optimizer created over the set-up module's parameters."""
        return optimizer

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: Sequence[Optimizer]
    ) -> tuple[StrategyModule, list[Optimizer]]:
        """Set up a module and the optimizers over its (set-up) parameters together.

        Strategies that must see both at once (DeepSpeed builds one engine from them)
        override this; elsewhere it is :meth:`setup_module` then :meth:`setup_optimizer`.
        Sharding replaces a module's parameters with new (sharded) ones: an optimizer
        created over the old ones, and not stepped yet, is rebuilt over the new ones
        with the same class, groups and hyperparameters.

        Raises:
            ValueError: for an optimizer that already has state and whose parameters
                the setup replaced (create it after :meth:`setup_module` instead).
        """
        names = {id(p): n for n, p in unwrap(module).named_parameters()}
        wrapped = self.setup_module(module)
        current = dict(unwrap(wrapped).named_parameters())
        return wrapped, [self.setup_optimizer(_rebind(o, names, current)) for o in optimizers]

    def module_to_device(self, module: nn.Module) -> nn.Module:
        if self.materializes_meta and has_meta_tensors(module):
            return module  # its shards are allocated when it is wrapped
        return module.to(self.root_device)

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
        """Build a module on the root device in the precision's dtype; with
        ``empty_init=True`` parameters are left uninitialised (to be loaded), and
        sharded strategies build on the meta device (no memory at all), allocating
        only each rank's shards in :meth:`setup_module`."""
        with contextlib.ExitStack() as stack:
            if empty_init and self.materializes_meta:
                stack.enter_context(torch.device("meta"))
            else:
                stack.enter_context(self.root_device)
            stack.enter_context(self.precision.module_init_context())
            if empty_init and not self.materializes_meta:
                stack.enter_context(empty_init_context())
            yield

    # ----------------------------------------------------------------- steps

    def backward(self, loss: torch.Tensor, module: nn.Module | None = None, *args: Any,
                 **kwargs: Any) -> None:
        self.precision.backward(loss, module, *args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        return self.precision.optimizer_step(optimizer, **kwargs)

    def clip_gradients_norm(self, module: nn.Module, optimizer: Optimizer, max_norm: float,
                            norm_type: float = 2.0) -> torch.Tensor:
        """Clip the gradients' total norm (unscaled first); returns the norm before."""
        self.precision.unscale_gradients(optimizer)
        # over sharded gradients the norm is a DTensor: return it whole
        return total_norm(torch.nn.utils.clip_grad_norm_(unwrap(module).parameters(),
                                                         max_norm, norm_type=norm_type))

    def clip_gradients_value(self, module: nn.Module, optimizer: Optimizer,
                             clip_value: float) -> None:
        self.precision.unscale_gradients(optimizer)
        torch.nn.utils.clip_grad_value_(unwrap(module).parameters(), clip_value)

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Skip gradient synchronisation in backward (gradient accumulation)."""
        yield

    # ----------------------------------------------------------------- collectives

    def all_reduce(self, tensor: torch.Tensor, reduce_op: ReduceOp = "mean") -> torch.Tensor:
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
        self.collective.barrier()

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Combine one boolean per rank: all of them (``all=True``) or any of them."""
        votes = torch.tensor(int(bool(decision)), device=self.root_device)
        total = int(self.collective.all_reduce(votes, "sum").item())
        return total == self.world_size if all else total > 0

    # ----------------------------------------------------------------- checkpoints

    def save_checkpoint(self, path: str | Path, state: Mapping[str, Any]) -> None:
        """Save modules, optimizers, the precision's state and plain values (rank 0
        writes one file, atomically; every rank waits for it)."""
        checkpoint = {name: _state_of(value) for name, value in state.items()}
        precision_state = self.precision.state_dict()
        if precision_state:
            checkpoint[PRECISION_KEY] = precision_state
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(checkpoint, path)
        self.barrier()

    def load_checkpoint(self, path: str | Path, state: dict[str, Any],
                        *, weights_only: bool = True) -> dict[str, Any]:
        """Restore modules and optimizers of ``state`` in place, set its plain values,
        and return the checkpoint entries ``state`` did not name.

        ``path`` is a checkpoint file, or a distributed checkpoint directory (as sharded
        strategies write), which is resharded into this strategy's modules.
        """
        if checkpointing.is_distributed_checkpoint(path):
            return checkpointing.load_distributed(self, path, state, weights_only=weights_only)
        checkpoint = self.checkpoint_io.load_checkpoint(
            path, map_location="cpu", weights_only=weights_only
        )
        problem = checkpointing.missing_entries(path, checkpoint, state)
        if problem is not None:
            # refuse before restoring anything: no half-loaded state
            raise CheckpointLoadError(str(path), problem)
        precision_state = checkpoint.pop(PRECISION_KEY, None)
        if precision_state is not None:
            self.precision.load_state_dict(precision_state)
        for name, target in state.items():
            value = checkpoint.pop(name)
            if isinstance(target, nn.Module):
                unwrap(target).load_state_dict(value)
            elif isinstance(target, Optimizer):
                target.load_state_dict(value)
            else:
                state[name] = value
        return checkpoint


def _rebind(optimizer: Optimizer, names: dict[int, str],
            current: dict[str, nn.Parameter]) -> Optimizer:
    """``optimizer`` over the set-up module's parameters (itself when they are the same)."""
    groups = optimizer.param_groups
    if all(current.get(names.get(id(p), "")) is p for g in groups for p in g["params"]):
        return optimizer
    if optimizer.state:
        raise ValueError(
            f"{type(optimizer).__name__} already has state for parameters that the strategy "
            "replaced when it set up the module; create the optimizer after setup_module"
        )
    missing = [p for g in groups for p in g["params"] if names.get(id(p)) not in current]
    if missing:
        raise ValueError(
            f"{type(optimizer).__name__} steps {len(missing)} tensor(s) that are not "
            "parameters of the module being set up"
        )
    rebuilt = [{**{k: v for k, v in g.items() if k != "params"},
                "params": [current[names[id(p)]] for p in g["params"]]} for g in groups]
    # defaults may hold derived entries the constructor does not take
    accepted = inspect.signature(type(optimizer)).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return type(optimizer)(rebuilt, **defaults)


def _state_of(value: Any) -> Any:
    if isinstance(value, nn.Module):
        return unwrap(value).state_dict()
    if isinstance(value, Optimizer):
        return value.state_dict()
    return value


def _run_worker(strategy: Strategy, fn: Callable[..., T], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> T:
    """What every process runs: set up, call the user's function, tear down."""
    try:
        strategy.setup_environment()
        return fn(strategy, *args, **kwargs)
    except BaseException as exc:
        # Record when and what failed now, before teardown closes connections and makes
        # the peers fail too: the launcher names the earliest failure, and a slow
        # teardown must not keep this record from it.
        report_failure(exc)
        raise
    finally:
        strategy.teardown()
