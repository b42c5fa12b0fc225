"""The mesh checks: one per dimension of parallelism a strategy declares
(`StrategySpec.parallel_dims`), each at world size 4 on a layout that uses it.

Each launches the strategy with ``parallelism=`` the layout, trains through
``forward_backward`` and compares, in the launching process: every rank's mesh
coordinates and flattened groups with the layout's arithmetic, the data shard each rank
read, the parameters with one plain process, the recipe of
:mod:`interlock.conformance.recipes` trained on the layout with one plain process, a
checkpoint saved under the layout and loaded at world size 1 (resharding), and what
each rank holds against the layout's plan (:mod:`interlock.conformance.memory_checks`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from interlock.conformance import memory_checks, recipes, reference
from interlock.conformance.checks import CheckFailed, CheckSkipped, full, share
from interlock.engine.errors import ResolutionError
from interlock.engine.parallelism import DIMS, FLATTENED, MeshLayout, Parallelism

#: the ranks every mesh check starts
MESH_WORLD_SIZE = 4
#: optimizer steps each trains
MESH_STEPS = 3

#: the partner of a dimension in its check's layout: the sharded (else replicated)
#: data-parallel dimension, when the strategy declares it
_PARTNERS = ("dp_shard", "dp_replicate")


def layout_for(parallel_dims: frozenset[str], dim: str) -> dict[str, int]:
    """The layout the check of ``dim`` runs: ``dim`` 2 x a declared data-parallel
    partner 2, or ``dim`` 4 alone; every other dimension 1."""
    degrees = dict.fromkeys(DIMS, 1)
    partner = next((p for p in _PARTNERS if p in parallel_dims and p != dim), None)
    if partner is None:
        degrees[dim] = MESH_WORLD_SIZE
    else:
        degrees[dim] = degrees[partner] = 2
    return degrees


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    loss: torch.Tensor = nn.functional.mse_loss(output.float(), target)
    return loss


def train_on_the_mesh(strategy: Any, path: str, accumulate: int,
                      clip: bool) -> dict[str, Any]:
    """In every rank: where the mesh puts this rank, then `MESH_STEPS` SGD steps
    through ``forward_backward``, then a checkpoint, then the recipe
    (:func:`recipe_on_the_mesh`). Returns every rank's view."""
    meshes = strategy.meshes
    where = {
        "rank": strategy.global_rank,
        "coords": {dim: meshes[dim].get_local_rank() for dim in DIMS},
        "flattened": {name: [meshes[name].get_local_rank(), meshes[name].size()]
                      for name in FLATTENED},
        "data": [strategy.data_parallel_rank, strategy.data_parallel_size],
    }
    module = strategy.setup_module(reference.model())
    opt = strategy.setup_optimizer(
        torch.optim.SGD(module.parameters(), lr=reference.LR, momentum=0.9))
    for step in range(MESH_STEPS):
        x, y = reference.batch(step)
        x, y = strategy.batch_to_device((share(x, strategy), share(y, strategy)))
        strategy.forward_backward(module, x, y, _loss)
        strategy.optimizer_step(opt)
        opt.zero_grad()
    params = {k: v.float() for k, v in full(module.state_dict()).items()}
    strategy.save_checkpoint(path, {"model": module, "optimizer": opt, "step": MESH_STEPS})
    merged: dict[str, torch.Tensor] = {}
    for part in strategy.collective.all_gather_object(params):  # pipeline stages differ
        merged.update(part)
    return {"ranks": strategy.collective.all_gather_object(where), "params": merged,
            "recipe": recipe_on_the_mesh(strategy, accumulate, clip),
            "memory": memory_on_the_mesh(strategy)}


def memory_on_the_mesh(strategy: Any) -> list[dict[str, Any]] | None:
    """Every rank's memory against the plan of the layout (`memory_checks.measure`);
    None under context parallel, where the sharding group a ``parallelize_fn`` uses
    (dp_shard, or dp_shard x cp) is the function's own choice."""
    if int(strategy.meshes["cp"].size()) > 1:
        return None
    engine = "engine_gradients" in getattr(strategy.plan.spec, "capabilities", ())
    measured: list[dict[str, Any]] = strategy.collective.all_gather_object(
        memory_checks.measure(strategy, engine=engine))
    return measured


def recipe_on_the_mesh(strategy: Any, accumulate: int, clip: bool) -> dict[str, Any]:
    """The recipe loop (:mod:`interlock.conformance.recipes`, no dropout) on the
    layout: the full parameters (every stage's), the batches every data-parallel rank
    read, and the norms clipping returned.

    Under pipeline parallel the head is untied (pipeline parallel refuses weights tied
    across stages), each batch is split into as many micro-batches as it has samples,
    and the epoch's last, smaller batch is dropped (a pipeline splits every batch into
    equal micro-batches)."""
    pipelined = int(strategy.meshes["pp"].size()) > 1
    if pipelined and hasattr(strategy, "pipeline_microbatches"):
        strategy.pipeline_microbatches = recipes.BATCH
    got = recipes.train(strategy, dropout=0.0, accumulate=accumulate, clip=clip,
                        tied=not pipelined, drop_last=pipelined)
    merged: dict[str, torch.Tensor] = {}
    for part in strategy.collective.all_gather_object(
            {k: v.float() for k, v in got["params"].items()}):
        merged.update(part)
    return {"params": merged, "norms": got["norms"], "tied": not pipelined,
            "seen": strategy.collective.all_gather_object((got["data_rank"], got["seen"]))}


