"""Render ``docs/compatibility.md`` and ``docs/compatibility.html`` from the engine.

Every cell is the answer `plan()` gives on a named machine profile; nothing here states
a compatibility fact of its own. A cell that resolves is "declared" (the strategy's row
says it works and the engine agrees) or "verified" (a conformance report records a run
that exercised it; see :func:`interlock.matrix.reports.read_report` for the exact rule).

The files must be byte-for-byte stable across machines (a test compares them with the
code), so they hold no date of their own, no runtime torch version and nothing probed
from the machine that renders them: the only dates are those written in the committed
conformance reports.

Run ``python -m interlock.matrix.compat [ROOT]`` to rewrite both files under ROOT/docs.
"""

from __future__ import annotations

import html
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import interlock
from interlock.connector.builtin import BUILTIN_STRATEGIES
from interlock.connector.errors import ResolutionError
from interlock.connector.planner import DevicesFlag, Plan, plan
from interlock.connector.registry import registered
from interlock.connector.specs import StrategySpec
from interlock.connector.tables import ACCELERATORS, PRECISIONS, AcceleratorRow
from interlock.matrix import fits
from interlock.matrix import parallelism as par
from interlock.matrix.profiles import PROFILES, Profile, profile_named
from interlock.matrix.reports import (
    REPORT_PREFIX,
    Evidence,
    ReportArg,
    ReportFile,
    Verification,
    merge_reports,
    read_reports,
)

DOCS_DIR = Path("docs")
MARKDOWN_PATH = DOCS_DIR / "compatibility.md"
HTML_PATH = DOCS_DIR / "compatibility.html"

#: The machine profile each accelerator's table is computed on. cuda uses the profile
#: with deepspeed and transformer_engine installed, so those rows show what the
#: strategy supports rather than a missing package.
ACCELERATOR_PROFILES: Mapping[str, str] = {
    "cpu": "cpu-extras",
    "cuda": "cuda-8-extras",
    "mps": "mps",
    "xla": "tpu-v4-8",
}

#: The conformance runner that exercises each accelerator (mps has none yet, so its
#: cells can only be declared).
RUNNER_FOR_ACCELERATOR: Mapping[str, str] = MappingProxyType(
    {row.name: row.runner for row in ACCELERATORS if row.runner is not None}
)


def builtin_accelerators() -> tuple[str, ...]:
    """The accelerators the committed documents cover: the built-in ones, read from the
    registry (a third-party row installed here must not change the documents)."""
    return tuple(row.name for row in ACCELERATORS)


def builtin_precisions() -> tuple[str, ...]:
    """The precisions the committed documents cover: the built-in ones, in table order."""
    return tuple(row.name for row in PRECISIONS)

#: Launch environments in table order (each is a profile's ``environment`` field).
ENVIRONMENTS: tuple[str, ...] = ("local", "notebook", "torchrun", "slurm", "no-fork")

#: The launch environments a conformance run exercises. The driver resolves each
#: strategy on the machine it runs on and starts the ranks with the strategy's own
#: launcher, from a script, without a notebook, torchrun or SLURM around it: that is
#: the "local" environment and nothing else. The other columns can only be declared.
EXERCISED_ENVIRONMENTS: frozenset[str] = frozenset({"local"})

#: (devices per node, num_nodes) per environment: its profile's job. A one-device
#: strategy (``max_devices == 1``) is asked for 1 device instead.
_ENVIRONMENT_GEOMETRY: Mapping[str, tuple[int, int]] = {
    p.environment: p.job for p in PROFILES if p.environment}

ENVIRONMENT_PRECISION = "32-true"

#: Longest line the Markdown page may have. Prose is wrapped well below it; table lines
#: cannot wrap, so their cells are kept short enough to stay under it.
MAX_MARKDOWN_LINE = 240
PROSE_WIDTH = 100

#: In a note shared by several strategies, this stands for each row's strategy name.
STRATEGY_PLACEHOLDER = "{strategy}"

#: Short column headers (in the HTML page the full name is the hover title).
HEADER_ABBREVIATIONS: Mapping[str, str] = {
    "transformer-engine": "te",
    "transformer-engine-float16": "te-float16",
}

# --------------------------------------------------------------------------- the data


@dataclass(frozen=True, slots=True)
class Outcome:
    """One cell: a plan or a refusal, with what the renderers show of it.

    Attributes:
        ok: whether `plan()` succeeded.
        launcher: for a resolved cell, the plan's launcher (None: in process).
        code: for a refusal, its stable code.
        reason: for a refusal, the full reason.
        evidence: for a verified cell, the report that verifies it (for a launch
            environment cell, narrowed to the one world size the cell stands for).
    """

    ok: bool
    launcher: str | None = None
    code: str = ""
    reason: str = ""
    evidence: Evidence | None = None

    @property
    def verified(self) -> bool:
        return self.evidence is not None


@dataclass(frozen=True, slots=True)
class Grid:
    """Strategies (rows) x columns of outcomes, as both renderers lay them out.

    Attributes:
        anchor: prefix of the note anchors in the HTML page (unique per page).
        columns: the column headers.
        across: how a row refused in every column is described ("all precisions").
        rows: each shown strategy with one outcome per column.
    """

    anchor: str
    columns: tuple[str, ...]
    across: str
    rows: tuple[tuple[StrategySpec, tuple[Outcome, ...]], ...]


@dataclass(frozen=True, slots=True)
class AcceleratorTable:
    """Strategies x precisions on one accelerator's profile."""

    accelerator: str
    profile: Profile
    runner: str | None
    devices: tuple[DevicesFlag, ...]  # the devices flag of each row, in row order
    grid: Grid


@dataclass(frozen=True, slots=True)
class EnvironmentTable:
    """Strategies x launch environments at one precision."""

    profiles: tuple[Profile, ...]
    grid: Grid


@dataclass(frozen=True, slots=True)
class Compatibility:
    """Everything both documents show."""

    accelerators: tuple[AcceleratorTable, ...]
    environments: EnvironmentTable
    presets: tuple[StrategySpec, ...]
    #: the parallelism section (see `interlock.matrix.parallelism`): the built-in
    #: strategies it covers, whatever ``specs`` the rest covers
    parallelism: tuple[par.Table, ...] = ()


