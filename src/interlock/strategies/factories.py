"""Loading a part row's ``"package.module:Class"`` factory, the one way every part kind
(precision, accelerator, cluster environment, launcher, checkpoint IO) becomes an object."""

from __future__ import annotations

from interlock.connector.registry import load_reference as load_part

__all__ = ["load_part"]
