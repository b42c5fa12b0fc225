"""`OptimizerRow`: what an optimizer keeps per parameter, the one fact the memory
estimate needs of it. The built-in rows are torch.optim's common optimizers with their
default options; others join through `interlock.register` or the
``interlock.optimizers`` entry point group, like every part kind."""

from __future__ import annotations

from dataclasses import dataclass

from interlock.engine.limits import int_in, short_repr
from interlock.engine.model import DTYPE_BYTES
from interlock.engine.part_problems import Known, common_problems, state_tensors_problems
from interlock.engine.registration import NAME_PATTERN


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerRow:
    """An optimizer's state, by size.

    Attributes:
        name: the name ``plan(optimizer=...)`` takes (lowercase, digits, underscores).
        state_tensors: tensors of each parameter's size the optimizer keeps (Adam's two
            moments: 2; SGD with momentum: 1; plain SGD: 0).
        state_dtype: their dtype; None: the parameter's own (torch.optim's default).
        scalar_bytes: bytes kept per parameter tensor beside them (torch's Adam keeps its
            step count in a 4-byte float32 tensor).
        description: one line for the docs.
        factory: what it is, ``"package.module:Class"`` (documentation only: the engine
            never imports it).
    """

    name: str
    state_tensors: int
    state_dtype: str | None = None
    scalar_bytes: int = 0
    description: str
    factory: str


OPTIMIZERS: tuple[OptimizerRow, ...] = (
    OptimizerRow(name="sgd", state_tensors=0, factory="torch.optim:SGD",
                 description="SGD without momentum: no state"),
    OptimizerRow(name="sgd_momentum", state_tensors=1, factory="torch.optim:SGD",
                 description="SGD with momentum: one momentum buffer per parameter"),
    OptimizerRow(name="adam", state_tensors=2, scalar_bytes=4, factory="torch.optim:Adam",
                 description="Adam: first and second moments, and a step count per tensor"),
    OptimizerRow(name="adamw", state_tensors=2, scalar_bytes=4, factory="torch.optim:AdamW",
                 description="AdamW: first and second moments, and a step count per tensor"),
    OptimizerRow(name="adagrad", state_tensors=1, scalar_bytes=4,
                 factory="torch.optim:Adagrad",
                 description="Adagrad: a running sum of squares, and a step count per tensor"),
    OptimizerRow(name="rmsprop", state_tensors=1, scalar_bytes=4,
                 factory="torch.optim:RMSprop",
                 description="RMSprop without momentum: a running square average, and a "
                 "step count per tensor"),
    OptimizerRow(name="rmsprop_momentum", state_tensors=2, scalar_bytes=4,
                 factory="torch.optim:RMSprop",
                 description="RMSprop with momentum: a square average and a momentum buffer"),
)

#: what ``plan()`` assumes when a model is given without an optimizer (the plan says so
#: in its notes): the commonest choice, and the one with the most state among them
DEFAULT_OPTIMIZER = "adamw"



def optimizer_problems(row: OptimizerRow, known: Known) -> list[str]:
    """Everything wrong with a would-be optimizer row (the registry's check of the
    kind: it lives with the row type, as a new kind's would)."""
    problems: list[str] = []
    common_problems(row, NAME_PATTERN, problems)
    state_tensors_problems(row, problems)
    if not int_in(row.scalar_bytes, 0, 1 << 20):
        problems.append(f"scalar_bytes must be an int from 0 to {1 << 20}, got "
                        f"{short_repr(row.scalar_bytes)}")
    if row.state_dtype is not None and row.state_dtype not in DTYPE_BYTES:
        problems.append(f"state_dtype {short_repr(row.state_dtype)} must be None (the "
                        f"parameters' dtype) or one of {', '.join(DTYPE_BYTES)}")
    return problems


__all__ = ["DEFAULT_OPTIMIZER", "OPTIMIZERS", "OptimizerRow", "optimizer_problems"]
