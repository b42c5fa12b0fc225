"""A real multi-node Ray cluster on this host: a head without CPUs and two raylets of
two CPUs each (Ray's own ``ray.cluster_utils.Cluster``), started once per session."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """The cluster's address; this process is connected to it."""
    ray = pytest.importorskip("ray", reason="the cluster tests need ray installed")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        # the actors import the functions they run (tests/ranks.py) by name
        ray.init(address=cluster.address, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent)}})
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
