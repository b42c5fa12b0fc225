"""Loading a part row's ``"package.module:Class"`` factory, the one way every part kind
(precision, accelerator, cluster environment, launcher) becomes an object."""

from __future__ import annotations

import importlib
from typing import Any

from interlock.connector.tables import INSTALL_HINTS


def load_part(noun: str, name: str, factory: str, requires: tuple[str, ...] = ()) -> Any:
    """Import what ``factory`` names for the ``noun`` row ``name``.

    Raises:
        ImportError: the module or attribute cannot be imported, naming the row, the
            factory and, for rows that need optional packages, how to install them.
    """
    module_name, _, attribute = factory.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        hints = "; ".join(INSTALL_HINTS[p] for p in requires if p in INSTALL_HINTS)
        raise ImportError(
            f"{noun} {name!r} is implemented by {factory}, which cannot be imported: "
            f"{exc}" + (f" (install: {hints})" if hints else "")
        ) from exc
    return target
