"""The checks that run inside the ranks, and what every check raises.

A check raises :class:`CheckFailed` with a message that explains itself without this
source, or :class:`CheckSkipped` with the reason it does not apply. Checks that run in
the ranks get a :class:`RankContext`; the launching process's run in
``launch_checks.py`` and the declaration's in ``declaration.py``. Which checks exist,
where each runs, when it applies and what it guarantees is said once, in ``table.py``.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from interlock.conformance import reference
from interlock.strategies.sharding import in_shared_memory

if TYPE_CHECKING:
    from interlock.engine.planner import Plan
    from interlock.engine.specs import StrategySpec
    from interlock.strategies.base import Strategy

#: the precision recorded for checks that do not depend on the precision
ANY_PRECISION = "*"
#: the pid of the driver process; its script-launcher children inherit it
DRIVER_ENV = "INTERLOCK_CONFORMANCE_DRIVER"
#: written by launch_arguments when a rank ran in the driver process itself
IN_DRIVER_MARK = "launch_arguments.in-driver"


class CheckFailed(AssertionError):
    """The strategy does not do what the check requires."""


class CheckSkipped(Exception):
    """The check does not apply here (the reason says why)."""


@dataclass(kw_only=True)
class RankContext:
    """What a check running inside a rank knows."""

    strategy: Strategy
    spec: StrategySpec
    precision: str
    accelerator: str
    world_size: int
    workdir: Path
    plan_for: Callable[[str], Plan]
    #: the module the driver passed through ``launch`` (the launch_arguments check)
    passed: nn.Module | None = None


# ------------------------------------------------------------------ helpers


def full(value: Any) -> Any:
    """``value`` with sharded tensors gathered, every tensor detached on the CPU.

    A collective for sharded values: every rank calls it in the same order.
    """
    if isinstance(value, DTensor):
        return value.full_tensor().detach().cpu().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: full(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(full(v) for v in value)
    return value


def share(tensor: torch.Tensor, strategy: Strategy) -> torch.Tensor:
    """This rank's share of a global batch."""
    return tensor.chunk(strategy.data_parallel_size)[strategy.data_parallel_rank]


class Expect:
    """Collects a check's problems instead of raising at the first one, so that every
    rank runs the same collectives to the end of the check even when its own
    expectations fail (raising early would leave the other ranks waiting)."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def __call__(self, condition: bool, message: str) -> bool:
        if not condition:
            self.problems.append(message)
        return condition

    def close(self, actual: Any, expected: Any, what: str, **tolerance: Any) -> None:
        try:
            torch.testing.assert_close(actual, expected, **tolerance)
        except AssertionError as error:
            self.problems.append(f"{what}: {error}")

    def same(self, actual: Any, expected: Any, what: str) -> None:
        """Nested state equal leaf by leaf: tensors exactly (NaN equal to NaN), other
        values (strings, versions, flags in an engine's optimizer state) by ``==``."""
        if isinstance(expected, dict) and isinstance(actual, dict):
            if set(actual) != set(expected):
                self.problems.append(f"{what}: keys {sorted(map(str, actual))} differ from "
                                     f"{sorted(map(str, expected))}")
                return
            for key in expected:
                self.same(actual[key], expected[key], f"{what}[{key!r}]")
        elif isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
            if len(actual) != len(expected):
                self.problems.append(f"{what}: {len(actual)} items, expected {len(expected)}")
                return
            for index, (a, b) in enumerate(zip(actual, expected, strict=True)):
                self.same(a, b, f"{what}[{index}]")
        elif isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
            self.close(actual, expected, what, rtol=0, atol=0, equal_nan=True)
        elif (type(actual) is type(expected) and hasattr(expected, "__dict__")
              and "__eq__" not in vars(type(expected))):
            # an object without equality of its own (a loss scaler): its attributes
            self.same(vars(actual), vars(expected), what)
        elif actual != expected and not (actual != actual and expected != expected):
            self.problems.append(f"{what}: {actual!r}, expected {expected!r}")

    def done(self) -> None:
        if self.problems:
            raise CheckFailed("; ".join(self.problems))


def _setup(ctx: RankContext, net: nn.Module) -> tuple[Any, Any]:
    opt: torch.optim.Optimizer = torch.optim.SGD(net.parameters(), lr=reference.LR,
                                                 momentum=0.9)
    module, (opt,) = ctx.strategy.setup_module_and_optimizers(net, [opt])
    return module, opt


def _step(ctx: RankContext, module: Any, opt: Any, step: int, accumulate: int = 1) -> None:
    strategy = ctx.strategy
    for micro in range(accumulate):
        x, y = reference.batch(step * accumulate + micro)
        x, y = strategy.batch_to_device((share(x, strategy), share(y, strategy)))
        with strategy.no_backward_sync(module, enabled=micro < accumulate - 1):
            loss = nn.functional.mse_loss(module(x).float(), y) / accumulate
            strategy.backward(loss, module)
    strategy.optimizer_step(opt)
    opt.zero_grad()


def _params(module: Any) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in full(module.state_dict()).items()}


