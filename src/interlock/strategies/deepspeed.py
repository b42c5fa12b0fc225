"""`DeepSpeedStrategy`: ZeRO stages 1-3 with optional CPU/NVMe offloading.

deepspeed is imported when the strategy is set up, never at import time; the engine
refuses the deepspeed rows when the package is missing (``missing-package``) and on
any accelerator but cuda.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import datetime
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim import Optimizer

from interlock.engine.tables import INSTALL_HINTS
from interlock.strategies import random_state
from interlock.strategies.accelerators import Accelerator
from interlock.strategies.base import check_module, check_optimizers
from interlock.strategies.deepspeed_config import deepspeed_config
from interlock.strategies.environments import ClusterEnvironment
from interlock.strategies.io import CheckpointIO, CheckpointLoadError
from interlock.strategies.module_wrapper import StrategyModule, unwrap
from interlock.strategies.parallel import DEFAULT_TIMEOUT, ParallelStrategy
from interlock.strategies.precision import Precision
from interlock.strategies.precision.deepspeed import DeepSpeedPrecision, LossScale
from interlock.strategies.random_state import RANDOM_KEY

#: the entry of a DeepSpeed checkpoint that lists the caller's plain entries
CLIENT_KEYS = "interlock_client_keys"
#: the entry of a DeepSpeed checkpoint that holds the precision's state (16-mixed's
#: loss scale; the engine saves its own loss scaler with the optimizer state)
PRECISION_STATE = "interlock_precision"
#: the ZeRO stage that saved a checkpoint (another stage cannot load its partitions)
ZERO_STAGE = "interlock_zero_stage"


def import_deepspeed() -> Any:
    """The deepspeed package, or an ImportError with the install hint.

    Importing deepspeed sets environment variables for the whole process
    (``PYTORCH_NVML_BASED_CUDA_CHECK``); the caller's environment is left as it was.
    """
    before = dict(os.environ)
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError(
            f"DeepSpeedStrategy needs deepspeed: {INSTALL_HINTS['deepspeed']}"
        ) from exc
    finally:
        for name in set(os.environ) - set(before):
            del os.environ[name]
        os.environ.update(before)
    return deepspeed


class DeepSpeedModule(StrategyModule):
    """The engine's module. Under ZeRO stage 3 its parameters are partitioned across
    the ranks, so ``state_dict()`` gathers them first (a collective: every rank calls
    it) and returns full copies, as for every other strategy."""

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        engine = self.forward_module
        if getattr(engine, "zero_optimization_stage", lambda: 0)() != 3:
            return super().state_dict(*args, **kwargs)
        deepspeed = import_deepspeed()
        params = list(unwrap(self).parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            state = super().state_dict(*args, **kwargs)
            return type(state)((k, v.detach().clone() if isinstance(v, torch.Tensor) else v)
                               for k, v in state.items())


class DeepSpeedOptimizer(Optimizer):
    """The engine's optimizer as a torch ``Optimizer``.

    ZeRO wraps the caller's optimizer (re-pointed at its flat partitions) in an object
    that is not a torch Optimizer. This one stands for it: ``param_groups`` are the
    caller's optimizer's own dicts, so a scheduler built on either drives what the
    engine steps; ``zero_grad``, ``state_dict`` and ``load_state_dict`` are the
    engine's (its partitioned state). The step is the engine's:
    ``strategy.optimizer_step(optimizer)``.
    """

    def __init__(self, zero_optimizer: Any) -> None:  # no Optimizer.__init__: no params
        self.zero_optimizer = zero_optimizer
        inner = getattr(zero_optimizer, "optimizer", zero_optimizer)
        self.defaults = dict(getattr(inner, "defaults", {}))
        self._optimizer_step_pre_hooks = collections.OrderedDict()
        self._optimizer_step_post_hooks = collections.OrderedDict()
        self._optimizer_state_dict_pre_hooks = collections.OrderedDict()
        self._optimizer_state_dict_post_hooks = collections.OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = collections.OrderedDict()
        self._optimizer_load_state_dict_post_hooks = collections.OrderedDict()

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        groups: list[dict[str, Any]] = self.zero_optimizer.param_groups
        return groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        inner = getattr(self.zero_optimizer, "optimizer", self.zero_optimizer)
        return inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.zero_optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        raise RuntimeError("the DeepSpeed engine steps its optimizer: call "
                           "strategy.optimizer_step(optimizer)")

    def state_dict(self) -> dict[str, Any]:
        """The engine's optimizer state. Its loss scaler is a live object that goes on
        counting steps (and changing scale); the state holds a copy, as of now."""
        state: dict[str, Any] = dict(self.zero_optimizer.state_dict())
        if "loss_scaler" in state:
            state["loss_scaler"] = copy.deepcopy(state["loss_scaler"])
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.zero_optimizer.load_state_dict(state_dict)


class DeepSpeedStrategy(ParallelStrategy):
    """DeepSpeed's ZeRO engine: one engine per rank built from the module and optimizer.

    Use :meth:`setup_module_and_optimizers` (the engine needs both at once);
    :meth:`backward` and :meth:`optimizer_step` go through the engine, which scales
    the loss, reduces and partitions gradients, steps and zeroes them.

    Args:
        stage, offload_optimizer, offload_parameters, remote_device, nvme_path: the
            ZeRO configuration (see :func:`deepspeed_config`).
        config: a dict or JSON file merged over the generated configuration.
        backend, timeout: as for every parallel strategy.
    """

    registry_name: ClassVar[str] = "deepspeed"

    def __init__(
        self,
        *,
        stage: int = 2,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        remote_device: str = "cpu",
        nvme_path: str | None = None,
        config: Mapping[str, Any] | str | Path | None = None,
        accelerator: Accelerator | None = None,
        parallel_devices: Sequence[torch.device | str] | None = None,
        num_nodes: int | None = None,
        precision: Precision | None = None,
        checkpoint_io: CheckpointIO | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        backend: str | None = None,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(
            accelerator=accelerator, parallel_devices=parallel_devices, num_nodes=num_nodes,
            precision=precision, checkpoint_io=checkpoint_io,
            cluster_environment=cluster_environment, backend=backend, timeout=timeout,
        )
        self.zero_options: dict[str, Any] = {
            "stage": stage, "offload_optimizer": offload_optimizer,
            "offload_parameters": offload_parameters, "remote_device": remote_device,
            "nvme_path": nvme_path,
        }
        self._overrides = config
        # refuse bad options now; a missing NVMe path only at setup, so that the
        # nvme row resolves by name and the error says what to pass
        deepspeed_config(**{**self.zero_options, "nvme_path": nvme_path or "?"},
                         overrides=config)
        self._engine: Any = None

    @property
    def config(self) -> dict[str, Any]:
        """The DeepSpeed configuration for the current options and precision."""
        return deepspeed_config(**self.zero_options, precision=self.precision.precision,
                                overrides=self._overrides)

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage the engine runs (the config's, overrides included)."""
        stage = self.config.get("zero_optimization", {}).get("stage", self.zero_options["stage"])
        return int(stage)

    @property
    def engine(self) -> Any:
        """The DeepSpeed engine (after :meth:`setup_module_and_optimizers`)."""
        if self._engine is None:
            raise RuntimeError("no DeepSpeed engine yet: call setup_module_and_optimizers()")
        return self._engine

    def setup_environment(self) -> None:
        deepspeed = import_deepspeed()
        super().setup_environment()
        # DeepSpeed's communication layer adopts the process group set up above
        deepspeed.init_distributed(dist_backend=self.backend, dist_init_required=False,
                                   auto_mpi_discovery=False)

    def teardown(self) -> None:
        if self._engine is not None:
            destroy = getattr(self._engine, "destroy", None)
            if callable(destroy):
                destroy()
            self._engine = None
        super().teardown()
        _forget_process_groups()

    # ----------------------------------------------------------------- modules

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: Sequence[Optimizer]
    ) -> tuple[StrategyModule, list[Optimizer]]:
        check_module("setup_module_and_optimizers", module)
        check_optimizers("setup_module_and_optimizers", optimizers)
        if len(optimizers) != 1:
            raise ValueError(
                f"DeepSpeed builds one engine from one module and one optimizer; got "
                f"{len(optimizers)} optimizers"
            )
        deepspeed = import_deepspeed()
        module = self.precision.convert_module(module)
        _reset_autocast_state()
        engine, optimizer, _, _ = deepspeed.initialize(
            model=module, optimizer=optimizers[0], config=self.config,
            dist_init_required=False,
        )
        self._engine = engine
        self._apply_loss_scale()
        # ZeRO wraps the caller's optimizer (re-pointed at its flat partitions) in an
        # object that is not a torch Optimizer: hand back the caller's own, so that
        # schedulers and references taken before keep driving what the engine steps
        return DeepSpeedModule(engine, module, self.precision), [DeepSpeedOptimizer(optimizer)]

    def setup_module(self, module: nn.Module) -> StrategyModule:
        """An engine without an optimizer (inference); to train, use
        :meth:`setup_module_and_optimizers`."""
        check_module("setup_module", module)
        deepspeed = import_deepspeed()
        module = self.precision.convert_module(module)
        _reset_autocast_state()
        engine, _, _, _ = deepspeed.initialize(model=module, config=self.config,
                                               dist_init_required=False)
        self._engine = engine
        return DeepSpeedModule(engine, module, self.precision)

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        raise RuntimeError(
            "DeepSpeed builds its engine from the module and the optimizer together: call "
            "strategy.setup_module_and_optimizers(module, [optimizer]) instead"
        )

    @contextlib.contextmanager
    def module_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """Under ZeRO stage 3 parameters are partitioned as they are created
        (``deepspeed.zero.Init``); otherwise as for every strategy."""
        if self.zero_options["stage"] != 3:
            with super().module_init_context(empty_init):
                yield
            return
        deepspeed = import_deepspeed()
        with deepspeed.zero.Init(config_dict_or_path=self.config,
                                 remote_device=self.zero_options["remote_device"]):
            yield

    # ----------------------------------------------------------------- steps

    def backward(self, loss: torch.Tensor, module: nn.Module | None = None, *args: Any,
                 **kwargs: Any) -> None:
        """The engine's backward, which scales the loss (16-mixed: by the precision's
        loss scale; 16-true: by DeepSpeed's static scale of 1)."""
        self._apply_loss_scale()
        self.engine.backward(loss, *args, **kwargs)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """The engine's step: unscale, clip (``gradient_clipping`` in the config), step
        and zero the gradients; a step with inf or NaN gradients is skipped (on every
        rank), and 16-mixed's loss scale then backs off."""
        boundary = bool(self.engine.is_gradient_accumulation_boundary())
        result = self.engine.step(**kwargs)
        scale = self._loss_scale()
        if scale is not None and boundary:
            scale.update(skipped=not self.engine.was_step_applied())
            self._apply_loss_scale()
        if boundary:
            # the engine stepped the optimizer itself, past the wrapper an LR scheduler
            # puts on optimizer.step to see that a step came first: tell it, or torch
            # warns "lr_scheduler.step() before optimizer.step()" on every run
            optimizer._opt_called = True  # type: ignore[attr-defined]
        return result

    def _loss_scale(self) -> LossScale | None:
        precision = self.precision
        return precision.loss_scale if isinstance(precision, DeepSpeedPrecision) else None

    def _apply_loss_scale(self) -> None:
        """Hand 16-mixed's loss scale to the engine's ZeRO optimizer, which then scales
        the loss by it, unscales the gradients and skips a step whose gradient norm is
        not finite.

        DeepSpeed's own GradScaler for ``torch_autocast`` float16 is switched off: ZeRO
        skips an overflowing step before that scaler sees it (so its scale never backs
        off), and with optimizer offloading it unscales CPU gradients by a CUDA scale.
        """
        scale = self._loss_scale()
        if scale is None or self._engine is None:
            return
        zero = self._engine.optimizer
        if not callable(getattr(zero, "override_loss_scale", None)):
            raise ValueError(
                "precision='16-mixed' on DeepSpeed needs ZeRO stage 1, 2 or 3 (the loss "
                f"scale is handed to the ZeRO optimizer); stage is "
                f"{self.zero_options['stage']}: use bf16-mixed, or a ZeRO stage"
            )
        if getattr(zero, "torch_autocast_gradscaler", None) is not None:
            zero.torch_autocast_gradscaler = None
        zero.override_loss_scale(scale.scale)

    def clip_gradients_norm(self, module: nn.Module, optimizer: Optimizer, max_norm: float,
                            norm_type: float = 2.0) -> torch.Tensor:
        raise RuntimeError(
            "DeepSpeed clips inside its step: set config={'gradient_clipping': "
            f"{max_norm}}} on DeepSpeedStrategy instead of calling clip_gradients_norm"
        )

    def clip_gradients_value(self, module: nn.Module, optimizer: Optimizer,
                             clip_value: float) -> None:
        raise RuntimeError("DeepSpeed clips gradients by norm only, inside its step: set "
                           "config={'gradient_clipping': ...} on DeepSpeedStrategy")

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        if enabled:
            raise RuntimeError(
                "DeepSpeed accumulates gradients itself: set config="
                "{'gradient_accumulation_steps': N} and call backward and optimizer_step "
                "every micro-batch, without no_backward_sync"
            )
        yield

    # ----------------------------------------------------------------- checkpoints

    def save_checkpoint(self, path: str | Path, state: Mapping[str, Any]) -> None:
        """A DeepSpeed checkpoint directory (every rank writes its partitions); the
        engine's module and optimizer are saved by the engine, plain values with them."""
        plain = self._plain_values(state)
        for reserved in (CLIENT_KEYS, PRECISION_STATE, RANDOM_KEY, ZERO_STAGE):
            if reserved in plain:
                raise ValueError(f"{reserved!r} is reserved in DeepSpeed checkpoints")
        # which entries are the caller's: DeepSpeed returns its own with them on load
        client = {**plain, CLIENT_KEYS: sorted(plain)}
        precision_state = self.precision.state_dict()
        if precision_state:
            client[PRECISION_STATE] = precision_state
        client[RANDOM_KEY] = random_state.gather(self)  # every rank's, rank 0 writes
        client[ZERO_STAGE] = self.zero_stage
        self.engine.save_checkpoint(str(path), client_state=client)

    def load_checkpoint(self, path: str | Path, state: dict[str, Any],
                        *, weights_only: bool = True, verify: bool = True) -> dict[str, Any]:
        """Load a DeepSpeed checkpoint directory through the engine. ``verify`` is
        accepted for the common signature: DeepSpeed writes its files without an
        interlock digest, so there is nothing to check them against."""
        plain = self._plain_values(state)
        # every entry asked for must be there before the engine restores anything
        states = _saved_model_states(Path(path))
        saved = set(states) if states is not None else None
        stage = _saved_zero_stage(states)
        if stage is not None and stage != self.zero_stage:
            raise CheckpointLoadError(
                str(path), f"checkpoint {str(path)!r} was saved at ZeRO stage {stage} and "
                f"this strategy runs stage {self.zero_stage}: DeepSpeed loads its optimizer "
                "partitions only into the stage that wrote them. Load it with a stage "
                f"{stage} strategy, or turn it into full weights first (DeepSpeed's "
                "zero_to_fp32.py in the checkpoint directory) and load those; nothing was "
                "loaded")
        if saved is not None:
            missing = sorted(name for name in plain if name not in saved)
            if missing:
                raise CheckpointLoadError(
                    str(path), f"checkpoint {str(path)!r} has no entries {missing}; "
                    "nothing was loaded")
        load_path, client = self.engine.load_checkpoint(
            str(path), load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if load_path is None:
            raise CheckpointLoadError(str(path), f"no DeepSpeed checkpoint at {str(path)!r}")
        missing = sorted(name for name in plain if name not in client)
        if missing:
            raise CheckpointLoadError(
                str(path), f"checkpoint {str(path)!r} has no entries {missing}"
            )
        for name in plain:
            state[name] = client[name]
        precision_state = client.get(PRECISION_STATE)
        if isinstance(precision_state, dict):
            self.precision.load_state_dict(precision_state)
            self._apply_loss_scale()
        random_state.restore(self, client.get(RANDOM_KEY))
        # the caller's other entries; a checkpoint written by DeepSpeed directly does
        # not say which are the caller's, so it gets every entry but the asked ones
        theirs = client.get(CLIENT_KEYS, list(client))
        return {k: client[k] for k in theirs if k in client and k not in plain
                and k not in (CLIENT_KEYS, PRECISION_STATE, RANDOM_KEY, ZERO_STAGE)}

    def _plain_values(self, state: Mapping[str, Any]) -> dict[str, Any]:
        engine_module = unwrap(self.engine.module) if self._engine is not None else None
        # ZeRO's optimizer wraps the torch one and is not a torch Optimizer itself
        engine_optimizer = getattr(self._engine, "optimizer", None)
        plain: dict[str, Any] = {}
        for name, value in state.items():
            if isinstance(value, nn.Module):
                inner = value.forward_module if isinstance(value, StrategyModule) else value
                if inner is not self._engine and unwrap(value) is not engine_module:
                    raise ValueError(
                        f"{name!r} is not the module of this strategy's DeepSpeed engine; "
                        "DeepSpeed checkpoints hold exactly the engine's module"
                    )
            elif not (isinstance(value, Optimizer) or value is engine_optimizer):
                plain[name] = value
        return plain


def _saved_zero_stage(states: dict[str, Any] | None) -> int | None:
    """The ZeRO stage that wrote a checkpoint's model states: interlock's own entry,
    else the DeepSpeed config saved with them; None when neither says."""
    if states is None:
        return None
    stage = states.get(ZERO_STAGE)
    if stage is None:
        config = states.get("ds_config")
        zero = config.get("zero_optimization") if isinstance(config, dict) else None
        stage = zero.get("stage") if isinstance(zero, dict) else None
    return int(stage) if isinstance(stage, int) and not isinstance(stage, bool) else None


def _saved_model_states(path: Path) -> dict[str, Any] | None:
    """The top-level entries of the newest DeepSpeed checkpoint under ``path`` (the
    tag its ``latest`` file names), read without loading tensors; None when the layout
    is not the one DeepSpeed writes by default (the engine then decides)."""
    try:
        tag = (path / "latest").read_text().strip()
    except OSError:
        return None
    files = sorted((path / tag).glob("*model_states.pt"))
    if not files:
        return None
    try:
        loaded = torch.load(files[0], map_location="cpu", mmap=True, weights_only=False)
    except Exception as error:  # a damaged file: say which
        raise CheckpointLoadError(str(path), f"{files[0]} cannot be read: {error}") from error
    return loaded if isinstance(loaded, dict) else None


def _reset_autocast_state() -> None:
    """Clear DeepSpeed's process-wide "torch_autocast is on" flag before an engine is
    built.

    DeepSpeed sets that flag (and its dtype) when an engine with ``torch_autocast``
    starts and never clears it; every later ZeRO optimizer in the process reads it.
    After a 16-mixed engine, a 16-true engine therefore got a float16 GradScaler at
    scale 65536 and skipped its first step (measured on CUDA: one step behind plain
    torch). An engine whose config enables ``torch_autocast`` sets the flag again."""
    import sys

    module = sys.modules.get("deepspeed.runtime.torch_autocast")
    if module is not None and hasattr(module, "TORCH_AUTOCAST_INITIALIZED"):
        setattr(module, "TORCH_AUTOCAST_INITIALIZED", False)  # noqa: B010
        setattr(module, "TORCH_AUTOCAST_DTYPE", None)  # noqa: B010


def _forget_process_groups() -> None:
    """Drop DeepSpeed's cached clones of the process group that teardown destroyed.

    DeepSpeed keeps a clone of the world group in a module global and releases it only
    when the group is destroyed through ``deepspeed.comm``; the strategy destroys its
    group through torch, so a second launch in the same process found the stale clone
    ("Group ... is not registered") in ``deepspeed.initialize``."""
    import sys

    groups = sys.modules.get("deepspeed.utils.groups")
    release = getattr(groups, "_release_process_group_references", None)
    if callable(release):
        release(group=None)

