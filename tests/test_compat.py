"""The generated compatibility docs and the doctor report say what the engine says."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from typeguard import suppress_type_checks

import interlock
from interlock import unregister
from interlock.engine.specs import StrategySpec
from interlock.engine.tables import PRECISION_NAMES
from interlock.matrix import compat
from interlock.matrix import parallelism as par
from interlock.matrix.compat import (
    DOCS_DIR,
    ENVIRONMENTS,
    HTML_PATH,
    MARKDOWN_PATH,
    MAX_MARKDOWN_LINE,
    compute,
    environment_devices,
    html_text,
    markdown_text,
    reason_template,
    render_html,
    render_markdown,
)
from interlock.matrix.doctor import doctor_report, main, runners
from interlock.matrix.profiles import profile_named
from interlock.matrix.reports import (
    load_report,
    merge_reports,
    read_report,
    read_reports,
    report_files,
)

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "run `python -m interlock.matrix.compat` from the repository root to regenerate it"
_FROM_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")

#: for the tests that render whole pages again (from other reports, to other places):
#: a page plans about 1,200 cells, 0.3 s as shipped and 6 to 10 s under typeguard's
#: instrumentation; the renderer and the engine are type-checked once here (the
#: `markdown` fixture and the committed pages) and by the engine's own tests
fast_render = suppress_type_checks


# --------------------------------------------------------------------------- reading pages


def _md_section(markdown: str, heading: str) -> str:
    return markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def _accelerator(markdown: str, accelerator: str) -> str:
    return _md_section(markdown, f"Accelerator `{accelerator}`")


def _environments(markdown: str) -> str:
    return _md_section(markdown, "Launch environments")


def _table(section: str) -> tuple[list[str], dict[str, list[str]]]:
    """The header and the rows (by strategy) of the one table in a section."""
    lines = [line for line in section.splitlines() if line.startswith("|")]
    split = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    header, rows = split[0], split[2:]
    return header, {row[0]: row[1:] for row in rows}


def _split_note(cell: str) -> tuple[str, int | None]:
    """A cell's text and the number of its note (None without one)."""
    match = re.fullmatch(r"(.*?)([⁰¹²³⁴⁵⁶⁷⁸⁹]+)", cell)
    if match is None:
        return cell, None
    return match[1], int(match[2].translate(_FROM_SUPERSCRIPT))


def _notes(section: str) -> dict[int, str]:
    """The numbered notes under a section's table, each joined onto one line."""
    notes: dict[int, str] = {}
    current: int | None = None
    for line in section.split("\nNotes:\n", 1)[1].splitlines():
        match = re.match(r"(\d+)\. (.*)", line)
        if match:
            current = int(match[1])
            notes[current] = match[2]
        elif line.startswith(" ") and current is not None:
            notes[current] += " " + line.strip()
        else:
            current = None
    return notes


def _collapsed(section: str) -> dict[str, str]:
    """strategy -> the "code + note" text of the collapsed line that lists it."""
    found: dict[str, str] = {}
    text = section.split("refused for one reason in every column.", 1)
    if len(text) == 1:
        return found
    items = re.split(r"\n- ", "\n" + text[1].split("\n\n", 2)[1])
    for item in filter(None, items):
        names, _, outcome = " ".join(item.split()).rpartition(": ")
        for name in re.findall(r"`([^`]+)`", names.split(" — ")[0]):
            found[name] = outcome.strip("`").replace("`", "")
    return found


def _cell(markdown: str, accelerator: str, strategy: str, precision: str) -> str:
    """What an accelerator table shows for one cell (a collapsed row's code too)."""
    section = _accelerator(markdown, accelerator)
    _, rows = _table(section) if "\n|" in section else ([], {})
    if strategy in rows:
        return rows[strategy][PRECISION_NAMES.index(precision)]
    collapsed = _collapsed(section)
    assert strategy in collapsed, f"no row for {strategy!r} in the {accelerator} table"
    return collapsed[strategy]


def _env_row(markdown: str, strategy: str) -> dict[str, str]:
    header, rows = _table(_environments(markdown))
    return dict(zip(header[1:], rows[strategy], strict=True))


@pytest.fixture(scope="module")
def markdown() -> str:
    return render_markdown(report=None)


@pytest.fixture(scope="module")
def html_page() -> str:
    """The HTML page without a report, rendered once (under typeguard) for the tests
    that read it."""
    return render_html(report=None)


@pytest.fixture(scope="module")
def data() -> compat.Compatibility:
    """The compatibility data without a report, computed once."""
    return compute()


# --------------------------------------------------------------------------- fake reports


def _record(status: str = "passed", check: str = "training_parity",
            precision: str = "32-true", strategy: str = "ddp", runner: str = "cpu",
            world_size: str = "2") -> dict[str, str]:
    return {"strategy": strategy, "runner": runner, "world_size": world_size,
            "precision": precision, "check": check, "status": status, "message": ""}


def _declaration(strategy: str = "ddp", runner: str = "cpu") -> dict[str, str]:
    return _record(check="declaration", precision="*", strategy=strategy, runner=runner,
                   world_size="*")