def load_elsewhere(strategy: Any, path: str) -> dict[str, Any]:
    """A fresh model and optimizer load the mesh's checkpoint at another world size."""
    module = strategy.setup_module(reference.other_model())
    opt = strategy.setup_optimizer(
        torch.optim.SGD(module.parameters(), lr=reference.LR, momentum=0.9))
    state: dict[str, Any] = {"model": module, "optimizer": opt, "step": 0}
    strategy.load_checkpoint(path, state)
    return {"params": {k: v.float() for k, v in full(module.state_dict()).items()},
            "step": state["step"]}


def check_mesh(dim: str, ctx: Any) -> None:
    """The mesh check of ``dim`` (see the module docstring); `MESH_CHECKS` binds it to
    each dimension."""
    if "32-true" not in ctx.spec.precisions:
        raise CheckSkipped("the mesh checks train in 32-true, which the strategy does not "
                           "declare")
    layout = layout_for(ctx.spec.parallel_dims, dim)
    shown = " x ".join(f"{d}={n}" for d, n in layout.items() if n != 1)
    try:
        strategy = ctx.resolve_layout("32-true", MESH_WORLD_SIZE, layout)
    except ResolutionError as error:  # the engine's reason is the declared fact
        raise CheckSkipped(f"plan() refuses {shown} here: [{error.code}] "
                           f"{error.reason}") from None
    path = str(ctx.workdir / f"mesh_{dim}")
    try:
        result = strategy.launch(train_on_the_mesh, path, *recipes.features(ctx.spec))
    except Exception as error:
        raise CheckFailed(f"{shown} on {MESH_WORLD_SIZE} ranks: {type(error).__name__}: "
                          f"{str(error)[:2000]}") from None
    problems = _mesh_problems(result, MeshLayout.of(Parallelism.from_flag(layout)))
    want = reference.baseline("32-true", MESH_STEPS)
    try:
        torch.testing.assert_close(result.get("params"), want)
    except AssertionError as error:
        problems.append(f"parameters after {MESH_STEPS} steps differ from one plain "
                        f"process: {str(error)[:800]}")
    problems += _recipe_problems(result.get("recipe"), ctx.spec)
    if result.get("memory"):
        problems += memory_checks.memory_problems(
            result["memory"], engine="engine_gradients" in ctx.spec.capabilities,
            what=f"the memory of {shown}")
    try:
        loaded = ctx.resolve("32-true", 1).launch(load_elsewhere, path)
        torch.testing.assert_close(loaded["params"], result.get("params"), rtol=0, atol=0)
        if loaded["step"] != MESH_STEPS:
            problems.append(f"the checkpoint's step came back as {loaded['step']!r}")
    except Exception as error:
        problems.append(f"the checkpoint saved under {shown} did not load at world size 1 "
                        f"into the same values: {type(error).__name__}: {str(error)[:800]}")
    if problems:
        raise CheckFailed(f"{shown}: " + "; ".join(problems))


def _mesh_problems(result: Any, layout: MeshLayout) -> list[str]:
    """Where the ranks' view of the mesh differs from the layout's arithmetic."""
    ranks = result.get("ranks") if isinstance(result, dict) else None
    if not isinstance(ranks, list) or len(ranks) != layout.size:
        return [f"launch() returned {type(result).__name__}, not every rank's view of the "
                "mesh"]
    problems = []
    for seen in ranks:
        rank = seen["rank"]
        if seen["coords"] != layout.coordinates(rank):
            problems.append(f"rank {rank} sits at {seen['coords']} on the mesh, expected "
                            f"{layout.coordinates(rank)}")
        for name in FLATTENED:
            if tuple(seen["flattened"][name]) != layout.flattened(name, rank):
                problems.append(f"rank {rank} is {tuple(seen['flattened'][name])} "
                                f"(index, size) in the {name} group, expected "
                                f"{layout.flattened(name, rank)}")
        if tuple(seen["data"]) != layout.flattened("dp", rank):
            problems.append(f"rank {rank} reads data shard {tuple(seen['data'])} (rank, "
                            f"size), expected {layout.flattened('dp', rank)}")
    return problems


def _recipe_problems(recipe: Any, spec: Any) -> list[str]:
    """Where the recipe trained on the layout differs from one plain process on the
    batches the ranks read."""
    if not isinstance(recipe, dict):
        return [f"the recipe on the layout returned {type(recipe).__name__}"]
    accumulate, clip = recipes.features(spec)
    steps = recipes.global_steps(recipe["seen"])
    want = recipes.one_process("32-true", steps, accumulate=accumulate, clip=clip,
                               tied=recipe["tied"])
    tol = reference.tolerance("32-true", spec.parity_tolerance)
    problems = []
    for what, got, expected in (
            ("the norms clip_gradients_norm returned", torch.tensor(recipe["norms"]),
             torch.tensor(want["norms"])),
            (f"the parameters after {len(steps)} steps", recipe["params"],
             want["params"])):
        try:
            torch.testing.assert_close(got, expected, rtol=tol["rtol"], atol=tol["atol"])
        except AssertionError as error:
            problems.append(f"the recipe (AdamW, warm-up, accumulation {accumulate}, "
                            f"clipping {'on' if clip else 'off'}): {what} differ from one "
                            f"plain process: {str(error)[:800]}")
    return problems


#: each dimension's check function: the same check on that dimension's layout
MESH_CHECKS: Mapping[str, Callable[[Any], None]] = MappingProxyType(
    {dim: partial(check_mesh, dim) for dim in DIMS})
