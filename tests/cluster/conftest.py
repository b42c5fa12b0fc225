"""The cluster tests' fixtures, defined (and type-checked) in cluster_fixtures.py.

This file only re-exports them: mypy checks the whole tree as one program, where two
modules named ``conftest`` cannot both exist, and tests/conftest.py guards every run.
"""

from cluster_fixtures import baseline, slurm, style

__all__ = ["baseline", "slurm", "style"]
