"""Imported by every process of a suite run (``--interlock-import``): a driver
process appends its pid to the file named by ``INTERLOCK_TEST_LAUNCHES``."""

from __future__ import annotations

import os
import sys

if sys.argv and sys.argv[0].endswith(os.path.join("conformance", "driver.py")):
    _where = os.environ.get("INTERLOCK_TEST_LAUNCHES")
    if _where:
        with open(_where, "a") as _file:
            _file.write(f"{os.getpid()}\n")
