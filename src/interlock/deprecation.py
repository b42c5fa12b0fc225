"""Deprecations: the one way a public name, parameter or value is retired (the policy:
docs/api-policy.md). The helpers live in the engine, `interlock.engine.deprecation`,
so that the engine can use them too; this is their public path."""

from __future__ import annotations

from interlock.engine.deprecation import (
    InterlockDeprecationWarning,
    deprecated,
    deprecation_message,
    moved_names,
    removal_version,
    warn_deprecated,
)

__all__ = ["InterlockDeprecationWarning", "deprecated", "deprecation_message", "moved_names",
           "removal_version", "warn_deprecated"]