def _write_report(directory: Path, records: list[dict[str, str]],
                  name: str = "conformance-report.json",
                  **top: object) -> Path:
    path = directory / name
    body = {"interlock": "0", "torch": "0", "machine": {}, **top, "records": records}
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- committed docs


@pytest.mark.parametrize(("path", "render"), [(MARKDOWN_PATH, render_markdown),
                                              (HTML_PATH, render_html)])
def test_committed_docs_match_the_code(path: Path, render: object) -> None:
    assert callable(render)
    committed = (ROOT / path).read_text(encoding="utf-8")
    assert committed == render(report=ROOT / DOCS_DIR), f"{path} is stale: {REGENERATE}"


def test_committed_docs_verify_the_cpu_runs() -> None:
    # The committed CPU report runs ddp at world sizes 1 and 2 and single_device at 1.
    text = (ROOT / MARKDOWN_PATH).read_text(encoding="utf-8")
    assert _cell(text, "cpu", "ddp", "32-true").startswith("✓ verified")
    env = _env_row(text, "ddp")
    assert _split_note(env["local"])[0] == "✓ subprocess, verified"
    assert _split_note(env["torchrun"])[0] == "✓ external"
    assert _split_note(_env_row(text, "single_device")["local"])[0] == "✓ in-process, verified"


# --------------------------------------------------------------------------- cells


@pytest.mark.parametrize(
    ("accelerator", "strategy", "precision", "expected"),
    [
        ("cpu", "fsdp", "64-true", "unsupported-precision"),
        ("cpu", "ddp", "16-mixed", "✓ declared"),
        ("cpu", "deepspeed", "32-true", "✓ declared"),
        ("cpu", "deepspeed_stage_3", "16-mixed", "unsupported-precision"),
        ("mps", "deepspeed", "32-true", "unsupported-accelerator"),
        ("cuda", "deepspeed", "bf16-mixed", "✓ declared"),
        ("cuda", "ddp", "transformer-engine", "✓ declared"),
        ("xla", "fsdp", "32-true", "unsupported-accelerator"),
        ("xla", "xla", "bf16-true", "✓ declared"),
        ("xla", "xla", "bf16-mixed", "unsupported-precision"),
        ("mps", "single_device", "64-true", "unsupported-precision"),
    ],
)
def test_cells_say_what_the_engine_says(markdown: str, accelerator: str, strategy: str,
                                        precision: str, expected: str) -> None:
    cell = _split_note(_cell(markdown, accelerator, strategy, precision))[0]
    assert cell == expected, (
        f"{accelerator}/{strategy}/{precision}: the table shows {cell!r}, expected {expected!r}"
    )


def test_refused_cell_shows_code_and_note_gives_reason(markdown: str) -> None:
    machine = profile_named("cpu-extras").machine
    with pytest.raises(interlock.ResolutionError) as info:
        interlock.plan(accelerator="cpu", devices=2, strategy="fsdp", precision="64-true",
                       machine=machine)
    code, note = _split_note(_cell(markdown, "cpu", "fsdp", "64-true"))
    assert code == info.value.code and note is not None
    # fsdp's own reason: the DeepSpeed rows refuse 64-true naming what they run on cpu
    assert _notes(_accelerator(markdown, "cpu"))[note] == f"`{code}`: {info.value.reason}"
    assert "on cpu" not in info.value.reason


def test_cuda_table_says_packages_are_installed(markdown: str) -> None:
    section = _accelerator(markdown, "cuda")
    assert "deepspeed and transformer_engine are installed" in " ".join(section.split())
    assert "missing-package" not in section


def test_presets_paragraph_printed_once(markdown: str, html_page: str) -> None:
    flat = " ".join(markdown.split())
    assert flat.count("Presets are not shown as rows") == 1
    assert "`ddp_find_unused_parameters_true` (of `ddp`)" in flat
    assert "| ddp_find_unused_parameters_true" not in markdown
    assert html_page.count("Presets are not shown as rows") == 1


# --------------------------------------------------------------------------- readability


@fast_render
def test_markdown_lines_are_short(markdown: str, tmp_path: Path) -> None:
    # The widest case: every cell of the cuda and xla tables verified, with notes.
    records = [_record(strategy=s.name, runner=r, precision=p)
               for s in compat.builtin_specs() for r in ("cpu", "cuda", "tpu")
               for p in PRECISION_NAMES]
    report = _write_report(tmp_path, records, date="2031-12-24",
                           runners={"tpu": "xla-cpu", "cuda": "NVIDIA H200"})
    for text in (markdown, render_markdown(report=report),
                 (ROOT / MARKDOWN_PATH).read_text(encoding="utf-8")):
        long = [line for line in text.splitlines() if len(line) > MAX_MARKDOWN_LINE]
        assert not long, f"{len(long)} lines over {MAX_MARKDOWN_LINE} characters: {long[0]}"
        prose = [line for line in text.splitlines()
                 if not line.startswith("|") and len(line) > compat.PROSE_WIDTH + 40]
        assert not prose, prose


