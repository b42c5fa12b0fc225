"""Third-party strategies: registration, validation, entry points."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import interlock
from interlock import RegistrationError, ResolutionError, StrategySpec, plan
from interlock.engine import registry
from interlock.engine.spec_problems import spec_problems
from machines import CPU, NOTEBOOK

COMPRESSED = StrategySpec(
    name="ddp_compressed",
    factory="thirdparty.strategies:CompressedDDP",
    description="DDP with bf16 gradient compression",
    family="ddp",
    accelerators=frozenset({"cpu", "cuda"}),
    precisions=frozenset({"32-true", "bf16-mixed"}),
    launcher="spawn",
)


@pytest.fixture
def clean_registry() -> Iterator[None]:
    with registry.isolated():
        yield


@pytest.mark.usefixtures("clean_registry")
def test_a_registered_strategy_takes_part_like_a_builtin() -> None:
    interlock.register(COMPRESSED)
    result = plan(strategy="ddp_compressed", devices=2, machine=CPU)
    assert (result.strategy, result.launcher) == ("ddp_compressed", "spawn")
    with pytest.raises(ResolutionError) as error:
        plan(strategy="ddp_compressed", precision="16-mixed", machine=CPU)
    assert error.value.code == "unsupported-precision"
    assert error.value.choices == ("32-true", "bf16-mixed")
    with pytest.raises(ResolutionError) as notebook:
        plan(strategy="ddp_compressed", devices=2, machine=NOTEBOOK)
    assert notebook.value.code == "interactive-incompatible"
    with pytest.raises(ResolutionError) as typo:
        plan(strategy="ddp_compresed", machine=CPU)
    assert typo.value.suggestion == "ddp_compressed"
    assert "ddp_compressed" in interlock.registered(interlock.StrategySpec)


@pytest.mark.usefixtures("clean_registry")
def test_registering_the_same_spec_twice_is_harmless() -> None:
    interlock.register(COMPRESSED)
    interlock.register(COMPRESSED)
    assert interlock.registered(interlock.StrategySpec)["ddp_compressed"] is COMPRESSED


@pytest.mark.usefixtures("clean_registry")
def test_name_clash_is_refused() -> None:
    with pytest.raises(RegistrationError,
                       match=r"already taken by a built-in strategy \(interlock\.strategies\.ddp"):
        interlock.register(dataclasses.replace(COMPRESSED, name="ddp"))
    with pytest.raises(RegistrationError, match="withdrawn on purpose"):
        interlock.register(dataclasses.replace(COMPRESSED, name="dp"))


@pytest.mark.usefixtures("clean_registry")
def test_malformed_spec_lists_every_problem() -> None:
    bad = StrategySpec(
        name="Bad Name",
        factory="no-colon",
        description="",
        family="x",
        accelerators=frozenset({"tpu9"}),
        precisions=frozenset({"fp8"}),
        launcher="mpirun",
        requires=("apex",),
    )
    with pytest.raises(RegistrationError) as info:
        interlock.register(bad)
    message = str(info.value)
    for fragment in ("'Bad Name'", "factory 'no-colon'", "description", "['tpu9']", "['fp8']",
                     "launcher 'mpirun'", "['apex']", "family 'x' is unknown"):
        assert fragment in message, f"{fragment!r} missing from: {message}"


def test_families_are_the_builtin_ones_and_other() -> None:
    from interlock.engine.builtin import BUILTIN_STRATEGIES
    from interlock.engine.spec_problems import strategy_families

    families = strategy_families()
    assert families[-1] == "other"
    assert set(families) == {s.family for s in BUILTIN_STRATEGIES} | {"other"}
    assert spec_problems(dataclasses.replace(COMPRESSED, family="other")) == []
    problems = spec_problems(dataclasses.replace(COMPRESSED, family="DDP"))
    assert problems == [f"family 'DDP' is unknown; known: {', '.join(families)} ('other' "
                        "for a strategy that belongs to none of the others)"]


@pytest.mark.parametrize("steps", [0, -1, True, 2.5, "5", 51])
def test_parity_steps_must_be_a_small_positive_int(steps: object) -> None:
    spec = dataclasses.replace(COMPRESSED, parity_steps=steps)  # type: ignore[arg-type]
    assert spec_problems(spec) == ["parity_steps must be None or an int from 1 to 50"]


def test_parity_steps_survives_pickling() -> None:
    import pickle

    spec = dataclasses.replace(COMPRESSED, parity_steps=5)
    assert spec_problems(spec) == []
    assert pickle.loads(pickle.dumps(spec)).parity_steps == 5


def test_the_registry_view_is_read_only() -> None:
    view = interlock.registered(interlock.StrategySpec)
    with pytest.raises(TypeError):
        view["x"] = COMPRESSED  # type: ignore[index]


def test_builtins_cannot_be_unregistered() -> None:
    with pytest.raises(RegistrationError):
        interlock.unregister(interlock.StrategySpec, "ddp")


def _make_distribution(root: Path, module: str, body: str, entry: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(body), encoding="utf-8")
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[interlock.strategies]\n{entry}\n")


RING = (
    "ilk_thirdparty",
    """
    from interlock import StrategySpec

    def specs():
        return [
            StrategySpec(
                name="ilk_ring", factory="ilk_thirdparty:Ring", description="ring",
                family="ddp", accelerators=frozenset({"cpu"}),
                precisions=frozenset({"32-true"}), launcher="fork",
            )
        ]
    """,
    "ring = ilk_thirdparty:specs",
)


@pytest.mark.usefixtures("clean_registry")
def test_entry_point_strategies_are_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make_distribution(tmp_path, *RING)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.forget_entry_points()
    assert plan(strategy="ilk_ring", devices=2, machine=CPU).launcher == "fork"
    sys.modules.pop("ilk_thirdparty", None)


BROKEN = ("ilk_broken", "raise ImportError('no such thing')\n", "broken = ilk_broken:specs")
def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
             *distributions: tuple[str, str, str]) -> None:
    """Put distributions with entry points on sys.path and make the registry reload."""
    for module, body, entry in distributions:
        _make_distribution(tmp_path, module, body, entry)
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.forget_entry_points()


@pytest.mark.usefixtures("clean_registry")
def test_a_broken_entry_point_is_contained_and_loud(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(tmp_path, monkeypatch, BROKEN, RING)
    with pytest.warns(RuntimeWarning, match=r"entry point 'broken' \(ilk_broken:specs\) of "
                      r"ilk_broken failed to load.*other strategies are not affected"):
        specs = interlock.registered(interlock.StrategySpec)
    # everything else still resolves: built-ins and the healthy plugin
    assert "ilk_ring" in specs
    assert plan(strategy="ddp", devices=2, machine=CPU).strategy == "ddp"
    assert plan(strategy="ilk_ring", devices=2, machine=CPU).launcher == "fork"
    # the broken plugin's own name is refused with its error, on every call
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once, at loading: not again
        for _ in range(2):
            with pytest.raises(ResolutionError) as info:
                plan(strategy="broken", machine=CPU)
            error = info.value
            assert (error.code, error.rule) == ("broken-entry-point",
                                                "flags/strategy-broken-entry-point")
            assert "entry point 'broken' (ilk_broken:specs)" in str(error)
            assert "ImportError('no such thing')" in str(error)
            assert "ddp" in error.choices
        # a name nobody registered points at the broken entry point as a suspect
        with pytest.raises(ResolutionError) as unknown:
            plan(strategy="ilk_missing", machine=CPU)
    assert unknown.value.code == "unknown-strategy"
    assert "entry point 'broken' (ilk_broken:specs) of ilk_broken failed to load" in str(
        unknown.value)
    (broken,) = registry.broken_entry_points("strategies")
    assert (broken.name, broken.strategies) == ("broken", ("broken",))
    statuses = {ep.name: ep for ep in registry.entry_points("strategies")}
    assert statuses["ring"].strategies == ("ilk_ring",) and not statuses["ring"].broken


@pytest.mark.usefixtures("clean_registry")
def test_an_entry_point_with_one_bad_spec_registers_none_and_names_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = """
    from interlock import StrategySpec

    def _spec(name, family):
        return StrategySpec(
            name=name, factory="ilk_half:Half", description="half", family=family,
            accelerators=frozenset({"cpu"}), precisions=frozenset({"32-true"}),
            launcher="fork",
        )

    def specs():
        return [_spec("ilk_good", "ddp"), _spec("ilk_bad", "gossip")]
    """
    _install(tmp_path, monkeypatch, ("ilk_half", body, "half = ilk_half:specs"))
    with pytest.warns(RuntimeWarning, match="family 'gossip' is unknown"):
        specs = interlock.registered(interlock.StrategySpec)
    assert "ilk_good" not in specs and "ilk_bad" not in specs
    for name in ("half", "ilk_good", "ilk_bad"):
        with pytest.raises(ResolutionError) as info:
            plan(strategy=name, machine=CPU)
        assert info.value.code == "broken-entry-point"
        assert "cannot register strategy 'ilk_bad'" in info.value.reason


@pytest.mark.usefixtures("clean_registry")
def test_a_broken_plugin_does_not_shadow_a_registered_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = """
    from interlock import StrategySpec

    SPEC = StrategySpec(
        name="ddp", factory="ilk_clash:Mine", description="mine", family="ddp",
        accelerators=frozenset({"cpu"}), precisions=frozenset({"32-true"}),
        launcher="fork",
    )
    """
    _install(tmp_path, monkeypatch, ("ilk_clash", body, "clash = ilk_clash:SPEC"))
    with pytest.warns(RuntimeWarning,
                      match=r"already taken by a built-in strategy \(interlock\.strategies\.ddp"):
        interlock.registered(interlock.StrategySpec)
    assert plan(strategy="ddp", devices=2, machine=CPU).spec.factory.startswith("interlock.")
    with pytest.raises(ResolutionError, match=r"\[broken-entry-point\] strategy='clash'"):
        plan(strategy="clash", machine=CPU)


@pytest.mark.usefixtures("clean_registry")
def test_entry_point_values_a_spec_a_tuple_or_a_callable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = """
    from interlock import StrategySpec

    def _spec(name):
        return StrategySpec(
            name=name, factory="ilk_forms:S", description=name, family="other",
            accelerators=frozenset({"cpu"}), precisions=frozenset({"32-true"}),
            launcher="fork",
        )

    ONE = _spec("ilk_one")
    SEVERAL = (_spec("ilk_two"), _spec("ilk_three"))

    def single():
        return _spec("ilk_four")

    def generator():
        yield _spec("ilk_five")
    """
    _make_distribution(tmp_path, "ilk_forms", body, "\n".join((
        "one = ilk_forms:ONE", "several = ilk_forms:SEVERAL", "single = ilk_forms:single",
        "generator = ilk_forms:generator")))
    monkeypatch.delitem(sys.modules, "ilk_forms", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.forget_entry_points()
    with pytest.warns(RuntimeWarning,
                      match="expected a StrategySpec or StrategyPreset, got generator"):
        specs = interlock.registered(interlock.StrategySpec)
    assert {"ilk_one", "ilk_two", "ilk_three", "ilk_four"} <= set(specs)
    assert [ep.name for ep in registry.broken_entry_points("strategies")] == ["generator"]


@pytest.mark.usefixtures("clean_registry")
def test_doctor_lists_entry_points_and_why_one_is_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from interlock.matrix.doctor import entry_point_lines

    _install(tmp_path, monkeypatch, BROKEN, RING)
    with pytest.warns(RuntimeWarning):
        section = "\n".join(entry_point_lines())  # the doctor report's section
    assert "yes entry point 'ring' (ilk_thirdparty:specs) of ilk_thirdparty: ilk_ring" in section
    assert ("no  entry point 'broken' (ilk_broken:specs) of ilk_broken failed to load: "
            "ImportError('no such thing')") in section, section


@pytest.mark.usefixtures("clean_registry")
def test_conformance_fails_a_broken_entry_point_only_when_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from interlock.conformance.cases import broken_entry_points_asked, resolve_strategies

    _install(tmp_path, monkeypatch, BROKEN, RING)
    with pytest.warns(RuntimeWarning):
        interlock.registered(interlock.StrategySpec)
    assert broken_entry_points_asked(["single_device"]) == []
    assert [ep.name for ep in broken_entry_points_asked(["all"])] == ["broken"]
    assert [ep.name for ep in broken_entry_points_asked(["broken"])] == ["broken"]
    assert resolve_strategies(["broken"]) == []  # not a usage error: a failure item
    with pytest.raises(ValueError, match="unknown strategy 'nope'"):
        resolve_strategies(["nope"])


@pytest.mark.timeout(120)
def test_the_conformance_cli_reports_a_broken_entry_point_as_a_failure(
    tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _make_distribution(site, *BROKEN)
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, "-m", "interlock.cli", "conformance", "--strategy", "broken",
         "--runner", "cpu", "--report", str(report)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    (record,) = json.loads(report.read_text())["records"]
    assert (record["strategy"], record["check"], record["status"]) == (
        "broken", "declaration", "failed"), record
    assert "entry point 'broken' (ilk_broken:specs)" in record["message"], record
    assert "ImportError('no such thing')" in record["message"], record


def test_the_conformance_guide_documents_every_spec_field_and_value() -> None:
    from interlock.engine.spec_problems import strategy_families
    from interlock.engine.specs import CAPABILITIES
    from interlock.engine.tables import (
        ACCELERATOR_ROWS,
        INSTALL_HINTS,
        LAUNCHER_ROWS,
        PRECISION_NAMES,
        STRATEGY_PRECISION_PLUGINS,
    )

    guide = (Path(__file__).resolve().parent.parent / "docs" / "conformance.md").read_text()
    fields = guide.split("### Fields", 1)[1].split("\n\n", 2)[1]
    rows = {line.split("|")[1].strip().strip("`"): line for line in fields.splitlines()[2:]}
    assert set(rows) == set(StrategySpec.__dataclass_fields__), set(rows) ^ set(
        StrategySpec.__dataclass_fields__)
    expected = {
        "family": strategy_families(),
        "launcher": [n for n in LAUNCHER_ROWS if n != "external"],
        "accelerators": list(ACCELERATOR_ROWS),
        "precisions": PRECISION_NAMES,
        "requires": list(INSTALL_HINTS),
        "capabilities": list(CAPABILITIES),
        "precision_plugin": STRATEGY_PRECISION_PLUGINS,
    }
    for field, values in expected.items():
        allowed = rows[field].split("|")[3]
        missing = [v for v in values if f"`{v}`" not in allowed]
        assert not missing, f"docs/conformance.md: the {field} row does not list {missing}"
