"""The recipe checks: a training loop the way real scripts write one, every feature on.

One loop (:func:`train`) trains a small language model with tied embeddings, LayerNorm,
a buffer and dropout, with AdamW (weight decay) under a warm-up schedule, gradient
accumulation over 2 micro-batches under ``no_backward_sync``, clipping that is active,
a shuffled ``setup_dataloader`` over a dataset whose size does not divide by the world
size, and checkpoints through a `CheckpointManager` saved mid-epoch. Two checks run it:

- ``recipe_parity`` (every rank, each precision): the loop without dropout against the
  same loop in one plain process on the batches the ranks read (every data-parallel
  rank's micro-batches together), so that each feature is right together with the
  others;
- ``recipe_resume`` (the launching process, ``32-true``): the loop with dropout, once
  undisturbed and once with a rank raising inside ``backward`` and one restart that
  resumes mid-epoch from the last checkpoint: parameters, AdamW state, the schedule and
  the batches read must equal the undisturbed run's bit for bit.

A strategy that does not declare ``accumulation`` or ``clipping`` trains the loop
without that feature (it has no such API to call).
"""

from __future__ import annotations

import datetime
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from interlock.conformance import faults, reference
from interlock.conformance.checks import CheckFailed, CheckSkipped, Expect, full
from interlock.strategies.restarts import restart_attempt

if TYPE_CHECKING:
    from interlock.conformance.checks import RankContext
    from interlock.conformance.launch_checks import LaunchContext

VOCAB, WIDTH, HIDDEN, LENGTH = 16, 8, 16, 4
#: samples in the dataset: odd, so that no world size above 1 divides it
SAMPLES = 21
BATCH = 2
EPOCHS = 2
LR, WEIGHT_DECAY, WARMUP = 1e-2, 0.1, 3
#: AdamW's epsilon: representable in float16 (torch's 1e-8 is 0 there, and a step
#: divides by it)
EPS = 1e-4
#: small enough that every step clips
MAX_NORM = 0.05
DROPOUT = 0.1
#: a checkpoint after every this many optimizer steps (the first falls mid-epoch)
SAVE_EVERY = 2
#: the optimizer step (0-based) whose backward raises in the faulted run
FAULT_STEP = 3
#: torch's seed in every rank (alike: tensor-parallel peers draw the same dropout masks)
SEED = 1234


class _Embedding(nn.Embedding):
    """Token embeddings plus a persistent buffer (a learned model's fixed offset)."""

    def __init__(self) -> None:
        super().__init__(VOCAB, WIDTH)
        self.register_buffer("offset", torch.linspace(-0.1, 0.1, WIDTH))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        offset: torch.Tensor = self.offset  # type: ignore[assignment]
        hidden: torch.Tensor = super().forward(tokens)
        return hidden + offset.to(hidden.dtype)


class _Block(nn.Module):
    """A pre-norm MLP with a residual and dropout."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.Tanh(),
                                 nn.Linear(HIDDEN, WIDTH))
        self.drop = nn.Dropout(dropout)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = hidden + self.drop(self.mlp(self.norm(hidden)))
        return out


class RecipeLM(nn.Sequential):
    """Embedding (tied to the head unless ``tied`` is False), a pre-norm MLP block with
    a residual and dropout, and a persistent buffer added to the embeddings. A
    sequence of three layers, so that pipeline parallel's default split cuts it (the
    head on the last stage)."""

    #: how the suite's parallelize function splits it over ``tp``
    tensor_parallel: ClassVar[dict[str, str]] = {"block.mlp.0": "colwise",
                                                 "block.mlp.2": "rowwise"}

    def __init__(self, dropout: float, tied: bool = True) -> None:
        super().__init__(OrderedDict(
            embed=_Embedding(), block=_Block(dropout),
            head=nn.Linear(WIDTH, VOCAB, bias=False)))
        if tied:
            embed, head = self.get_submodule("embed"), self.get_submodule("head")
            assert isinstance(embed, nn.Embedding) and isinstance(head, nn.Linear)
            head.weight = embed.weight


def build(dropout: float, tied: bool = True) -> RecipeLM:
    """The model, initialised the same way every time (the caller's random state is
    left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return RecipeLM(dropout, tied)


def sequences() -> torch.Tensor:
    """The dataset: ``SAMPLES`` token sequences of ``LENGTH + 1`` (inputs, then the
    targets shifted by one)."""
    g = torch.Generator().manual_seed(77)
    return torch.randint(VOCAB, (SAMPLES, LENGTH + 1), generator=g)


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / WARMUP)


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten())


