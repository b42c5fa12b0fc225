"""Run the conformance suite in a subprocess over test strategies and read its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_suite(workdir: Path, module: str, strategies: list[str], *extra: str,
              timeout: float = 900) -> dict[str, Any]:
    """The suite at world size 2, 32-true, on the CPU runner, over ``strategies``
    registered by importing ``module`` (from this folder); its report and output."""
    report = workdir / "report.json"
    args = [sys.executable, "-m", "pytest", "--pyargs", "interlock.conformance", "-q",
            "-p", "no:cacheprovider", "-o", "addopts=", "--interlock-world-sizes", "2",
            "--interlock-precisions", "32-true", "--interlock-runner", "cpu",
            "--interlock-import", module, "--interlock-report", str(report), *extra]
    for name in strategies:
        args += ["--interlock-strategy", name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert report.exists(), f"the suite wrote no report:\n{done.stdout[-4000:]}{done.stderr}"
    return {"report": json.loads(report.read_text()), "stdout": done.stdout,
            "returncode": done.returncode}
