"""Render ``docs/compatibility.md`` and ``docs/compatibility.html`` from the engine.

Every cell is the answer `plan()` gives on a named machine profile; nothing here states
a compatibility fact of its own. A cell that resolves is "declared" (the strategy's row
says it works and the engine agrees) or "verified" (a conformance report says every
check for it passed on the runner of that accelerator).

The files must be byte-for-byte stable across machines (a test compares them with the
code), so they hold no dates, no runtime torch version and nothing probed from the
machine that renders them.

Run ``python -m interlock.matrix.compat [ROOT]`` to rewrite both files under ROOT/docs.
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import interlock
from interlock.connector.builtin import BUILTIN_STRATEGIES
from interlock.connector.errors import ResolutionError
from interlock.connector.planner import DevicesFlag, plan
from interlock.connector.specs import StrategySpec
from interlock.connector.tables import (
    ACCELERATOR_NAMES,
    ACCELERATOR_ROWS,
    ACCELERATORS,
    PRECISION_NAMES,
)
from interlock.matrix.profiles import PROFILES, Profile, profile_named

MARKDOWN_PATH = Path("docs") / "compatibility.md"
HTML_PATH = Path("docs") / "compatibility.html"
REPORT_PATH = Path("docs") / "conformance-report.json"

#: The machine profile each accelerator's table is computed on. cuda uses the profile
#: with deepspeed and transformer_engine installed, so those rows show what the
#: strategy supports rather than a missing package.
ACCELERATOR_PROFILES: Mapping[str, str] = {
    "cpu": "cpu-laptop",
    "cuda": "cuda-8-extras",
    "mps": "mps",
    "xla": "tpu-v4-8",
}

#: The conformance runner that exercises each accelerator (mps has none yet, so its
#: cells can only be declared). The conformance package owns runners once it lands;
#: until then this is the one place that names them.
RUNNER_FOR_ACCELERATOR: Mapping[str, str] = MappingProxyType(
    {row.name: row.runner for row in ACCELERATORS if row.runner is not None}
)

#: Launch environments in table order (each is a profile's ``environment`` field).
ENVIRONMENTS: tuple[str, ...] = ("local", "notebook", "torchrun", "slurm", "no-fork")

#: (devices, num_nodes) per environment, fitting the profile's job geometry. None for
#: devices means "2, or 1 when the strategy allows one device per node".
_ENVIRONMENT_GEOMETRY: Mapping[str, tuple[int | None, int]] = {
    "local": (None, 1),
    "notebook": (None, 1),
    "torchrun": (8, 2),
    "slurm": (4, 2),
    "no-fork": (2, 1),
}

ENVIRONMENT_PRECISION = "32-true"
SHORT_REASON = 60

#: A (strategy, runner, precision) triple that a conformance report marks as passed.
Verified = frozenset[tuple[str, str, str]]


# --------------------------------------------------------------------------- the data


@dataclass(frozen=True, slots=True)
class Outcome:
    """One cell: a plan or a refusal, with what the renderers show of it.

    Attributes:
        ok: whether `plan()` succeeded.
        verified: for a resolved cell, whether a conformance report verified it.
        launcher: for a resolved cell, the plan's launcher (None: in process).
        code: for a refusal, its stable code.
        reason: for a refusal, the full reason.
    """

    ok: bool
    verified: bool = False
    launcher: str | None = None
    code: str = ""
    reason: str = ""

    @property
    def short_reason(self) -> str:
        return short_reason(self.reason)


@dataclass(frozen=True, slots=True)
class AcceleratorTable:
    """Strategies x precisions on one accelerator's profile."""

    accelerator: str
    profile: Profile
    runner: str | None
    rows: tuple[tuple[StrategySpec, DevicesFlag, tuple[Outcome, ...]], ...]


@dataclass(frozen=True, slots=True)
class EnvironmentTable:
    """Strategies x launch environments at one precision."""

    profiles: tuple[Profile, ...]
    rows: tuple[tuple[StrategySpec, tuple[Outcome, ...]], ...]


