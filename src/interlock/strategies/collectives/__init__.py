"""Collectives: one implementation of each cross-process operation."""

from interlock.strategies.collectives.base import REDUCE_OPS, Collective, ReduceOp
from interlock.strategies.collectives.single_device import SingleDeviceCollective
from interlock.strategies.collectives.torch_collective import TorchCollective

__all__ = ["REDUCE_OPS", "Collective", "ReduceOp", "SingleDeviceCollective", "TorchCollective"]