# ------------------------------------------------------------------ in every rank


def train(strategy: Any, *, dropout: float, accumulate: int, clip: bool,
          directory: str | None = None, fault: faults.Fault | None = None,
          tied: bool = True, drop_last: bool = False) -> dict[str, Any]:
    """The recipe in every rank: resume from the newest checkpoint in ``directory``
    (when given), train ``EPOCHS`` epochs, save every ``SAVE_EVERY`` optimizer steps.
    Returns the full parameters (and, with ``directory``, the optimizer state), the
    schedule, the sample indices this rank read per optimizer step (with its
    data-parallel rank), and where it resumed.

    Every rank seeds torch alike (tensor-parallel peers must draw the same dropout
    masks); the caller's random state is restored afterwards, and the environment is
    not touched (``seed_everything`` would leave its seed there)."""
    device = strategy.root_device
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(SEED)
        return _train(strategy, dropout=dropout, accumulate=accumulate, clip=clip,
                      directory=directory, fault=fault, tied=tied, drop_last=drop_last)


def _train(strategy: Any, *, dropout: float, accumulate: int, clip: bool,
           directory: str | None, fault: faults.Fault | None,
           tied: bool, drop_last: bool) -> dict[str, Any]:
    from torch.utils.data import DataLoader, TensorDataset

    from interlock.checkpoints import CheckpointManager

    attempt = restart_attempt()
    model = build(dropout, tied)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY,
                            eps=EPS)
    module, (opt,) = strategy.setup_module_and_optimizers(model, [opt])
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    loader = strategy.setup_dataloader(DataLoader(TensorDataset(torch.arange(SAMPLES)),
                                                  batch_size=BATCH, shuffle=True,
                                                  drop_last=drop_last))
    data = sequences()
    state: dict[str, Any] = {"model": module, "optimizer": opt, "step": 0, "epoch": 0,
                             "batches": 0, "schedule": schedule.state_dict()}
    manager = CheckpointManager(strategy, directory) if directory is not None else None
    start = (manager.load_latest(state) or 0) if manager is not None else 0
    schedule.load_state_dict(state["schedule"])
    if fault is not None and (attempt or fault.rank != strategy.global_rank):
        fault = None
    step, seen, norms = state["step"], [], []
    usable = len(loader) // accumulate * accumulate  # whole optimizer steps per epoch
    for epoch in range(state["epoch"], EPOCHS):
        loader.set_epoch(epoch)
        done = state["batches"] if epoch == state["epoch"] else 0
        micro: list[list[int]] = []
        for position, (indices,) in enumerate(loader):
            if position < done:
                continue  # read before the checkpoint: skipped on resume
            if position >= usable:
                break
            if fault is not None and fault.step == step and not micro:
                faults.fire_before_step(fault, Path(directory or "."), module)
            tokens = strategy.batch_to_device(data[indices.cpu()])
            last = len(micro) == accumulate - 1
            with strategy.no_backward_sync(module, enabled=not last):
                strategy.forward_backward(
                    module, tokens[:, :-1], tokens[:, 1:],
                    lambda out, target: _loss(out, target) / accumulate)
            micro.append(indices.tolist())
            if not last:
                continue
            if clip:
                norms.append(float(strategy.clip_gradients_norm(module, opt, MAX_NORM)))
            strategy.optimizer_step(opt)
            opt.zero_grad()
            schedule.step()
            seen.append(micro)
            micro, step = [], step + 1
            if manager is not None and step % SAVE_EVERY == 0:
                state.update(step=step, epoch=epoch, batches=position + 1,
                             schedule=schedule.state_dict())
                manager.save(step, state)
    if manager is not None:
        manager.close()
    return {"params": full(module.state_dict()),
            "optimizer": full(opt.state_dict()) if manager is not None else None,
            "schedule": schedule.state_dict(), "seen": seen, "norms": norms,
            "data_rank": int(strategy.data_parallel_rank), "attempt": attempt,
            "resumed_from": start}