@dataclass(frozen=True, slots=True)
class Compatibility:
    """Everything both documents show."""

    accelerators: tuple[AcceleratorTable, ...]
    environments: EnvironmentTable
    presets: tuple[StrategySpec, ...]
    report_used: bool


def short_reason(reason: str, limit: int = SHORT_REASON) -> str:
    """The first sentence of ``reason``, cut to about ``limit`` characters."""
    first = re.split(r"(?<=[.!?])\s", reason.strip(), maxsplit=1)[0]
    if len(first) <= limit:
        return first
    return first[: limit - 1].rstrip() + "…"


def load_report(path: Path) -> Verified:
    """The (strategy, runner, precision) cells a conformance report verifies.

    The report is what ``interlock conformance --report`` writes: an object whose
    ``records`` list has one record per check run (a bare list of records is accepted
    too)::

        {"records": [{"strategy": "ddp", "runner": "cpu", "precision": "32-true",
                      "check": "training_parity", "status": "passed", ...}, ...]}

    ``precision`` is ``"*"`` for checks that do not depend on it. A cell is verified
    when some record for its precision passed and no record for its precision, or for
    ``"*"`` of the same strategy and runner, failed; skips are neutral. A missing file
    verifies nothing.

    Raises:
        ValueError: the file exists but is not such a report.
    """
    if not path.exists():
        return frozenset()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"conformance report {path} is not valid JSON: {exc}") from exc
    records = data.get("records") if isinstance(data, dict) else data
    if not isinstance(records, list):
        raise ValueError(f"conformance report {path} must hold a list of records")
    keys = ("strategy", "runner", "precision", "check", "status")
    passed: set[tuple[str, str, str]] = set()
    failed: set[tuple[str, str, str]] = set()
    for index, record in enumerate(records):
        if not isinstance(record, dict) or not all(
            isinstance(record.get(k), str) for k in keys
        ):
            raise ValueError(
                f"conformance report {path}: record {index} must be an object with string "
                f"fields {', '.join(keys)}; got {record!r}"
            )
        cell = (record["strategy"], record["runner"], record["precision"])
        if record["status"] == "passed":
            passed.add(cell)
        elif record["status"] in ("failed", "error"):
            failed.add(cell)
    return frozenset(
        cell for cell in passed
        if cell[2] != "*" and cell not in failed and (*cell[:2], "*") not in failed
    )


def _resolve(accelerator: str, devices: DevicesFlag, strategy: str, precision: str,
             num_nodes: int, profile: Profile) -> Outcome:
    try:
        result = plan(accelerator=accelerator, devices=devices, strategy=strategy,
                      precision=precision, num_nodes=num_nodes, machine=profile.machine)
    except ResolutionError as error:
        return Outcome(ok=False, code=error.code, reason=error.reason)
    return Outcome(ok=True, launcher=result.launcher)


def _one_device(spec: StrategySpec, accelerator: str | None = None) -> bool:
    limits = [spec.max_devices]
    if accelerator is not None:
        limits.append(ACCELERATOR_ROWS[accelerator].max_devices)
    return 1 in limits


def table_devices(spec: StrategySpec, accelerator: str) -> DevicesFlag:
    """The devices flag a strategy's cells use on an accelerator.

    1 when the strategy or the accelerator allows one device per node (so that mps
    rows say what the strategy does there rather than that a Mac has one GPU),
    "auto" on xla (a TPU host's devices come as a set), 2 otherwise.
    """
    if _one_device(spec, accelerator):
        return 1
    return "auto" if accelerator == "xla" else 2


def builtin_specs() -> tuple[StrategySpec, ...]:
    """The strategies the committed docs cover: the built-in ones, in registry order."""
    return BUILTIN_STRATEGIES


