"""Stage 1, flags: parse every flag into a typed value, or refuse it.

`read_flags` is the stage: the flags as written in, a frozen `Flags` out. Each flag's
own decision also runs alone through `read_flag`, which is how the matrix parses each
distinct value of a flag once.

One module per flag (`accelerator`, `devices`, `strategy`, `precision`, `num_nodes`,
`plugins`), `conflicts` between them, what they share (`draft`) and the stage
(`stage`).
"""

from interlock.engine.stages.flags.draft import Flags
from interlock.engine.stages.flags.plugins import plugin_kind
from interlock.engine.stages.flags.stage import (
    FLAGS_STAGE,
    OneFlag,
    read_flag,
    read_flags,
    seeds,
)

__all__ = [
    "FLAGS_STAGE",
    "Flags",
    "OneFlag",
    "plugin_kind",
    "read_flag",
    "read_flags",
    "seeds",
]
