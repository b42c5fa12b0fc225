"""The page's parallelism section: one table per setting (a machine profile and the
``parallelism=`` layouts asked for), its columns merged and its notes numbered like
the main tables, in both formats."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from interlock.engine.specs import StrategySpec
from interlock.matrix import parallelism as par
from interlock.matrix.compat.data import STRATEGY_PLACEHOLDER, Compatibility, Outcome
from interlock.matrix.compat.html_text import (
    escape,
    html_cell,
    html_collapsed,
    html_notes,
    html_strategy,
    html_table,
    inline_html,
    note_link,
)
from interlock.matrix.compat.layout import Note, reason_template
from interlock.matrix.compat.markdown_text import (
    md_cell,
    md_collapsed,
    md_notes,
    md_table,
    md_text,
    superscript,
    wrap,
)
from interlock.matrix.compat.words import and_list
from interlock.matrix.profiles import Profile


def profiles_used(data: Compatibility) -> tuple[Profile, ...]:
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
    covered = and_list([f"`{f}`" for f in par.FAMILIES])
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
    text = md_text(_parallelism_note_text(note))
    return f"`{note.code}`: {text}" if note.code else text


def _md_parallelism_cell(answer: par.Answer, note: int | None) -> str:
    if answer.ok:
        return answer.shape() + ("" if note is None else superscript(note))
    return md_cell(Outcome(ok=False, code=answer.code), note, "")


def md_parallelism(tables: Sequence[par.Table]) -> list[str]:
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
            out.append(md_table(
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
        out += md_collapsed("columns", "every layout", laid.collapsed)
        out += md_notes(laid.notes, _md_parallelism_note)
    return out


def _html_parallelism_cell(answer: par.Answer, anchor: str, note: int | None) -> str:
    if not answer.ok:
        return html_cell(Outcome(ok=False, code=answer.code, reason=answer.reason), "",
                          anchor, note)
    link = note_link(anchor, note) if note is not None else ""
    title = f' title="{escape("; ".join(answer.notes))}"' if answer.notes else ""
    shape = f"{par.SHAPE_SEPARATOR}<wbr>".join(escape(f"{d}{n}") for d, n in answer.degrees())
    return f'<td class="declared"{title}>{shape or escape(answer.shape())}{link}</td>'


def html_parallelism(tables: Sequence[par.Table]) -> list[str]:
    """The HTML lines of the parallelism section."""
    if not tables:
        return []
    out = ["<h2>Parallelism</h2>", f"<p>{inline_html(_parallelism_intro())}</p>",
           f"<p>{inline_html(_parallelism_columns_sentence())}</p>",
           "<p>The layouts (rows), and the flag each passes:</p>", "<ul>",
           *(f"<li>{inline_html(_layout_line(layout))}</li>" for layout in par.LAYOUTS),
           "</ul>"]
    for table in tables:
        laid = layout_parallelism(table)
        anchor = laid.anchor
        out.append(f"<h3>Profile <code>{escape(table.setting.profile)}</code></h3>")
        head = "<th>layout</th>" + "".join(html_strategy(s) for s, _ in laid.columns)
        body = "\n".join(
            f'<tr><th title="{escape(_layout_title(layout))}">{escape(layout.name)}</th>'
            + "".join(_html_parallelism_cell(a, anchor, n) for a, n in cells) + "</tr>"
            for layout, cells in laid.rows
        ) if laid.columns else ""
        out += html_table(_parallelism_caption(table), head, body)
        alike = [(spec, others) for spec, others in laid.columns if others]
        if alike:
            out += ["<ul>", *(f"<li>{inline_html(_alike_line(s, o))}</li>" for s, o in alike),
                    "</ul>"]
        out += html_collapsed("columns", "every layout", anchor, laid.collapsed)
        out += html_notes(laid.notes, anchor, _html_parallelism_note)
    return out


def _html_parallelism_note(note: Note) -> str:
    text = escape(_parallelism_note_text(note))
    return f"<code>{escape(note.code)}</code>: {text}" if note.code else text


def _layout_title(layout: par.NamedLayout) -> str:
    return ("parallelism= not given" if layout.flag is None
            else f"parallelism={layout.flag_text()}")
