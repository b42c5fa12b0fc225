"""Test helpers: launch any parallel strategy's ranks as forked children of the test
process, and compare results with messages that say what was compared.

Strategies whose table launcher re-runs the script (fsdp, model_parallel) cannot
re-run pytest; forking the ranks directly exercises everything else for real: the
rendezvous, the process group, setup and teardown in every rank, failure reporting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from interlock.strategies.base import _run_worker
from interlock.strategies.launchers import MultiProcessingLauncher
from interlock.strategies.parallel import ParallelStrategy

T = TypeVar("T")


def launch_forked(strategy: ParallelStrategy, fn: Callable[..., T], *args: Any,
                  **kwargs: Any) -> T:
    """``strategy.launch(fn, ...)``, but with forked worker processes."""
    launcher = MultiProcessingLauncher(start_method="fork",
                                       num_processes=strategy.num_processes)
    result: T = launcher.launch(_run_worker, strategy, fn, args, kwargs)
    return result


def close(actual: Any, expected: Any, what: str, rtol: float | None = None,
          atol: float | None = None) -> None:
    """assert_close whose message says what was compared."""
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")
