"""The random state a checkpoint carries, per rank, so that a resumed run draws the
numbers an undisturbed one would (dropout masks, random augmentations, sampling).

Saved for every rank (gathered on rank 0, which writes): torch's CPU generator, the
generator of the rank's device (CUDA's, where CUDA is in use), Python's ``random`` and
numpy's global generator (where numpy is imported). Restored on load when the loading
world has as many ranks as the saving one; at another world size no rank's stream
continues another's, and nothing is restored (a warning says so).

Not saved: generators a program makes itself (``torch.Generator()`` objects, numpy
``default_rng`` instances) and those of data-loader worker processes; those belong in
the program's own state.
"""

from __future__ import annotations

import random
import sys
import warnings
from typing import Any, Protocol

import torch

#: checkpoint key under which the ranks' random state travels
RANDOM_KEY = "interlock/random_state"


class RankedStrategy(Protocol):
    """What this module reads of a strategy: its device and ranks, and its collectives
    (the checkpoint functions read these and a few more)."""

    @property
    def root_device(self) -> torch.device: ...
    @property
    def world_size(self) -> int: ...
    @property
    def global_rank(self) -> int: ...
    @property
    def is_global_zero(self) -> bool: ...
    @property
    def collective(self) -> Any: ...


def capture(device: torch.device) -> dict[str, Any]:
    """This process's generators' states, in types a ``weights_only`` load accepts."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, position, has_gauss, gauss = numpy.random.get_state()
        state["numpy"] = (str(kind), torch.from_numpy(keys.astype("int64")), int(position),
                          int(has_gauss), float(gauss))
    if device.type == "cuda" and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_own(state: dict[str, Any], device: torch.device) -> None:
    """Set this process's generators to ``state`` (from :func:`capture`)."""
    python = state.get("python")
    if python is not None:
        random.setstate(_as_tuples(python))
    if isinstance(state.get("torch"), torch.Tensor):
        torch.set_rng_state(state["torch"])
    saved_numpy = state.get("numpy")
    if saved_numpy is not None:
        _restore_numpy(saved_numpy)
    if isinstance(state.get("cuda"), torch.Tensor) and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def _restore_numpy(saved: Any) -> None:
    """numpy's global generator set to ``saved`` (numpy was in use when it was saved;
    where it is not installed now, there is nothing to restore it into)."""
    try:
        import numpy
    except ImportError:
        return
    kind, keys, position, has_gauss, gauss = saved
    numpy.random.set_state((kind, keys.numpy().astype("uint32"), position, has_gauss, gauss))


def gather(strategy: RankedStrategy) -> dict[str, Any]:
    """Every rank's state, on every rank (a collective where there are several)."""
    mine = capture(strategy.root_device)
    ranks = (strategy.collective.all_gather_object(mine) if strategy.world_size > 1
             else [mine])
    return {"world_size": strategy.world_size, "ranks": ranks}


def restore(strategy: RankedStrategy, saved: object) -> None:
    """Give this rank the state its rank saved; nothing at another world size."""
    if not isinstance(saved, dict) or not isinstance(saved.get("ranks"), list):
        return
    ranks: list[Any] = saved["ranks"]
    if saved.get("world_size") != strategy.world_size or len(ranks) != strategy.world_size:
        if strategy.is_global_zero:
            warnings.warn(
                f"the checkpoint's random state is from {saved.get('world_size')} ranks and "
                f"this run has {strategy.world_size}: it is not restored (dropout and "
                "other random draws continue from this run's own seeds)",
                RuntimeWarning, stacklevel=3)
        return
    own = ranks[strategy.global_rank]
    if isinstance(own, dict):
        restore_own(own, strategy.root_device)


def _as_tuples(value: Any) -> Any:
    """Python's random state with its tuples back (a checkpoint may turn them into
    lists)."""
    if isinstance(value, list):
        return tuple(_as_tuples(v) for v in value)
    if isinstance(value, tuple):
        return tuple(_as_tuples(v) for v in value)
    return value