def compute(specs: Iterable[StrategySpec] | None = None,
            verified: Verified = frozenset()) -> Compatibility:
    """Resolve every cell of both documents.

    Args:
        specs: the strategies to cover, each registered (None: the built-in ones).
        verified: cells a conformance report verified (see :func:`load_report`).
    """
    chosen = tuple(builtin_specs() if specs is None else specs)
    rows_specs = tuple(s for s in chosen if s.variant_of is None)
    presets = tuple(s for s in chosen if s.variant_of is not None)

    tables = []
    for accelerator in ACCELERATOR_NAMES:
        profile = profile_named(ACCELERATOR_PROFILES[accelerator])
        runner = RUNNER_FOR_ACCELERATOR.get(accelerator)
        rows = []
        for spec in rows_specs:
            devices = table_devices(spec, accelerator)
            cells = []
            for precision in PRECISION_NAMES:
                outcome = _resolve(accelerator, devices, spec.name, precision, 1, profile)
                if outcome.ok and runner is not None and (
                    (spec.name, runner, precision) in verified
                ):
                    outcome = Outcome(ok=True, verified=True, launcher=outcome.launcher)
                cells.append(outcome)
            rows.append((spec, devices, tuple(cells)))
        tables.append(AcceleratorTable(accelerator=accelerator, profile=profile,
                                       runner=runner, rows=tuple(rows)))

    by_environment = {p.environment: p for p in PROFILES if p.environment}
    env_profiles = tuple(by_environment[e] for e in ENVIRONMENTS)
    env_rows = []
    for spec in rows_specs:
        cells = []
        for environment, profile in zip(ENVIRONMENTS, env_profiles, strict=True):
            fixed, nodes = _ENVIRONMENT_GEOMETRY[environment]
            devices = fixed if fixed is not None else (1 if _one_device(spec) else 2)
            cells.append(_resolve("auto", devices, spec.name, ENVIRONMENT_PRECISION, nodes,
                                  profile))
        env_rows.append((spec, tuple(cells)))
    return Compatibility(
        accelerators=tuple(tables),
        environments=EnvironmentTable(profiles=env_profiles, rows=tuple(env_rows)),
        presets=presets,
        report_used=bool(verified),
    )


def _environment_geometry(environment: str) -> str:
    devices, nodes = _ENVIRONMENT_GEOMETRY[environment]
    shown = "2 (1 for one-device strategies)" if devices is None else str(devices)
    return f"devices={shown}, num_nodes={nodes}"


def _devices_note(table: AcceleratorTable) -> str:
    used = sorted({str(devices) for _, devices, _ in table.rows})
    return ", ".join(f"devices={d}" for d in used)


def _caption(table: AcceleratorTable) -> str:
    text = (f"accelerator=\"{table.accelerator}\" on the `{table.profile.name}` profile "
            f"({table.profile.description}); {_devices_note(table)} as fits each strategy, "
            "num_nodes=1.")
    extras = sorted(table.profile.machine.packages - set(ACCELERATOR_ROWS[table.accelerator]
                                                          .requires))
    if extras:
        text += (f" {' and '.join(extras)} {'is' if len(extras) == 1 else 'are'} installed "
                 "on this profile, so these rows show what each strategy supports rather "
                 "than a missing package.")
    if table.runner is None:
        text += " No conformance runner covers this accelerator yet: every ✓ is declared."
    else:
        text += f" Verified by the `{table.runner}` conformance runner."
    return text


def _presets_sentence(presets: Sequence[StrategySpec]) -> str:
    if not presets:
        return ""
    parts = [f"`{p.name}` (of `{p.variant_of}`)" for p in presets]
    return ("Presets not shown as rows (each is a preset of the strategy in parentheses): "
            + ", ".join(parts) + ".")


REPORT_NOTE = (
    "A ✓ is *verified* when `docs/conformance-report.json` records that every conformance "
    "check for that (strategy, runner, precision) passed, and *declared* when the "
    "strategy's registry row and the engine accept the combination but no passing "
    "conformance run is recorded."
)


# --------------------------------------------------------------------------- markdown


def _md(text: str) -> str:
    # A raw "|" would split a GitHub table cell; the entity renders as the character.
    return text.replace("|", "&#124;").replace("\n", " ")


