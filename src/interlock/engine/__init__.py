"""The resolution engine: typed rule stages over the compatibility tables.

It knows the strategies only as their rows' ``"module:Class"`` factory strings and never
imports the runtime; :func:`interlock.resolve` hands its `Plan` to the builder that
lives with the strategies.

Its public names are exported by `interlock` (``interlock.plan``, ``interlock.Plan``,
the row types, ...); this package exports none of its own, and its modules are free to
change (docs/api-policy.md).
"""