# ------------------------------------------------------------------ rank checks


def check_lifecycle(ctx: RankContext) -> None:
    e = Expect()
    s = ctx.strategy
    cluster = s.cluster_environment
    me = {
        "global_rank": s.global_rank, "local_rank": s.local_rank, "node_rank": s.node_rank,
        "world_size": s.world_size, "is_global_zero": s.is_global_zero,
        "device": str(s.root_device), "device_type": s.root_device.type,
        "cluster": (cluster.global_rank(), cluster.local_rank(), cluster.node_rank()),
        "pid": os.getpid(),
    }
    ranks = s.collective.all_gather_object(me)
    seen = sorted(r["global_rank"] for r in ranks)
    e(seen == list(range(ctx.world_size)),
           f"global ranks {seen} ran; expected each of 0..{ctx.world_size - 1} exactly once")
    e(len({r["pid"] for r in ranks}) == len(ranks),
           f"{len(ranks)} ranks ran in {len({r['pid'] for r in ranks})} processes")
    zero = [r["global_rank"] for r in ranks if r["is_global_zero"]]
    e(zero == [0], f"is_global_zero is True on ranks {zero}; expected on rank 0 only")
    sizes = sorted({r["world_size"] for r in ranks})
    e(sizes == [ctx.world_size],
           f"world_size reported as {sizes}; {ctx.world_size} ranks ran")
    for r in ranks:
        e(r["cluster"] == (r["global_rank"], r["local_rank"], r["node_rank"]),
               f"rank {r['global_rank']}: strategy says (global, local, node) = "
               f"{(r['global_rank'], r['local_rank'], r['node_rank'])} but its cluster "
               f"environment says {r['cluster']}")
        e(r["device_type"] == ctx.accelerator,
               f"rank {r['global_rank']}: root_device is {r['device']}, not on the "
               f"{ctx.accelerator} accelerator")
    if ctx.accelerator != "cpu":
        devices = [r["device"] for r in ranks]
        e(len(set(devices)) == len(devices),
               f"ranks share devices: {devices}; each process needs its own")
    e.done()