def _resolve(accelerator: str, devices: DevicesFlag, strategy: str, precision: str,
             num_nodes: int, profile: Profile) -> tuple[Outcome, Plan | None]:
    try:
        result = plan(accelerator=accelerator, devices=devices, strategy=strategy,
                      precision=precision, num_nodes=num_nodes, machine=profile.machine)
    except ResolutionError as error:
        return Outcome(ok=False, code=error.code, reason=error.reason), None
    return Outcome(ok=True, launcher=result.launcher), result


def one_device(spec: StrategySpec, accelerator: str | None = None) -> bool:
    """Whether the strategy (or the accelerator, when given) takes one device per node."""
    limits = [spec.max_devices]
    if accelerator is not None:
        limits.append(registered(AcceleratorRow)[accelerator].max_devices)
    return 1 in limits


def table_devices(spec: StrategySpec, accelerator: str) -> DevicesFlag:
    """The devices flag a strategy's cells use on an accelerator.

    1 when the strategy or the accelerator allows one device per node (so that mps
    rows say what the strategy does there rather than that a Mac has one GPU),
    "auto" on xla (a TPU host's devices come as a set), 2 otherwise.
    """
    if one_device(spec, accelerator):
        return 1
    return "auto" if accelerator == "xla" else 2


def environment_devices(spec: StrategySpec, environment: str) -> int:
    """The devices flag a strategy's cell uses in a launch environment: 1 for a
    one-device strategy, else the environment's devices per node."""
    return 1 if one_device(spec) else _ENVIRONMENT_GEOMETRY[environment][0]


def builtin_specs() -> tuple[StrategySpec, ...]:
    """The strategies the committed docs cover: the built-in ones, in registry order."""
    return BUILTIN_STRATEGIES


def _environment_evidence(spec: StrategySpec, environment: str, result: Plan,
                          verification: Verification) -> Evidence | None:
    """The newest evidence verifying a resolved launch-environment cell, or None.

    Only an exercised environment (see EXERCISED_ENVIRONMENTS) on one node qualifies,
    and only a report that launched the strategy at exactly the cell's world size."""
    if environment not in EXERCISED_ENVIRONMENTS or result.num_nodes != 1:
        return None
    runner = RUNNER_FOR_ACCELERATOR.get(result.accelerator)
    if runner is None:
        return None
    for evidence in verification.get((spec.name, runner, result.precision), ()):
        if result.world_size in evidence.world_sizes:
            return replace(evidence, world_sizes=(result.world_size,))
    return None


def compute(specs: Iterable[StrategySpec] | None = None,
            verification: Verification = MappingProxyType({})) -> Compatibility:
    """Resolve every cell of both documents.

    Args:
        specs: the strategies to cover, each registered (None: the built-in ones).
        verification: the cells conformance reports verify (see :func:`merge_reports`).
    """
    chosen = tuple(builtin_specs() if specs is None else specs)
    rows_specs = tuple(s for s in chosen if s.variant_of is None)
    presets = tuple(s for s in chosen if s.variant_of is not None)

    tables = []
    precisions = builtin_precisions()
    for accelerator in builtin_accelerators():
        profile = profile_named(ACCELERATOR_PROFILES[accelerator])
        runner = RUNNER_FOR_ACCELERATOR.get(accelerator)
        rows = []
        devices_used = []
        for spec in rows_specs:
            devices = table_devices(spec, accelerator)
            cells = []
            for precision in precisions:
                outcome, _ = _resolve(accelerator, devices, spec.name, precision, 1, profile)
                found = () if runner is None else verification.get((spec.name, runner,
                                                                    precision), ())
                if outcome.ok and found:
                    outcome = replace(outcome, evidence=found[0])
                cells.append(outcome)
            rows.append((spec, tuple(cells)))
            devices_used.append(devices)
        grid = Grid(anchor=accelerator, columns=precisions, across="all precisions",
                    rows=tuple(rows))
        tables.append(AcceleratorTable(accelerator=accelerator, profile=profile,
                                       runner=runner, devices=tuple(devices_used),
                                       grid=grid))

    by_environment = {p.environment: p for p in PROFILES if p.environment}
    env_profiles = tuple(by_environment[e] for e in ENVIRONMENTS)
    env_rows = []
    for spec in rows_specs:
        cells = []
        for environment, profile in zip(ENVIRONMENTS, env_profiles, strict=True):
            nodes = _ENVIRONMENT_GEOMETRY[environment][1]
            outcome, result = _resolve("auto", environment_devices(spec, environment),
                                       spec.name, ENVIRONMENT_PRECISION, nodes, profile)
            if result is not None:
                outcome = replace(outcome, evidence=_environment_evidence(
                    spec, environment, result, verification))
            cells.append(outcome)
        env_rows.append((spec, tuple(cells)))
    env_grid = Grid(anchor="env", columns=ENVIRONMENTS, across="all environments",
                    rows=tuple(env_rows))
    return Compatibility(
        accelerators=tuple(tables),
        environments=EnvironmentTable(profiles=env_profiles, grid=env_grid),
        presets=presets,
        parallelism=par.compute(),
    )


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True, slots=True)
class Note:
    """One note under a table: a refusal's reason, or what verified a cell.

    Attributes:
        number: its number, from 1 in each table.
        code: the refusal code ("" for a verification note).
        reason: the refusal's reason; with STRATEGY_PLACEHOLDER for the strategy's name
            when several strategies share the note.
        evidence: for a verification note, the report that verified the cells.
    """

    number: int
    code: str = ""
    reason: str = ""
    evidence: Evidence | None = None


@dataclass(frozen=True, slots=True)
class Layout:
    """A grid as it is printed: the rows kept in the table (each cell with its note
    number, None for a plain declared cell), the rows refused for one reason in every
    column (collapsed into one line per reason, with the note number), and the notes."""

    shown: tuple[tuple[StrategySpec, tuple[tuple[Outcome, int | None], ...]], ...]
    collapsed: tuple[tuple[tuple[StrategySpec, ...], Outcome, int], ...]
    notes: tuple[Note, ...]


