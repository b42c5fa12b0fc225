"""What a checkpoint holds besides the tensors, and how its entries map onto the live
modules and optimizers: the strategy a checkpoint needs (`SavingStrategy`), the keys it
adds (the precision's and the random state), optimizer state by parameter index or by
name, and the per-parameter state keys a load must create first."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
from torch.optim import Optimizer

from interlock.strategies import random_state
from interlock.strategies.io import CheckpointLoadError
from interlock.strategies.module_wrapper import unwrap
from interlock.strategies.random_state import RANDOM_KEY, RankedStrategy

if TYPE_CHECKING:
    from interlock.strategies.collectives import Collective
    from interlock.strategies.io.base import CheckpointIO
    from interlock.strategies.precision.base import Precision

T = TypeVar("T")


class SavingStrategy(RankedStrategy, Protocol):
    """What checkpoint files need of a strategy (`interlock.strategies.base.Strategy`,
    which calls these functions, and so is not imported here): its ranks, collectives,
    precision and checkpoint IO."""

    @property
    def collective(self) -> Collective: ...
    @property
    def precision(self) -> Precision: ...
    @property
    def checkpoint_io(self) -> CheckpointIO: ...

    def barrier(self) -> None: ...

    def broadcast(self, obj: T, src: int = 0) -> T: ...

#: checkpoint key under which the precision's state (the grad scaler's) travels
PRECISION_KEY = "interlock/precision"
#: the entries a checkpoint carries besides the state it was given
RUNTIME_KEYS = frozenset((PRECISION_KEY, RANDOM_KEY))
#: the file in a distributed checkpoint directory that holds the plain values
PLAIN_FILE = "interlock.pt"


def optimizer_owners(state: Mapping[str, Any]) -> dict[str, nn.Module]:
    """For each optimizer in ``state``, the (unwrapped) module whose parameters it steps.

    Sharded state dicts name optimizer state by parameter name, so every optimizer
    must travel with its module.

    Raises:
        ValueError: for an optimizer whose parameters no module in ``state`` owns.
    """
    modules = {name: unwrap(v) for name, v in state.items() if isinstance(v, nn.Module)}
    owned = {name: {id(p) for p in m.parameters()} for name, m in modules.items()}
    owners: dict[str, nn.Module] = {}
    for name, value in state.items():
        if not isinstance(value, Optimizer):
            continue
        params = {id(p) for group in value.param_groups for p in group["params"]}
        owner = next((m for m, ids in owned.items() if params <= ids), None)
        if owner is None:
            raise ValueError(
                f"the parameters of optimizer {name!r} belong to none of the modules in the "
                f"checkpoint state ({', '.join(map(repr, modules)) or 'none'}); a sharded "
                "strategy names optimizer state by parameter, so save the module with it"
            )
        owners[name] = modules[owner]
    return owners


# ------------------------------------------------------------------ optimizer layouts


def optimizer_state_by_index(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name turned into ``Optimizer.state_dict``'s
    layout (parameters numbered in ``param_groups`` order)."""
    if not state:
        return state
    order = [name for group in state["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    return {
        "state": {index[name]: value for name, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [index[name] for name in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def optimizer_state_by_name(state: dict[str, Any], optimizer: Optimizer,
                            module: nn.Module) -> dict[str, Any]:
    """The inverse of :func:`optimizer_state_by_index` for ``optimizer`` over ``module``.

    Raises:
        CheckpointLoadError: when the saved groups do not match the optimizer's.
    """
    # a tied parameter (a head sharing the embedding's weight) goes by its first name,
    # the canonical one torch's state-dict functions use, not by its alias
    names: dict[int, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved = [i for group in state.get("param_groups", ()) for i in group["params"]]
    if sorted(saved) != list(range(len(order))):
        raise CheckpointLoadError(
            "", f"the optimizer state holds {len(saved)} parameters but the optimizer "
            f"steps {len(order)}; it was saved from a different model or optimizer"
        )
    for mine, theirs in zip(optimizer.param_groups, state.get("param_groups", ()),
                            strict=False):
        if set(mine) != set(theirs):
            raise CheckpointLoadError(
                "", f"the saved optimizer's settings are {sorted(set(theirs) - {'params'})}, "
                f"this {type(optimizer).__name__}'s are {sorted(set(mine) - {'params'})}: it "
                "was saved from a different optimizer"
            )
    return {
        "state": {order[i]: value for i, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [order[i] for i in group["params"]]}
            for group in state["param_groups"]
        ],
    }


def missing_entries(path: str | Path, saved: Mapping[str, Any] | set[str],
                    state: Mapping[str, Any]) -> str | None:
    """The error message for names of ``state`` that the checkpoint lacks, or None."""
    missing = sorted(name for name in state if name not in saved)
    if not missing:
        return None
    present = sorted(k for k in saved if k not in RUNTIME_KEYS)
    return (
        f"checkpoint {str(path)!r} has no entr{'y' if len(missing) == 1 else 'ies'} "
        f"{', '.join(map(repr, missing))}; it has {', '.join(map(repr, present))}"
    )


def runtime_entries(strategy: SavingStrategy) -> dict[str, Any]:
    """What every checkpoint carries besides the state given: the precision's state
    (a grad scaler's), and every rank's random state (a collective where there are
    several ranks; see `interlock.strategies.random_state`)."""
    entries: dict[str, Any] = {}
    precision_state = strategy.precision.state_dict()
    if precision_state:
        entries[PRECISION_KEY] = precision_state
    entries[RANDOM_KEY] = random_state.gather(strategy)
    return entries


def restore_plain(strategy: SavingStrategy, state: dict[str, Any],
                   rest: dict[str, Any]) -> dict[str, Any]:
    """Restore what a checkpoint holds besides modules and optimizers: the precision's
    state, the plain values of ``state`` (set in it) and every rank's random state (last,
    once nothing else can fail). ``rest`` is the checkpoint less its modules and
    optimizers; returns what is left of it, the entries ``state`` did not name."""
    precision_state = rest.pop(PRECISION_KEY, None)
    if precision_state is not None:
        strategy.precision.load_state_dict(precision_state)
    saved_random = rest.pop(RANDOM_KEY, None)
    for name, target in list(state.items()):
        if not isinstance(target, (nn.Module, Optimizer)):
            state[name] = rest.pop(name)
    random_state.restore(strategy, saved_random)  # last: after nothing else can fail
    return rest


#: per parameter (by fully qualified name), the state keys a checkpoint holds for it,
#: each with its dtype and shape
StateKeys = dict[str, dict[str, tuple[torch.dtype, tuple[int, ...]]]]


def saved_state_keys(by_name: Mapping[str, Any]) -> StateKeys:
    """The per-parameter tensor keys of an optimizer state dict keyed by name."""
    return {fqn: {key: (value.dtype, tuple(value.shape)) for key, value in values.items()
                  if isinstance(value, torch.Tensor)}
            for fqn, values in by_name.get("state", {}).items()}


def add_state_keys(optimizer: Optimizer, owner: nn.Module, wanted: StateKeys) -> None:
    """Give a fresh optimizer the per-parameter state keys a checkpoint holds that its
    own step does not create, before the checkpoint is loaded into it.

    torch loads an optimizer's sharded state into what the optimizer holds after one
    step with zero gradients (``exp_avg``, ``momentum_buffer``): a key a precision keeps
    beside those (a Kahan compensation buffer) would be dropped, or on other ranks than
    0 never arrive. Each such key gets zeros shaped and sharded like its parameter, in
    the saved dtype (a scalar key, a plain scalar), for the load to fill."""
    if not any(wanted.values()):
        return
    # torch's own loaders initialise a fresh optimizer's state this way first
    groups: list[dict[str, Any]] = list(
        get_optimizer_state_dict(owner, optimizer)["param_groups"])  # type: ignore[arg-type]
    names = [str(fqn) for group in groups for fqn in group["params"]]
    params = [param for group in optimizer.param_groups for param in group["params"]]
    for fqn, param in zip(names, params, strict=True):
        for key, (dtype, shape) in wanted.get(fqn, {}).items():
            state = optimizer.state[param]
            if key in state:
                continue
            if shape == ():
                state[key] = torch.zeros((), dtype=dtype)
            elif tuple(param.shape) == shape:
                state[key] = torch.zeros_like(param.detach(), dtype=dtype)


def pipeline_stages(strategy: SavingStrategy) -> int:
    """How many pipeline stages ``strategy`` splits models into (1 for most)."""
    degrees = getattr(strategy, "parallelism", None)
    return int(getattr(degrees, "pp", 1))
