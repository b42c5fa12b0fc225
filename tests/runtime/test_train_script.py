"""examples/train.py run as a user runs it: every launcher, resume, failures, signals.

The script launcher (strategy 'ddp') re-runs the main script, so it can only be tested
through a real script in a real subprocess; every run has a timeout and the tests
check by command line that no process of a run survives it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def trained(tmp_path: Path, name: str, *args: str) -> dict[str, torch.Tensor]:
    out = tmp_path / f"{name}.pt"
    proc = run(*args, "--output", str(out))
    assert proc.returncode == 0, f"train.py {' '.join(args)} failed:\n{proc.stderr[-3000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["steps"] > 0
    params: dict[str, torch.Tensor] = torch.load(out, weights_only=True)
    return params


def processes_mentioning(marker: str) -> list[int]:
    """Live processes whose command line contains ``marker`` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def wait_until_gone(marker: str, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = processes_mentioning(marker)
        if not alive:
            return []
        time.sleep(0.1)
    return processes_mentioning(marker)


def assert_close_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str,
                        **tolerance: float) -> None:
    assert a.keys() == b.keys(), what
    for key in a:
        torch.testing.assert_close(a[key], b[key], msg=_prefix(f"{what} {key}"),
                                   **tolerance)  # type: ignore[arg-type]


def _prefix(what: str) -> Callable[[str], str]:
    return lambda message: f"{what}: {message}"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory
                ) -> Callable[..., dict[str, torch.Tensor]]:
    """The script trained by one process (single_device) with the given arguments,
    each set of arguments trained once for the module: the baseline several tests
    compare with."""
    done: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}

    def train(*args: str) -> dict[str, torch.Tensor]:
        if args not in done:
            done[args] = trained(tmp_path_factory.mktemp("single"), "single",
                                 "--strategy", "single_device", *args)
        return done[args]

    return train


#: model_parallel through the script is in the slow tier: the script launcher is ddp's
#: and fsdp's too, and model_parallel's parity at world size 2 is the conformance suite's
#: training_parity and mesh_tp, which the README's main job runs
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "ddp_fork", "fsdp",
                                      pytest.param("model_parallel", marks=pytest.mark.slow)])
def test_two_ranks_match_one_process(tmp_path: Path, strategy: str,
                                     one_process: Callable[..., dict[str, torch.Tensor]]
                                     ) -> None:
    common = ("--steps", "12", "--batch-size", "16")
    single = one_process(*common)
    double = trained(tmp_path, strategy, "--strategy", strategy, "--devices", "2", *common)
    assert_close_params(double, single, f"{strategy} vs single_device")


#: the script's --precision through to the ranks, loosely against one process: 16-mixed
#: (the grad scaler) in the default tier; the others in the slow tier, since every
#: precision's parity at world size 2 is the conformance suite's training_parity check,
#: which the README's main job runs for every strategy
@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision", [
    pytest.param("bf16-mixed", marks=pytest.mark.slow), "16-mixed",
    pytest.param("64-true", marks=pytest.mark.slow)])
def test_precisions_run_and_match_loosely(tmp_path: Path, precision: str) -> None:
    common = ("--steps", "8", "--precision", precision)
    single = trained(tmp_path, "single", "--strategy", "single_device", *common)
    double = trained(tmp_path, "ddp", "--strategy", "ddp", "--devices", "2", *common)
    assert_close_params(double, single, f"ddp {precision}", rtol=2e-2, atol=2e-3)


@pytest.mark.timeout(300)
def test_resume_continues_exactly(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt" / "last.pt"
    straight = trained(tmp_path, "straight", "--strategy", "ddp", "--devices", "2",
                       "--steps", "10", "--precision", "16-mixed")
    first = run("--strategy", "ddp", "--devices", "2", "--steps", "6", "--precision", "16-mixed",
                "--checkpoint", str(ckpt), "--checkpoint-every", "3")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = trained(tmp_path, "resumed", "--strategy", "ddp", "--devices", "2", "--steps",
                      "10", "--precision", "16-mixed", "--checkpoint", str(ckpt),
                      "--checkpoint-every", "3", "--resume")
    # same samples, same order, optimizer momentum and grad-scaler state restored
    assert_close_params(resumed, straight, "resumed vs straight", rtol=0.0, atol=0.0)


#: model_parallel in the slow tier: its restart resuming bit for bit is the conformance
#: suite's recipe_resume, which the README's main job runs
@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["fsdp", pytest.param("model_parallel",
                                                           marks=pytest.mark.slow)])
