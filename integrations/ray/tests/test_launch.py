"""Launches on a real Ray cluster of two raylets on this host: where the ranks are,
parity with one plain PyTorch process, failures named, restarts, nothing left behind."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import ranks
import torch
from interlock_ray.environment import RayEnvironment

import interlock
from interlock import Machine
from interlock.strategies.launchers import LaunchError, RankFailedError

ray = pytest.importorskip("ray", reason="the cluster tests need ray installed")

pytestmark = pytest.mark.usefixtures("ray_cluster")

MACHINE = Machine(packages=frozenset({"ray"}))


def strategy(name: str = "ray_ddp", devices: int = 1, num_nodes: int = 2,
             **env: Any) -> Any:
    plugins = [RayEnvironment(**env)] if env else None
    return interlock.resolve(strategy=name, accelerator="cpu", devices=devices,
                             num_nodes=num_nodes, plugins=plugins, machine=MACHINE)


def groups_left() -> list[str]:
    from ray.util import placement_group_table

    return [k for k, v in placement_group_table().items() if v["state"] != "REMOVED"]


def alive(pid_dir: Path) -> list[int]:
    found = []
    for file in pid_dir.glob("*.pid"):
        pid = int(file.read_text())
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            continue
        found.append(pid)
    return found


def assert_nothing_left(pid_dir: Path) -> None:
    assert list(pid_dir.glob("*.pid")), "the ranks recorded no pid"
    assert alive(pid_dir) == [], "rank actors still running after launch() returned"
    assert groups_left() == [], "placement groups left after launch() returned"


@pytest.mark.timeout(180)
def test_ranks_learn_their_place_from_ray_two_per_node_on_two_nodes(tmp_path: Path) -> None:
    gathered = strategy(devices=2, num_nodes=2).launch(ranks.places, str(tmp_path))
    assert [g["rank"] for g in gathered] == [0, 1, 2, 3]
    assert [g["torch_rank"] for g in gathered] == [0, 1, 2, 3]
    assert [(g["node"], g["local"]) for g in gathered] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {(g["world"], g["torch_world"], g["nodes"], g["env"]) for g in gathered} == {
        (4, 4, 2, "ray")}
    # the two ranks of a node share a Ray node; the two nodes are different raylets
    assert gathered[0]["ray_node"] == gathered[1]["ray_node"]
    assert gathered[2]["ray_node"] == gathered[3]["ray_node"]
    assert gathered[0]["ray_node"] != gathered[2]["ray_node"]
    assert len({g["pid"] for g in gathered}) == 4
    assert_nothing_left(tmp_path)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["ray_ddp", "ray_fsdp"])
def test_two_ranks_on_two_nodes_train_like_one_plain_process(name: str) -> None:
    result = strategy(name, devices=1, num_nodes=2).launch(ranks.train, 4)
    expected = ranks.baseline(4)
    assert set(result) == set(expected)
    for key, value in expected.items():
        torch.testing.assert_close(result[key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert groups_left() == []


@pytest.mark.timeout(180)
def test_a_rank_that_raises_is_named_and_every_actor_is_stopped(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        strategy(devices=2, num_nodes=1).launch(ranks.fail_on, 1, str(tmp_path))
    assert caught.value.rank == 1
    assert "planned failure on rank 1" in caught.value.detail
    assert time.monotonic() - start < 60, "the failure took the collective timeout to show"
    assert_nothing_left(tmp_path)


@pytest.mark.timeout(180)
def test_a_rank_killed_by_a_signal_is_named_not_the_peer_it_strands(tmp_path: Path) -> None:
    with pytest.raises(RankFailedError) as caught:
        strategy(devices=1, num_nodes=2).launch(ranks.die_on, 1, str(tmp_path))
    assert caught.value.rank == 1, caught.value.detail
    assert_nothing_left(tmp_path)


@pytest.mark.timeout(240)
def test_max_restarts_starts_new_actors_after_a_rank_dies(tmp_path: Path) -> None:
    marker = tmp_path / "died"
    result = strategy(devices=1, num_nodes=2).launch(ranks.die_once, str(marker),
                                                      max_restarts=1)
    assert marker.exists(), "rank 1 never died: the restart was not exercised"
    assert result == {"attempt": 1, "world": 2}
    assert groups_left() == []


@pytest.mark.timeout(120)
def test_a_job_the_cluster_cannot_hold_is_refused_with_what_it_has() -> None:
    # 3 ranks of 2 CPUs on one node: no raylet has 6 CPUs
    job = strategy(devices=3, num_nodes=1, cpus_per_rank=2, placement_timeout=3)
    # it could never fit: said at once, before the timeout runs out
    with pytest.raises(LaunchError) as caught, pytest.warns(
            RuntimeWarning, match="cannot place the job on the cluster as it is"):
        job.launch(ranks.places, "/nonexistent")
    text = str(caught.value)
    assert "1 bundle(s) of CPU 6" in text and "alive node(s)" in text
    assert groups_left() == []
    # three nodes do not exist either: STRICT_SPREAD cannot place them
    job = strategy(devices=1, num_nodes=3, placement_timeout=3)
    with pytest.raises(LaunchError, match="on 3 different nodes"), pytest.warns(
            RuntimeWarning, match="waiting up to 3 s for it to grow"):
        job.launch(ranks.places, "/nonexistent")
    assert groups_left() == []


@pytest.mark.timeout(180)
def test_a_second_launch_reuses_the_connection_and_rank_zeros_result_comes_back(
        tmp_path: Path) -> None:
    job = strategy(devices=1, num_nodes=2)
    first = job.launch(ranks.places, str(tmp_path))
    second = job.launch(ranks.places, str(tmp_path))
    assert [g["rank"] for g in first] == [g["rank"] for g in second] == [0, 1]
    assert {g["pid"] for g in first}.isdisjoint(g["pid"] for g in second)
    assert_nothing_left(tmp_path)


@pytest.mark.timeout(180)
def test_a_fresh_process_connects_to_the_cluster_its_environment_names(
        ray_cluster: str, tmp_path: Path) -> None:
    """Not connected yet: RayEnvironment(address=...) picks the cluster; the ranks land on
    its raylets and the caller's environment is left as it was."""
    import subprocess
    import sys

    script = tmp_path / "driver.py"
    script.write_text(f"""
import json, os, sys
import interlock, ray
from interlock_ray import RayEnvironment

def where(strategy):
    return ray.get_runtime_context().get_node_id()

before = dict(os.environ)
env = RayEnvironment(address={ray_cluster!r})
strategy = interlock.resolve(strategy="ray_ddp", accelerator="cpu", devices=1, num_nodes=2,
                             plugins=[env])
node = strategy.launch(where)
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps({{"node": node, "changed": changed}}))
""")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=150, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    out = json.loads(done.stdout.strip().splitlines()[-1])
    cluster_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert out["node"] in cluster_nodes, "rank 0 did not run on the named cluster"
    assert out["changed"] == [], f"launch changed the caller's environment: {out['changed']}"


