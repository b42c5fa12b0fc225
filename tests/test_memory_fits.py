"""docs/memory-fits.md is what the engine says."""

from __future__ import annotations

from pathlib import Path

from interlock.matrix import fits

# ------------------------------------------------------------------ the generated page


def test_the_committed_fits_page_is_what_the_engine_says() -> None:
    committed = (Path(__file__).resolve().parent.parent / fits.FITS_PATH).read_text(
        encoding="utf-8")
    assert committed == fits.render_markdown(), (
        "docs/memory-fits.md is stale: run `python -m interlock.matrix.fits` (or "
        "`nox -s matrix -- --update`) and commit the result")


def test_the_fits_page_refuses_what_the_engine_refuses() -> None:
    """A ✗ cell is a plan refused for memory; a figure is a plan that fits."""
    machine = fits.MACHINES[0]
    ddp = next(layout for layout in fits.LAYOUTS if layout.strategy == "ddp")
    seven = next(model for model in fits.MODELS if model.name == "7B")
    assert fits.cell(seven, machine, ddp) == "✗ 130.4 GiB"
    fsdp = next(layout for layout in fits.LAYOUTS if layout.strategy == "fsdp")
    assert not fits.cell(seven, machine, fsdp).startswith("✗")
