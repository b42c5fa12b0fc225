"""Run a command against a Ray cluster of several raylets started on this host.

    python integrations/ray/tools/with_cluster.py --nodes 2 --cpus 4 -- interlock conformance ...

Starts a head (no CPUs, so no rank lands on it) and ``--nodes`` raylets of ``--cpus``
CPUs each with Ray's own ``ray.cluster_utils.Cluster``, exports its address as
``RAY_ADDRESS`` to the command, and shuts every Ray process down when the command ends
(or this script is interrupted). Exits with the command's status.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2, help="raylets besides the head")
    parser.add_argument("--cpus", type=int, default=4, help="CPUs of each raylet")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if not 1 <= args.nodes <= 16 or not 1 <= args.cpus <= 256:
        parser.error("--nodes must be 1..16 and --cpus 1..256")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.cpus)
        cluster.wait_for_nodes()
        print(f"with_cluster: {args.nodes} raylet(s) of {args.cpus} CPUs at {cluster.address}",
              flush=True)
        child = subprocess.Popen(command, env={**os.environ, "RAY_ADDRESS": cluster.address})
        return child.wait()
    finally:
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
        cluster.shutdown()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
