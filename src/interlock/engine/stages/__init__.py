"""The stages of `interlock.plan`, one module each, in the order they run.

Each module holds one stage's rules as named rows and one pure function from a frozen
input to a frozen result (or a `ResolutionError`):

- flags: `flags.read_flags`, `written.Written` to `flags.Flags`;
- sizing: `sizing.read_sizing`, `sizing.SizingInput` (the model, optimizer and
  micro-batch flags) to `sizing.Sizing` (which decides nothing unless one is given);
- accelerator: `accelerator.choose_accelerator`, `accelerator.AcceleratorInput` to
  `accelerator.AcceleratorChoice`;
- devices: `devices.place_devices`, `devices.DevicesInput` to `devices.Placement`;
- cluster: `cluster.choose_cluster`, `cluster.ClusterInput` to `cluster.ClusterChoice`;
- strategy: `strategy.choose_strategy`, `strategy.StrategyInput` to
  `strategy.StrategyChoice`;
- precision: `precision.choose_precision`, `precision.PrecisionInput` to
  `precision.PrecisionChoice`;
- parallelism: `parallelism.choose_parallelism`, `parallelism.ParallelismInput` to
  `parallelism.ParallelismChoice`;
- plugins: `plugins.choose_plugins`, `plugins.PluginsInput` to `plugins.PluginsChoice`;
- memory: `memory.estimate_memory`, `memory.MemoryInput` to `memory.MemoryChoice` (only
  when a model's shape is given).

Each module but flags also declares its `runner.Step`: its function, its input (whose
field names are the facts it reads) and the facts it writes; `flags.seeds` hands the
parsed flags on. `STEPS` lists them in order; `interlock.engine.runner` runs
them, once per call for `interlock.engine.planner.plan` and memoised by what each
step reads for `interlock.matrix.evaluate` (the flags as parsed, never their spelling,
which is kept only to quote).
"""

from typing import Any

from interlock.engine.rules import Stage
from interlock.engine.runner import Step, check_steps
from interlock.engine.stages import (
    accelerator,
    cluster,
    devices,
    memory,
    parallelism,
    plugins,
    precision,
    sizing,
    strategy,
)
from interlock.engine.stages.flags import FLAGS_STAGE

#: The stages, in the order they run.
STAGES: tuple[Stage[Any], ...] = (
    FLAGS_STAGE,
    sizing.SIZING_STAGE,
    accelerator.ACCELERATOR_STAGE,
    devices.DEVICES_STAGE,
    cluster.CLUSTER_STAGE,
    strategy.STRATEGY_STAGE,
    precision.PRECISION_STAGE,
    parallelism.PARALLELISM_STAGE,
    plugins.PLUGINS_STAGE,
    memory.MEMORY_STAGE,
)

#: The stages after flags as the runner runs them, in the same order.
STEPS: tuple[Step, ...] = check_steps((
    sizing.STEP,
    accelerator.STEP,
    devices.STEP,
    cluster.STEP,
    strategy.STEP,
    precision.STEP,
    parallelism.STEP,
    plugins.STEP,
    memory.STEP,
))

__all__ = ["STAGES", "STEPS"]