def test_each_distinct_reason_printed_once_per_table(markdown: str,
                                                    data: compat.Compatibility) -> None:
    grids = [(_accelerator(markdown, t.accelerator), t.grid) for t in data.accelerators]
    grids.append((_environments(markdown), data.environments.grid))
    for section, grid in grids:
        notes = _notes(section)
        assert len(set(notes.values())) == len(notes), f"a note repeats: {notes}"
        for spec, cells in grid.rows:
            for cell in cells:
                if cell.ok:
                    continue
                exact = f"`{cell.code}`: {cell.reason}"
                shared = f"`{cell.code}`: {reason_template(cell.reason, spec.name)}"
                found = [n for n in notes.values() if n in (exact, shared)]
                assert len(found) == 1, f"{spec.name}: {exact!r} is in {len(found)} notes"
                # the reason lives in the note, never in the cells
                assert section.count(cell.reason) <= 1


def test_rows_refused_for_one_reason_collapse(markdown: str) -> None:
    section = _accelerator(markdown, "mps")
    _, rows = _table(section)
    ds = [s.name for s in compat.builtin_specs()
          if s.name.startswith("deepspeed") and s.variant_of is None]
    assert not set(ds) & set(rows), "fully refused rows are not table rows"
    lines = [line for line in section.split("\n- ")[1:] if "`deepspeed_stage_1`" in line]
    assert len(lines) == 1
    assert "all precisions: `unsupported-accelerator`" in " ".join(lines[0].split())
    collapsed = _collapsed(section)
    assert {collapsed[name] for name in ds} == {collapsed["deepspeed"]}
    note = _split_note(collapsed["deepspeed"])[1]
    assert note is not None
    assert _notes(section)[note].startswith(
        "`unsupported-accelerator`: '{strategy}' runs on cpu, cuda")
    # a row refused in some columns only stays a row
    assert "single_device" in rows


def test_wrap_never_opens_a_block() -> None:
    text = " ".join(["word"] * 12 + ["-", "3.", "#", ">", "+", "12)", "end"] * 3)
    lines = compat.wrap(text, width=16, first="- ", rest="  ")
    assert " ".join(" ".join(lines)[2:].split()) == text
    for line in lines[1:]:
        assert not re.match(r"\s*(?:[-+*>#|=]|\d+[.)])", line), line


# --------------------------------------------------------------------------- environments


def test_environment_table(markdown: str) -> None:
    header, _ = _table(_environments(markdown))
    assert header == ["strategy", *ENVIRONMENTS]
    ddp = {k: _split_note(v)[0] for k, v in _env_row(markdown, "ddp").items()}
    assert ddp["local"] == "✓ subprocess"
    assert ddp["notebook"] == "interactive-incompatible"
    assert ddp["torchrun"] == "✓ external"
    assert ddp["slurm"] == "✓ external"
    notebook = {k: _split_note(v)[0] for k, v in _env_row(markdown, "ddp_notebook").items()}
    assert notebook["notebook"] == "✓ fork"
    assert notebook["no-fork"] == "start-method-unavailable"


def test_one_device_strategies_get_one_device_everywhere(markdown: str) -> None:
    spec = interlock.registered(interlock.StrategySpec)["single_device"]
    assert spec.max_devices == 1
    assert all(environment_devices(spec, e) == 1 for e in ENVIRONMENTS)
    assert environment_devices(interlock.registered(interlock.StrategySpec)["ddp"], "torchrun") == 8
    single = {k: _split_note(v)[0] for k, v in _env_row(markdown, "single_device").items()}
    assert single["no-fork"] == "✓ in-process", "not invalid-devices: it asks for devices=1"
    assert single["local"] == single["notebook"] == "✓ in-process"
    assert "invalid-devices" not in _environments(markdown)


def _env_outcomes(report: Path, strategy: str) -> dict[str, compat.Outcome]:
    data = compute(verification=merge_reports(read_reports(report)))
    cells = dict((spec.name, cells) for spec, cells in data.environments.grid.rows)[strategy]
    return dict(zip(ENVIRONMENTS, cells, strict=True))


@fast_render
def test_environment_cells_verified_from_the_report(tmp_path: Path) -> None:
    records = [_declaration(), _record(world_size="1"), _record(world_size="2"),
               _record(check="collectives", precision="*", world_size="2")]
    for name in ("ddp_fork", "ddp_notebook"):
        records += [_declaration(name), _record(strategy=name)]
    report = _write_report(tmp_path, records, date="2030-05-06", runners={"cpu": "cpu"})
    ddp = _env_outcomes(report, "ddp")
    assert ddp["local"].verified
    assert ddp["local"].evidence is not None and ddp["local"].evidence.world_sizes == (2,)
    # resolved, but a cluster launch or another platform is not what the runner exercised
    assert ddp["torchrun"].ok and not ddp["torchrun"].verified
    assert ddp["slurm"].ok and not ddp["slurm"].verified
    assert ddp["no-fork"].ok and not ddp["no-fork"].verified
    # the CPU runner does not run inside a notebook
    assert not _env_outcomes(report, "ddp_notebook")["notebook"].verified
    assert _env_outcomes(report, "ddp_notebook")["local"].verified
    text = render_markdown(report=report)
    cell, note = _split_note(_env_row(text, "ddp")["local"])
    assert cell == "✓ subprocess, verified" and note is not None
    assert "`cpu` runner at world size 2" in _notes(_environments(text))[note]
    assert "2030-05-06" in _notes(_environments(text))[note]


