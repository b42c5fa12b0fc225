"""``python -m interlock.matrix.compat [ROOT]``: rewrite the compatibility pages."""

import sys

from interlock.matrix.compat.pages import main

sys.exit(main())
