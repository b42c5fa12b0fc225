"""`TransformerEnginePrecision`: NVIDIA Transformer Engine FP8 layers.

``transformer_engine`` is imported when the plugin is created, never at import time.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from interlock.engine.tables import INSTALL_HINTS
from interlock.strategies.precision.base import Precision
from interlock.strategies.precision.true import TruePrecision
from interlock.strategies.precision.utils import check_one_of, default_dtype

#: the precisions this plugin implements and the dtype of everything outside FP8 GEMMs
TE_DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {"transformer-engine": torch.bfloat16, "transformer-engine-float16": torch.float16}
)


class MissingPackageError(ImportError):
    """An optional package a precision needs is not installed."""


def _import_te(precision: str) -> tuple[Any, Any]:
    """``transformer_engine.pytorch`` and its recipe module, or a MissingPackageError."""
    try:
        te = importlib.import_module("transformer_engine.pytorch")
        recipe = importlib.import_module("transformer_engine.common.recipe")
    except ImportError as exc:
        raise MissingPackageError(
            f"precision={precision!r} needs the transformer_engine package, which could "
            f"not be imported ({exc}); install it with: "
            f"{INSTALL_HINTS['transformer_engine']}"
        ) from exc
    return te, recipe


class TransformerEnginePrecision(TruePrecision):
    """FP8 matrix multiplies through Transformer Engine; bfloat16 or float16 elsewhere.

    Args:
        precision: ``"transformer-engine"`` (bfloat16 parameters) or
            ``"transformer-engine-float16"`` (float16 parameters).
        recipe: an FP8 recipe; a default ``DelayedScaling()`` when None.
        replace_layers: swap ``nn.Linear``/``nn.LayerNorm`` for TE layers in
            :meth:`convert_module`.

    Raises:
        ValueError: for any other precision name.
        MissingPackageError: when ``transformer_engine`` cannot be imported.
    """

    @classmethod
    def for_precision(cls, precision: str, device_type: str) -> Precision:
        return cls(precision)

    def __init__(self, precision: str, recipe: Any = None, replace_layers: bool = True) -> None:
        check_one_of("TransformerEnginePrecision", "precision", precision, TE_DTYPES)
        self._te, recipes = _import_te(precision)
        self.precision = precision
        self.dtype = TE_DTYPES[precision]
        self.recipe: Any = recipe if recipe is not None else recipes.DelayedScaling()
        self.replace_layers = replace_layers

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast to :attr:`dtype`, then swap eligible layers for TE ones (weights copied)."""
        module = module.to(dtype=self.dtype)
        return self._replace(module) if self.replace_layers else module

    def _replace(self, module: nn.Module) -> nn.Module:
        new = self._te_layer(module)
        if new is not None:
            return new
        for name, child in module.named_children():
            setattr(module, name, self._replace(child))
        return module

    def _te_layer(self, layer: nn.Module) -> nn.Module | None:
        """The TE equivalent of ``layer`` with its weights, or None to keep it."""
        te = self._te
        new: nn.Module
        pairs: list[tuple[Any, torch.Tensor]]
        # FP8 GEMMs need both dimensions divisible by 16; other Linears stay as they are.
        if (isinstance(layer, nn.Linear) and layer.in_features % 16 == 0
                and layer.out_features % 16 == 0):
            new = te.Linear(layer.in_features, layer.out_features,
                            bias=layer.bias is not None, params_dtype=self.dtype,
                            device=layer.weight.device)
            pairs = [(new.weight, layer.weight)]
            if layer.bias is not None:
                pairs.append((new.bias, layer.bias))
        elif (isinstance(layer, nn.LayerNorm) and len(layer.normalized_shape) == 1
              and layer.weight is not None and layer.bias is not None):
            new = te.LayerNorm(layer.normalized_shape[0], eps=layer.eps,
                               params_dtype=self.dtype, device=layer.weight.device)
            pairs = [(new.weight, layer.weight), (new.bias, layer.bias)]
        else:
            return None
        with torch.no_grad():
            for target, source in pairs:
                target.copy_(source)
        return new

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        """FP8 autocast with :attr:`recipe`, default dtype :attr:`dtype`."""
        with default_dtype(self.dtype), self._te.fp8_autocast(
            enabled=True, fp8_recipe=self.recipe
        ):
            yield