def test_sharded_strategies_resume_exactly(tmp_path: Path, strategy: str) -> None:
    ckpt = tmp_path / "ckpt" / "last"
    common = ("--strategy", strategy, "--devices", "2", "--precision", "bf16-mixed")
    straight = trained(tmp_path, "straight", *common, "--steps", "8")
    first = run(*common, "--steps", "4", "--checkpoint", str(ckpt), "--checkpoint-every", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = trained(tmp_path, "resumed", *common, "--steps", "8", "--checkpoint", str(ckpt),
                      "--checkpoint-every", "2", "--resume")
    assert_close_params(resumed, straight, f"{strategy} resumed vs straight", rtol=0.0,
                        atol=0.0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_a_failing_rank_ends_the_job_and_is_named(tmp_path: Path, strategy: str) -> None:
    """The job ends soon after rank 1 fails, instead of rank 0 waiting in a collective
    for the process group's 30-minute timeout. The budget is the whole job's (start-up
    included: about 10 s idle, 40 s seen on a loaded 2-core machine)."""
    marker = str(tmp_path / "ckpt.pt")
    started = time.monotonic()
    proc = run("--strategy", strategy, "--devices", "2", "--steps", "1000", "--fail-at-step", "3",
               "--fail-rank", "1", "--checkpoint", marker, timeout=240)
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    assert "rank 1 failed" in proc.stderr and "deliberate failure at step 3" in proc.stderr, (
        proc.stderr[-3000:])
    assert elapsed < STARTUP_BUDGET_S, f"the failure took {elapsed:.1f}s to end the job"
    assert wait_until_gone(marker, 5) == [], "processes of the failed job survived it"


#: Seconds a job may take to reach a point on a busy machine (each process imports torch).
STARTUP_BUDGET_S = 120.0
#: Seconds within which a signalled job must have exited (about 5 on an idle machine; a
#: job that misses a signal waits for its process group's timeout instead).
EXIT_BUDGET_S = 60.0


def _default_sigint() -> None:
    """SIGINT as a user at a terminal has it. A test run started in the background of a
    non-interactive shell (``cmd &``) inherits SIGINT ignored, and Python then installs
    no KeyboardInterrupt handler: the job would rightly keep ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Job:
    """examples/train.py started in the background, its stderr in a file."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.marker = str(tmp_path / "ckpt.pt")  # on every rank's command line
        self.ready = tmp_path / "ready"
        self.stderr_path = tmp_path / "stderr.txt"
        with self.stderr_path.open("w") as stderr:  # a file: a full pipe would block ranks
            self.proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), "--devices", "2", "--steps", "100000000",
                 "--checkpoint", self.marker, "--ready-file", str(self.ready), *args],
                stdout=subprocess.DEVNULL, stderr=stderr, text=True,
                preexec_fn=_default_sigint,
            )

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def await_(self, what: str, reached: Callable[[], bool]) -> None:
        """Wait (at most STARTUP_BUDGET_S) until ``reached()``, failing if the job ends."""
        deadline = time.monotonic() + STARTUP_BUDGET_S
        while not reached():
            assert self.proc.poll() is None, (
                f"the job exited ({self.proc.returncode}) before {what}:\n{self.stderr()[-3000:]}")
            assert time.monotonic() < deadline, (
                f"the job did not reach {what} in {STARTUP_BUDGET_S:.0f}s:\n"
                f"{self.stderr()[-3000:]}")
            time.sleep(0.1)

    def training(self, ranks: int = 2) -> bool:
        return all(Path(f"{self.ready}.rank{r}").exists() for r in range(ranks))

    def signal_and_wait(self, signum: signal.Signals) -> int:
        """Send ``signum`` to the parent alone (not its process group); its exit code."""
        sent = time.monotonic()
        self.proc.send_signal(signum)
        try:
            code = self.proc.wait(timeout=EXIT_BUDGET_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the parent did not exit within {EXIT_BUDGET_S:.0f}s of "
                        f"{signum.name}:\n{self.stderr()[-3000:]}")
        took = time.monotonic() - sent
        assert code != 0, f"exit code 0 after {signum.name}:\n{self.stderr()[-3000:]}"
        assert wait_until_gone(self.marker, 30) == [], (
            f"ranks survived {signum.name} to their parent (which exited in {took:.1f}s)")
        return code

    def end(self) -> None:
        """Leave nothing behind, whatever happened."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in processes_mentioning(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


SIGNALS = pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT],
                                  ids=["SIGTERM", "SIGINT"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_fork"])
@SIGNALS
def test_a_signal_to_the_parent_reaches_every_rank(
    tmp_path: Path, strategy: str, signum: signal.Signals
) -> None:
    job = Job(tmp_path, "--strategy", strategy)
    try:
        job.await_("the training loop on both ranks", job.training)
        job.signal_and_wait(signum)
    finally:
        job.end()


@pytest.mark.timeout(300)
@SIGNALS
def test_a_signal_while_a_rank_is_starting_ends_the_job(
    tmp_path: Path, signum: signal.Signals
) -> None:
    # Rank 1 never connects, as if it were still importing torch: rank 0 waits for it,
    # and must still act on the signal at once (not after the process group's timeout).
    job = Job(tmp_path, "--strategy", "ddp", "--hang-before-setup-rank", "1",
              "--pg-timeout", "600")
    try:
        job.await_("rank 1's start", lambda: "rank 1 hangs before setup" in job.stderr())
        job.signal_and_wait(signum)
    finally:
        job.end()


@pytest.mark.timeout(300)
def test_sigint_while_rank_zero_waits_in_a_collective_ends_the_job(tmp_path: Path) -> None:
    # Rank 0 (the parent) blocks in C++ in a collective that rank 1 never joins, where
    # Python runs no signal handler; the launcher stops the other ranks to free it.
    job = Job(tmp_path, "--strategy", "ddp", "--hang-at-step", "3", "--hang-rank", "1",
              "--pg-timeout", "600")
    try:
        job.await_("rank 1's hang", lambda: "rank 1 hangs at step 3" in job.stderr())
        job.signal_and_wait(signal.SIGINT)
        assert "RankFailedError" not in job.stderr(), job.stderr()[-3000:]
    finally:
        job.end()


def test_an_impossible_request_exits_2_without_traceback() -> None:
    proc = run("--strategy", "fsdp_cpu_offload", timeout=60)  # cuda only
    assert proc.returncode == 2
    assert "[unsupported-accelerator]" in proc.stderr and "Traceback" not in proc.stderr


TWO_LAUNCHES = """
import sys
import interlock

