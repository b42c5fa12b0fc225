"""`Parallelism`: the degrees a job is split by, and the `MeshLayout` they make.

Glossary (outermost mesh dimension first):

pp (pipeline parallel)
    the model's layers are cut into stages, one per pipeline rank; micro-batches flow
    from stage to stage. Ranks of different stages see the same batch.
dp_replicate (replicated data parallel)
    whole copies of the (possibly sharded) model; gradients are averaged across them
    (DDP, or the replicate dimension of HSDP).
dp_shard (sharded data parallel)
    FSDP: each rank holds a shard of every parameter, gathered for compute.
cp (context parallel)
    a long sequence is split across ranks; attention exchanges keys and values.
tp (tensor parallel)
    each layer's weights are split across ranks that see the same batch.

Ranks form one mesh of shape ``(pp, dp_replicate, dp_shard, cp, tp)`` in row-major
order: ``tp`` varies fastest, so tensor-parallel neighbours are consecutive ranks, on
the same node, where links are fastest; ``pp`` varies slowest, because a pipeline only
sends activations between neighbouring stages and tolerates slow links.

Three flattened groups have stated roles:

``dp`` = dp_replicate x dp_shard
    the data-loading group: ranks that see different batches
    (``strategy.data_parallel_size`` / ``data_parallel_rank``).
``dp_shard_cp`` = dp_shard x cp
    the sharding group: FSDP shards parameters over it.
``dp_cp`` = dp_replicate x dp_shard x cp
    the loss-reduction group: gradients (and the logged loss) are averaged over it.

Pure Python: the engine validates degrees without importing torch; the runtime builds
the `torch.distributed.device_mesh.DeviceMesh` from a `MeshLayout`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Literal, TypeAlias

from interlock.engine.errors import ResolutionError, did_you_mean
from interlock.engine.limits import short_repr

#: a degree as written: an int >= 1, or "auto" (also spelled -1) for "what is left"
Degree: TypeAlias = int | Literal["auto"]

#: the mesh dimensions, outermost (slowest-varying) first
DIMS: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

#: what each dimension does, in words (rendered into the docs and errors)
DIM_DOCS: Mapping[str, str] = MappingProxyType({
    "pp": "pipeline parallel: layers cut into stages",
    "dp_replicate": "replicated data parallel: whole copies, gradients averaged",
    "dp_shard": "sharded data parallel (FSDP): parameters sharded",
    "cp": "context parallel: sequences split",
    "tp": "tensor parallel: each layer's weights split",
})

#: the flattened groups the runtime derives, by name: (dimensions, role)
FLATTENED: Mapping[str, tuple[tuple[str, ...], str]] = MappingProxyType({
    "dp": (("dp_replicate", "dp_shard"),
           "data loading: the ranks that see different batches"),
    "dp_shard_cp": (("dp_shard", "cp"),
                    "sharding: FSDP shards parameters over it"),
    "dp_cp": (("dp_replicate", "dp_shard", "cp"),
              "loss reduction: gradients and the loss are averaged over it"),
})

#: the largest degree accepted (a world is at most `limits.MAX_WORLD_SIZE` ranks)
_MAX_DEGREE = 1 << 23


def _refuse(value: object, reason: str, choices: tuple[str, ...] = (),
            suggestion: str | None = None) -> ResolutionError:
    return ResolutionError("invalid-parallelism", flag="parallelism", value=value,
                           reason=reason, choices=choices, suggestion=suggestion)


def _degree(name: str, value: object, whole: object) -> Degree:
    """One degree as written, checked: an int from 1, ``"auto"`` or ``-1``."""
    if type(value) is int and 1 <= value <= _MAX_DEGREE:  # the common case, first
        return value
    if isinstance(value, str) and value.strip().lower() in ("auto", "-1"):
        return "auto"
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 9:
        value = int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool):
        if value == -1:
            return "auto"
        if 1 <= value <= _MAX_DEGREE:
            return value
        raise _refuse(whole, f"{name}={short_repr(value)} is not a degree: a degree is an "
                      f"int from 1 to {_MAX_DEGREE:,}, or 'auto' (also -1) for what the "
                      "other degrees leave of the world.")
    raise _refuse(whole, f"{name}={short_repr(value)} is not a degree: expected an int "
                  f">= 1 or 'auto' (also -1), got {type(value).__name__}.")


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallelism:
    """Degrees of parallelism, as asked for: ints >= 1 or ``"auto"`` (-1), at most one
    ``"auto"``, which takes what the others leave of the world.

    The defaults shard data parallel over the whole world (FSDP). A plan's
    `interlock.Plan.parallelism` is a `Parallelism` with every degree an int whose
    product is the world size. See the module docstring for the glossary.

    Raises:
        ResolutionError: ``invalid-parallelism`` for a degree that is not an int >= 1 or
            ``"auto"``, or more than one ``"auto"``.
    """

    dp_replicate: Degree = 1
    dp_shard: Degree = "auto"
    tp: Degree = 1
    pp: Degree = 1
    cp: Degree = 1

    def __post_init__(self) -> None:
        # every plan makes a few of these: an int degree and 'auto' as such are taken
        # as they are, anything else is checked and normalised (`_degree`)
        autos: list[str] = []
        for name in DIMS:
            value = getattr(self, name)
            if type(value) is int and 1 <= value <= _MAX_DEGREE:
                continue
            if not (type(value) is str and value == "auto"):
                value = _degree(name, value, self)
                object.__setattr__(self, name, value)
            if value == "auto":
                autos.append(name)
        if len(autos) > 1:
            raise _refuse(
                self.describe(),
                f"{' and '.join(autos)} are all 'auto', but only one degree can take "
                "what the others leave of the world (dp_shard is 'auto' unless set).",
                choices=tuple(f"{a}=<int>" for a in autos),
            )

    # ------------------------------------------------------------------ reading

    @classmethod
    def from_flag(cls, value: object) -> Parallelism:
        """The ``parallelism=`` flag as a `Parallelism`: an instance, a mapping of
        dimension names to degrees (the others keep their defaults), or text such as
        ``"dp_replicate=2,dp_shard=2"``.

        Raises:
            ResolutionError: ``invalid-parallelism`` naming what cannot be read.
        """
        if isinstance(value, Parallelism):
            return value
        if isinstance(value, str):
            return cls.from_flag(_parse_text(value))
        if not isinstance(value, Mapping):
            raise _refuse(value, "expected interlock.Parallelism(...), a mapping such as "
                          "{'dp_shard': 2, 'tp': 2} or text such as 'dp_shard=2,tp=2'; got "
                          f"{type(value).__name__}.")
        given: dict[str, object] = {}
        for key, degree in value.items():
            name = key.strip().lower() if isinstance(key, str) else key
            if name not in DIMS:
                raise _refuse(
                    short_repr(dict(value)),
                    f"{short_repr(key)} is not a dimension of parallelism.",
                    choices=DIMS, suggestion=did_you_mean(name, DIMS),
                )
            given[str(name)] = degree
        return cls(**given)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ views

    def degrees(self) -> dict[str, Degree]:
        """Every degree by dimension, outermost first."""
        return {name: getattr(self, name) for name in DIMS}

    def given(self) -> dict[str, Degree]:
        """The degrees that differ from the defaults, outermost first."""
        defaults = {f.name: f.default for f in fields(Parallelism)}
        return {k: v for k, v in self.degrees().items() if v != defaults[k]}

    @property
    def auto(self) -> str | None:
        """The dimension that is ``"auto"``, if any."""
        return next((name for name in DIMS if getattr(self, name) == "auto"), None)

    @property
    def resolved(self) -> bool:
        """Whether every degree is an int."""
        return self.auto is None

    @property
    def world_size(self) -> int:
        """The product of the degrees (only once resolved)."""
        if not self.resolved:
            raise ValueError(f"{self.describe()} has an 'auto' degree: no world size yet")
        return math.prod(int(v) for v in self.degrees().values())

    @property
    def data_parallel(self) -> int:
        """The size of ``dp`` (dp_replicate x dp_shard): how many different batches a
        step sees."""
        return self.group_size("dp")

    def group_size(self, group: str) -> int:
        """The size of a flattened group of `FLATTENED` (``"dp_shard_cp"``, the
        sharding group): the product of its dimensions' degrees.

        Raises:
            ValueError: ``group`` is not a flattened group, or one of its degrees is
                still ``"auto"``.
        """
        found = FLATTENED.get(group) if isinstance(group, str) else None
        if found is None:
            raise ValueError(f"no flattened group {short_repr(group)}; the groups: "
                             f"{', '.join(FLATTENED)}")
        degrees = [getattr(self, dim) for dim in found[0]]
        if "auto" in degrees:
            raise ValueError(f"{self.describe()} has an 'auto' degree in {group}: no size "
                             "yet")
        return math.prod(degrees)

    def enabled(self) -> tuple[str, ...]:
        """The dimensions with a degree other than 1, outermost first."""
        return tuple(name for name in DIMS if getattr(self, name) != 1)

    def describe(self) -> str:
        """``"pp=1, dp_replicate=2, dp_shard=2, cp=1, tp=1"``."""
        return ", ".join(f"{k}={v!r}" if v == "auto" else f"{k}={v}"
                         for k, v in self.degrees().items())

    def to_dict(self) -> dict[str, Degree]:
        return self.degrees()


def _parse_text(text: str) -> dict[str, object]:
    """``"dp_replicate=2, dp_shard=auto"`` as a mapping (values still text)."""
    result: dict[str, object] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, degree = item.partition("=")
        if not sep:
            raise _refuse(text, f"{short_repr(item)} is not 'dimension=degree'.",
                          choices=tuple(f"{d}=<int|auto>" for d in DIMS))
        if name.strip() in result:
            raise _refuse(text, f"{name.strip()!r} is given twice; give each dimension "
                          "once.", choices=tuple(f"{d}=<int|auto>" for d in DIMS))
        result[name.strip()] = degree.strip()
    if not result:
        raise _refuse(text, "no degrees given; write 'dimension=degree' pairs separated by "
                      "commas.", choices=tuple(f"{d}=<int|auto>" for d in DIMS))
    return result


def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n``, ascending (``n`` is at most a world size)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


def fill(requested: Parallelism, world_size: int, *, where: str) -> Parallelism:
    """``requested`` with its ``"auto"`` degree filled in so that the degrees multiply
    to ``world_size``.

    Args:
        where: how the world is made, for messages (``"2 nodes x 4 devices"``).

    Raises:
        ResolutionError: ``invalid-parallelism`` showing the arithmetic and the values
            that would fit.
    """
    fixed = {k: int(v) for k, v in requested.degrees().items() if v != "auto"}
    product = math.prod(fixed.values())
    auto = requested.auto
    if auto is not None:
        if world_size % product:
            shown = _product_text(fixed, product)
            raise _refuse(
                requested.describe(),
                f"{shown} does not divide the world size {world_size} ({where}), so "
                f"{auto}='auto' has no whole value; the other degrees must multiply to a "
                f"divisor of {world_size}.",
                choices=_completions(fixed, world_size, divides=True),
            )
        degrees: dict[str, int] = {**fixed, auto: world_size // product}
        return Parallelism(**degrees)
    if product != world_size:
        shown = _product_text(fixed, product)
        raise _refuse(
            requested.describe(),
            f"{shown}, but the world has {world_size} ranks ({where}); the degrees must "
            f"multiply to {world_size}.",
            choices=_completions(fixed, world_size, divides=False),
        )
    return requested


def _product_text(fixed: dict[str, int], product: int) -> str:
    """``"tp=2 x pp=3 = 6"``: the degrees above 1 and their product, for a refusal."""
    named = [f"{k}={v}" for k, v in fixed.items() if v != 1]
    return " x ".join(named) + (f" = {product}" if len(named) > 1 else "") if named else "1"


def _completions(fixed: dict[str, int], world_size: int, *, divides: bool) -> tuple[str, ...]:
    """Changes of one degree that would fit: the degrees of a dimension set above 1
    that make the product divide ``world_size`` (``divides``, an 'auto' takes the rest)
    or equal it; then 'auto' on such a dimension, which always fits when the rest does."""
    product = math.prod(fixed.values())
    found: list[str] = []
    for name, degree in fixed.items():
        rest = product // degree
        if degree == 1 and divides:
            continue
        if divides:
            found += [f"{name}={d}" for d in divisors(world_size)
                      if (world_size // d) % rest == 0 and d != degree and d > 1][:4]
        elif world_size % rest == 0 and (degree != 1 or not found):
            found.append(f"{name}={world_size // rest}")
    return tuple(found)


@dataclass(frozen=True, slots=True)
class MeshLayout:
    """The device mesh a plan describes: every dimension, outermost first, with its
    size (size-1 dimensions included, so that code can always name any of them)."""

    dims: tuple[str, ...]
    shape: tuple[int, ...]

    @classmethod
    def of(cls, degrees: Parallelism) -> MeshLayout:
        return cls(dims=DIMS, shape=tuple(int(getattr(degrees, d)) for d in DIMS))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def sizes(self) -> dict[str, int]:
        return dict(zip(self.dims, self.shape, strict=True))

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where global ``rank`` sits on each dimension (row-major: the last dimension
        varies fastest)."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside a mesh of {self.size} ranks")
        coords: dict[str, int] = {}
        for name, size in reversed(self.sizes().items()):
            rank, coords[name] = divmod(rank, size)
        return {name: coords[name] for name in self.dims}

    def flattened(self, name: str, rank: int) -> tuple[int, int]:
        """``(index, size)`` of ``rank`` within the flattened group ``name`` (one of
        `FLATTENED`): its coordinate over those dimensions, row-major."""
        dims = FLATTENED[name][0]
        coords, sizes = self.coordinates(rank), self.sizes()
        index, size = 0, 1
        for dim in dims:
            index, size = index * sizes[dim] + coords[dim], size * sizes[dim]
        return index, size

    def describe(self) -> str:
        """``"pp 1 x dp_replicate 2 x dp_shard 2 x cp 1 x tp 1"``."""
        return " x ".join(f"{d} {s}" for d, s in zip(self.dims, self.shape, strict=True))
