"""Third-party strategies: registration, validation, entry points."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import interlock
from interlock import RegistrationError, ResolutionError, StrategySpec, plan
from interlock.connector import registry
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
    before = dict(registry._specs)
    loaded = registry._entry_points_loaded
    yield
    registry._specs.clear()
    registry._specs.update(before)
    registry._entry_points_loaded = loaded


@pytest.mark.usefixtures("clean_registry")
def test_a_registered_strategy_takes_part_like_a_builtin() -> None:
    interlock.register_strategy(COMPRESSED)
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
    assert "ddp_compressed" in interlock.strategy_specs()


@pytest.mark.usefixtures("clean_registry")
def test_registering_the_same_spec_twice_is_harmless() -> None:
    interlock.register_strategy(COMPRESSED)
    interlock.register_strategy(COMPRESSED)
    assert interlock.strategy_specs()["ddp_compressed"] is COMPRESSED


@pytest.mark.usefixtures("clean_registry")
def test_name_clash_is_refused() -> None:
    import dataclasses

    with pytest.raises(RegistrationError, match=r"already taken by interlock\.strategies\.ddp"):
        interlock.register_strategy(dataclasses.replace(COMPRESSED, name="ddp"))
    with pytest.raises(RegistrationError, match="withdrawn on purpose"):
        interlock.register_strategy(dataclasses.replace(COMPRESSED, name="dp"))


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
        interlock.register_strategy(bad)
    message = str(info.value)
    for fragment in ("'Bad Name'", "factory 'no-colon'", "description", "['tpu9']", "['fp8']",
                     "launcher 'mpirun'", "['apex']"):
        assert fragment in message, f"{fragment!r} missing from: {message}"


def test_the_registry_view_is_read_only() -> None:
    view = interlock.strategy_specs()
    with pytest.raises(TypeError):
        view["x"] = COMPRESSED  # type: ignore[index]


def test_builtins_cannot_be_unregistered() -> None:
    with pytest.raises(RegistrationError):
        interlock.unregister_strategy("ddp")


def _make_distribution(root: Path, module: str, body: str, entry: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(body), encoding="utf-8")
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[interlock.strategies]\n{entry}\n")


@pytest.mark.usefixtures("clean_registry")
def test_entry_point_strategies_are_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make_distribution(
        tmp_path,
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
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._entry_points_loaded = False
    assert plan(strategy="ilk_ring", devices=2, machine=CPU).launcher == "fork"
    sys.modules.pop("ilk_thirdparty", None)


@pytest.mark.usefixtures("clean_registry")
def test_a_broken_entry_point_is_named_and_not_silently_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _make_distribution(tmp_path, "ilk_broken", "raise ImportError('no such thing')\n",
                       "broken = ilk_broken:specs")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._entry_points_loaded = False
    for _ in range(2):  # raised on every call, not only the first
        with pytest.raises(RegistrationError, match="entry point 'broken'"):
            interlock.strategy_specs()
    sys.modules.pop("ilk_broken", None)