# ------------------------------------------------------------------ one plain process


def one_process(precision: str, steps: list[list[list[int]]], *, accumulate: int,
                clip: bool, tied: bool = True) -> dict[str, Any]:
    """The recipe without dropout in one process, each optimizer step on the
    micro-batches ``steps`` lists (every data-parallel rank's together), in
    ``precision`` the way one device runs it: plain torch for the built-in precisions;
    for a registered one, whose plugin may change the arithmetic (a compensated
    optimizer update, say), the plugin itself on one device (`one_device`)."""
    from interlock.engine.tables import PRECISION_ROWS

    if precision not in PRECISION_ROWS:
        return one_device(precision, steps, accumulate=accumulate, clip=clip, tied=tied)
    made = reference.recipe(precision)
    net = build(0.0, tied).to(made.param_dtype)
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, eps=EPS)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    scaler = (torch.amp.GradScaler("cpu", init_scale=reference.PARITY_SCALE) if made.scaler
              else None)
    data = sequences()
    norms = []
    for micro_batches in steps:
        for indices in micro_batches:
            tokens = data[torch.tensor(indices)]
            with reference.autocast(made):
                out = net(tokens[:, :-1])
            loss = _loss(out, tokens[:, 1:]) / accumulate
            (scaler.scale(loss) if scaler else loss).backward()  # type: ignore[no-untyped-call]
        if scaler:
            scaler.unscale_(opt)
        if clip:
            norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), MAX_NORM)))
        reference.optimizer_step(opt, scaler)
        schedule.step()
    return {"params": {k: v.detach().float().clone() for k, v in net.state_dict().items()},
            "norms": norms}


def one_device(precision: str, steps: list[list[list[int]]], *, accumulate: int,
               clip: bool, tied: bool = True) -> dict[str, Any]:
    """The recipe without dropout through ``single_device`` in ``precision`` on the
    CPU, in this process: the reference for a precision whose plugin the suite cannot
    reproduce in plain torch."""
    import interlock

    single = interlock.resolve(strategy="single_device", accelerator="cpu",
                               precision=precision)
    net = build(0.0, tied)
    adamw = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, eps=EPS)
    module, (opt,) = single.setup_module_and_optimizers(net, [adamw])
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    data = sequences()
    norms = []
    for micro_batches in steps:
        for indices in micro_batches:
            tokens = single.batch_to_device(data[torch.tensor(indices)])
            single.forward_backward(module, tokens[:, :-1], tokens[:, 1:],
                                    lambda out, target: _loss(out, target) / accumulate)
        if clip:
            norms.append(float(single.clip_gradients_norm(module, opt, MAX_NORM)))
        single.optimizer_step(opt)
        opt.zero_grad()
        schedule.step()
    return {"params": {k: v.detach().float().cpu().clone()
                       for k, v in module.state_dict().items()}, "norms": norms}