def check_collectives(ctx: RankContext) -> None:
    e = Expect()
    s = ctx.strategy
    r, w, device = s.global_rank, ctx.world_size, s.root_device

    def f_of(rank: int) -> torch.Tensor:
        return torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * rank

    def i_of(rank: int) -> torch.Tensor:
        return torch.arange(4, dtype=torch.int64) * (rank + 1)

    inputs = {
        "float": (f_of(r).to(device), [f_of(k) for k in range(w)]),
        "int": (i_of(r).to(device), [i_of(k) for k in range(w)]),
        "scalar": (torch.tensor(float(r + 1), device=device),
                   [torch.tensor(float(k + 1)) for k in range(w)]),
        "non-contiguous": (f_of(r).to(device).t(), [f_of(k).t() for k in range(w)]),
    }
    ops: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "sum": lambda t: t.sum(0), "max": lambda t: t.max(0).values,
        "min": lambda t: t.min(0).values,
    }
    for kind, (mine, everyone) in inputs.items():
        before = mine.clone()
        stacked = torch.stack(everyone)
        for op in ("sum", "mean", "max", "min"):
            if op == "mean" and kind == "int":
                continue  # the mean of integers is not an integer
            got = s.all_reduce(mine, op)
            want = stacked.float().mean(0).to(stacked.dtype) if op == "mean" \
                else ops[op](stacked)
            e(got.device == device,
                   f"all_reduce({op}) of a {kind} tensor returned it on {got.device}, not "
                   f"on the root device {device}")
            e.close(got.cpu(), want, f"all_reduce({op}) of a {kind} tensor on rank {r}")
        e(torch.equal(mine, before), f"all_reduce changed its {kind} input in place")
        gathered = s.all_gather(mine)
        e.close(gathered.cpu(), stacked,
                     f"all_gather of a {kind} tensor on rank {r} (row k must be rank k's)")
    got = s.broadcast(f_of(r).to(device), src=w - 1)
    e.close(got.cpu(), f_of(w - 1), f"broadcast of a tensor from rank {w - 1}")
    obj = s.broadcast({"from": r, "items": [r, "x"]}, src=w - 1)
    e(obj == {"from": w - 1, "items": [w - 1, "x"]},
           f"broadcast of an object from rank {w - 1} gave {obj!r} on rank {r}")
    s.barrier()
    decisions = {
        "all(True)": (s.reduce_boolean_decision(True), True),
        "all(rank == 0)": (s.reduce_boolean_decision(r == 0), w == 1),
        "any(rank == 0)": (s.reduce_boolean_decision(r == 0, all=False), True),
        "any(False)": (s.reduce_boolean_decision(False, all=False), False),
    }
    for what, (got_decision, want_decision) in decisions.items():
        e(got_decision is want_decision or got_decision == want_decision,
               f"reduce_boolean_decision {what} over {w} ranks gave {got_decision}, "
               f"expected {want_decision}")
    e.done()


def check_training_parity(ctx: RankContext) -> None:
    e = Expect()
    module, opt = _setup(ctx, reference.model())
    steps = ctx.spec.parity_steps or 3  # a declared warm-up, else 3
    for step in range(steps):
        _step(ctx, module, opt, step)
    got = _params(module)
    want = reference.baseline(ctx.precision, steps)
    tol = reference.tolerance(ctx.precision, ctx.spec.parity_tolerance)
    e.close(got, want, f"parameters after {steps} steps on {ctx.world_size} ranks vs one "
                 f"process on the full batches ({ctx.precision})", **tol)
    e.done()


def check_accumulation_parity(ctx: RankContext) -> None:
    e = Expect()
    module, opt = _setup(ctx, reference.model())
    steps = ctx.spec.parity_steps or 2  # a declared warm-up, else 2
    for step in range(steps):
        _step(ctx, module, opt, step, accumulate=2)
    got = _params(module)
    want = reference.baseline(ctx.precision, steps, accumulate=2)
    tol = reference.tolerance(ctx.precision, ctx.spec.parity_tolerance)
    e.close(got, want, f"parameters after {steps} steps of 2 micro-batches accumulated "
                 "under no_backward_sync vs one process on the large batches", **tol)
    e.done()


