"""One call that makes a run reproducible: Python's, numpy's and torch's generators.

Importing this module imports neither torch nor numpy (``import interlock`` stays light);
:func:`seed_everything` imports them when it is called.
"""

from __future__ import annotations

import os
import random
import secrets

from interlock.strategies.rank_zero import process_rank

__all__ = ["MAX_SEED", "SEED_ENV", "SEED_WORKERS_ENV", "derive_seed", "seed_everything",
           "seed_workers_enabled"]

#: The largest seed every generator accepts (numpy's legacy one takes 32 bits).
MAX_SEED = 2**32 - 1
#: Where :func:`seed_everything` leaves the seed for processes started later (spawned
#: or re-run ranks inherit the environment and call ``seed_everything()`` again).
SEED_ENV = "INTERLOCK_SEED"
#: "0" after ``seed_everything(workers=False)``; read by ``Strategy.setup_dataloader``.
SEED_WORKERS_ENV = "INTERLOCK_SEED_WORKERS"

_MASK64 = 2**64 - 1


def seed_everything(seed: int | None = None, *, workers: bool = True,
                    rank_offset: bool = False) -> int:
    """Seed Python's ``random``, numpy's global generator (when numpy is installed) and
    torch (the CPU and every CUDA device, without initialising CUDA); return the seed.

    Args:
        seed: an integer in ``[0, 2**32 - 1]``. ``None`` takes the one in the
            ``INTERLOCK_SEED`` environment variable (left there by an earlier call, in
            this process or the one that started it), else draws a fresh one.
        workers: data loaders set up by a strategy give every data-parallel rank's
            workers their own seeds (see ``Strategy.setup_dataloader``); ``False``
            leaves worker seeding to torch, whose base seed comes from each rank's own
            generator, so identically seeded ranks get identical worker seeds.
        rank_offset: add this process's global rank (:func:`process_rank`: the process
            group's, else ``RANK``), so that ranks draw different numbers on purpose;
            the sum wraps around past ``2**32 - 1``.

    Returns:
        The seed the generators were seeded with (the environment keeps the seed
        before any rank offset, for the next call to add its own rank to).

    Raises:
        TypeError: ``seed`` is not an int (a bool included), or a flag is not a bool.
        ValueError: ``seed`` (or ``INTERLOCK_SEED``) is outside ``[0, 2**32 - 1]``.
    """
    for flag, value in (("workers", workers), ("rank_offset", rank_offset)):
        if not isinstance(value, bool):
            raise TypeError(f"seed_everything({flag}={value!r}): expected True or False")
    if seed is None:
        base = _seed_from_environment()
        if base is None:
            base = secrets.randbelow(MAX_SEED + 1)
    else:
        base = _checked(seed, "seed")
    os.environ[SEED_ENV] = str(base)
    os.environ[SEED_WORKERS_ENV] = "1" if workers else "0"
    used = (base + process_rank()) % (MAX_SEED + 1) if rank_offset else base

    import torch

    random.seed(used)
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(used)
    # torch.manual_seed queues the CUDA seeds until CUDA is first used
    torch.manual_seed(used)
    return used


def seed_workers_enabled() -> bool:
    """Whether data loaders seed each data-parallel rank's workers apart (the default,
    and after ``seed_everything(workers=True)``)."""
    return os.environ.get(SEED_WORKERS_ENV, "1") != "0"


def derive_seed(*values: int) -> int:
    """A 64-bit seed mixed from ``values`` (splitmix64): nearby inputs give unrelated
    seeds, and the result is the same in every process."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        state = (state ^ (state >> 31)) * 0x94D049BB133111EB & _MASK64
        state ^= state >> 29
    return state


def _seed_from_environment() -> int | None:
    text = os.environ.get(SEED_ENV)
    if text is None or not text.strip():
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(
            f"{SEED_ENV}={text!r} in the environment is not a seed: expected an integer in "
            f"[0, {MAX_SEED}] (seed_everything(seed) sets it)"
        ) from None
    return _checked(value, SEED_ENV)


def _checked(seed: object, what: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(
            f"{what}={seed!r} ({type(seed).__name__}) is not a seed: expected an int in "
            f"[0, {MAX_SEED}]"
        )
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{what}={seed} is out of range: a seed is an int in [0, {MAX_SEED}]")
    return seed
