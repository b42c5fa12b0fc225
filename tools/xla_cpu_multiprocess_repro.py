"""Reproducer: torch_xla's CPU PJRT device cannot run a collective across two devices.

Plain torch_xla, no interlock. Run it in an environment with torch and torch_xla::

    python tools/xla_cpu_multiprocess_repro.py            # every scenario
    python tools/xla_cpu_multiprocess_repro.py threads    # one of them

Each scenario sums ``rank + 1`` over two XLA CPU devices with ``xm.all_reduce``; the
right answer is 3.0 on both. It sets ``PJRT_DEVICE=CPU`` for its children itself and
needs no accelerator. Exit status 1 while the failure reproduces, 0 once every
scenario gives 3.0.

Observed with torch 2.9.0 and torch_xla 2.9.0 (PyPI wheels, Python 3.11, x86-64 Linux):

``spawn-nprocs``
    ``xmp.spawn(fn, nprocs=2)`` raises ``ValueError: Unsupported nprocs (2). Please use
    nprocs=1 or None (default)...``: on PJRT the process count is not the caller's.
``processes``
    Two processes started with the variables torchrun and xmp.spawn give their workers
    (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``PJRT_LOCAL_PROCESS_RANK``, ``PJRT_LOCAL_PROCESS_COUNT``, ``MASTER_ADDR``,
    ``MASTER_PORT``; ``torchrun --nproc-per-node 2`` behaves the same). Each process
    reports ``xr.world_size() == 1`` and ``xr.process_count() == 1``, and the
    all-reduce returns the process's own value (1.0 and 2.0): the CPU client is
    created from ``CPU_NUM_DEVICES`` alone, with no distributed runtime (coordinator,
    key-value store, cross-process collectives), so every process is a world of its
    own. ``torch.distributed`` with the ``xla`` backend and ``init_method="xla://"``
    follows: both processes become rank 0 of 1, and both try to host the TCPStore
    (the second fails with EADDRINUSE).
``threads``
    One process with ``CPU_NUM_DEVICES=2`` and ``xmp.spawn(fn)`` (what xmp.spawn does
    on CPU: one process, one thread per device). Each thread compiles the graph for
    its own device, the two executables give the all-reduce different op ids, and
    XLA's in-process rendezvous never completes::

        E external/xla/xla/service/rendezvous.cc:100] ... waiting for `all reduce
        RendezvousKey{run_id=RunId: 0, global_devices=[0,1], num_local_participants=2,
        collective_op_kind=cross_replica, op_id=1}` for 5 seconds and may be stuck.
        F external/xla/xla/service/rendezvous.cc:127] ... Termination timeout for
        `all reduce RendezvousKey{... op_id=0}` of 10 seconds exceeded. Exiting to
        ensure a consistent program state.

    The process aborts; xmp.spawn's pool raises ``BrokenProcessPool: A process in the
    process pool was terminated abruptly``. ``PJRT_CPU_ASYNC_CLIENT=0`` and the fork
    start method change nothing.

Upstream: pytorch/xla issues #5005 ("Collective operations not working when using
multiple CPUs", closed as a duplicate) and #9089 ("Error on collective operations when
using XLA:CPU", open).
"""

from __future__ import annotations

import os
import subprocess
import sys

TIMEOUT_S = 240
SCENARIOS = ("spawn-nprocs", "processes", "threads")


def _reduce_and_print(index: int) -> None:
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    rank = int(os.environ.get("RANK", index))
    value = torch.tensor([float(rank + 1)]).to(torch_xla.device())
    total = xm.all_reduce(xm.REDUCE_SUM, value)
    torch_xla.sync()
    print(f"rank {rank}: world_size={xr.world_size()} process_count={xr.process_count()} "
          f"sum={total.cpu().item()}", flush=True)


def _child(scenario: str) -> None:
    import torch_xla.distributed.xla_multiprocessing as xmp

    if scenario == "processes":
        _reduce_and_print(int(os.environ["RANK"]))
    elif scenario == "spawn-nprocs":
        xmp.spawn(_reduce_and_print, nprocs=2)
    else:
        xmp.spawn(_reduce_and_print)


def _run(scenario: str) -> bool:
    """Run one scenario in child processes; whether it summed correctly."""
    base = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, os.path.abspath(__file__), "--child", scenario]
    if scenario == "processes":
        envs = [{**base, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r),
                 "LOCAL_WORLD_SIZE": "2", "PJRT_LOCAL_PROCESS_RANK": str(r),
                 "PJRT_LOCAL_PROCESS_COUNT": "2", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29531", "CPU_NUM_DEVICES": "1"} for r in (0, 1)]
    else:
        envs = [{**base, "CPU_NUM_DEVICES": "2"}]
    children = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for env in envs]
    output = ""
    for child in children:
        try:
            output += child.communicate(timeout=TIMEOUT_S)[0]
        except subprocess.TimeoutExpired:
            child.kill()
            output += child.communicate()[0] + f"\n(killed after {TIMEOUT_S}s)\n"
    lines = [line for line in output.splitlines()
             if line.startswith(("rank ", "ValueError", "concurrent.futures",
                                 "(killed"))
             or "rendezvous.cc" in line]
    sums = [line for line in lines if line.startswith("rank ")]
    ok = len(sums) == 2 and all(line.endswith("sum=3.0") for line in sums)
    print(f"== {scenario}: {'works' if ok else 'FAILS'}")
    for line in lines:
        print(f"   {line[:400]}")
    return ok


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        _child(argv[1])
        return 0
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch
    import torch_xla

    print(f"torch {torch.__version__}, torch_xla {torch_xla.__version__}")
    chosen = argv or list(SCENARIOS)
    results = [_run(name) for name in chosen]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