def global_steps(per_rank: list[tuple[int, list[list[list[int]]]]]
                 ) -> list[list[list[int]]]:
    """Each optimizer step's micro-batches over the whole world: the data-parallel
    ranks' micro-batches concatenated in rank order (ranks of one tensor-parallel
    group read the same, and count once)."""
    by_rank = dict(sorted(per_rank))
    ranks = list(by_rank.values())
    return [[[i for rank in ranks for i in rank[step][micro]]
             for micro in range(len(ranks[0][step]))]
            for step in range(len(ranks[0]))]


def features(spec: Any) -> tuple[int, bool]:
    """What the recipe uses for a strategy: accumulation over 2 micro-batches where it
    declares ``accumulation``, clipping where it declares ``clipping``."""
    return (2 if "accumulation" in spec.capabilities else 1,
            "clipping" in spec.capabilities)


# ------------------------------------------------------------------ the checks


def check_recipe_parity(ctx: RankContext) -> None:
    """The recipe (no dropout) on this launch's ranks against one plain process."""
    from interlock.engine.registry import current_parts

    if current_parts().precisions[ctx.precision].param_dtype == "float16":
        raise CheckSkipped(
            f"{ctx.precision} keeps the parameters in float16: under AdamW the squared "
            "gradients underflow there and a step divides by epsilon, so runs that round "
            "once differently diverge (one plain process against itself in another "
            "summation order); training_parity holds this precision to one process")
    e = Expect()
    accumulate, clip = features(ctx.spec)
    got = train(ctx.strategy, dropout=0.0, accumulate=accumulate, clip=clip)
    everyone = ctx.strategy.collective.all_gather_object((got["data_rank"], got["seen"]))
    steps = global_steps(everyone)
    _check_epochs(e, steps, accumulate)
    want = one_process(ctx.precision, steps, accumulate=accumulate, clip=clip)
    exact = one_process("32-true", steps, accumulate=accumulate, clip=clip)
    tol = reference.tolerance(ctx.precision, ctx.spec.parity_tolerance)
    if clip:
        e(all(n > MAX_NORM for n in want["norms"]),
          f"the recipe's clipping was not active in one process: norms {want['norms']}")
        _within(e, {"norms": torch.tensor(got["norms"])},
                {"norms": torch.tensor(want["norms"])},
                {"norms": torch.tensor(exact["norms"])}, tol,
                "the norms clip_gradients_norm returned, step by step, vs one process")
    params = {k: v.float() for k, v in got["params"].items()}
    _within(e, params, want["params"], exact["params"], tol,
            f"the recipe's parameters after {len(steps)} steps on {ctx.world_size} ranks "
            f"vs one process ({ctx.precision})")
    e.done()


def _within(e: Expect, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
            exact: dict[str, torch.Tensor], tol: dict[str, float], what: str) -> None:
    """``got`` equals ``want`` (one process in the precision) within the precision's
    parity tolerance widened, element by element, by twice the precision's own error
    there (``want`` against ``exact``, one process in float32).

    In float32 the two references agree and the tolerance is the plain one. With
    half-precision parameters AdamW's normalised step turns a one-ulp difference in a
    small gradient into a step of up to the learning rate, so a strategy that sums in
    another order may differ from one process by about what half precision costs
    anyway: it must do no worse than twice that."""
    problems = []
    for key, value in want.items():
        mine = got.get(key)
        if mine is None or mine.shape != value.shape:
            problems.append(f"{key}: {None if mine is None else list(mine.shape)}, "
                            f"expected {list(value.shape)}")
            continue
        own_error = (value.float() - exact[key].float()).abs()
        allowed = tol["atol"] + tol["rtol"] * value.float().abs() + 2 * own_error
        off = (mine.float() - value.float()).abs()
        if not bool((off <= allowed).all()):
            worst = int((off - allowed).argmax())
            problems.append(
                f"{key}: {int((off > allowed).sum())} of {off.numel()} elements off, the "
                f"worst by {float(off.flatten()[worst]):.3g} where "
                f"{float(allowed.flatten()[worst]):.3g} is allowed (got "
                f"{float(mine.flatten()[worst]):.6g}, one process "
                f"{float(value.flatten()[worst]):.6g})")
    e(not problems, f"{what}: " + "; ".join(problems[:6]))