@fast_render
def test_environment_cell_needs_its_world_size(tmp_path: Path) -> None:
    # ddp's local cell launches 2 processes; a run at world size 1 does not cover it,
    # while the accelerator table (any world size the runner launched) is verified.
    report = _write_report(tmp_path, [_declaration(), _record(world_size="1")])
    assert not _env_outcomes(report, "ddp")["local"].verified
    text = render_markdown(report=report)
    assert _split_note(_cell(text, "cpu", "ddp", "32-true"))[0] == "✓ verified"
    # single_device's cell launches 1 process
    single = _write_report(tmp_path, [_record(strategy="single_device", world_size="1")],
                           name="conformance-report-single.json")
    assert _env_outcomes(single, "single_device")["local"].verified
    assert _env_outcomes(single, "single_device")["no-fork"].ok
    assert not _env_outcomes(single, "single_device")["no-fork"].verified


# --------------------------------------------------------------------------- reports


def test_report_absent_verifies_nothing(tmp_path: Path) -> None:
    assert load_report(tmp_path / "missing.json") == {}
    assert read_reports(tmp_path) == ()
    assert read_reports(None) == ()


def test_report_cell_verified_when_a_check_ran_and_none_failed(tmp_path: Path) -> None:
    passed = _write_report(tmp_path, [
        _declaration(), _record(), _record("skipped", "scaler_skip"),
        _record("xfailed", "clipping"), _record(check="collectives", precision="*"),
    ])
    assert set(load_report(passed)) == {("ddp", "cpu", "32-true")}, "skips are neutral"
    failed = _write_report(tmp_path, [_record(), _record("failed", "init_contexts")])
    assert load_report(failed) == {}
    any_failed = _write_report(tmp_path, [_record(), _record("failed", "collectives", "*")])
    assert load_report(any_failed) == {}, "a failed '*' check counts for every precision"
    not_run = _write_report(tmp_path, [_record(), _record("not run", "clipping")])
    assert load_report(not_run) == {}, "a check that did not run spoils it"
    declaration_failed = _write_report(tmp_path, [_record(), {**_declaration(),
                                                              "status": "failed"}])
    assert load_report(declaration_failed) == {}
    only_skips = _write_report(tmp_path, [_record("skipped", "scaler_skip")])
    assert load_report(only_skips) == {}
    only_xfailed = _write_report(tmp_path, [_record("xfailed")])
    assert load_report(only_xfailed) == {}, "an expected failure proves nothing"
    other_precision = _write_report(tmp_path, [_record(), _record("failed", precision="16-true")])
    assert set(load_report(other_precision)) == {("ddp", "cpu", "32-true")}


@fast_render
def test_a_report_that_checked_nothing_verifies_nothing(tmp_path: Path) -> None:
    # Only the declaration passed (say every launch was skipped): nothing ran in ranks.
    only_declaration = _write_report(tmp_path, [
        _declaration(), _record("skipped"), _record("skipped", check="collectives",
                                                    precision="*"),
    ])
    assert load_report(only_declaration) == {}
    text = render_markdown(report=only_declaration)
    assert _cell(text, "cpu", "ddp", "32-true") == "✓ declared"
    assert _split_note(_env_row(text, "ddp")["local"])[0] == "✓ subprocess"
    # precision-independent checks alone do not verify a precision either
    star_only = _write_report(tmp_path, [_record(check="collectives", precision="*"),
                                         _record("skipped")])
    assert load_report(star_only) == {}


@fast_render
def test_report_marks_cells_verified(tmp_path: Path) -> None:
    report = _write_report(tmp_path, [_declaration(), _record()], date="2030-01-02")
    text = render_markdown(report=report)
    assert _split_note(_cell(text, "cpu", "ddp", "32-true"))[0] == "✓ verified"
    assert _cell(text, "cpu", "ddp", "16-mixed") == "✓ declared"
    # the cpu runner's results say nothing about cuda
    assert _cell(text, "cuda", "ddp", "32-true") == "✓ declared"
    assert 'class="verified"' in render_html(report=report)


@fast_render
def test_verified_cell_names_runner_and_date(tmp_path: Path) -> None:
    report = _write_report(tmp_path, [_declaration(), _record()], date="2030-01-02",
                           runners={"cpu": "cpu"})
    text = render_markdown(report=report)
    _, note = _split_note(_cell(text, "cpu", "ddp", "32-true"))
    assert note is not None
    assert _notes(_accelerator(text, "cpu"))[note] == (
        "verified by the `cpu` runner at world size 2: every check that ran passed; report "
        "dated 2030-01-02 ([conformance-report.json](conformance-report.json)).")
    page = render_html(report=report)
    cell = re.search(r'<td class="verified" title="([^"]*)">✓ verified'
                     r'<sup><a href="#cpu-(\d+)">', page)
    assert cell is not None
    assert "cpu runner" in cell[1] and "2030-01-02" in cell[1]
    assert re.search(rf'<li id="cpu-{cell[2]}">verified by the <code>cpu</code> runner'
                     r'[^<]*2030-01-02', page)
    # an older report without a date says so
    undated = _write_report(tmp_path, [_declaration(), _record()], name="old.json")
    text = render_markdown(report=undated)
    _, note = _split_note(_cell(text, "cpu", "ddp", "32-true"))
    assert note is not None and "undated report" in _notes(_accelerator(text, "cpu"))[note]


