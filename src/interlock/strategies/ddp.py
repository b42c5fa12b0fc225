"""`DDPStrategy`: DistributedDataParallel with any of four launchers."""

from __future__ import annotations

import contextlib
import datetime
import inspect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from interlock.engine.errors import ResolutionError, did_you_mean
from interlock.strategies.accelerators import Accelerator
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.io import CheckpointIO
from interlock.strategies.module_wrapper import StrategyModule
from interlock.strategies.parallel import DEFAULT_TIMEOUT, ParallelStrategy
from interlock.strategies.precision import Precision

if TYPE_CHECKING:
    from interlock.engine.planner import Plan

#: start method -> the registry name of that launch style: the name an instance built
#: by hand stands for (one built from a plan takes the plan's). The built-in DDP rows
#: say the same, and tests hold the two together.
DDP_NAMES: dict[str, str] = {
    "popen": "ddp", "spawn": "ddp_spawn", "fork": "ddp_fork", "forkserver": "ddp_forkserver",
}

#: interlock's own launchers -> the start method a DDPStrategy of that launcher has
#: (launchers named like their start method; the script launcher re-runs with popen)
_LAUNCHER_START_METHODS: dict[str, str] = {
    "subprocess": "popen", "spawn": "spawn", "fork": "fork", "forkserver": "forkserver",
}

#: DistributedDataParallel parameters the strategy sets itself
_DDP_OWN = ("self", "module", "device_ids")


def ddp_parameters() -> tuple[str, ...]:
    """The keyword parameters of torch's DistributedDataParallel that a DDPStrategy
    passes through from its constructor (``**ddp_kwargs``)."""
    return tuple(n for n in inspect.signature(DistributedDataParallel.__init__).parameters
                 if n not in _DDP_OWN)


def _refuse_unknown_ddp_kwargs(keys: Iterable[str], strategy: str) -> None:
    accepted = ddp_parameters()
    for key in keys:
        if key in accepted:
            continue
        why = ("is set by the strategy from its root device" if key in _DDP_OWN else
               f"is not a parameter of torch's DistributedDataParallel (torch "
               f"{torch.__version__})")
        raise ResolutionError(
            "unknown-option", flag="strategy", value=strategy,
            reason=f"DDPStrategy passes keyword options it does not know itself on to "
            f"DistributedDataParallel, and {key!r} {why}.",
            choices=accepted, suggestion=did_you_mean(key, accepted),
        )


def _constructor_parameters(cls: type[DDPStrategy]) -> set[str]:
    """The keyword parameters ``cls(...)`` takes itself: those of its constructor and,
    where a subclass's constructor passes ``**kwargs`` on (``super().__init__(**kwargs)``,
    the ordinary way to extend one), those of the constructors up the hierarchy, as far
    as DDPStrategy's (whose own ``**ddp_kwargs`` go to DistributedDataParallel)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names.update(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                           p.KEYWORD_ONLY))
        if klass is DDPStrategy or not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


class DDPStrategy(ParallelStrategy):
    """Data parallel: a full replica per process, gradients averaged in backward.

    Args:
        start_method: ``"popen"`` re-runs the script per rank; ``"spawn"``, ``"fork"``
            and ``"forkserver"`` start worker processes from this one.
        find_unused_parameters, static_graph, gradient_as_bucket_view: passed to
            ``DistributedDataParallel``.
        backend: process-group backend; gloo on cpu and nccl on cuda by default.
        timeout: how long a collective waits for a missing rank before failing.
        **ddp_kwargs: further ``DistributedDataParallel`` keyword arguments
            (``bucket_cap_mb``, ``broadcast_buffers``, ...).

    Attributes:
        ddp_kwargs: every keyword argument ``DistributedDataParallel`` receives (the
            three above included); a subclass may change it in its constructor.

    Raises:
        ResolutionError: ``unknown-option`` for a keyword DistributedDataParallel
            does not take (with the closest one it does).

    Subclasses customise the wrapped module by overriding :meth:`configure_ddp` (a
    communication hook, for instance) rather than :meth:`wrap_module`.
    """

    registry_name: ClassVar[str] = "ddp"

    def __init__(
        self,
        *,
        accelerator: Accelerator | None = None,
        parallel_devices: Sequence[torch.device | str] | None = None,
        num_nodes: int | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        start_method: str = "popen",
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        backend: str | None = None,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
        **ddp_kwargs: Any,
    ) -> None:
        if start_method not in DDP_NAMES:
            raise ValueError(
                f"start_method {start_method!r} is unknown; choose {', '.join(DDP_NAMES)}"
            )
        _refuse_unknown_ddp_kwargs(ddp_kwargs, self._unplanned_name(start_method))
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            num_nodes=num_nodes, precision=precision, checkpoint_io=checkpoint_io,
            cluster_environment=cluster_environment, backend=backend, timeout=timeout,
        )
        self.start_method = start_method
        self.ddp_kwargs = {
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
            **ddp_kwargs,
        }

    @classmethod
    def _check_options(cls, options: Mapping[str, object], strategy: str) -> None:
        own = _constructor_parameters(cls)
        _refuse_unknown_ddp_kwargs((k for k in options if k not in own), strategy)

    @property
    def name(self) -> str:
        """The registry name: its plan's, else the ``registry_name`` of a subclass that
        sets its own, else that of its launch style."""
        return self.plan.strategy if self.plan is not None else (
            self._unplanned_name(self.start_method))

    def complete(self, plan: Plan) -> None:
        """As `Strategy.complete`; the start method then follows the plan's launcher
        where it is one of interlock's own (the script launcher's is ``"popen"``)."""
        super().complete(plan)
        method = _LAUNCHER_START_METHODS.get(plan.launcher or "")
        if method is not None:
            self.start_method = method

    def _unplanned_name(self, start_method: str) -> str:
        own = type(self).registry_name
        return DDP_NAMES[start_method] if own == DDPStrategy.registry_name else own

    def wrap_module(self, module: nn.Module) -> nn.Module:
        """Wrap in ``DistributedDataParallel(module, **ddp_kwargs)``, then let
        :meth:`configure_ddp` configure it."""
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        ddp_module = DistributedDataParallel(module, device_ids=device_ids, **self.ddp_kwargs)
        self.configure_ddp(ddp_module)
        return ddp_module

    def configure_ddp(self, ddp_module: DistributedDataParallel) -> None:
        """Extension point: configure each freshly wrapped module; does nothing here.

        Called in every rank, once per :meth:`setup_module`, before the module's first
        forward. Override it to register a communication hook
        (``ddp_module.register_comm_hook(state, hook)``), creating any hook state here
        so that each module gets its own. Every rank must configure alike.
        """

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Accumulate gradients locally: backward inside skips the all-reduce."""
        inner = module.forward_module if isinstance(module, StrategyModule) else module
        if not enabled or not isinstance(inner, DistributedDataParallel):
            yield
            return
        with inner.no_sync():
            yield