def _md_cell(outcome: Outcome) -> str:
    if outcome.ok:
        return "✓ verified" if outcome.verified else "✓ declared"
    return _md(f"`{outcome.code}`: {outcome.short_reason}")


def _md_env_cell(outcome: Outcome) -> str:
    if outcome.ok:
        return f"✓ {outcome.launcher or 'in-process'}"
    return _md(f"`{outcome.code}`: {outcome.short_reason}")


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    from tabulate import tabulate

    return str(tabulate(list(rows), headers=list(headers), tablefmt="github",
                        disable_numparse=True))


def render_markdown(specs: Iterable[StrategySpec] | None = None,
                    report: Path | None = REPORT_PATH) -> str:
    """The text of docs/compatibility.md.

    Args:
        specs: the strategies to cover, each registered (None: the built-in ones).
        report: the conformance report to mark verified cells from (absent or None:
            every ✓ is declared).
    """
    data = compute(specs, load_report(report) if report is not None else frozenset())
    out = [
        "# Compatibility",
        "",
        "<!-- Generated by `python -m interlock.matrix.compat` from the engine's own "
        "answers. Do not edit by hand: a test fails when this file differs from the code. -->",
        "",
        "Each cell is what `interlock.plan()` answers for that strategy and precision on a "
        "named machine profile: ✓ when it resolves, otherwise the refusal code and the "
        "start of its reason. The HTML version (`compatibility.html`) shows full reasons "
        "on hover.",
        "",
        "## Legend",
        "",
        "- **✓ verified**: resolves, and the conformance suite passed for it.",
        "- **✓ declared**: resolves; no passing conformance run is recorded.",
        "- **`code`: reason**: refused; codes are explained in [rules.md](rules.md#error-codes).",
        "",
        REPORT_NOTE,
        "",
    ]
    for table in data.accelerators:
        out += [f"## Accelerator `{table.accelerator}`", "", _caption(table), ""]
        out.append(_md_table(
            ("strategy", *PRECISION_NAMES),
            ((f"`{spec.name}`", *(_md_cell(c) for c in cells)) for spec, _, cells in table.rows),
        ))
        out.append("")
        if data.presets:
            out += [_presets_sentence(data.presets), ""]
    out += [
        "## Launch environments",
        "",
        f"accelerator=\"auto\", precision=\"{ENVIRONMENT_PRECISION}\"; each cell shows the "
        "launcher the plan uses (`external`: the cluster started the processes; "
        "`in-process`: no launcher).",
        "",
    ]
    env = data.environments
    out.append(_md_table(
        ("strategy", *(e for e in ENVIRONMENTS)),
        ((f"`{spec.name}`", *(_md_env_cell(c) for c in cells)) for spec, cells in env.rows),
    ))
    out += ["", "Profiles and flags per environment:", ""]
    out += [f"- **{e}**: `{p.name}` ({p.description}); {_environment_geometry(e)}"
            for e, p in zip(ENVIRONMENTS, env.profiles, strict=True)]
    out += [
        "",
        "## Generated with",
        "",
        f"interlock {interlock.__version__}, on these machine profiles:",
        "",
    ]
    used = [*(t.profile for t in data.accelerators), *env.profiles]
    out += [f"- `{p.name}`: {p.description}" for p in dict.fromkeys(used)]
    out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------- html

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; }
th { background: #f0f0f0; }
td.verified { background: #4caf50; color: #fff; }
td.declared { background: #c8e6c9; }
td.refused { background: #e0e0e0; color: #555; cursor: help; }
caption { caption-side: top; text-align: left; padding: 0.3em 0; }
code { font-family: ui-monospace, monospace; }
"""


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _html_cell(outcome: Outcome, ok_text: str) -> str:
    if outcome.ok:
        kind = "verified" if outcome.verified else "declared"
        return f'<td class="{kind}">{_e(ok_text)}</td>'
    return (f'<td class="refused" title="{_e(outcome.reason)}">'
            f"<code>{_e(outcome.code)}</code></td>")


def _html_table(caption: str, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "\n".join(f"<tr>{''.join(row)}</tr>" for row in rows)
    return (f"<table>\n<caption>{_e(caption)}</caption>\n<thead><tr>{head}</tr></thead>\n"
            f"<tbody>\n{body}\n</tbody>\n</table>")


def _html_strategy(spec: StrategySpec) -> str:
    return f'<th title="{_e(spec.description)}"><code>{_e(spec.name)}</code></th>'


def render_html(specs: Iterable[StrategySpec] | None = None,
                report: Path | None = REPORT_PATH) -> str:
    """The text of docs/compatibility.html: the same tables as one self-contained page
    (inline CSS, no scripts, no external assets). Arguments as for
    :func:`render_markdown`."""
    data = compute(specs, load_report(report) if report is not None else frozenset())
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        "<title>interlock compatibility</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        "<!-- Generated by python -m interlock.matrix.compat; do not edit by hand. -->",
        "<h1>Compatibility</h1>",
        "<p>Each cell is what <code>interlock.plan()</code> answers on a named machine "
        "profile. Hover a grey cell for the full reason of the refusal.</p>",
        "<h2>Legend</h2>",
        "<table><tbody>",
        '<tr><td class="verified">✓ verified</td><td>resolves, and the conformance suite '
        "passed for it</td></tr>",
        '<tr><td class="declared">✓ declared</td><td>resolves; no passing conformance run is '
        "recorded</td></tr>",
        '<tr><td class="refused"><code>code</code></td><td>refused; codes are explained in '
        '<a href="rules.md#error-codes">rules.md</a></td></tr>',
        "</tbody></table>",
        "<p>" + re.sub(r"`([^`]+)`", r"<code>\1</code>",
                       re.sub(r"\*(\w+)\*", r"<em>\1</em>", _e(REPORT_NOTE))) + "</p>",
    ]
    for table in data.accelerators:
        out.append(f"<h2>Accelerator <code>{_e(table.accelerator)}</code></h2>")
        out.append(_html_table(
            _caption(table).replace("`", ""),
            ("strategy", *PRECISION_NAMES),
            ([_html_strategy(spec), *(_html_cell(c, "✓ verified" if c.verified
                                                 else "✓ declared") for c in cells)]
             for spec, _, cells in table.rows),
        ))
        if data.presets:
            out.append(f"<p>{_e(_presets_sentence(data.presets).replace('`', ''))}</p>")
    env = data.environments
    out.append("<h2>Launch environments</h2>")
    out.append(_html_table(
        f"accelerator=\"auto\", precision=\"{ENVIRONMENT_PRECISION}\"; each cell shows the "
        "launcher the plan uses (external: the cluster started the processes; in-process: "
        "no launcher).",
        ("strategy", *ENVIRONMENTS),
        ([_html_strategy(spec), *(_html_cell(c, f"✓ {c.launcher or 'in-process'}")
                                  for c in cells)]
         for spec, cells in env.rows),
    ))
    out.append("<ul>")
    out += [f"<li><b>{_e(e)}</b>: <code>{_e(p.name)}</code> ({_e(p.description)}); "
            f"{_e(_environment_geometry(e))}</li>"
            for e, p in zip(ENVIRONMENTS, env.profiles, strict=True)]
    out.append("</ul>")
    out += ["<h2>Generated with</h2>",
            f"<p>interlock {_e(interlock.__version__)}, on these machine profiles:</p>", "<ul>"]
    used = [*(t.profile for t in data.accelerators), *env.profiles]
    out += [f"<li><code>{_e(p.name)}</code>: {_e(p.description)}</li>"
            for p in dict.fromkeys(used)]
    out += ["</ul>", "</body>", "</html>", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- files


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", newline="\n")
    tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    """Write docs/compatibility.md and .html under ROOT (default: the current
    directory), reading ROOT/docs/conformance-report.json when it exists."""
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]) if args else Path.cwd()
    report = root / REPORT_PATH
    for path, text in ((root / MARKDOWN_PATH, render_markdown(report=report)),
                       (root / HTML_PATH, render_html(report=report))):
        _write(path, text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
