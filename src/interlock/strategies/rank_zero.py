"""Output from global rank 0 only, and how a process knows its global rank.

Importing this module does not import torch: a logger can be made at import time,
before any process exists, and decides at every record which rank it is running in.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

__all__ = ["RankZeroLogger", "process_rank", "rank_zero_logger"]


def process_rank() -> int:
    """This process's global rank: the process group's once one exists, before that the
    ``RANK`` environment variable (torchrun, interlock's launchers), else 0.

    Raises:
        ValueError: ``RANK`` is set to something that is not a non-negative integer.
    """
    # no process group can exist unless torch.distributed was imported: looking it up
    # in sys.modules keeps this (and every logging call) from importing torch
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    value = os.environ.get("RANK", "0").strip() or "0"
    if not (value.isascii() and value.isdigit()):  # isdigit alone accepts "¹"
        raise ValueError(
            f"RANK={value!r} in the environment is not a rank: expected a non-negative "
            "integer (the launcher sets it; unset it to run as rank 0)"
        )
    return int(value)


if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:  # LoggerAdapter is subscriptable at runtime only from Python 3.11
    _Adapter = logging.LoggerAdapter


class RankZeroLogger(_Adapter):
    """A ``logging.Logger`` stand-in whose records are emitted on global rank 0 only.

    Every other rank drops them before formatting. Handlers, levels and propagation are
    those of the wrapped logger; the rank is read at each call (:func:`process_rank`).
    """

    def isEnabledFor(self, level: int) -> bool:
        return self.logger.isEnabledFor(level) and process_rank() == 0

    def process(self, msg: object, kwargs: MutableMapping[str, Any]
                ) -> tuple[object, MutableMapping[str, Any]]:
        return msg, kwargs  # the caller's ``extra`` as it is (the base class replaces it)


def rank_zero_logger(name: str | None = None) -> RankZeroLogger:
    """``logging.getLogger(name)``, emitting on global rank 0 only.

    Example:
        >>> log = interlock.rank_zero_logger(__name__)
        >>> log.info("epoch %d: loss %.3f", epoch, loss)  # once, not once per rank
    """
    return RankZeroLogger(logging.getLogger(name))