def reason_template(reason: str, strategy: str) -> str:
    """``reason`` with the quoted strategy name replaced by STRATEGY_PLACEHOLDER, so that
    refusals that differ only by the strategy's name share one note."""
    return reason.replace(f"'{strategy}'", f"'{STRATEGY_PLACEHOLDER}'")


def _note_key(spec: StrategySpec, outcome: Outcome) -> tuple[str, ...] | Evidence | None:
    if not outcome.ok:
        return ("refused", outcome.code, reason_template(outcome.reason, spec.name))
    return outcome.evidence


def layout(grid: Grid) -> Layout:
    """Collapse the rows refused for one reason everywhere and number the notes."""
    keyed = [(spec, [(c, _note_key(spec, c)) for c in cells]) for spec, cells in grid.rows]
    shown = []
    collapsed: dict[tuple[str, ...], list[StrategySpec]] = {}
    first: dict[tuple[str, ...], Outcome] = {}
    for spec, cells in keyed:
        keys = {k for _, k in cells}
        only = next(iter(keys)) if len(keys) == 1 else None
        if isinstance(only, tuple) and all(not c.ok for c, _ in cells):
            collapsed.setdefault(only, []).append(spec)
            first.setdefault(only, cells[0][0])
        else:
            shown.append((spec, cells))

    # A refusal note keeps the exact reason unless several strategies share it.
    users: dict[tuple[str, ...], set[str]] = {}
    for spec, cells in keyed:
        for _, key in cells:
            if isinstance(key, tuple):
                users.setdefault(key, set()).add(spec.name)

    numbers: dict[object, int] = {}
    notes: list[Note] = []

    def number(key: tuple[str, ...] | Evidence, outcome: Outcome) -> int:
        if key not in numbers:
            numbers[key] = len(notes) + 1
            if isinstance(key, Evidence):
                notes.append(Note(number=numbers[key], evidence=key))
            else:
                shared = len(users[key]) > 1
                notes.append(Note(number=numbers[key], code=outcome.code,
                                  reason=key[2] if shared else outcome.reason))
        return numbers[key]

    shown_rows = tuple(
        (spec, tuple((c, None if k is None else number(k, c)) for c, k in cells))
        for spec, cells in shown
    )
    collapsed_rows = tuple(
        (tuple(specs), first[key], number(key, first[key]))
        for key, specs in collapsed.items()
    )
    return Layout(shown=shown_rows, collapsed=collapsed_rows, notes=tuple(notes))


# --------------------------------------------------------------------------- words


