"""`ModelShape`: what the memory estimate needs to know of a model, and nothing else.

A shape holds sizes, never weights: a 405B model's shape is a few numbers, written by
hand or measured from a module (`interlock.model_shape`, on the meta device too). Pure
Python: the engine reads it without importing torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from interlock.engine.limits import short_repr

#: the most parameters a shape may declare: 10**15, a thousand times the largest model
#: trained today; a larger number is a typo (or an exponent too many)
MAX_PARAMETERS = 10**15
#: the most bytes any size in a shape may be (an exabyte)
MAX_BYTES = 10**18
#: the most entries of ``layers`` and ``tensor_rows`` (a shape is a summary; a model
#: with more tensors than this is given by its totals)
MAX_ENTRIES = 1_000_000

#: bytes per element of the dtypes a shape and a precision may name
DTYPE_BYTES: Mapping[str, int] = MappingProxyType({
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
})


def _count(name: str, value: object, *, least: int = 0, most: int = MAX_PARAMETERS,
           what: str = "a count of elements") -> int:
    """An int within ``[least, most]``; floats that hold an integer (``7e9``) are taken."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= most * 10:
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"ModelShape.{name} must be {what} (an int), got {short_repr(value)}")
    if not least <= value <= most:
        bound = f"{most:,}" if most < MAX_BYTES else f"{most:.0e}"
        raise ValueError(f"ModelShape.{name} must be from {least} to {bound} ({what}), got "
                         f"{short_repr(value)}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """A model's sizes: what `interlock.plan` needs to say what each rank holds.

    Only ``parameters`` is required; every other field refines the estimate, and the
    plan's trace says which fields it used. `interlock.model_shape(module)` measures all
    of them from a module.

    Attributes:
        parameters: elements of the trainable parameters (those with
            ``requires_grad``): they have gradients and optimizer state.
        dtype: the dtype the parameters are created in (``"float32"``). Precisions
            whose row stores parameters in another dtype (``bf16-true``, ``64-true``)
            cast them; ``32-true`` and the mixed precisions keep this one.
        frozen_parameters: elements of parameters without gradients (a frozen
            backbone): held, sharded like the others, but never stepped.
        buffer_bytes: bytes of the module's buffers (running statistics, caches),
            which every rank holds whole.
        tensors: how many trainable parameter tensors there are (optimizers such as
            Adam keep a 4-byte step counter per tensor). None: counted as one.
        tensor_parallel: elements, among ``parameters``, of the weights a tensor-parallel
            plan splits over ``tp`` (attention and MLP projections; embeddings, norms
            and the biases of row-wise layers usually stay whole).
        layers: the trainable elements of the model's consecutive top-level layers, in
            order (an ``nn.Sequential``'s children with parameters): a pipeline puts
            runs of them on its stages, and its largest stage is what one rank holds.
            Empty: the stages are taken as equal.
        largest_unit: elements a sharded strategy gathers at once: its largest FSDP unit
            (the largest layer, when every layer is wrapped as its own unit; the whole
            model when only the root is sharded, an ``FSDPStrategy`` without
            ``auto_wrap_policy``). None: not known, and the gathered units are left out
            of the estimate (the plan says so).
        tensor_rows: per trainable tensor, ``(rows, elements)``: its first dimension and
            its size. FSDP shards every tensor by rows and pads the last shard, so with
            these the estimate of a rank's shard is exact; without, it is the share of
            the elements.
        activation_bytes_per_sample: bytes of activations one sample keeps for the
            backward pass on one rank without tensor, context or pipeline parallelism.
            None: activations are not estimated (``Plan.memory.activation_bytes`` is
            None) and nothing is refused for them.
        largest_activation_bytes_per_sample: the largest single tensor among those, per
            sample. When the backward pass starts, its gradient and the gradient of the
            tensor it was computed from exist beside every activation (a language
            model's logits: the loss's gradient and the logits' own), so twice this is
            added to the activations. None: not added.

    Raises:
        ValueError: a size that is negative, not an integer, absurd (beyond
            `MAX_PARAMETERS` elements or `MAX_BYTES` bytes), or inconsistent with the
            others (layers that do not add up, tensor-parallel weights that outnumber the
            parameters).
    """

    parameters: int
    dtype: str = "float32"
    frozen_parameters: int = 0
    buffer_bytes: int = 0
    tensors: int | None = None
    tensor_parallel: int = 0
    layers: tuple[int, ...] = ()
    largest_unit: int | None = None
    tensor_rows: tuple[tuple[int, int], ...] = field(default=(), repr=False)
    activation_bytes_per_sample: int | None = None
    largest_activation_bytes_per_sample: int | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "parameters", _count("parameters", self.parameters, least=1,
                                       what="the number of trainable parameter elements"))
        if not isinstance(self.dtype, str) or self.dtype.removeprefix("torch.") not in DTYPE_BYTES:
            raise ValueError(f"ModelShape.dtype must be a dtype name such as 'float32' or "
                             f"'bfloat16', got {short_repr(self.dtype)}; known: "
                             f"{', '.join(DTYPE_BYTES)}")
        put(self, "dtype", self.dtype.removeprefix("torch."))
        put(self, "frozen_parameters", _count("frozen_parameters", self.frozen_parameters))
        put(self, "buffer_bytes", _count("buffer_bytes", self.buffer_bytes, most=MAX_BYTES,
                                         what="a size in bytes"))
        if self.tensors is not None:
            put(self, "tensors", _count("tensors", self.tensors, least=1,
                                        most=min(self.parameters, MAX_ENTRIES),
                                        what="the number of trainable tensors, at most one "
                                        "per element"))
        put(self, "tensor_parallel", _count("tensor_parallel", self.tensor_parallel,
                                            most=self.parameters,
                                            what="elements among `parameters`"))
        put(self, "layers", self._layers())
        if self.largest_unit is not None:
            put(self, "largest_unit", _count("largest_unit", self.largest_unit, least=1,
                                             most=self.parameters + self.frozen_parameters,
                                             what="elements of one unit, at most the "
                                             "model's"))
        put(self, "tensor_rows", self._tensor_rows())
        if self.activation_bytes_per_sample is not None:
            put(self, "activation_bytes_per_sample",
                _count("activation_bytes_per_sample", self.activation_bytes_per_sample,
                       most=MAX_BYTES, what="a size in bytes"))
        if self.largest_activation_bytes_per_sample is not None:
            if self.activation_bytes_per_sample is None:
                raise ValueError("ModelShape.largest_activation_bytes_per_sample is one of "
                                 "the activations: give activation_bytes_per_sample too")
            put(self, "largest_activation_bytes_per_sample",
                _count("largest_activation_bytes_per_sample",
                       self.largest_activation_bytes_per_sample,
                       most=self.activation_bytes_per_sample,
                       what="a size in bytes, at most activation_bytes_per_sample"))

    def _layers(self) -> tuple[int, ...]:
        if not isinstance(self.layers, (tuple, list)):
            raise ValueError("ModelShape.layers must be a sequence of element counts, got "
                             f"{short_repr(self.layers)}")
        if len(self.layers) > MAX_ENTRIES:
            raise ValueError(f"ModelShape.layers has {len(self.layers):,} entries; at most "
                             f"{MAX_ENTRIES:,}")
        layers = tuple(_count("layers[]", n, least=1, what="a layer's trainable elements")
                       for n in self.layers)
        if layers and sum(layers) != self.parameters:
            raise ValueError(f"ModelShape.layers add up to {sum(layers):,} elements, but "
                             f"parameters is {self.parameters:,}: list every layer with "
                             "trainable parameters, in order")
        return layers

    def _tensor_rows(self) -> tuple[tuple[int, int], ...]:
        rows = self.tensor_rows
        if not isinstance(rows, (tuple, list)) or len(rows) > MAX_ENTRIES:
            raise ValueError("ModelShape.tensor_rows must be a sequence of at most "
                             f"{MAX_ENTRIES:,} (rows, elements) pairs")
        pairs: list[tuple[int, int]] = []
        for pair in rows:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError("ModelShape.tensor_rows holds (rows, elements) pairs, got "
                                 f"{short_repr(pair)}")
            count, size = (_count("tensor_rows[]", n, least=1) for n in pair)
            if size % count:
                raise ValueError(f"ModelShape.tensor_rows: {size:,} elements do not make "
                                 f"{count:,} equal rows")
            pairs.append((count, size))
        if pairs and sum(size for _, size in pairs) != self.parameters:
            raise ValueError(f"ModelShape.tensor_rows add up to "
                             f"{sum(size for _, size in pairs):,} elements, but parameters "
                             f"is {self.parameters:,}: give one pair per trainable tensor")
        if pairs and self.tensors is not None and len(pairs) != self.tensors:
            raise ValueError(f"ModelShape.tensor_rows has {len(pairs)} pairs but tensors is "
                             f"{self.tensors}")
        return tuple(pairs)

    def __repr__(self) -> str:
        # only what differs from the defaults: a refusal quotes the shape it was given
        given = [f"{name}={getattr(self, name)!r}" for name, default in _REPR_FIELDS
                 if getattr(self, name) != default]
        given.extend(f"{name}=<{len(getattr(self, name))} entries>"
                     for name in ("layers", "tensor_rows") if getattr(self, name))
        return f"ModelShape({', '.join(given)})"

    @property
    def tensor_count(self) -> int:
        """Trainable tensors: ``tensors``, else one per ``tensor_rows`` pair, else 1."""
        if self.tensors is not None:
            return self.tensors
        return len(self.tensor_rows) or 1

    def describe(self) -> str:
        """One line, for the plan's explanation."""
        text = f"{_elements(self.parameters)} trainable parameters in {self.dtype}"
        if self.frozen_parameters:
            text += f", {_elements(self.frozen_parameters)} frozen"
        if self.buffer_bytes:
            text += f", {self.buffer_bytes:,} bytes of buffers"
        return text

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly view (``tensor_rows`` by its length only)."""
        found = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**found, "tensors": self.tensor_count, "layers": len(self.layers),
                "tensor_rows": len(self.tensor_rows)}


#: the fields a repr names when they differ from their defaults (``parameters`` always)
_REPR_FIELDS = tuple((f.name, f.default) for f in fields(ModelShape)
                     if f.name not in ("layers", "tensor_rows"))


def _elements(count: int) -> str:
    """``7.00B``, ``350M``, ``12,345``: a parameter count for people."""
    for size, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M")):
        if count >= size:
            return f"{count / size:.3g}{suffix}"
    return f"{count:,}"


__all__ = ["DTYPE_BYTES", "MAX_BYTES", "MAX_PARAMETERS", "ModelShape"]