def _check_epochs(e: Expect, steps: list[list[list[int]]], accumulate: int) -> None:
    """Every epoch reads each sample at least once (the shuffle lost none), and no
    two epochs read the same order."""
    per_epoch = len(steps) // EPOCHS
    orders = []
    for epoch in range(EPOCHS):
        read = [i for step in steps[epoch * per_epoch:(epoch + 1) * per_epoch]
                for micro in step for i in micro]
        orders.append(read)
        if per_epoch * accumulate * BATCH >= SAMPLES:
            missing = sorted(set(range(SAMPLES)) - set(read))
            e(not missing, f"epoch {epoch} never read samples {missing}")
    e(len(orders) < 2 or orders[0] != orders[1],
      "both epochs read the samples in the same order: the shuffle does not change "
      "from epoch to epoch")


def check_recipe_resume(ctx: LaunchContext) -> None:
    """The recipe with dropout, undisturbed and with one rank raising in ``backward``
    at optimizer step ``FAULT_STEP`` and one restart: equal bit for bit."""
    from interlock.conformance.launch_checks import FAILURE_BOUND_S, _is_driver, _wait_gone
    from interlock.strategies.restarts import RestartPolicy

    if "32-true" not in ctx.spec.precisions:
        raise CheckSkipped("the recipe's restart runs in 32-true, which the strategy does "
                           "not declare")
    accumulate, clip = features(ctx.spec)
    runs: dict[str, dict[str, Any]] = {}
    fault = faults.Fault(kind="raise_in_backward", rank=ctx.world_size - 1, step=FAULT_STEP)
    for name, injected in (("undisturbed", None), ("restarted", fault)):
        directory = ctx.workdir / "recipe" / name
        if _is_driver():
            faults.prepare(directory)
        strategy = ctx.resolve("32-true", ctx.world_size)
        if hasattr(strategy, "timeout"):
            strategy.timeout = datetime.timedelta(seconds=FAILURE_BOUND_S)
        try:
            runs[name] = strategy.launch(
                train, dropout=DROPOUT, accumulate=accumulate, clip=clip,
                directory=str(directory), fault=injected,
                restart_policy=RestartPolicy(max_restarts=1, backoff_s=0))
        except Exception as error:
            survivors = _wait_gone(directory, 10)
            raise CheckFailed(
                f"the {name} recipe run raised {type(error).__name__}: "
                f"{str(error)[:1500]}" + (f"; worker processes {survivors} are still alive"
                                          if survivors else "")) from None
    clean, restarted = runs["undisturbed"], runs["restarted"]
    problems = []
    if restarted.get("attempt") != 1:
        problems.append(f"launch returned attempt {restarted.get('attempt')}, expected 1 "
                        "(one restart)")
    resumed = restarted.get("resumed_from")
    expected_resume = FAULT_STEP // SAVE_EVERY * SAVE_EVERY
    if resumed != expected_resume:
        problems.append(f"the restarted attempt resumed from step {resumed}, expected the "
                        f"checkpoint of step {expected_resume}")
    elif clean["seen"][expected_resume:] != restarted["seen"]:
        problems.append("after resuming, rank 0 read other batches than the undisturbed "
                        f"run: {restarted['seen'][:2]} instead of "
                        f"{clean['seen'][expected_resume:expected_resume + 2]}")
    for key in ("params", "optimizer", "schedule"):
        wrong = faults.differences(restarted[key], clean[key], key)
        if wrong:
            problems.append(f"{len(wrong)} entries differ from the undisturbed run: "
                            + "; ".join(wrong[:6]))
    if problems:
        raise CheckFailed(f"with rank {fault.rank} raising in backward at step "
                          f"{FAULT_STEP} and max_restarts=1: " + "; ".join(problems))