@pytest.mark.timeout(180)
def test_a_local_instance_grows_for_a_larger_job_and_leaves_the_environment_alone(
        tmp_path: Path) -> None:
    """No address anywhere (docs/ray.md's laptop path): the local instance started for
    a 2-rank job is replaced by one large enough for the 4-rank job after it, and no
    launch leaves a variable of Ray's in the caller's environment."""
    import json
    import subprocess
    import sys

    script = tmp_path / "laptop.py"
    script.write_text("""
import json, os
import interlock

def world(strategy):
    return strategy.world_size

before = dict(os.environ)
out = {}
for devices in (2, 4):
    strategy = interlock.resolve(strategy="ray_ddp", accelerator="cpu", devices=devices)
    out[devices] = strategy.launch(world)
    out[f"changed {devices}"] = sorted(
        k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps(out))
""")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=170, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["2"], out["4"]) == (2, 4), out
    assert out["changed 2"] == out["changed 4"] == [], out


@pytest.mark.timeout(120)
def test_arguments_that_do_not_pickle_are_refused_before_any_rank_runs() -> None:
    import threading

    with pytest.raises(LaunchError, match="must pickle"):
        strategy(devices=1, num_nodes=1).launch(ranks.places, threading.Lock())
    assert groups_left() == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_driver_stopped_by_a_signal_kills_its_actors_first(
        ray_cluster: str, tmp_path: Path, signum: str) -> None:
    import signal
    import subprocess
    import sys

    script = tmp_path / "driver.py"
    # SIGINT as a user at a terminal has it: a test run started in the background of a
    # non-interactive shell (``cmd &``) passes SIGINT on ignored, and the driver would
    # rightly go on ignoring it
    script.write_text(f"""
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
import interlock, ranks
from interlock_ray import RayEnvironment

env = RayEnvironment(address={ray_cluster!r}, init_options={{
    "runtime_env": {{"env_vars": {{"PYTHONPATH": {str(Path(__file__).parent)!r}}}}}}})
strategy = interlock.resolve(strategy="ray_ddp", accelerator="cpu", devices=1, num_nodes=2,
                             plugins=[env])
strategy.launch(ranks.sleep_forever, {str(tmp_path)!r})
""")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(Path(__file__).parent)
    # the driver's output goes to a file, not a pipe: Ray forwards the actors' logs to
    # the driver's stderr, and a pipe nobody reads would block the driver once full
    log = tmp_path / "driver.log"

    def tail() -> str:
        return log.read_text(errors="replace")[-3000:]

    with log.open("wb") as sink:
        driver = subprocess.Popen([sys.executable, str(script)], env=env,
                                  stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("*.pid"))) < 2:
            assert driver.poll() is None, tail()
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.2)
        driver.send_signal(getattr(signal, signum))
        try:
            code = driver.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the driver did not exit within 60 s of {signum}:\n{tail()}")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert code != 0
    deadline = time.monotonic() + 30
    while alive(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(tmp_path) == [], "rank actors outlived the driver"
    assert groups_left() == []