@fast_render
def test_multiple_reports_merge(tmp_path: Path) -> None:
    _write_report(tmp_path, [_declaration(), _record(), _record(precision="16-true")],
                  date="2030-01-02", runners={"cpu": "cpu"})
    _write_report(tmp_path, [_record(strategy="xla", runner="tpu", precision="bf16-true",
                                     world_size="1")],
                  name="conformance-report-xla.json", date="2030-02-03",
                  runners={"tpu": "xla-cpu"})
    # a newer CPU run of one precision, and an undated one
    _write_report(tmp_path, [_record()], name="conformance-report-cpu2.json",
                  date="2030-03-04", runners={"cpu": "cpu"})
    _write_report(tmp_path, [_record(precision="16-true", world_size="1")],
                  name="conformance-report-old.json")
    (tmp_path / "conformance-reports.json").write_text("not a report", encoding="utf-8")
    (tmp_path / "notes.json").write_text("[]", encoding="utf-8")
    assert [p.name for p in report_files(tmp_path)] == [
        "conformance-report-cpu2.json", "conformance-report-old.json",
        "conformance-report-xla.json", "conformance-report.json"]
    merged = merge_reports(read_reports(tmp_path))
    assert [e.date for e in merged[("ddp", "cpu", "32-true")]] == ["2030-03-04", "2030-01-02"]
    assert [e.date for e in merged[("ddp", "cpu", "16-true")]] == ["2030-01-02", ""]
    assert merged[("xla", "tpu", "bf16-true")][0].place == "tpu on xla-cpu"

    text = render_markdown(report=tmp_path)
    cpu = _notes(_accelerator(text, "cpu"))
    assert "2030-03-04" in cpu[_split_note(_cell(text, "cpu", "ddp", "32-true"))[1] or 0]
    assert "2030-01-02" in cpu[_split_note(_cell(text, "cpu", "ddp", "16-true"))[1] or 0]
    xla_cell, xla_note = _split_note(_cell(text, "xla", "xla", "bf16-true"))
    assert xla_cell == "✓ verified" and xla_note is not None
    assert _notes(_accelerator(text, "xla"))[xla_note] == (
        "verified by the `tpu` runner on xla-cpu at world size 1: every check that ran "
        "passed; report dated 2030-02-03 "
        "([conformance-report-xla.json](conformance-report-xla.json)).")
    assert _cell(text, "xla", "xla", "32-true") == "✓ declared"
    generated = " ".join(_md_section(text, "Generated with").split())
    assert "[conformance-report-old.json](conformance-report-old.json): undated" in generated
    assert "`tpu` on xla-cpu" in generated


@pytest.mark.parametrize(
    "body",
    [{"not": "a list"}, {"records": 3}, [{"strategy": "ddp"}], ["x"],
     {"records": [], "date": "yesterday"}, {"records": [], "runners": ["cpu"]},
     [{**_record(), "world_size": 2}]],
)
def test_malformed_report_is_refused(tmp_path: Path, body: object) -> None:
    path = tmp_path / "conformance-report.json"
    path.write_text(json.dumps(body), encoding="utf-8")
    with pytest.raises(ValueError, match="conformance report"):
        read_report(path)


@fast_render
def test_markdown_is_stable_and_machine_free(markdown: str) -> None:
    import torch

    assert render_markdown(report=None) == markdown
    assert torch.__version__ not in markdown
    assert f"interlock {interlock.__version__}" in markdown
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", markdown), "no dates without reports"
    committed = (ROOT / MARKDOWN_PATH).read_text(encoding="utf-8")
    dates = {r.date for r in read_reports(ROOT / DOCS_DIR)}
    assert set(re.findall(r"\b20\d\d-\d\d-\d\d\b", committed)) <= dates, (
        "the only dates are those of the committed reports")


# --------------------------------------------------------------------------- html


def test_html_is_self_contained(html_page: str) -> None:
    page = html_page
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page
    external = re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page)
    assert not external, f"external assets in the page: {external}"
    assert "<style>" in page


@fast_render
def test_html_fits_1000px() -> None:
    page = render_html(report=ROOT / DOCS_DIR)
    css = page.split("<style>", 1)[1].split("</style>", 1)[0]
    assert "max-width: 1000px" in css
    assert re.search(r"table\.grid \{[^}]*table-layout: fixed;[^}]*width: 100%", css)
    assert re.search(r"code \{[^}]*white-space: nowrap", css)
    assert re.search(r"code\.words span \{[^}]*white-space: nowrap", css)
    # long headers are abbreviated, with the full name on hover
    assert '<th><abbr title="transformer-engine-float16">te-float16</abbr></th>' in page
    # nothing that cannot wrap is wider than a narrow column: codes and names break
    # only between their words
    for table in re.findall(r'<table class="grid">.*?</table>', page, flags=re.S):
        body = re.sub(r"<caption>.*?</caption>", "", table, flags=re.S)
        units = re.findall(r"<span>([^<]*)</span>|<code>([^<]*)</code>", body)
        widest = max(len(a or b) for a, b in units)
        assert widest <= 12, f"an unbreakable piece of {widest} characters"


