"""`Written`: the flags of `plan()` exactly as the caller wrote them.

One field per flag, in `plan()`'s order. It is the one list of the flags the engine
keeps: `errors.FLAGS` (the flags a refusal can name) is made from it, and the stage
runner hands each flag the flags stage does not parse on as the fact ``<flag>_flag``.
"""

from __future__ import annotations

from typing import NamedTuple


class Written(NamedTuple):
    """The flags exactly as the caller wrote them, kept only to quote them in reasons,
    notes and refusals. Stage functions take it beside their input, so the input holds
    only what the rules decide from: two spellings of one parsed value are one input."""

    accelerator: object = None
    devices: object = None
    strategy: object = None
    precision: object = None
    num_nodes: object = None
    plugins: object = None
    parallelism: object = None
    model: object = None
    optimizer: object = None
    micro_batch_size: object = None
    launcher: object = None


#: No flags written (a stage run from parsed values only, as the matrix does).
NOT_WRITTEN = Written()
