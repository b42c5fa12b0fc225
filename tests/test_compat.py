"""The generated compatibility docs and the doctor report say what the engine says."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import interlock
from interlock.connector.registry import unregister_strategy
from interlock.connector.specs import StrategySpec
from interlock.matrix import compat
from interlock.matrix.compat import (
    HTML_PATH,
    MARKDOWN_PATH,
    REPORT_PATH,
    compute,
    load_report,
    render_html,
    render_markdown,
    short_reason,
)
from interlock.matrix.doctor import doctor_report, main, runners
from interlock.matrix.profiles import profile_named

ROOT = Path(__file__).resolve().parents[1]
REGENERATE = "run `python -m interlock.matrix.compat` from the repository root to regenerate it"


def _row(markdown: str, accelerator: str, strategy: str) -> list[str]:
    """The cells of one strategy's row in one accelerator's markdown table."""
    section = markdown.split(f"## Accelerator `{accelerator}`", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == f"`{strategy}`":
            return cells[1:]
    raise AssertionError(f"no row for {strategy!r} in the {accelerator} table")


def _cell(markdown: str, accelerator: str, strategy: str, precision: str) -> str:
    index = interlock.connector.tables.PRECISION_NAMES.index(precision)
    return _row(markdown, accelerator, strategy)[index]


@pytest.fixture(scope="module")
def markdown() -> str:
    return render_markdown(report=None)


@pytest.mark.parametrize(("path", "render"), [(MARKDOWN_PATH, render_markdown),
                                              (HTML_PATH, render_html)])
def test_committed_docs_match_the_code(path: Path, render: object) -> None:
    assert callable(render)
    committed = (ROOT / path).read_text(encoding="utf-8")
    assert committed == render(report=ROOT / REPORT_PATH), f"{path} is stale: {REGENERATE}"


@pytest.mark.parametrize(
    ("accelerator", "strategy", "precision", "expected"),
    [
        ("cpu", "fsdp", "64-true", "`unsupported-precision`"),
        ("cpu", "ddp", "16-mixed", "✓ declared"),
        ("cuda", "deepspeed", "bf16-mixed", "✓ declared"),
        ("cuda", "ddp", "transformer-engine", "✓ declared"),
        ("xla", "fsdp", "32-true", "`unsupported-accelerator`"),
        ("xla", "xla", "bf16-true", "✓ declared"),
        ("xla", "xla", "bf16-mixed", "`unsupported-precision`"),
        ("mps", "single_device", "64-true", "`unsupported-precision`"),
    ],
)
def test_cells_say_what_the_engine_says(markdown: str, accelerator: str, strategy: str,
                                        precision: str, expected: str) -> None:
    cell = _cell(markdown, accelerator, strategy, precision)
    assert cell.startswith(expected), (
        f"{accelerator}/{strategy}/{precision}: the table shows {cell!r}, expected it to "
        f"start with {expected!r}"
    )


def test_refused_cells_agree_with_plan(markdown: str) -> None:
    machine = profile_named("cpu-laptop").machine
    with pytest.raises(interlock.ResolutionError) as info:
        interlock.plan(accelerator="cpu", devices=2, strategy="fsdp", precision="64-true",
                       machine=machine)
    cell = _cell(markdown, "cpu", "fsdp", "64-true")
    assert cell == f"`{info.value.code}`: {short_reason(info.value.reason)}"


def test_cuda_table_says_packages_are_installed(markdown: str) -> None:
    section = markdown.split("## Accelerator `cuda`", 1)[1].split("\n## ", 1)[0]
    assert "deepspeed and transformer_engine are installed" in section
    assert "missing-package" not in section


def test_presets_are_listed_not_rows(markdown: str) -> None:
    assert "`ddp_find_unused_parameters_true` (of `ddp`)" in markdown
    assert "| `ddp_find_unused_parameters_true`" not in markdown


def test_environment_table(markdown: str) -> None:
    section = markdown.split("## Launch environments", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| `")}
    header = next(line for line in section.splitlines() if line.startswith("| strategy"))
    columns = [c.strip() for c in header.strip().strip("|").split("|")]
    assert columns == ["strategy", "local", "notebook", "torchrun", "slurm", "no-fork"]
    ddp = dict(zip(columns, rows["`ddp`"], strict=True))
    assert ddp["local"] == "✓ subprocess"
    assert ddp["notebook"].startswith("`interactive-incompatible`")
    assert ddp["torchrun"] == "✓ external"
    assert ddp["slurm"] == "✓ external"
    notebook = dict(zip(columns, rows["`ddp_notebook`"], strict=True))
    assert notebook["notebook"] == "✓ fork"
    assert notebook["no-fork"].startswith("`start-method-unavailable`")
    single = dict(zip(columns, rows["`single_device`"], strict=True))
    assert single["local"] == "✓ in-process"


def test_markdown_cells_have_no_raw_pipes() -> None:
    assert "|" not in compat._md_cell(compat.Outcome(ok=False, code="invalid-plugin",
                                                     reason="a | b"))


def test_short_reason_is_first_sentence_and_bounded() -> None:
    assert short_reason("One thing. Another thing.") == "One thing."
    long = short_reason("x" * 200)
    assert len(long) <= compat.SHORT_REASON and long.endswith("…")


def test_markdown_is_stable_and_machine_free(markdown: str) -> None:
    import torch

    assert render_markdown(report=None) == markdown
    assert torch.__version__ not in markdown
    assert f"interlock {interlock.__version__}" in markdown
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", markdown), "no dates in generated docs"


# --------------------------------------------------------------------------- report


def _write_report(tmp_path: Path, records: object) -> Path:
    path = tmp_path / "conformance-report.json"
    path.write_text(json.dumps(records), encoding="utf-8")
    return path


def _record(status: str, check: str = "training_parity",
            precision: str = "32-true") -> dict[str, str]:
    return {"strategy": "ddp", "runner": "cpu", "precision": precision, "check": check,
            "status": status}


def test_report_absent_verifies_nothing(tmp_path: Path) -> None:
    assert load_report(tmp_path / "missing.json") == frozenset()


def test_report_cell_verified_when_a_check_passed_and_none_failed(tmp_path: Path) -> None:
    passed = _write_report(tmp_path, {"records": [
        _record("passed"), _record("skipped", "scaler_skip"),
        _record("passed", "collectives", "*"),
    ]})
    assert load_report(passed) == {("ddp", "cpu", "32-true")}, "a skip is neutral"
    failed = _write_report(tmp_path, [_record("passed"), _record("failed", "init_contexts")])
    assert load_report(failed) == frozenset()
    any_failed = _write_report(tmp_path, [_record("passed"),
                                          _record("failed", "collectives", "*")])
    assert load_report(any_failed) == frozenset(), "a failed '*' check counts for every cell"
    only_skips = _write_report(tmp_path, [_record("skipped", "scaler_skip")])
    assert load_report(only_skips) == frozenset()


def test_report_marks_cells_verified(tmp_path: Path) -> None:
    report = _write_report(tmp_path, [_record("passed")])
    text = render_markdown(report=report)
    assert _cell(text, "cpu", "ddp", "32-true") == "✓ verified"
    assert _cell(text, "cpu", "ddp", "16-mixed") == "✓ declared"
    # the cpu runner's results say nothing about cuda
    assert _cell(text, "cuda", "ddp", "32-true") == "✓ declared"
    assert 'class="verified"' in render_html(report=report)


@pytest.mark.parametrize("records", [{"not": "a list"}, {"records": 3}, [{"strategy": "ddp"}],
                                     ["x"]])
def test_malformed_report_is_refused(tmp_path: Path, records: object) -> None:
    with pytest.raises(ValueError, match="conformance report"):
        load_report(_write_report(tmp_path, records))


# --------------------------------------------------------------------------- html


def test_html_is_self_contained() -> None:
    page = render_html(report=None)
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page
    external = re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page)
    assert not external, f"external assets in the page: {external}"
    assert "<style>" in page


def test_html_marks_refusals_with_full_reason() -> None:
    page = render_html(report=None)
    machine = profile_named("cpu-laptop").machine
    with pytest.raises(interlock.ResolutionError) as info:
        interlock.plan(accelerator="cpu", devices=2, strategy="fsdp", precision="64-true",
                       machine=machine)
    import html

    title = f'title="{html.escape(info.value.reason, quote=True)}"'
    assert f'<td class="refused" {title}><code>unsupported-precision</code></td>' in page


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
    interlock.register_strategy(spec)
    try:
        yield spec
    finally:
        interlock.unregister_strategy(spec.name)


def test_html_escapes_registered_text(odd_strategy: interlock.StrategySpec) -> None:
    specs = list(interlock.strategy_specs().values())
    page = render_html(specs=specs, report=None)
    assert "<b>bold</b>" not in page
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;" in page
    text = render_markdown(specs=specs, report=None)
    assert _cell(text, "cpu", "compat_test_markup", "32-true") == "✓ declared"
    assert _cell(text, "cpu", "compat_test_markup", "64-true").startswith(
        "`unsupported-precision`")


def test_html_escapes_reasons() -> None:
    cell = compat._html_cell(compat.Outcome(ok=False, code="invalid-plugin",
                                            reason='<img src=x> & "q"'), "")
    assert "<img" not in cell and "&lt;img src=x&gt; &amp; &quot;q&quot;" in cell


def test_compute_covers_every_accelerator_and_strategy() -> None:
    data = compute()
    assert [t.accelerator for t in data.accelerators] == ["cpu", "cuda", "mps", "xla"]
    names = [spec.name for spec, _, _ in data.accelerators[0].rows]
    assert "ddp" in names and "deepspeed_stage_3" in names
    assert not any("find_unused" in n for n in names)


def test_main_writes_both_files(tmp_path: Path) -> None:
    assert compat.main([str(tmp_path)]) == 0
    assert (tmp_path / MARKDOWN_PATH).read_text(encoding="utf-8") == render_markdown(
        report=None)
    assert (tmp_path / HTML_PATH).read_text(encoding="utf-8") == render_html(report=None)
    assert not list((tmp_path / "docs").glob("*.tmp"))


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
    interlock.register_strategy(spec)
    try:
        strategies = _section(doctor_report(interlock.Machine()), "Strategies on cpu")
    finally:
        unregister_strategy(spec.name)
    assert re.search(r"no  unimportable_probe\s+planned \(1 x cpu", strategies), strategies
    assert "its implementation cannot be imported" in strategies