def test_html_marks_refusals_with_full_reason(html_page: str) -> None:
    page = html_page
    machine = profile_named("cpu-extras").machine
    with pytest.raises(interlock.ResolutionError) as info:
        interlock.plan(accelerator="cpu", devices=2, strategy="fsdp", precision="64-true",
                       machine=machine)
    title = f'title="{html.escape(info.value.reason, quote=True)}"'
    code = ('<code class="words"><span>unsupported-</span><wbr><span>precision</span>'
            "</code>")
    match = re.search(rf'<td class="refused" {re.escape(title)}>{re.escape(code)}'
                      r'<sup><a href="#cpu-(\d+)">\d+</a></sup></td>', page)
    assert match is not None
    # fsdp's own reason (the DeepSpeed rows name what they run on cpu)
    note = (f'<li id="cpu-{match[1]}"><code>unsupported-precision</code>: '
            f"{html.escape(info.value.reason, quote=True)}</li>")
    assert page.count(note) == 1


@pytest.fixture
def odd_strategy() -> Iterator[interlock.StrategySpec]:
    # Names cannot hold "<" (registration checks them), so markup travels in the
    # description, which the page shows on hover.
    spec = interlock.StrategySpec(
        name="compat_test_markup",
        factory="compat_test_pkg.strategy:Markup",
        description='<b>bold</b> & "quoted"',
        family="other",
        accelerators=frozenset(("cpu",)),
        precisions=frozenset(("32-true",)),
        launcher="subprocess",
    )
    interlock.register(spec)
    try:
        yield spec
    finally:
        interlock.unregister(interlock.StrategySpec, spec.name)


@fast_render
def test_html_escapes_registered_text(odd_strategy: interlock.StrategySpec) -> None:
    specs = list(interlock.registered(interlock.StrategySpec).values())
    page = render_html(specs=specs, report=None)
    assert "<b>bold</b>" not in page
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;" in page
    text = render_markdown(specs=specs, report=None)
    assert _cell(text, "cpu", "compat_test_markup", "32-true") == "✓ declared"
    assert _cell(text, "cpu", "compat_test_markup", "64-true").startswith(
        "unsupported-precision")


def test_html_escapes_reasons() -> None:
    cell = html_text.html_cell(compat.Outcome(ok=False, code="invalid-plugin",
                                            reason='<img src=x> & "q"'), "")
    assert "<img" not in cell and "&lt;img src=x&gt; &amp; &quot;q&quot;" in cell


def test_markdown_notes_escape_reasons() -> None:
    note = markdown_text.md_note(compat.Note(number=1, code="invalid-plugin",
                                       reason="a | b <i>*x*</i>"))
    assert "<i>" not in note and "*x*" not in note and "|" not in note


def test_compute_covers_every_accelerator_and_strategy(data: compat.Compatibility) -> None:
    assert [t.accelerator for t in data.accelerators] == ["cpu", "cuda", "mps", "xla"]
    names = [spec.name for spec, _ in data.accelerators[0].grid.rows]
    assert "ddp" in names and "deepspeed_stage_3" in names
    assert not any("find_unused" in n for n in names)


@fast_render
def test_main_writes_both_files(tmp_path: Path) -> None:
    assert compat.main([str(tmp_path)]) == 0
    assert (tmp_path / MARKDOWN_PATH).read_text(encoding="utf-8") == render_markdown(
        report=None)
    assert (tmp_path / HTML_PATH).read_text(encoding="utf-8") == render_html(report=None)
    assert not list((tmp_path / "docs").glob("*.tmp"))


# --------------------------------------------------------------------------- parallelism


def _direct_parallelism(setting: par.Setting, layout: par.NamedLayout,
                        strategy: str) -> tuple[str, str, tuple[str, ...]]:
    """(what the cell must show, the refusal's reason or "", the plan's notes), straight
    from interlock.plan."""
    try:
        result = interlock.plan(
            strategy=strategy, devices=setting.devices, num_nodes=setting.num_nodes,
            precision="32-true", machine=profile_named(setting.profile).machine,
            parallelism=None if layout.flag is None else dict(layout.flag))
    except interlock.ResolutionError as error:
        return error.code, error.reason, ()
    shown = "·".join(f"{d}{n}" for d, n in zip(result.mesh.dims, result.mesh.shape,
                                                strict=True) if n != 1)
    assert result.parallelism.world_size == result.world_size == setting.world_size
    return shown or "one rank", "", result.notes


def _parallelism_profiles(markdown: str) -> dict[str, str]:
    """profile -> its subsection of the Parallelism section."""
    section = _md_section(markdown, "Parallelism")
    parts = section.split("\n### Profile `")[1:]
    return {part.split("`", 1)[0]: part for part in parts}


def _parallelism_table(section: str) -> tuple[list[str], dict[str, list[str]]]:
    header, rows = _table(section)
    assert header[0] == "layout"
    return header[1:], rows