def check_precision_dtypes(ctx: RankContext) -> None:
    e = Expect()
    row = reference.precision_row(ctx.precision)
    param_dtype = getattr(torch, row.param_dtype)
    compute_dtype = reference.activation_dtype(ctx.precision)
    module, _ = _setup(ctx, reference.model())
    seen: dict[str, torch.dtype] = {}

    def record(mod: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        seen.setdefault("activation", output.dtype)

    from interlock.strategies.module_wrapper import unwrap

    first = next(m for m in unwrap(module).modules() if isinstance(m, nn.Linear))
    hook = first.register_forward_hook(record)
    x, _ = reference.batch(0)
    out = module(ctx.strategy.batch_to_device(share(x, ctx.strategy)))
    hook.remove()
    ctx.strategy.backward(out.float().sum(), module)
    param = next(module.parameters())  # the set-up module's, where the strategy keeps them
    local = param.to_local() if isinstance(param, DTensor) else param
    e(local.dtype == param_dtype,
           f"{ctx.precision}: parameters are stored in {local.dtype}, expected {param_dtype}")
    e(seen.get("activation") == compute_dtype,
           f"{ctx.precision}: the first layer computed in {seen.get('activation')}, "
           f"expected {compute_dtype}")
    grad = param.grad
    if "engine_gradients" in ctx.spec.capabilities:
        # declared: the engine keeps gradients in its own buffers, never in .grad
        e(grad is None, f"{ctx.precision}: the strategy declares 'engine_gradients' but "
          f"a parameter's .grad is set after backward ({getattr(grad, 'dtype', None)})")
    elif e(grad is not None, f"{ctx.precision}: no gradient after backward"):
        e(grad is not None and grad.dtype == param_dtype,
          f"{ctx.precision}: gradients are {getattr(grad, 'dtype', None)}, expected "
          f"{param_dtype}")
    want_out = (torch.get_default_dtype() if row.output_dtype == "default"
                else getattr(torch, row.output_dtype))
    e(out.dtype == want_out,
      f"{ctx.precision}: the output came back as {out.dtype}, expected {want_out} (the "
      "precision table's output dtype)")
    e.done()


def check_scaler_skip(ctx: RankContext) -> None:
    """Run for precisions with a loss scaler only (the table's ``loss_scaler``)."""
    e = Expect()
    s = ctx.strategy
    module, opt = _setup(ctx, reference.model())
    before = _params(module)
    state = s.precision.state_dict()
    if "scaler" not in state:
        raise CheckFailed(f"{ctx.precision}: the precision's state has no 'scaler'")
    scale = float(state["scaler"]["scale"])
    x, y = reference.batch(0)
    x, y = s.batch_to_device((share(x, s), share(y, s)))
    loss = nn.functional.mse_loss(module(x).float(), y)
    if s.global_rank == ctx.world_size - 1:
        loss = loss * float("inf")
    s.backward(loss, module)
    s.optimizer_step(opt)
    opt.zero_grad()
    after_skip = _params(module)
    changed = [k for k in before if not torch.equal(before[k], after_skip[k])]
    e(not changed, f"rank {s.global_rank} stepped although rank {ctx.world_size - 1}'s "
           f"loss was inf: {changed} changed")
    new_scale = float(s.precision.state_dict()["scaler"]["scale"])
    e(new_scale == scale / 2, f"the scale went from {scale} to {new_scale} after an inf "
           "gradient; expected it halved")
    _step(ctx, module, opt, 1)
    moved = [k for k, v in _params(module).items() if not torch.equal(after_skip[k], v)]
    e(bool(moved), "the step after the skipped one was not taken either")
    e.done()


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise OSError("simulated failure in the middle of writing a checkpoint")


def check_checkpoint_round_trip(ctx: RankContext) -> None:
    e = Expect()
    s = ctx.strategy
    path = ctx.workdir / f"round-trip-{ctx.precision}.ckpt"
    module, opt = _setup(ctx, reference.model())
    for step in range(2):
        _step(ctx, module, opt, step)
    saved_params, saved_opt = _params(module), full(opt.state_dict())
    saved_precision = copy.deepcopy(s.precision.state_dict())
    s.save_checkpoint(path, {"model": module, "optimizer": opt, "step": 2, "tag": "x"})
    for step in range(2, 4):  # move away from what was saved
        _step(ctx, module, opt, step)
    # a freshly completed strategy: new parts (precision included) from the same plan
    s.complete(ctx.plan_for(ctx.precision))
    fresh, fresh_opt = _setup(ctx, reference.other_model())
    state: dict[str, Any] = {"model": fresh, "optimizer": fresh_opt, "step": 0}
    rest = s.load_checkpoint(path, state)
    e.close(_params(fresh), saved_params, "parameters after loading", rtol=0, atol=0,
            equal_nan=True)
    e.same(full(fresh_opt.state_dict()), saved_opt, "optimizer state after loading")
    e(s.precision.state_dict() == saved_precision,
           f"precision state after loading is {s.precision.state_dict()}, saved "
           f"{saved_precision}")
    e(state["step"] == 2, f"the plain value 'step' loaded as {state['step']!r}, saved 2")
    e(rest == {"tag": "x"}, f"load_checkpoint returned {rest!r} for the entries it was "
           "not asked for; expected {'tag': 'x'}")
    e.done()


def check_init_contexts(ctx: RankContext) -> None:
    e = Expect()
    s = ctx.strategy
    row = reference.precision_row(ctx.precision)
    param_dtype = getattr(torch, row.param_dtype)
    from interlock.strategies.module_wrapper import unwrap

    # where parameters rest after setup: the root device, or CPU memory for a strategy
    # that declares it offloads them
    home = (torch.device("cpu") if "parameter_offload" in ctx.spec.capabilities
            else s.root_device)
    for empty in (False, True):
        with s.module_init_context(empty_init=empty):
            net = reference.model()
        module, _ = _setup(ctx, net)
        for name, p in unwrap(module).named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            e(local.device.type == home.type and not local.is_meta,
                   f"module_init_context(empty_init={empty}) then setup_module: {name} is on "
                   f"{local.device}, not {home}")
            e(local.dtype == param_dtype,
                   f"module_init_context(empty_init={empty}): {name} is {local.dtype}, "
                   f"expected {param_dtype} for {ctx.precision}")
    # a buffer computed in __init__ and not in the state dict: no checkpoint restores
    # it, so empty init must keep the value __init__ gave it
    with s.module_init_context(empty_init=True):
        net = reference.model_with_buffer()
    module, _ = _setup(ctx, net)
    buffer = unwrap(module).get_buffer("1.freq")
    local = buffer.to_local() if isinstance(buffer, DTensor) else buffer
    want = reference.buffer_values().to(local.dtype)
    e(torch.equal(local.detach().cpu(), want),
      f"module_init_context(empty_init=True): a non-persistent buffer computed in __init__ "
      f"reads {local.detach().cpu().tolist()} after setup_module, expected {want.tolist()}")
    with s.tensor_init_context():
        t = torch.empty(2)
    e(t.device.type == s.root_device.type,
           f"tensor_init_context made a tensor on {t.device}, not {s.root_device}")
    e(t.dtype == param_dtype or row.plugin == "mixed",
           f"tensor_init_context made {t.dtype}, expected {param_dtype}")
    e.done()


def check_interrupted_save(ctx: RankContext) -> None:
    """Run at world size 1 only (the table's ``world_sizes``)."""
    e = Expect()
    s = ctx.strategy
    path = ctx.workdir / "interrupted.ckpt"
    module, opt = _setup(ctx, reference.model())
    _step(ctx, module, opt, 0)
    saved = _params(module)
    s.save_checkpoint(path, {"model": module, "optimizer": opt, "step": 1})
    _step(ctx, module, opt, 1)
    try:
        s.save_checkpoint(path, {"model": module, "optimizer": opt, "step": 2,
                                 "bad": _Unpicklable()})
    except Exception:  # any error is the simulated interruption
        pass
    else:
        raise CheckFailed("saving an unpicklable value did not raise, so nothing was "
                          "interrupted")
    fresh, fresh_opt = _setup(ctx, reference.other_model())
    state: dict[str, Any] = {"model": fresh, "optimizer": fresh_opt, "step": 0}
    try:
        s.load_checkpoint(path, state)
    except Exception as error:  # reported as the failure
        raise CheckFailed(f"after an interrupted save, the previous checkpoint no longer "
                          f"loads: {type(error).__name__}: {error}") from None
    e.close(_params(fresh), saved, "the previous checkpoint after an interrupted save",
                 rtol=0, atol=0)
    e(state["step"] == 1, f"the previous checkpoint's step is {state['step']!r}, not 1")
    e.done()


def check_launch_arguments(ctx: RankContext) -> None:
    e = Expect()
    if ctx.passed is None:
        raise CheckFailed("the driver passed no module through launch()")
    if os.environ.get(DRIVER_ENV) == str(os.getpid()):
        # this rank runs in the launching process (the script launcher's rank 0): it
        # trains the caller's own object, as any function call would
        (ctx.workdir / IN_DRIVER_MARK).touch()
    shared = [n for n, p in ctx.passed.named_parameters() if in_shared_memory(p)]
    module, opt = _setup(ctx, ctx.passed)
    still_shared = [n for n, p in module.named_parameters() if in_shared_memory(p)]
    e(not still_shared or ctx.world_size == 1,
      f"parameters {still_shared} are in shared memory after setup_module (they arrived "
      f"shared: {shared}), so every rank of this node steps the same storage")
    steps = ctx.spec.parity_steps or 3  # as training_parity
    for step in range(steps):
        _step(ctx, module, opt, step)
    want = reference.baseline(ctx.precision, steps)
    tol = reference.tolerance(ctx.precision, ctx.spec.parity_tolerance)
    e.close(_params(module), want, f"a module passed through launch(), after {steps} steps on "
            f"{ctx.world_size} ranks vs one process ({ctx.precision})", **tol)
    e.done()


def check_same_start(ctx: RankContext) -> None:
    e = Expect()
    s = ctx.strategy
    with torch.random.fork_rng():
        torch.manual_seed(4242 + s.global_rank)  # as frameworks that seed per rank do
        net = nn.Sequential(nn.Linear(reference.FEATURES, reference.HIDDEN), nn.Tanh(),
                            nn.Linear(reference.HIDDEN, 1))
    built = {k: v.detach().clone() for k, v in net.state_dict().items()}
    rank0_built = s.broadcast(built, src=0)
    module, _ = _setup(ctx, net)
    mine = {k: v.float() for k, v in full(module.state_dict()).items()}
    everyone = s.collective.all_gather_object(mine)
    for rank, theirs in enumerate(everyone):
        e.close(theirs, mine, f"rank {rank}'s weights after setup vs rank "
                f"{s.global_rank}'s", rtol=0, atol=0)
    # the precision may have cast them: compare in the set-up module's dtype
    dtypes = {k: v.dtype for k, v in full(module.state_dict()).items()}
    want = {k: v.to(dtypes[k]).float() for k, v in rank0_built.items()}
    e.close(mine, want, "weights after setup vs what rank 0 built (each rank seeded its "
            "own way)", rtol=0, atol=0)
    e.done()


def check_lr_scheduler(ctx: RankContext) -> None:
    e = Expect()
    net = reference.model()
    opt = torch.optim.SGD(net.parameters(), lr=reference.LR)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    module, (stepped,) = ctx.strategy.setup_module_and_optimizers(net, [opt])
    _step(ctx, module, stepped, 0)
    scheduler.step()
    lrs = [group["lr"] for group in stepped.param_groups]
    e(all(abs(lr - reference.LR * 0.1) < 1e-12 for lr in lrs),
      f"after one StepLR(gamma=0.1) step over the optimizer given to "
      f"setup_module_and_optimizers, the optimizer the strategy returned has lr {lrs}, "
      f"expected {reference.LR * 0.1}: the scheduler drives another object")
    e.done()


def check_clipping(ctx: RankContext) -> None:
    e = Expect()
    s = ctx.strategy
    net = reference.model()
    first, _, last = net.children()
    given: list[torch.optim.Optimizer] = [
        torch.optim.SGD(first.parameters(), lr=reference.LR),
        torch.optim.SGD(last.parameters(), lr=reference.LR)]
    module, opts = s.setup_module_and_optimizers(net, given)
    want = reference.gradient_norms(LOSS_FACTOR)
    x, y = reference.batch(0)
    x, y = s.batch_to_device((share(x, s), share(y, s)))
    s.backward(nn.functional.mse_loss(module(x).float(), y) * LOSS_FACTOR, module)
    tol = reference.tolerance(ctx.precision, ctx.spec.parity_tolerance)
    for index, opt in enumerate(opts):
        got = s.clip_gradients_norm(module, opt, max_norm=1e9).detach().float().cpu()
        e.close(got, want[index], f"clip_gradients_norm with optimizer {index} (over layer "
                f"{index}) returned a norm other than that layer's gradient norm in one "
                f"plain process ({ctx.precision})", **tol)
    for opt in opts:
        s.optimizer_step(opt)
        opt.zero_grad()
    e.done()


#: a small loss keeps 16-mixed's scaled float16 gradients finite in the clipping check,
#: so its first step is not skipped for an overflow
LOSS_FACTOR = 2.0**-8


def _batches(loader: Any, device: torch.device, e: Expect, what: str) -> list[list[int]]:
    """The sample indices of each batch one pass over ``loader`` gives, in order."""
    batches = []
    for batch in loader:
        (indices,) = batch
        e(indices.device.type == device.type,
          f"{what}: a batch arrived on {indices.device}, not on the root device {device}")
        batches.append([int(i) for i in indices.cpu()])
    return batches


def check_data_loading(ctx: RankContext) -> None:
    e = Expect()
    s = ctx.strategy
    samples = 4 * reference.BATCH + 3  # shares differ in size at every world size > 1
    data = torch.utils.data.TensorDataset(torch.arange(samples))
    train = s.setup_dataloader(torch.utils.data.DataLoader(data, batch_size=3, shuffle=True))
    evaluation = s.setup_dataloader(torch.utils.data.DataLoader(data, batch_size=3),
                                    evaluation=True)
    train_len = len(train)
    mine = {"rank": s.global_rank, "dp_rank": s.data_parallel_rank,
            "dp_size": s.data_parallel_size, "train_len": train_len,
            "train": _batches(train, s.root_device, e, "setup_dataloader"),
            "eval": _batches(evaluation, s.root_device, e,
                             "setup_dataloader(evaluation=True)")}
    everyone = s.collective.all_gather_object(mine)
    sizes = sorted({r["dp_size"] for r in everyone})
    if not (len(sizes) == 1 and sizes[0] > 0 and ctx.world_size % sizes[0] == 0):
        raise CheckFailed(f"data_parallel_size is {sizes} across the ranks; expected one "
                          f"value that divides the world size {ctx.world_size}")
    size = sizes[0]
    replicas: dict[int, list[dict[str, Any]]] = {}
    for r in everyone:
        replicas.setdefault(r["dp_rank"], []).append(r)
    e(sorted(replicas) == list(range(size))
      and all(len(v) == ctx.world_size // size for v in replicas.values()),
      f"data_parallel_rank over ranks 0..{ctx.world_size - 1} is "
      f"{[r['dp_rank'] for r in everyone]}; expected each of 0..{size - 1} equally often")
    counts = [len(r["train"]) for r in everyone]
    e(len(set(counts)) == 1,
      f"for training the ranks got different numbers of batches: {counts}")
    for r in everyone:
        e(r["train_len"] == len(r["train"]), f"rank {r['rank']}: len() of its training "
          f"loader is {r['train_len']}, but iterating it gave {len(r['train'])} batches")
    for group in replicas.values():
        for r in group[1:]:
            e(r["train"] == group[0]["train"] and r["eval"] == group[0]["eval"],
              f"ranks {group[0]['rank']} and {r['rank']} are one data-parallel replica "
              f"(data_parallel_rank {r['dp_rank']}) but got different batches")
    heads = [group[0] for _, group in sorted(replicas.items())]
    trained = [[i for b in r["train"] for i in b] for r in heads]
    covered = {i for share in trained for i in share}
    e(covered == set(range(samples)), f"for training the data-parallel replicas together "
      f"saw {len(covered)} of the {samples} samples")
    per_replica = -(-samples // size)  # the dataset shared out, padded to equal shares
    e(all(len(share) == per_replica for share in trained),
      f"for training each of {size} replica(s) should see {per_replica} samples; they "
      f"saw {[len(share) for share in trained]}")
    seen = sorted(i for r in heads for b in r["eval"] for i in b)
    e(seen == list(range(samples)), f"with evaluation=True the data-parallel replicas "
      f"together saw {len(seen)} samples ({len(set(seen))} distinct) of {samples}; "
      "expected each exactly once")
    e.done()


def check_rank_zero_print(ctx: RankContext) -> None:
    e = Expect()
    s = ctx.strategy
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        s.print("conformance", s.global_rank, sep=":")
    everyone = s.collective.all_gather_object((s.global_rank, out.getvalue()))
    printed = [rank for rank, text in everyone if text]
    e(printed == [0], f"strategy.print wrote on ranks {printed}; expected on rank 0 only")
    zero = dict(everyone).get(0, "")
    e(zero in ("", "conformance:0\n"), f"strategy.print('conformance', 0, sep=':') wrote "
      f"{zero!r} on rank 0; expected 'conformance:0\\n' as print() writes it")
    e.done()


def check_load_refusal(ctx: RankContext) -> None:
    e = Expect()
    s = ctx.strategy
    path = ctx.workdir / "refusal.ckpt"
    module, opt = _setup(ctx, reference.model())
    _step(ctx, module, opt, 0)
    s.save_checkpoint(path, {"model": module, "optimizer": opt, "step": 1})
    fresh, fresh_opt = _setup(ctx, reference.other_model())
    params, opt_state = _params(fresh), full(fresh_opt.state_dict())
    state: dict[str, Any] = {"model": fresh, "optimizer": fresh_opt, "step": 0,
                             "epoch": 0}  # "epoch" was never saved
    try:
        s.load_checkpoint(path, state)
    except Exception:  # any error is the refusal; CheckpointLoadError for the built-ins
        pass
    else:
        e(False, "load_checkpoint restored a state naming 'epoch', which the checkpoint "
          "does not have, without raising")
    e.close(_params(fresh), params, "parameters after a refused load (they must not be "
            "half-loaded)", rtol=0, atol=0)
    e.same(full(fresh_opt.state_dict()), opt_state, "optimizer state after a refused load")
    e(state["step"] == 0, f"the plain value 'step' is {state['step']!r} after a refused "
      "load; expected it left at 0")
    e.done()


def check_teardown(ctx: RankContext) -> None:
    import torch.distributed as dist

    s = ctx.strategy
    rank = s.global_rank  # read now: after teardown the strategy may not know it
    problems = []
    for call in ("first", "second"):
        try:
            s.teardown()
        except Exception as error:
            problems.append(f"the {call} teardown() raised {type(error).__name__}: {error}")
        # no process group existed before setup_environment (relaunch holds the
        # launching process to that, and other ranks start fresh), so any is its own
        if dist.is_available() and dist.is_initialized():
            problems.append(f"after the {call} teardown() a torch.distributed process "
                            "group still exists")
    if problems:
        raise CheckFailed(f"rank {rank}: " + "; ".join(problems))