def where(strategy, tag):
    return [tag, strategy.world_size, strategy.collective.all_gather_object(strategy.global_rank)]

if __name__ == "__main__":
    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp")
    first = strategy.launch(where, "fit")
    second = strategy.launch(where, "test")
    if strategy.is_global_zero:
        print(first, second)
"""


@pytest.mark.timeout(120)
def test_the_script_launcher_serves_several_launches(tmp_path: Path) -> None:
    script = tmp_path / "two_launches.py"
    script.write_text(TWO_LAUNCHES)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=100, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "['fit', 2, [0, 1]] ['test', 2, [0, 1]]"


HAND_BUILT = """
import interlock
from interlock.strategies.ddp import DDPStrategy

def where(strategy):
    return [strategy.world_size, type(strategy.accelerator).__name__,
            type(strategy.cluster_environment).__name__,
            strategy.collective.all_gather_object(strategy.global_rank)]

if __name__ == "__main__":
    strategy = DDPStrategy(parallel_devices=["cpu", "cpu"])
    result = strategy.launch(where)
    if strategy.is_global_zero:
        print(result, strategy.plan.launcher, strategy.plan.strategy)
"""


@pytest.mark.timeout(120)
def test_a_strategy_built_by_hand_plans_itself_and_runs_under_the_script_launcher(
        tmp_path: Path) -> None:
    """No resolve(): the strategy completes itself through the engine on first use, in
    the script and again in each rank the script launcher starts."""
    script = tmp_path / "hand_built.py"
    script.write_text(HAND_BUILT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=100, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == \
        "[2, 'CPUAccelerator', 'LocalEnvironment', [0, 1]] subprocess ddp"


CAUGHT_FAILURE = """
import os
import sys
import interlock

def work(strategy, fail):
    if fail and strategy.global_rank == 1:
        raise RuntimeError("rank 1 breaks on purpose")
    return strategy.collective.all_gather_object(strategy.global_rank)

def note(line):
    with open(sys.argv[1], "a") as out:
        out.write(f"{os.getpid()} {line}\\n")

if __name__ == "__main__":
    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp")
    try:
        strategy.launch(work, True)
    except Exception as error:
        note(f"caught {type(error).__name__} rank={getattr(error, 'rank', None)}")
    note(f"second launch returned {strategy.launch(work, False)}")
