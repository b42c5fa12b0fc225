"""The stages of `interlock.plan`, one module each, in the order they run.

Each module holds one stage's rules as named rows and one pure function from a frozen
input to a frozen result (or a `ResolutionError`):

- flags: `flags.read_flags`, `rules.Written` to `flags.Flags`;
- sizing: `sizing.read_sizing`, the model, optimizer and micro-batch flags to
  `sizing.Sizing` (only when one of them is given);
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

`interlock.connector.planner.plan` chains them; `interlock.matrix.evaluate` calls the
same functions, memoised by their inputs (which compare by what the rules decide from,
never by the flags' spelling, kept only to quote).
"""

from typing import Any

from interlock.connector.rules import Stage
from interlock.connector.stages.accelerator import ACCELERATOR_STAGE
from interlock.connector.stages.cluster import CLUSTER_STAGE
from interlock.connector.stages.devices import DEVICES_STAGE
from interlock.connector.stages.flags import FLAGS_STAGE
from interlock.connector.stages.memory import MEMORY_STAGE
from interlock.connector.stages.parallelism import PARALLELISM_STAGE
from interlock.connector.stages.plugins import PLUGINS_STAGE
from interlock.connector.stages.precision import PRECISION_STAGE
from interlock.connector.stages.sizing import SIZING_STAGE
from interlock.connector.stages.strategy import STRATEGY_STAGE

#: The stages, in the order they run.
STAGES: tuple[Stage[Any], ...] = (
    FLAGS_STAGE,
    SIZING_STAGE,
    ACCELERATOR_STAGE,
    DEVICES_STAGE,
    CLUSTER_STAGE,
    STRATEGY_STAGE,
    PRECISION_STAGE,
    PARALLELISM_STAGE,
    PLUGINS_STAGE,
    MEMORY_STAGE,
)

__all__ = ["STAGES"]