def _and(items: Sequence[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


def _world_sizes(evidence: Evidence) -> str:
    sizes = [str(s) for s in evidence.world_sizes]
    return f"world size{'s' if len(sizes) > 1 else ''} {_and(sizes)}" if sizes else ""


def evidence_text(evidence: Evidence, link: bool = True) -> str:
    """One sentence naming the runner, where it ran, the world sizes and the report date,
    in the inline syntax both renderers read (`code`, [text](link)); without the link to
    the report, and in plain text, when ``link`` is false (for hover titles)."""
    runner = (f"`{evidence.runner}`" if link else evidence.runner) + " runner" + (
        "" if evidence.place == evidence.runner else f" on {evidence.where}")
    sizes = _world_sizes(evidence)
    date = f"report dated {evidence.date}" if evidence.date else "undated report"
    source = f" ([{evidence.report}]({evidence.report}))" if link else f" ({evidence.report})"
    return (f"verified by the {runner}{f' at {sizes}' if sizes else ''}: every check that "
            f"ran passed; {date}{source}.")


def _caption(table: AcceleratorTable) -> str:
    used = sorted({str(d) for d in table.devices})
    text = (f"accelerator=\"{table.accelerator}\" on the `{table.profile.name}` profile "
            f"({table.profile.description}); {', '.join(f'devices={d}' for d in used)} as "
            "fits each strategy, num_nodes=1.")
    needs = registered(AcceleratorRow)[table.accelerator].requires
    extras = sorted(table.profile.machine.packages - set(needs))
    if extras:
        text += (f" {' and '.join(extras)} {'is' if len(extras) == 1 else 'are'} installed "
                 "on this profile, so these rows show what each strategy supports rather "
                 "than a missing package.")
    if table.runner is None:
        text += " No conformance runner covers this accelerator yet: every ✓ is declared."
    else:
        text += f" Verified cells come from the `{table.runner}` conformance runner."
    return text


def _environment_geometry(environment: str) -> str:
    devices, nodes = _ENVIRONMENT_GEOMETRY[environment]
    return f"devices={devices} (1 for one-device strategies), num_nodes={nodes}"


def _environment_caption() -> str:
    return (f"accelerator=\"auto\", precision=\"{ENVIRONMENT_PRECISION}\"; each cell shows the "
            "launcher the plan uses (`external`: the cluster started the processes; "
            "`in-process`: no launcher). A one-device strategy is asked for devices=1 "
            "everywhere.")


def _presets_sentence(presets: Sequence[StrategySpec]) -> str:
    parts = [f"`{p.name}` (of `{p.variant_of}`)" for p in presets]
    return ("Presets are not shown as rows; each behaves as the strategy in parentheses: "
            + ", ".join(parts) + ".")


def _legend() -> list[tuple[str, bool, str]]:
    """(term, whether its cells carry a note number, explanation), in the inline syntax
    both renderers read."""
    return [
        ("✓ verified", True, "resolves, and a conformance report verifies it (see below); the "
         "cell's note names the runner, where it ran, the world sizes and the report date."),
        ("✓ declared", False, "resolves: the strategy's registry row and the engine accept it, but "
         "no conformance report verifies it."),
        ("code", True, "refused with that code (codes are explained in "
         "[rules.md](rules.md#error-codes)); the cell's note gives the engine's reason. In a "
         f"note shared by several strategies, `{STRATEGY_PLACEHOLDER}` stands for each row's "
         "strategy name."),
    ]


def _layout_sentence() -> str:
    """How the tables are laid out beyond the legend (inline syntax)."""
    shorts = [f"{short} stands for the {name} precision"
              for name, short in HEADER_ABBREVIATIONS.items()]
    return ("A strategy refused for the same reason in every column is listed under its "
            "table instead of as a row. In the accelerator tables' headers, "
            + _and(shorts) + ".")


def _rules() -> list[str]:
    """What counts as verified, paragraph by paragraph (inline syntax)."""
    runners = ", ".join(f"{a}: `{r}`" for a, r in RUNNER_FOR_ACCELERATOR.items())
    unrun = [a for a in builtin_accelerators() if a not in RUNNER_FOR_ACCELERATOR]
    exercised = [e for e in ENVIRONMENTS if e in EXERCISED_ENVIRONMENTS]
    others = [e for e in ENVIRONMENTS if e not in EXERCISED_ENVIRONMENTS]
    return [
        f"The conformance reports are `docs/{REPORT_PREFIX}.json` and "
        f"`docs/{REPORT_PREFIX}-*.json`, read in file-name order. A report verifies a "
        "(strategy, runner, precision) when its records for it (the checks of that "
        "precision and the precision-independent ones) include at least one check of that "
        "precision that ran inside the launched ranks and passed, and none that failed or "
        "did not run; skipped checks are neutral and expected failures count as passing. "
        "The declaration check launches nothing, so a report that only passed it verifies "
        "nothing. When several reports verify a cell, its note names the newest; an undated "
        "report counts as the oldest.",
        f"Accelerator tables: a resolved cell is verified when a report verifies its "
        f"strategy and precision on that accelerator's runner ({runners}"
        + (f"; {_and(unrun)} {'has' if len(unrun) == 1 else 'have'} none" if unrun else "")
        + "), at whichever world sizes the runner launched; its note lists them.",
        f"Launch environments: only the {_and(exercised)} column can be verified, because "
        "a conformance run resolves each strategy on the machine it runs on and starts the "
        "ranks with the strategy's own launcher from a script, with no notebook, torchrun "
        f"or SLURM around it. The {_and(others)} columns say what the engine answers there "
        f"and are never verified. A {_and(exercised)} cell is verified when a report "
        f"verifies its strategy at precision {ENVIRONMENT_PRECISION} on the runner of the "
        "accelerator the plan picks, and launched it at exactly the cell's world size "
        "(devices x num_nodes); a run at another world size does not cover it.",
    ]


def _report_line(report: ReportFile) -> str:
    runners = (", ".join(f"`{r}`" + ("" if w == r else f" on {w}") for r, w in report.runners)
               if report.runners else "runners not recorded")
    date = f"dated {report.date}" if report.date else "undated"
    return f"[{report.name}]({report.name}): {date}; {runners}."


# --------------------------------------------------------------------------- markdown


_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _sup(number: int) -> str:
    return str(number).translate(_SUPERSCRIPT)


def _md(text: str) -> str:
    # A raw "|" would split a GitHub table cell; the entity renders as the character.
    return text.replace("|", "&#124;").replace("\n", " ")


def _md_text(text: str) -> str:
    """Engine text (a reason) made safe to print as Markdown prose."""
    return _md(text.replace("\\", "\\\\").replace("*", "\\*").replace("<", "&lt;"))


# A line that starts with one of these would open a list, heading, quote or table.
_BLOCK_START = re.compile(r"^(?:[-+*>#|=]|\d+[.)])")


def wrap(text: str, width: int = PROSE_WIDTH, first: str = "", rest: str = "") -> list[str]:
    """Greedy word wrap for Markdown prose; never starts a continuation line with
    something Markdown would read as a new block."""
    lines: list[str] = []
    current = first
    fresh = True
    for word in text.split():
        if not fresh and len(current) + 1 + len(word) > width and not _BLOCK_START.match(word):
            lines.append(current)
            current, fresh = rest + word, False
        else:
            current = (current + word) if fresh else f"{current} {word}"
            fresh = False
    lines.append(current)
    return lines


def _md_cell(outcome: Outcome, note: int | None, ok_text: str) -> str:
    # Plain text, not `code`: table lines cannot wrap, and every character counts.
    if not outcome.ok:
        return f"{outcome.code}{_sup(note or 0)}"
    if note is None:
        return ok_text
    return f"{ok_text}{_sup(note)}"


def _md_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table, columns padded by character count (the same
    on every machine, whatever width libraries are installed)."""
    body = [list(r) for r in rows]
    widths = [max(len(c) for c in column) for column in zip(headers, *body, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in body)])


def _md_note(note: Note) -> str:
    if note.evidence is not None:
        return evidence_text(note.evidence)
    return f"`{note.code}`: {_md_text(note.reason)}"


def _md_grid(grid: Grid, ok_text: Callable[[Outcome], str]) -> list[str]:
    """The table, the collapsed rows and the notes of one grid, as Markdown lines."""
    laid = layout(grid)
    out: list[str] = []
    if laid.shown:
        out.append(_md_table(
            ("strategy", *(HEADER_ABBREVIATIONS.get(c, c) for c in grid.columns)),
            ((spec.name, *(_md_cell(c, n, ok_text(c)) for c, n in cells))
             for spec, cells in laid.shown),
        ))
        out.append("")
    if laid.collapsed:
        out += ["Not shown as rows: refused for one reason in every column.", ""]
        for specs, outcome, number in laid.collapsed:
            names = ", ".join(f"`{s.name}`" for s in specs)
            out += wrap(f"{names} — {grid.across}: `{outcome.code}`{_sup(number)}",
                        first="- ", rest="  ")
        out.append("")
    out += _md_notes(laid.notes, _md_note)
    return out


def _md_notes(notes: Sequence[Any], render: Callable[[Any], str]) -> list[str]:
    """A table's numbered notes, each wrapped under its number."""
    if not notes:
        return []
    out = ["Notes:", ""]
    for note in notes:
        first = f"{note.number}. "
        out += wrap(render(note), first=first, rest=" " * len(first))
    return [*out, ""]


def _md_ok(outcome: Outcome) -> str:
    return "✓ verified" if outcome.verified else "✓ declared"


def _md_env_ok(outcome: Outcome) -> str:
    text = f"✓ {outcome.launcher or 'in-process'}"
    return f"{text}, verified" if outcome.verified else text


def render_markdown(specs: Iterable[StrategySpec] | None = None,
                    report: ReportArg = DOCS_DIR) -> str:
    """The text of docs/compatibility.md.

    Args:
        specs: the strategies to cover, each registered (None: the built-in ones).
        report: the conformance reports to mark verified cells from (see
            :func:`read_reports`; default: every report in ./docs; None: every ✓ is
            declared).
    """
    reports = read_reports(report)
    data = compute(specs, merge_reports(reports))
    out = [
        "# Compatibility",
        "",
        "<!-- Generated by `python -m interlock.matrix.compat` from the engine's own answers.",
        "     Do not edit by hand: a test fails when this file differs from the code. -->",
        "",
        *wrap("Each cell is what `interlock.plan()` answers for that strategy on a named "
              "machine profile: ✓ when it resolves, otherwise the refusal code. The numbered "
              "notes under each table give each refusal's reason and what verified each "
              "verified cell. The HTML version (`compatibility.html`) shows the same tables "
              "with full reasons on hover."),
        "",
        "## Legend",
        "",
    ]
    for term, noted, text in _legend():
        out += wrap(f"**{term}**{'ⁿ' if noted else ''}: {text}", first="- ", rest="  ")
    out += ["", *wrap(_layout_sentence()), ""]
    out += ["### What counts as verified", ""]
    for paragraph in _rules():
        out += [*wrap(paragraph), ""]
    if data.presets:
        out += [*wrap(_presets_sentence(data.presets)), ""]
    for table in data.accelerators:
        out += [f"## Accelerator `{table.accelerator}`", "", *wrap(_caption(table)), ""]
        out += _md_grid(table.grid, _md_ok)
    env = data.environments
    out += ["## Launch environments", "", *wrap(_environment_caption()), ""]
    out += _md_grid(env.grid, _md_env_ok)
    out += ["Profiles and flags per environment:", ""]
    for e, p in zip(ENVIRONMENTS, env.profiles, strict=True):
        out += wrap(f"**{e}**: `{p.name}` ({p.description}); {_environment_geometry(e)}",
                    first="- ", rest="  ")
    out += ["", *_md_parallelism(data.parallelism)]
    out += _md_fits()
    out += [
        "## Generated with",
        "",
        f"interlock {interlock.__version__}, on these machine profiles:",
        "",
    ]
    out += [f"- `{p.name}`: {p.description}" for p in _profiles_used(data)]
    out += ["", "and these conformance reports:" if reports else
            "and no conformance report: every ✓ is declared.", ""]
    for r in reports:
        out += wrap(_report_line(r), first="- ", rest="  ")
    if reports:
        out.append("")
    return "\n".join(out[:-1] if out[-1] == "" else out) + "\n"


# --------------------------------------------------------------------------- html

_CSS = """
body { font-family: system-ui, sans-serif; color: #222; max-width: 1000px;
       margin: 0 auto; padding: 0 12px 2em; box-sizing: border-box; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 12px; }
table.grid { table-layout: fixed; width: 100%; }
table.grid col.strategy { width: 21%; }
th, td { border: 1px solid #ccc; padding: 3px 4px; text-align: left; vertical-align: top;
         overflow-wrap: normal; word-break: normal; hyphens: none; }
th { background: #f0f0f0; font-weight: 600; }
td.verified { background: #4caf50; color: #fff; }
td.verified a { color: #fff; }
td.declared { background: #c8e6c9; }
td.refused { background: #e0e0e0; color: #555; cursor: help; }
caption { caption-side: top; text-align: left; padding: 0.3em 0; font-size: 13px; }
code { font-family: ui-monospace, monospace; white-space: nowrap; }
code.words { white-space: normal; }
code.words span { white-space: nowrap; }
td code, th code { font-size: 11px; }
sup { font-size: 9px; margin-left: 1px; }
ol.notes, ul.collapsed { font-size: 13px; }
abbr { text-decoration: none; }
"""


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _inline(text: str) -> str:
    """The small inline syntax of the shared texts (`code`, **bold**, [text](link)) as
    escaped HTML."""
    out = _e(text)
    out = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', out)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def _words(text: str, separator: str) -> str:
    """``text`` as code that may break only after ``separator`` (a hyphen in a refusal
    code, an underscore in a strategy name), never inside a word."""
    parts = re.findall(rf"[^{separator}]+{separator}?|{separator}", text)
    if len(parts) <= 1:
        return f"<code>{_e(text)}</code>"
    return ('<code class="words">' + "<wbr>".join(f"<span>{_e(p)}</span>" for p in parts)
            + "</code>")


def _note_link(anchor: str, number: int) -> str:
    return f'<sup><a href="#{anchor}-{number}">{number}</a></sup>'


def _html_cell(outcome: Outcome, ok_text: str, anchor: str = "", note: int | None = None
               ) -> str:
    link = _note_link(anchor, note) if note is not None else ""
    if outcome.ok:
        kind = "verified" if outcome.verified else "declared"
        title = ""
        if outcome.evidence is not None:
            title = f' title="{_e(evidence_text(outcome.evidence, link=False))}"'
        return f'<td class="{kind}"{title}>{_e(ok_text)}{link}</td>'
    return (f'<td class="refused" title="{_e(outcome.reason)}">{_words(outcome.code, "-")}'
            f"{link}</td>")


def _html_header(name: str) -> str:
    short = HEADER_ABBREVIATIONS.get(name)
    if short is None:
        return f"<th>{_e(name)}</th>"
    return f'<th><abbr title="{_e(name)}">{_e(short)}</abbr></th>'


def _html_strategy(spec: StrategySpec) -> str:
    return f'<th title="{_e(spec.description)}">{_words(spec.name, "_")}</th>'


def _html_grid(grid: Grid, caption: str, ok_text: Callable[[Outcome], str]) -> list[str]:
    laid = layout(grid)
    out: list[str] = []
    if laid.shown:
        head = "".join(_html_header(h) for h in ("strategy", *grid.columns))
        body = "\n".join(
            "<tr>" + _html_strategy(spec)
            + "".join(_html_cell(c, ok_text(c), grid.anchor, n) for c, n in cells) + "</tr>"
            for spec, cells in laid.shown
        )
        out += ['<table class="grid">', f"<caption>{_inline(caption)}</caption>",
                '<colgroup><col class="strategy"></colgroup>',
                f"<thead><tr>{head}</tr></thead>", "<tbody>", body, "</tbody>", "</table>"]
    else:
        out.append(f"<p>{_inline(caption)}</p>")
    if laid.collapsed:
        out += ["<p>Not shown as rows: refused for one reason in every column.</p>",
                '<ul class="collapsed">']
        for specs, outcome, number in laid.collapsed:
            names = ", ".join(f"<code>{_e(s.name)}</code>" for s in specs)
            out.append(f"<li>{names} — {_e(grid.across)}: {_words(outcome.code, '-')}"
                       f"{_note_link(grid.anchor, number)}</li>")
        out.append("</ul>")
    if laid.notes:
        out += ["<p>Notes:</p>", '<ol class="notes">']
        for note in laid.notes:
            text = (_inline(evidence_text(note.evidence)) if note.evidence is not None
                    else f"<code>{_e(note.code)}</code>: {_e(note.reason)}")
            out.append(f'<li id="{_e(grid.anchor)}-{note.number}">{text}</li>')
        out.append("</ol>")
    return out


def render_html(specs: Iterable[StrategySpec] | None = None,
                report: ReportArg = DOCS_DIR) -> str:
    """The text of docs/compatibility.html: the same tables as one self-contained page
    (inline CSS, no scripts, no external assets) that fits 1000 px without scrolling
    sideways. Arguments as for :func:`render_markdown`."""
    reports = read_reports(report)
    data = compute(specs, merge_reports(reports))
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>interlock compatibility</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        "<!-- Generated by python -m interlock.matrix.compat; do not edit by hand. -->",
        "<h1>Compatibility</h1>",
        "<p>Each cell is what <code>interlock.plan()</code> answers for that strategy on a "
        "named machine profile. Hover a cell for the full reason of a refusal or what "
        "verified it; the numbered notes under each table say the same.</p>",
        "<h2>Legend</h2>",
        '<table class="legend"><tbody>',
        *(f'<tr><td class="{kind}">{_words(term, "-") if kind == "refused" else _e(term)}'
          f'{"<sup>n</sup>" if noted else ""}</td>'
          f"<td>{_inline(text)}</td></tr>"
          for kind, (term, noted, text) in zip(("verified", "declared", "refused"), _legend(),
                                               strict=True)),
        "</tbody></table>",
        f"<p>{_inline(_layout_sentence())}</p>",
        "<h3>What counts as verified</h3>",
        *(f"<p>{_inline(p)}</p>" for p in _rules()),
    ]
    if data.presets:
        out.append(f"<p>{_inline(_presets_sentence(data.presets))}</p>")
    for table in data.accelerators:
        out.append(f"<h2>Accelerator <code>{_e(table.accelerator)}</code></h2>")
        out += _html_grid(table.grid, _caption(table), _md_ok)
    env = data.environments
    out.append("<h2>Launch environments</h2>")
    out += _html_grid(env.grid, _environment_caption(), _md_env_ok)
    out += ["<p>Profiles and flags per environment:</p>", "<ul>"]
    out += [f"<li><b>{_e(e)}</b>: <code>{_e(p.name)}</code> ({_e(p.description)}); "
            f"{_e(_environment_geometry(e))}</li>"
            for e, p in zip(ENVIRONMENTS, env.profiles, strict=True)]
    out.append("</ul>")
    out += _html_parallelism(data.parallelism)
    out += _html_fits()
    out += ["<h2>Generated with</h2>",
            f"<p>interlock {_e(interlock.__version__)}, on these machine profiles:</p>", "<ul>"]
    out += [f"<li><code>{_e(p.name)}</code>: {_e(p.description)}</li>"
            for p in _profiles_used(data)]
    out.append("</ul>")
    if reports:
        out += ["<p>and these conformance reports:</p>", "<ul>"]
        out += [f"<li>{_inline(_report_line(r))}</li>" for r in reports]
        out.append("</ul>")
    else:
        out.append("<p>and no conformance report: every ✓ is declared.</p>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- what fits


def _fits_caption() -> str:
    machine = fits.MACHINES[0]
    return (f"What one device holds on {machine.name}, per reference model and strategy "
            f"({fits.PRECISION}, {fits.OPTIMIZER}; `✗` where it does not fit, with what it "
            "would need): `interlock.plan(model=...)`'s own answer. The other reference "
            "machines, and what each cell counts: [memory-fits.md](memory-fits.md).")


def _md_fits() -> list[str]:
    return ["## What fits", "", *wrap(_fits_caption()), "",
            *fits.markdown_table(*fits.table(fits.MACHINES[0])), ""]


def _html_fits() -> list[str]:
    headers, rows = fits.table(fits.MACHINES[0])
    out = ["<h2>What fits</h2>", f"<p>{_inline(_fits_caption())}</p>", "<table>",
           "<tr>" + "".join(f"<th>{_inline(h)}</th>" for h in headers) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows]
    out.append("</table>")
    return out


# --------------------------------------------------------------------------- parallelism


def _profiles_used(data: Compatibility) -> tuple[Profile, ...]:
    """Every profile the documents are computed on, in order of first use."""
    used = [*(t.profile for t in data.accelerators), *data.environments.profiles,
            *(t.setting.machine_profile for t in data.parallelism)]
    return tuple(dict.fromkeys(used))


def name_template(text: str, strategy: str) -> str:
    """:func:`reason_template`, and the strategy's name as the first word replaced too
    (the parallelism stage starts its reasons with the bare name: "fsdp cannot run
    tp=2"). A bare name elsewhere is left alone: it may be a package's ("'deepspeed'
    needs deepspeed")."""
    return re.sub(rf"\A{re.escape(strategy)}(?![\w-])", STRATEGY_PLACEHOLDER,
                  reason_template(text, strategy))


#: a parallelism cell's note key: ("refused", code, reason template) or
#: ("ok", shape, plan notes template)
_CellKey = tuple[str, str, str]


def _parallelism_key(spec: StrategySpec, answer: par.Answer) -> _CellKey:
    if answer.ok:
        return ("ok", answer.shape(), name_template("; ".join(answer.notes), spec.name))
    return ("refused", answer.code, name_template(answer.reason, spec.name))


@dataclass(frozen=True, slots=True)
class ParallelismLayout:
    """One profile's parallelism table as it is printed.

    Attributes:
        table: the cells.
        anchor: prefix of the note anchors in the HTML page.
        columns: the strategies shown as columns, each with the strategies of its family
            that give the same answer in every row (their own names in the reasons),
            which it stands for.
        rows: each layout, with one (answer, note number or None) per column.
        collapsed: strategies refused for one reason in every row, not shown as
            columns (with their alike strategies), the answer and its note number.
        notes: the notes: a refusal's reason, or what a resolved plan notes (code "").
    """

    table: par.Table
    anchor: str
    columns: tuple[tuple[StrategySpec, tuple[StrategySpec, ...]], ...]
    rows: tuple[tuple[par.NamedLayout, tuple[tuple[par.Answer, int | None], ...]], ...]
    collapsed: tuple[tuple[tuple[StrategySpec, ...], par.Answer, int], ...]
    notes: tuple[Note, ...]


def layout_parallelism(table: par.Table) -> ParallelismLayout:
    """Merge alike strategies into one column, take out the columns refused for one
    reason in every row, and number the notes (the same rules as :func:`layout`)."""
    answers = [(spec, [cells[i] for _, cells in table.rows])
               for i, spec in enumerate(table.strategies)]
    keys = {spec.name: tuple(_parallelism_key(spec, a) for a in column)
            for spec, column in answers}

    groups: list[tuple[StrategySpec, list[par.Answer], list[StrategySpec]]] = []
    for spec, column in answers:
        group = next((g for g in groups if g[0].family == spec.family
                      and keys[g[0].name] == keys[spec.name]), None)
        if group is None:
            groups.append((spec, column, []))
        else:
            group[2].append(spec)

    users: dict[_CellKey, int] = {}
    for spec, _ in answers:
        for key in set(keys[spec.name]):
            users[key] = users.get(key, 0) + 1

    numbers: dict[_CellKey, int] = {}
    notes: list[Note] = []

    def number(spec: StrategySpec, answer: par.Answer) -> int | None:
        key = _parallelism_key(spec, answer)
        if answer.ok and not answer.notes:
            return None
        if key not in numbers:
            numbers[key] = len(notes) + 1
            shared = users[key] > 1
            text = key[2] if shared else (answer.reason if not answer.ok
                                          else "; ".join(answer.notes))
            notes.append(Note(number=numbers[key], code=answer.code, reason=text))
        return numbers[key]

    shown = []
    collapsed_groups = []
    for spec, column, alike in groups:
        distinct = set(keys[spec.name])
        if len(distinct) == 1 and not column[0].ok:
            collapsed_groups.append((spec, column[0], alike))
        else:
            shown.append((spec, column, alike))
    rows = tuple(
        (layout, tuple((column[r], number(spec, column[r])) for spec, column, _ in shown))
        for r, (layout, _) in enumerate(table.rows)
    )
    merged: dict[_CellKey, list[StrategySpec]] = {}
    first: dict[_CellKey, tuple[StrategySpec, par.Answer]] = {}
    for spec, answer, alike in collapsed_groups:
        key = _parallelism_key(spec, answer)
        merged.setdefault(key, []).extend((spec, *alike))
        first.setdefault(key, (spec, answer))
    collapsed = []
    for key, specs in merged.items():
        note = number(*first[key])
        assert note is not None  # a refusal always has a note
        collapsed.append((tuple(specs), first[key][1], note))
    return ParallelismLayout(
        table=table, anchor=f"par-{table.setting.profile}",
        columns=tuple((spec, tuple(alike)) for spec, _, alike in shown),
        rows=rows, collapsed=tuple(collapsed), notes=tuple(notes),
    )


def _parallelism_intro() -> str:
    covered = _and([f"`{f}`" for f in par.FAMILIES])
    return (
        "Each cell is what `interlock.plan()` answers when the column's strategy is asked "
        "for the row's layout (a value of the `parallelism=` flag) on the profile, with "
        f"accelerator=\"auto\" and precision=\"{par.PRECISION}\": the device mesh it "
        "resolves to, naming each dimension of degree above 1, outermost first "
        f"(`pp2{par.SHAPE_SEPARATOR}dp_shard2{par.SHAPE_SEPARATOR}tp2` is pp=2, dp_shard=2, "
        "tp=2 and the other degrees 1), or the refusal code, whose reason is in the "
        "numbered note. [parallelism.md](parallelism.md) explains the dimensions, the flag "
        "and what the engine checks. The columns are `ddp` and every built-in strategy of "
        f"the {covered} families."
    )


def _parallelism_columns_sentence() -> str:
    return ("A column also stands for the strategies of its family listed under the table: "
            "they give the same answer in every row, with their own names in the reasons. "
            "A strategy refused for one reason in every row is listed under its table "
            "instead of as a column.")


def _layout_line(layout: par.NamedLayout) -> str:
    if layout.flag is None:
        return (f"**{layout.name}**: no `parallelism=` flag: each strategy's own default "
                "degrees (its row's `default_parallelism`).")
    return f"**{layout.name}**: `parallelism={layout.flag_text()}`"


def _parallelism_caption(table: par.Table) -> str:
    setting = table.setting
    profile = setting.machine_profile
    return (f"On the `{profile.name}` profile ({profile.description}), "
            f"devices={setting.devices} and num_nodes={setting.num_nodes}: a world of "
            f"{setting.world_size} ranks.")


def _alike_line(spec: StrategySpec, alike: Sequence[StrategySpec]) -> str:
    names = ", ".join(f"`{s.name}`" for s in alike)
    return f"`{spec.name}` also stands for {names}."


def _parallelism_note_text(note: Note) -> str:
    """A note in the inline syntax, unescaped (each renderer escapes it)."""
    if note.code:
        return note.reason
    return f"resolves, and the plan notes: {note.reason}"


def _md_parallelism_note(note: Note) -> str:
    text = _md_text(_parallelism_note_text(note))
    return f"`{note.code}`: {text}" if note.code else text


def _md_parallelism_cell(answer: par.Answer, note: int | None) -> str:
    if answer.ok:
        return answer.shape() + ("" if note is None else _sup(note))
    return _md_cell(Outcome(ok=False, code=answer.code), note, "")


def _md_parallelism(tables: Sequence[par.Table]) -> list[str]:
    """The Markdown lines of the parallelism section (ending with a blank line)."""
    if not tables:
        return []
    out = ["## Parallelism", "", *wrap(_parallelism_intro()), "",
           *wrap(_parallelism_columns_sentence()), "",
           "The layouts (rows), and the flag each passes:", ""]
    for layout in par.LAYOUTS:
        out += wrap(_layout_line(layout), first="- ", rest="  ")
    out.append("")
    for table in tables:
        laid = layout_parallelism(table)
        out += [f"### Profile `{table.setting.profile}`", "",
                *wrap(_parallelism_caption(table)), ""]
        if laid.columns:
            out.append(_md_table(
                ("layout", *(spec.name for spec, _ in laid.columns)),
                ((layout.name, *(_md_parallelism_cell(a, n) for a, n in cells))
                 for layout, cells in laid.rows),
            ))
            out.append("")
        alike = [(spec, others) for spec, others in laid.columns if others]
        if alike:
            for spec, others in alike:
                out += wrap(_alike_line(spec, others), first="- ", rest="  ")
            out.append("")
        if laid.collapsed:
            out += ["Not shown as columns: refused for one reason in every row.", ""]
            for specs, answer, number in laid.collapsed:
                names = ", ".join(f"`{s.name}`" for s in specs)
                out += wrap(f"{names} — every layout: `{answer.code}`{_sup(number)}",
                            first="- ", rest="  ")
            out.append("")
        out += _md_notes(laid.notes, _md_parallelism_note)
    return out


def _html_parallelism_cell(answer: par.Answer, anchor: str, note: int | None) -> str:
    if not answer.ok:
        return _html_cell(Outcome(ok=False, code=answer.code, reason=answer.reason), "",
                          anchor, note)
    link = _note_link(anchor, note) if note is not None else ""
    title = f' title="{_e("; ".join(answer.notes))}"' if answer.notes else ""
    shape = f"{par.SHAPE_SEPARATOR}<wbr>".join(_e(f"{d}{n}") for d, n in answer.degrees())
    return f'<td class="declared"{title}>{shape or _e(answer.shape())}{link}</td>'


def _html_parallelism(tables: Sequence[par.Table]) -> list[str]:
    """The HTML lines of the parallelism section."""
    if not tables:
        return []
    out = ["<h2>Parallelism</h2>", f"<p>{_inline(_parallelism_intro())}</p>",
           f"<p>{_inline(_parallelism_columns_sentence())}</p>",
           "<p>The layouts (rows), and the flag each passes:</p>", "<ul>",
           *(f"<li>{_inline(_layout_line(layout))}</li>" for layout in par.LAYOUTS),
           "</ul>"]
    for table in tables:
        laid = layout_parallelism(table)
        anchor = laid.anchor
        out.append(f"<h3>Profile <code>{_e(table.setting.profile)}</code></h3>")
        caption = _parallelism_caption(table)
        if laid.columns:
            head = "<th>layout</th>" + "".join(_html_strategy(s) for s, _ in laid.columns)
            body = "\n".join(
                f'<tr><th title="{_e(_layout_title(layout))}">{_e(layout.name)}</th>'
                + "".join(_html_parallelism_cell(a, anchor, n) for a, n in cells) + "</tr>"
                for layout, cells in laid.rows
            )
            out += ['<table class="grid">', f"<caption>{_inline(caption)}</caption>",
                    '<colgroup><col class="strategy"></colgroup>',
                    f"<thead><tr>{head}</tr></thead>", "<tbody>", body, "</tbody>",
                    "</table>"]
        else:
            out.append(f"<p>{_inline(caption)}</p>")
        alike = [(spec, others) for spec, others in laid.columns if others]
        if alike:
            out += ["<ul>", *(f"<li>{_inline(_alike_line(s, o))}</li>" for s, o in alike),
                    "</ul>"]
        if laid.collapsed:
            out += ["<p>Not shown as columns: refused for one reason in every row.</p>",
                    '<ul class="collapsed">']
            for specs, answer, number in laid.collapsed:
                names = ", ".join(f"<code>{_e(s.name)}</code>" for s in specs)
                out.append(f"<li>{names} — every layout: {_words(answer.code, '-')}"
                           f"{_note_link(anchor, number)}</li>")
            out.append("</ul>")
        if laid.notes:
            out += ["<p>Notes:</p>", '<ol class="notes">']
            for note in laid.notes:
                text = _e(_parallelism_note_text(note))
                if note.code:
                    text = f"<code>{_e(note.code)}</code>: {text}"
                out.append(f'<li id="{_e(anchor)}-{note.number}">{text}</li>')
            out.append("</ol>")
    return out


def _layout_title(layout: par.NamedLayout) -> str:
    return ("parallelism= not given" if layout.flag is None
            else f"parallelism={layout.flag_text()}")


# --------------------------------------------------------------------------- files


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", newline="\n")
    tmp.replace(path)


def main(argv: Sequence[str] | None = None) -> int:
    """Write docs/compatibility.md and .html under ROOT (default: the current
    directory), reading every conformance report in ROOT/docs."""
    from interlock.connector.docs import checkout_root

    root = checkout_root(None if argv is None else list(argv),
                         "python -m interlock.matrix.compat",
                         "docs/compatibility.md and .html, reading every conformance "
                         "report in ROOT/docs")
    reports = root / DOCS_DIR
    for path, text in ((root / MARKDOWN_PATH, render_markdown(report=reports)),
                       (root / HTML_PATH, render_html(report=reports))):
        _write(path, text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
