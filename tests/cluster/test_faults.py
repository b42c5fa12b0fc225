"""Faults under every launcher: a crashing rank, a hanging rank, SIGTERM to the job.

The scenarios and what they check live in fault_scenarios.py (repeat_faults.py runs
them many times and prints the times to detection).
"""

from __future__ import annotations

from pathlib import Path

import fault_scenarios
import pytest
from cluster_launchers import STYLES, Style

pytestmark = pytest.mark.cluster

ALL = list(STYLES)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("style", ALL, indirect=True)
def test_a_crashing_rank_ends_the_job_and_the_checkpoint_survives(
    style: Style, tmp_path: Path
) -> None:
    fault_scenarios.crash(style, tmp_path)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("style", ALL, indirect=True)
def test_a_hanging_rank_becomes_an_error_after_the_timeout(style: Style, tmp_path: Path) -> None:
    fault_scenarios.hang(style, tmp_path)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("style", ALL, indirect=True)
def test_sigterm_saves_at_an_agreed_step_and_exits_non_zero(
    style: Style, tmp_path: Path
) -> None:
    fault_scenarios.preempt(style, tmp_path)