def _stands_for(section: str) -> dict[str, str]:
    """strategy -> the column that stands for it."""
    found: dict[str, str] = {}
    flat = " ".join(section.split("\nNotes:\n", 1)[0].split())
    for column, names in re.findall(r"`([^`]+)` also stands for ((?:`[^`]+`(?:, )?)+)\.",
                                    flat):
        for name in re.findall(r"`([^`]+)`", names):
            found[name] = column
    return found


def _collapsed_columns(section: str) -> dict[str, str]:
    """strategy -> the "code + note" of the line that lists it under the table."""
    found: dict[str, str] = {}
    text = section.split("refused for one reason in every row.", 1)
    if len(text) == 1:
        return found
    items = re.split(r"\n- ", "\n" + text[1].split("\n\n", 2)[1])
    for item in filter(None, items):
        names, _, outcome = " ".join(item.split()).rpartition(" — every layout: ")
        for name in re.findall(r"`([^`]+)`", names):
            found[name] = outcome.replace("`", "")
    return found


def _parallelism_cell(section: str, layout: str, strategy: str) -> str:
    """What a profile's table shows for a strategy and a layout (by name)."""
    columns, rows = _parallelism_table(section) if "\n|" in section else ([], {})
    column = _stands_for(section).get(strategy, strategy)
    if column in columns:
        return rows[layout][columns.index(column)]
    collapsed = _collapsed_columns(section)
    assert strategy in collapsed, f"{strategy} is neither a column nor listed"
    return collapsed[strategy]


def test_parallelism_cells_say_what_plan_says(markdown: str) -> None:
    """Every cell of the section, and the note it points to, is plan()'s answer."""
    profiles = _parallelism_profiles(markdown)
    assert list(profiles) == [s.profile for s in par.SETTINGS]
    names = [s.name for s in par.strategies()]
    assert names[:2] == ["ddp", "fsdp"] and "model_parallel" in names
    assert "deepspeed_stage_3" in names and "ddp_spawn" not in names
    for setting in par.SETTINGS:
        section = profiles[setting.profile]
        notes = _notes(section)
        for layout in par.LAYOUTS:
            for strategy in names:
                expected, reason, plan_notes = _direct_parallelism(setting, layout, strategy)
                cell, note = _split_note(_parallelism_cell(section, layout.name, strategy))
                where = f"{setting.profile}/{layout.name}/{strategy}"
                assert cell == expected, f"{where}: shows {cell!r}, plan() says {expected!r}"
                if reason:
                    assert note is not None, where
                    assert notes[note] in (
                        f"`{expected}`: {reason}",
                        f"`{expected}`: {compat.name_template(reason, strategy)}"), where
                elif plan_notes:
                    assert note is not None, where
                    assert notes[note] == ("resolves, and the plan notes: "
                                           + "; ".join(plan_notes)), where
                else:
                    assert note is None, where


def test_parallelism_data_is_plans_answer() -> None:
    for table in par.compute():
        for layout, cells in table.rows:
            for spec, answer in zip(table.strategies, cells, strict=True):
                expected, reason, notes = _direct_parallelism(table.setting, layout,
                                                              spec.name)
                shown = answer.shape() if answer.ok else answer.code
                assert (shown, answer.reason, answer.notes) == (expected, reason, notes)


@pytest.mark.parametrize(
    ("profile", "layout", "strategy", "expected"),
    [
        ("cuda-8-extras", "HSDP 2 x 4", "fsdp", "dp_replicate2·dp_shard4"),
        ("cuda-8-extras", "not given", "model_parallel", "tp8"),
        ("cuda-8-extras", "PP 2 x FSDP 2 x TP 2", "model_parallel", "pp2·dp_shard2·tp2"),
        ("cuda-8-extras", "CP 2, FSDP over the rest", "model_parallel", "dp_shard4·cp2"),
        ("cuda-8-extras", "TP 3", "model_parallel", "invalid-parallelism"),
        ("cuda-8-extras", "TP 8", "fsdp", "unsupported-parallelism"),
        ("cuda-8-extras", "DDP", "ddp", "dp_replicate8"),
        ("slurm-2x4", "not given", "model_parallel", "dp_shard2·tp4"),
        ("slurm-2x4", "TP 8", "model_parallel", "tp8"),
        ("slurm-2x4", "FSDP over all", "deepspeed", "missing-package"),
        ("cpu-laptop", "CP 2, FSDP over the rest", "model_parallel", "unsupported-parallelism"),
        ("cpu-laptop", "HSDP 2 x 4", "fsdp", "invalid-parallelism"),
        ("cpu-laptop", "TP 2, FSDP over the rest", "model_parallel", "dp_shard2·tp2"),
        ("cpu-laptop", "DDP", "fsdp_cpu_offload", "unsupported-accelerator"),
    ],
)
def test_parallelism_cells(markdown: str, profile: str, layout: str, strategy: str,
                           expected: str) -> None:
    section = _parallelism_profiles(markdown)[profile]
    assert _split_note(_parallelism_cell(section, layout, strategy))[0] == expected


