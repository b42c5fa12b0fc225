"""`XLAEnvironment`: ranks from the torch_xla runtime (PJRT) on a TPU host."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Mapping
from types import ModuleType

from interlock.engine.errors import ResolutionError
from interlock.engine.tables import INSTALL_HINTS
from interlock.strategies.environments.base import ClusterEnvironment


def _runtime() -> ModuleType:
    try:
        return importlib.import_module("torch_xla.runtime")
    except ImportError as exc:
        raise ResolutionError(
            "missing-package",
            flag="accelerator",
            value="xla",
            reason="the xla cluster environment reads ranks from torch_xla, which is not "
            f"installed; install it with {INSTALL_HINTS['torch_xla']}.",
        ) from exc


class XLAEnvironment(ClusterEnvironment):
    """Ranks from ``torch_xla.runtime``, imported on first use.

    The XLA runtime does its own rendezvous, so there is no main address or port to
    give: :attr:`main_address` and :attr:`main_port` raise ``NotImplementedError``.
    Processes are started by interlock's xla launcher, not externally. Detected only
    where torch_xla is importable; environment variables play no part.
    """

    name = "xla"

    @property
    def creates_processes_externally(self) -> bool:
        return False

    @property
    def main_address(self) -> str:
        raise NotImplementedError(
            "the XLA runtime (PJRT) performs its own rendezvous; there is no main address"
        )

    @property
    def main_port(self) -> int:
        raise NotImplementedError(
            "the XLA runtime (PJRT) performs its own rendezvous; there is no main port"
        )

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> bool:
        """Whether torch_xla is importable (``environ`` is not consulted)."""
        if "torch_xla" in sys.modules:
            return sys.modules["torch_xla"] is not None
        return importlib.util.find_spec("torch_xla") is not None

    def world_size(self) -> int:
        return int(_runtime().world_size())

    def global_rank(self) -> int:
        return int(_runtime().global_ordinal())

    def local_rank(self) -> int:
        return int(_runtime().local_ordinal())

    def node_rank(self) -> int:
        return int(_runtime().host_index())