"""


@pytest.mark.timeout(120)
def test_a_rank_whose_launch_failed_goes_no_further_in_the_script(tmp_path: Path) -> None:
    """A script that catches a failed launch and goes on: only rank 0 goes on. The
    re-run script of the failing rank must not return into the script as if it were
    rank 0 (it would run rank 0's code, and meet the next launch as a stray)."""
    script = tmp_path / "caught_failure.py"
    script.write_text(CAUGHT_FAILURE)
    log = tmp_path / "log.txt"
    proc = subprocess.Popen([sys.executable, str(script), str(log)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=100)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "rank 1 breaks on purpose" in stderr  # the failing rank's traceback is shown
    assert "ran past its launch" not in stderr
    lines = [line.split(" ", 1) for line in log.read_text().splitlines()]
    # rank 0 (this script's process) catches the failure naming rank 1 and launches
    # again; the second launch's rank 1 replays the first launch's outcome (the same
    # failure, so it takes the same path) and runs the second launch only
    by_rank_zero = [what for pid, what in lines if pid == str(proc.pid)]
    assert by_rank_zero == ["caught RankFailedError rank=1",
                            "second launch returned [0, 1]"], lines
    others = [what for pid, what in lines if pid != str(proc.pid)]
    assert others == ["caught RankFailedError rank=1"], lines


RANK_ZERO_AWAY = """
import sys
import threading
import time
import interlock
from interlock.strategies.launchers import subprocess_script

subprocess_script.FAILURE_GRACE_S = 5.0

def work(strategy, where):
    if strategy.global_rank == 1:
        time.sleep(1.0)  # rank 0 is in its loop or its sleep by now
        if where == "exit":
            # not a daemon: this interpreter's shutdown waits for it, so rank 1
            # records its failure but never exits
            threading.Thread(target=time.sleep, args=(600,)).start()
        raise RuntimeError("rank 1 breaks on purpose")
    if where == "native":
        time.sleep(3600)  # one call into C that no exception can enter until it returns
    while True:
        time.sleep(0.05)  # Python code: an interrupt lands between two sleeps

if __name__ == "__main__":
    strategy = interlock.resolve(accelerator="cpu", devices=2, strategy="ddp")
    strategy.launch(work, sys.argv[1])
"""


def _sigint_ignored() -> None:
    """What ``nohup`` or ``cmd &`` in a script gives a job: SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["python", "native", "exit"])
def test_a_failed_child_ends_the_job_wherever_rank_zero_is(tmp_path: Path, where: str) -> None:
    """Rank 0 is interrupted when rank 1 fails even where SIGINT is ignored; where
    rank 0 is blocked in native code, which no interrupt reaches, the launcher ends the
    job after its grace, naming the failure and showing where rank 0 was stuck; and a
    failed rank that never exits is killed once it recorded its failure."""
    script = tmp_path / "rank_zero_away.py"
    script.write_text(RANK_ZERO_AWAY)
    proc = subprocess.Popen([sys.executable, str(script), where], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_ignored)
    try:
        _, stderr = proc.communicate(timeout=100)
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    assert "rank 1 failed" in stderr and "rank 1 breaks on purpose" in stderr, stderr[-3000:]
    blocked = "rank 0 is still blocked 5s after rank 1 failed"
    if where == "native":
        assert blocked in stderr, stderr[-3000:]
        assert "in work" in stderr  # the stack shows the user's function that blocks
    else:
        stuck = "rank 1 recorded its failure 2s ago and has not exited"
        assert (stuck in stderr) == (where == "exit"), stderr[-3000:]
        assert blocked not in stderr, stderr[-3000:]
        assert "RankFailedError" in stderr  # rank 0's own exception, raised as usual
    assert wait_until_gone(str(script), 5) == [], "processes of the failed job survived it"


def test_the_script_launcher_rebuilds_the_command_line(tmp_path: Path) -> None:
    package = tmp_path / "ilkapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    show = (
        "import json\n"
        "from interlock.strategies.launchers.subprocess_script import script_command\n"
        "print(json.dumps(script_command()))\n"
    )
    (package / "__main__.py").write_text(show)
    (tmp_path / "script.py").write_text(show)
    as_module = subprocess.run([sys.executable, "-m", "ilkapp", "--lr", "0.1"], cwd=tmp_path,
                               capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(as_module.stdout) == [sys.executable, "-m", "ilkapp", "--lr", "0.1"]
    as_file = subprocess.run([sys.executable, "script.py", "x"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(as_file.stdout) == [sys.executable, str(tmp_path / "script.py"), "x"]
    interactive = subprocess.run(
        [sys.executable, "-c", show], capture_output=True, text=True, timeout=60, check=False)
    assert interactive.returncode != 0 and "use strategy='ddp_notebook'" in interactive.stderr
