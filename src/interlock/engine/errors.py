"""The one exception the engine raises, and the stable codes it carries."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from interlock.engine.limits import short_repr
from interlock.engine.trace import TraceStep
from interlock.engine.written import Written

#: Every refusal code the engine can raise, with its meaning. Codes are stable API:
#: a code is never reused for a different meaning.
ERROR_CODES: Mapping[str, str] = MappingProxyType(
    {
        "unknown-accelerator": "the accelerator name is not one the engine knows",
        "unknown-strategy": "no strategy is registered under that name",
        "broken-entry-point": "the name belongs to a third-party entry point "
        "(`interlock.strategies`, `interlock.precisions` or `interlock.accelerators`) that "
        "failed to load; the error names the entry point and says why",
        "unknown-option": "a strategy's options name a keyword its factory does not take "
        "(checked when the plan is built, where the factory is imported)",
        "unknown-precision": "the precision is neither a canonical name nor a legacy alias",
        "invalid-devices": "the devices value cannot be parsed, is beyond the bound on "
        "devices per node (`interlock.engine.limits`), or does not fit the accelerator "
        "or strategy",
        "invalid-num-nodes": "num_nodes is not an int >= 1, or it (or the world size it "
        "makes) is beyond its bound (`interlock.engine.limits`)",
        "invalid-plugin": "a plugin is of an unknown kind, or a kind was given twice",
        "conflicting-flags": "two flags set the same thing to different values",
        "accelerator-unavailable": "the machine has no device of that accelerator",
        "devices-unavailable": "more devices, or higher device ids, than the machine has",
        "missing-package": "an optional package the choice needs is not installed",
        "unsupported-accelerator": "the strategy cannot run on that accelerator",
        "unsupported-precision": "the precision is not supported by that strategy or "
        "accelerator",
        "unsupported-multi-node": "the strategy runs on one node only",
        "unknown-launcher": "the launcher is not one the engine knows (a built-in "
        "launcher row or a registered one)",
        "unsupported-launcher": "the strategy does not run under that launcher (a preset "
        "that pins another, or a strategy that runs in the calling process)",
        "interactive-incompatible": "the launcher cannot start processes from an "
        "interactive session",
        "start-method-unavailable": "the launcher needs a multiprocessing start method "
        "this platform lacks",
        "cluster-mismatch": "the job's geometry (from the cluster environment) disagrees "
        "with devices x num_nodes",
        "invalid-environment": "a cluster environment variable holds a value that cannot "
        "be read",
        "invalid-parallelism": "the degrees of parallelism cannot be read, or do not fit "
        "the world (their product, divisibility, 'auto', tensor parallel split across "
        "nodes); the message shows the arithmetic",
        "unsupported-parallelism": "the strategy, accelerator or precision cannot run a "
        "dimension of parallelism that was asked for",
        "invalid-model": "the model flag is not an `interlock.ModelShape`, or the "
        "micro-batch size is not an int >= 1",
        "unknown-optimizer": "the optimizer is not one the engine knows (a built-in "
        "optimizer row or a registered one)",
        "insufficient-memory": "a rank needs more memory than its device (or, for "
        "offloaded state, the host) has; the error gives the breakdown and the choices "
        "that fit",
    }
)

#: Codes raised when a plan is built (`Plan.build`, `interlock.resolve`), where the
#: strategy's factory is imported, rather than by a rule of the pure `plan()`. Still
#: raised before any process starts.
BUILD_ERROR_CODES: frozenset[str] = frozenset({"unknown-option"})

#: The flags a refusal can name: `plan()`'s, and "environment", the machine's
#: environment variables rather than an argument.
FLAGS: tuple[str, ...] = (*Written._fields, "environment")
_FLAG_SET = frozenset(FLAGS)


def did_you_mean(value: object, names: Iterable[str]) -> str | None:
    """Return the closest name to ``value`` when it looks like a typo, else None."""
    if not isinstance(value, str):
        return None
    matches = difflib.get_close_matches(value.lower(), list(names), n=1, cutoff=0.6)
    return matches[0] if matches else None


class ResolutionError(ValueError):
    """A combination of flags that cannot work, and what to do instead.

    Attributes:
        code: stable kebab-case identifier from :data:`ERROR_CODES`.
        flag: the flag at fault (see :data:`FLAGS`).
        value: the value the user gave for that flag.
        reason: why it cannot work, with the machine fact behind it.
        choices: valid alternatives, possibly empty.
        suggestion: the closest valid name when the value looks like a typo.
        rule: id of the rule that refused, when a rule did.
        trace: the steps the engine had taken before refusing.
    """

    code: str
    flag: str
    value: object
    reason: str
    choices: tuple[str, ...]
    suggestion: str | None
    rule: str | None
    trace: tuple[TraceStep, ...]

    def __init__(
        self,
        code: str,
        *,
        flag: str,
        value: object,
        reason: str,
        choices: Iterable[str] = (),
        suggestion: str | None = None,
        rule: str | None = None,
    ) -> None:
        if code not in ERROR_CODES:
            raise RuntimeError(f"internal error: unregistered refusal code {code!r}")
        if flag not in _FLAG_SET:
            raise RuntimeError(f"internal error: unknown flag {flag!r} in a refusal")
        self.code = code
        self.flag = flag
        self.value = value
        self.reason = reason
        self.choices = tuple(choices)
        self.suggestion = suggestion
        self.rule = rule
        self.trace = ()
        super().__init__(self._message())

    def _message(self) -> str:
        # short_repr: the value may be absurd (a million ids, a 5,000-digit int)
        head = (f"{self.flag}={short_repr(self.value)}" if self.flag != "environment"
                else "environment")
        text = f"[{self.code}] {head}: {self.reason}"
        if self.suggestion is not None:
            text += f" Did you mean {self.suggestion!r}?"
        if self.choices:
            text += " Choices: " + ", ".join(self.choices) + "."
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only constructor: rebuild through a helper so the error survives
        # pickling across process boundaries.
        return (_rebuild, (self.code, self.to_dict()))

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly view of the refusal."""
        return {
            "code": self.code,
            "flag": self.flag,
            "value": self.value if isinstance(self.value, (str, float, bool, type(None)))
            or (isinstance(self.value, int) and self.value.bit_length() <= 64)
            else short_repr(self.value),
            "reason": self.reason,
            "choices": list(self.choices),
            "suggestion": self.suggestion,
            "rule": self.rule,
            "message": str(self),
        }


def _rebuild(code: str, fields: dict[str, Any]) -> ResolutionError:
    return ResolutionError(
        code,
        flag=fields["flag"],
        value=fields["value"],
        reason=fields["reason"],
        choices=fields["choices"],
        suggestion=fields["suggestion"],
        rule=fields["rule"],
    )