def test_parallelism_section_notes_and_links(markdown: str, html_page: str) -> None:
    section = _md_section(markdown, "Parallelism")
    assert "[parallelism.md](parallelism.md)" in section
    for layout in par.LAYOUTS:
        assert f"**{layout.name}**: " in section
    assert '`parallelism={"dp_replicate": 2, "dp_shard": 4}`' in section
    slurm = _parallelism_profiles(markdown)["slurm-2x4"]
    note = _split_note(_parallelism_cell(slurm, "TP 8", "model_parallel"))[1]
    assert note is not None
    assert "tensor-parallel groups span nodes" in _notes(slurm)[note]
    cpu = _parallelism_profiles(markdown)["cpu-laptop"]
    note = _split_note(_parallelism_cell(cpu, "CP 2, FSDP over the rest", "model_parallel"))[1]
    assert note is not None and _notes(cpu)[note].startswith(
        "`unsupported-parallelism`: cp=2 on cpu: ")
    for part in _parallelism_profiles(markdown).values():
        notes = _notes(part)
        assert len(set(notes.values())) == len(notes), f"a note repeats: {notes}"
    page = html_page
    assert "<h2>Parallelism</h2>" in page and '<a href="parallelism.md">' in page
    assert '<td class="declared">pp2·<wbr>dp_shard2·<wbr>tp2</td>' in page
    assert re.search(r'<td class="declared" title="tp=8 is more than[^"]*">tp8<sup><a '
                     r'href="#par-slurm-2x4-\d+">', page)


def test_name_template() -> None:
    assert compat.name_template("fsdp cannot run tp=2", "fsdp") == "{strategy} cannot run tp=2"
    assert compat.name_template("fsdp_cpu_offload cannot run", "fsdp") == (
        "fsdp_cpu_offload cannot run")
    assert compat.name_template("'deepspeed' needs deepspeed (pip install deepspeed)",
                                "deepspeed") == (
        "'{strategy}' needs deepspeed (pip install deepspeed)")


# --------------------------------------------------------------------------- doctor


def _section(report: str, title: str) -> str:
    return report.split(title, 1)[1].split("\n\n", 1)[0]


def test_doctor_on_a_cpu_machine() -> None:
    report = doctor_report(interlock.Machine())
    assert interlock.Machine().describe() in report
    runners_part = _section(report, "Conformance runners:")
    assert "yes cpu" in runners_part
    assert "no  cuda  [accelerator-unavailable] this machine has 0 CUDA devices" in runners_part
    assert "no  tpu   [missing-package] the xla accelerator needs torch_xla" in runners_part
    assert "Strategies on cpu" in report and "Strategies on cuda" not in report
    assert "[accelerator-unavailable] this machine has 0 CUDA devices" in report
    precisions = _section(report, "Precisions on cpu:")
    assert "ddp: 64-true, 32-true" in precisions
    assert "transformer-engine [unsupported-precision]" in precisions


def test_doctor_on_a_cuda_machine() -> None:
    machine = interlock.Machine(cuda_devices=2)
    report = doctor_report(machine)
    assert runners(machine)["cuda"] is None
    assert "yes cuda  available" in _section(report, "Conformance runners:")
    strategies = _section(report, "Strategies on cuda")
    assert re.search(r"yes ddp\s+2 x cuda", strategies)
    assert re.search(r"no  deepspeed\s+\[missing-package\]", strategies)
    precisions = _section(report, "Precisions on cuda:")
    assert "transformer-engine [missing-package]" in precisions


def test_doctor_on_a_tpu_host() -> None:
    machine = profile_named("tpu-v4-8").machine
    report = doctor_report(machine)
    assert "yes tpu   available" in _section(report, "Conformance runners:")
    assert "no  cuda  [accelerator-unavailable] this machine has 0 CUDA devices" in report
    strategies = _section(report, "Strategies on xla")
    assert re.search(r"yes xla\s+8 x xla", strategies), strategies
    precisions = _section(report, "Precisions on xla:")
    assert "single_xla (stands in for single_device here): 32-true, 16-true, bf16-true" \
        in precisions
    assert "xla (stands in for ddp here)" in precisions


def test_doctor_tpu_runner_needs_devices_too() -> None:
    reason = runners(interlock.Machine(packages=frozenset({"torch_xla"})))["tpu"]
    assert reason == "[accelerator-unavailable] this machine has 0 XLA devices."


def test_doctor_main(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--profile", "mps"]) == 0
    assert "Strategies on mps" in capsys.readouterr().out
    assert main(["--profile", "nope"]) == 2
    assert "no machine profile named 'nope'" in capsys.readouterr().err


def test_doctor_tells_planned_from_runnable() -> None:
    report = doctor_report(interlock.Machine())
    strategies = _section(report, "Strategies on cpu")
    assert re.search(r"yes ddp\s+1 x cpu", strategies), strategies
    assert re.search(r"yes fsdp\s+1 x cpu", strategies), strategies
    spec = StrategySpec(
        name="unimportable_probe", factory="interlock_nonexistent.module:Strategy",
        description="probe", family="other", accelerators=frozenset({"cpu"}),
        precisions=frozenset({"32-true"}), launcher="fork",
    )
    interlock.register(spec)
    try:
        strategies = _section(doctor_report(interlock.Machine()), "Strategies on cpu")
    finally:
        unregister(StrategySpec, spec.name)
    assert re.search(r"no  unimportable_probe\s+planned \(1 x cpu", strategies), strategies
    assert "its implementation cannot be imported" in strategies
