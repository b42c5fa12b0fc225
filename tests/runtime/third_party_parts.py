"""Parts a third-party package would ship, named by the rows in test_registered_parts.py
as ``"third_party_parts:Class"`` factories."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.optim import Optimizer

from interlock.strategies.environments import LocalEnvironment
from interlock.strategies.io import TorchCheckpointIO
from interlock.strategies.precision import Precision


class CountingPrecision(Precision):
    """float32 that counts the batches it converts (to prove it is the one in use)."""

    def __init__(self, precision: str, device_type: str) -> None:
        self.precision = precision
        self.device_type = device_type
        self.inputs = 0

    @classmethod
    def for_precision(cls, precision: str, device_type: str) -> Precision:
        return cls(precision, device_type)

    def convert_input(self, data: Any) -> Any:
        self.inputs += 1
        return data


class GradSumPrecision(Precision):
    """float32 that keeps, per parameter, the sum of its gradients in the optimizer's
    state beside the optimizer's own (a state key torch's own step does not create)."""

    KEY = "ilk_grad_sum"

    def __init__(self, precision: str) -> None:
        self.precision = precision

    @classmethod
    def for_precision(cls, precision: str, device_type: str) -> Precision:
        return cls(precision)

    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        # after the step: the optimizer creates its own state on a parameter's first
        result = optimizer.step(**kwargs)
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    state = optimizer.state[param]
                    total = state.get(self.KEY)
                    state[self.KEY] = (param.grad.detach().clone() if total is None
                                       else total + param.grad.detach())
        return result


class GridEnvironment(LocalEnvironment):
    """One process of an in-house grid scheduler; everything else as on one machine."""

    name = "probe_grid"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__(environ)

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> bool:
        return environ is not None and "PROBE_GRID_JOB" in environ


class TaggedCheckpointIO(TorchCheckpointIO):
    """A third party's checkpoint IO: torch's format, with its own name."""

    name = "probe_tagged"


class NotACheckpointIO:
    """What a broken checkpoint IO row's factory makes."""
