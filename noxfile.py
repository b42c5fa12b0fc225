"""Development sessions: tests, typecheck, lint, docs, apidocs, package, bench, cluster, soak.

The torch requirement comes from INTERLOCK_TORCH (default ``torch==2.13.0``, a CPU
build on machines that carry it locally); set it to test against another release.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox
from nox.virtualenv import PassthroughEnv

nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests", "typecheck"]

TORCH = os.environ.get("INTERLOCK_TORCH", "torch==2.13.0")
#: the Ray the ray session (and ``bench -- ray``) installs; INTERLOCK_RAY overrides it
RAY = os.environ.get("INTERLOCK_RAY", "ray>=2.10")
# None: the interpreter nox itself runs on
PYTHON = os.environ.get("INTERLOCK_PYTHON") or None


def _install(session: nox.Session, extra: str) -> None:
    if isinstance(session.virtualenv, PassthroughEnv):
        # `nox --no-venv`: the calling environment runs the session and must already
        # hold the extra (CI's .venv has `dev`, which includes `test`); it saves a
        # fresh environment per session
        return
    # torch first and pinned, so that nothing pulls an unpinned (CUDA, multi-GB) build
    session.install(TORCH)
    session.install("-e", f".[{extra}]", TORCH)


def _test_workers() -> str:
    """pytest-xdist's ``-n`` for the test tiers: ``INTERLOCK_TEST_WORKERS``, else one
    worker per core."""
    return os.environ.get("INTERLOCK_TEST_WORKERS", "auto")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The test suite, in parallel, under typeguard's import hook for interlock.

    ``--dist loadfile`` keeps each file on one worker: a module-scoped fixture (a run
    of the suite, up to minutes) then runs once, not once per worker that got one of
    its tests."""
    _install(session, "test")
    session.run(
        "pytest", "-n", _test_workers(), "--dist", "loadfile",
        "--typeguard-packages=interlock", *session.posargs
    )


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, the tests and this file."""
    _install(session, "dev")
    session.run("mypy", "--strict", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over the package and the tests."""
    session.install("ruff")
    session.run("ruff", "check", "src", "tests", "noxfile.py", "tools", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Regenerate docs/rules.md from the engine's tables."""
    _install(session, "test")
    session.run("python", "-m", "interlock.engine.docs")


@nox.session(python=PYTHON)
def apidocs(session: nox.Session) -> None:
    """The API reference (Sphinx autodoc over the docstrings) into docs/api/_build/html.

    Built from scratch (-E) with every warning an error, so a docstring that does not
    render fails it.
    """
    _install(session, "docs")
    session.run("sphinx-build", "-E", "-W", "--keep-going", "-b", "html", "docs/api",
                "docs/api/_build/html", *session.posargs)


@nox.session(python=PYTHON)
def matrix(session: nox.Session) -> None:
    """Check matrix.lock against the engine; ``-- --update`` rewrites it and regenerates
    docs/rules.md, docs/memory-fits.md and the compatibility pages."""
    _install(session, "test")
    session.run("python", "-m", "interlock.matrix.lock", *session.posargs)
    if "--update" in session.posargs:
        session.run("python", "-m", "interlock.engine.docs")
        session.run("python", "-m", "interlock.matrix.fits")
        session.run("python", "-m", "interlock.matrix.compat")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Side-by-side measurements: plan() latency and import cost vs Lightning's
    connector; DDP step time, launch latency and resolve() vs raw torch and Fabric;
    blocking against asynchronous checkpoint saves; an FSDP x TP step vs raw torch.

    Lightning lives only in this session's environment, never in interlock's
    dependencies. ``nox -s bench -- plan ARGS`` (or ``runtime``, ``fsdp``,
    ``checkpoint``, ``parallelism``) runs one script with its own arguments; without
    arguments those five run with their defaults. ``-- cold-plan --before REV``
    compares cold plan() with a revision; ``-- ray`` installs the Ray integration and
    compares its launcher with interlock's fork and spawn launchers.
    """
    session.install(TORCH)
    session.install("-r", "benchmarks/requirements.txt", TORCH)
    session.install("-e", ".", TORCH)
    which, *rest = session.posargs or [""]
    if which in ("", "plan"):
        session.run("python", "benchmarks/bench_plan.py", *rest)
    if which in ("", "runtime"):
        session.run("python", "benchmarks/bench_runtime.py", *rest)
    if which in ("", "fsdp"):
        session.run("python", "benchmarks/bench_fsdp.py", *rest)
    if which in ("", "checkpoint"):
        session.run("python", "benchmarks/bench_checkpoint.py", *rest)
    if which in ("", "parallelism"):
        session.run("python", "benchmarks/bench_parallelism.py", *rest)
    if which == "cold-plan":  # needs --before REV: not part of the default run
        session.run("python", "benchmarks/bench_cold_plan.py", *rest)
    if which == "ray":  # installs ray and the integration: not part of the default run
        session.install("-e", "integrations/ray", RAY, TORCH)
        session.run("python", "benchmarks/bench_ray.py", *rest)
    if which not in ("", "plan", "runtime", "fsdp", "checkpoint", "parallelism",
                     "cold-plan", "ray"):
        session.error(f"unknown benchmark {which!r}: use 'plan', 'runtime', 'fsdp', "
                      "'checkpoint', 'parallelism', 'cold-plan' or 'ray'")


def _regenerate_pages(session: nox.Session) -> None:
    """The compatibility pages cite every report's date and verdicts: a session that
    writes a report rewrites them at once, so a committed report never leaves them stale."""
    session.run("python", "-m", "interlock.matrix.compat")


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """The conformance suite for every registered strategy on every runner this machine
    has, with the example third-party packages (a strategy, a precision) installed;
    writes docs/conformance-report.json and regenerates the compatibility pages that read
    it. Arguments after -- go to ``interlock conformance``."""
    _install(session, "test")
    session.install("--no-deps", "-e", "examples/plugin")
    session.install("--no-deps", "-e", "examples/precision")
    session.run("interlock", "conformance", "--strategy", "all", "--workers", "2",
                "--report", "docs/conformance-report.json", *session.posargs)
    _regenerate_pages(session)


@nox.session(python=PYTHON)
def package(session: nox.Session) -> None:
    """The distributions as a user gets them: build the sdist and the wheel, check what
    they hold (tools/check_dist.py: no tests or junk, py.typed, the license files, the
    sdist rebuilding the same wheel byte for byte), then install the wheel into a clean
    environment and, from an empty folder outside the checkout, plan, refuse the suite
    without its extra (one line, exit 2), check the committed matrix.lock against the
    installed engine, install the extra and the example strategy package
    (examples/plugin), run the suite for the strategies given after -- (default
    single_device and that package's ddp_fp16_compress), and write and compare a
    report."""
    import tempfile

    session.install("build")
    dist = Path(session.create_tmp()) / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--wheel", "--outdir", str(dist / "tree"))
    # without --wheel/--sdist: the sdist, then a wheel built from that sdist
    session.run("python", "-m", "build", "--outdir", str(dist / "sdist"))
    (wheel,) = (dist / "tree").glob("*.whl")
    (sdist,) = (dist / "sdist").glob("*.tar.gz")
    (rebuilt,) = (dist / "sdist").glob("*.whl")
    session.run("python", "tools/check_dist.py", "--wheel", str(wheel), "--sdist", str(sdist),
                "--rebuilt", str(rebuilt))

    # single_device, and a third-party strategy from its own package against the wheel
    strategies = session.posargs or ["single_device", "ddp_fp16_compress"]
    lock = Path("matrix.lock").absolute()
    with tempfile.TemporaryDirectory(prefix="interlock-wheel-") as empty:
        env = Path(empty) / "env"
        session.run(sys.executable, "-m", "venv", str(env), external=True)
        pip, interlock = str(env / "bin" / "pip"), str(env / "bin" / "interlock")
        session.run(pip, "install", "-q", TORCH, external=True)
        session.run(pip, "install", "-q", str(wheel), TORCH, external=True)
        work = Path(empty) / "work"
        work.mkdir()
        with session.chdir(work):
            session.run(interlock, "plan", "--simulate", "cuda=8", "--devices", "-1",
                        "--strategy", "fsdp", "--precision", "bf16-mixed", external=True)
            session.run(interlock, "matrix", "--diff", str(lock), external=True)
            refused = session.run(interlock, "conformance", "--strategy", strategies[0],
                                  external=True, success_codes=[2], silent=True)
            if "interlock[conformance]" not in str(refused):
                session.error(f"without pytest the suite must name its extra; said: "
                              f"{refused!r}")
        session.run(pip, "install", "-q", f"{wheel}[conformance]", TORCH, external=True)
        session.run(pip, "install", "-q", "--no-deps", "examples/plugin", external=True)
        with session.chdir(work):
            chosen = [arg for name in strategies for arg in ("--strategy", name)]
            session.run(interlock, "conformance", *chosen, "--workers", "2",
                        "--report", "report.json", external=True)
            session.run(interlock, "conformance", "--compare", "report.json", "report.json",
                        external=True)


#: torch_xla wheels exist only for its own torch releases (2.9.0 at the time of
#: writing), so the xla session has its own torch; a CUDA build from PyPI, about 7 GB
XLA_PACKAGES = os.environ.get("INTERLOCK_XLA", "torch==2.9.0 torch_xla==2.9.0").split()


@nox.session(python=PYTHON)
def xla(session: nox.Session) -> None:
    """The XLA strategies on torch_xla's CPU PJRT device (no TPU needed): real training
    through single_xla and xla_fsdp, every XLA unit test, then the conformance suite for
    single_xla, xla and xla_fsdp on the tpu runner, written to
    docs/conformance-report-xla.json. Not part of CI: its environment is several GB;
    ``INTERLOCK_XLA`` overrides the torch/torch_xla pins.

    The CPU PJRT device runs one rank only: torch_xla's CPU client has no collective
    across devices (tools/xla_cpu_multiprocess_repro.py), so the suite's world size 2
    cases are skipped there and run on a TPU host.
    """
    session.install(*XLA_PACKAGES)
    session.install("--no-deps", "-e", ".")
    session.install("numpy", "tabulate", "typeguard>=4.2", "pytest", "pytest-timeout",
                    "pytest-xdist", "hypothesis")
    session.run("pytest", "tests/runtime/test_deepspeed_and_xla.py",
                "--typeguard-packages=interlock", *session.posargs,
                env={"PJRT_DEVICE": "CPU"})
    session.run("interlock", "conformance", "--strategy", "single_xla", "--strategy", "xla",
                "--strategy", "xla_fsdp", "--runner", "tpu", "--world-sizes", "1,2",
                "--report", "docs/conformance-report-xla.json", env={"PJRT_DEVICE": "CPU"})
    _regenerate_pages(session)


#: the DeepSpeed rows the suite runs on the CPU runner (the NVMe row needs a path on a
#: fast local disk, which the suite cannot choose: tests/runtime trains it instead)
DEEPSPEED_ROWS = ("deepspeed", "deepspeed_stage_1", "deepspeed_stage_1_offload",
                  "deepspeed_stage_2", "deepspeed_stage_2_offload", "deepspeed_stage_3",
                  "deepspeed_stage_3_offload")


def _apt_install(session: nox.Session, *packages: str) -> None:
    """Debian packages, when this is a root shell on Debian (CI); otherwise the tests
    that need them say so when they skip."""
    if os.name == "posix" and os.geteuid() == 0 and shutil.which("apt-get"):
        # install steps: they run under --install-only, and not again under -R
        session.run_install("apt-get", "update", "-qq", external=True)
        session.run_install("apt-get", "install", "-y", "-qq", *packages, external=True)


@nox.session(python=PYTHON)
def deepspeed(session: nox.Session) -> None:
    """DeepSpeed for real on the CPU runner: its runtime tests, then the conformance
    suite for every DeepSpeed row, written to docs/conformance-report-deepspeed.json
    (arguments after -- go to ``interlock conformance``; ``--strategy`` among them
    replaces the rows).

    DeepSpeed is an extra (``interlock[deepspeed]``), never a dependency; its ops build
    on first use (the shared-memory collective, and the asynchronous I/O op for NVMe
    offloading, which needs libaio: installed here on Debian as root). They are built
    as an install step (tools/build_deepspeed_ops.py), so ``--install-only`` prepares
    the session, ops included, and ``-R`` then runs it without building anything.
    """
    chosen = _rows_chosen(session, DEEPSPEED_ROWS, "DeepSpeed")
    _apt_install(session, "libaio-dev")
    session.install(TORCH)
    session.install("-e", ".[test,deepspeed]", TORCH)
    session.run_install("python", "tools/build_deepspeed_ops.py")
    session.run("pytest", "tests/runtime/test_deepspeed_and_xla.py", "-k", "deepspeed",
                "--typeguard-packages=interlock")
    rows = [] if chosen else [arg for row in DEEPSPEED_ROWS for arg in ("--strategy", row)]
    session.run("interlock", "conformance", *rows, "--runner", "cpu", "--workers", "2",
                "--report", "docs/conformance-report-deepspeed.json", *session.posargs)
    _regenerate_pages(session)


#: the torch the GPU session installs: PyPI's build for Linux is a CUDA build
GPU_TORCH = os.environ.get("INTERLOCK_GPU_TORCH", TORCH)
#: optional packages the GPU runner tries; a precision or row whose package did not
#: install is skipped there with the reason
GPU_EXTRAS = ("deepspeed", "transformer_engine[pytorch]")


def _cuda_devices() -> int:
    """How many NVIDIA GPUs ``nvidia-smi`` lists here (0 without the tool)."""
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return 0
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                          timeout=60, check=False)
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines())


@nox.session(python=PYTHON)
def gpu(session: nox.Session) -> None:
    """The CUDA runner in one command, for a machine with NVIDIA GPUs: the conformance
    suite's ``cuda`` runner for every row that declares cuda (world size 1, and 2 when
    there are two GPUs or more), then the CUDA-only tests (``-m gpu``); the report goes
    to docs/conformance-report-gpu.json. Stops at once where there is no GPU."""
    devices = _cuda_devices()
    if devices == 0:
        session.error("no NVIDIA GPU here (nvidia-smi lists none): the gpu session runs "
                      "only on a machine with CUDA devices")
    _apt_install(session, "libaio-dev")
    session.install(GPU_TORCH)
    session.install("-e", ".[test]", GPU_TORCH)
    for extra in GPU_EXTRAS:
        try:
            session.install(extra, GPU_TORCH)
        except nox.command.CommandFailed:
            session.warn(f"{extra} did not install: the rows and precisions that need "
                         "it are skipped with the reason")
    sizes = "1,2" if devices >= 2 else "1"
    workers = str(max(1, min(devices, 4)))
    # the NVMe row is skipped there, as the CPU runner leaves it out (it needs nvme_path)
    session.run("interlock", "conformance", "--strategy", "all", "--runner", "cuda",
                "--world-sizes", sizes, "--workers", workers,
                "--skips-file", "tools/conformance-skips-cuda.txt",
                "--report", "docs/conformance-report-gpu.json", *session.posargs)
    _regenerate_pages(session)
    session.run("pytest", "-m", "gpu", "-n", workers, "--typeguard-packages=interlock",
                "tests/runtime")


#: the Ray integration's strategy rows, run through the conformance suite
RAY_ROWS = ("ray_ddp", "ray_fsdp", "ray_model_parallel")


def _rows_chosen(session: nox.Session, rows: tuple[str, ...], family: str) -> bool:
    """Whether ``--strategy`` after -- chooses which of ``rows`` to run; a name that is
    not one of them stops the session at once, before minutes of installs and tests."""
    args = session.posargs
    names = []
    for i, arg in enumerate(args):
        if arg == "--strategy":
            names.append(args[i + 1] if i + 1 < len(args) else "")
        elif arg.startswith("--strategy="):
            names.append(arg.partition("=")[2])
    wrong = [name for name in names if name not in rows]
    if wrong:
        session.error(f"--strategy {wrong[0]!r}: the {family} session runs the suite for "
                      f"these rows only: {', '.join(rows)}")
    return bool(names)


@nox.session(python=PYTHON)
def ray(session: nox.Session) -> None:
    """The Ray integration, a package of its own (integrations/ray): mypy --strict and
    ruff over it, its tests on a real Ray cluster of two raylets on this host, then
    the conformance suite for its three rows at world sizes 1 and 2 against such a
    cluster, written to docs/conformance-report-ray.json (arguments after -- go to
    ``interlock conformance``; ``--strategy`` among them replaces the three rows).
    """
    chosen = _rows_chosen(session, RAY_ROWS, "Ray")
    session.install(TORCH)
    session.install("-e", ".[dev]", TORCH)
    session.install("-e", "integrations/ray[test]", RAY, TORCH)
    session.run("mypy", "--strict", "integrations/ray/src", "integrations/ray/tests",
                "integrations/ray/tools")
    session.run("ruff", "check", "integrations/ray")
    session.run("pytest", "integrations/ray/tests", "-p", "no:cacheprovider",
                "--typeguard-packages=interlock,interlock_ray", "-m", "")
    rows = [] if chosen else [arg for row in RAY_ROWS for arg in ("--strategy", row)]
    session.run("python", "integrations/ray/tools/with_cluster.py", "--nodes", "2",
                "--cpus", "4", "--", "interlock", "conformance", *rows, "--runner", "cpu",
                "--world-sizes", "1,2", "--workers", "2",
                "--report", "docs/conformance-report-ray.json", *session.posargs)
    _regenerate_pages(session)


@nox.session(python=PYTHON)
def cluster(session: nox.Session) -> None:
    """Real launches: torchrun (two simulated nodes), SLURM (srun, sbatch), Open MPI and
    interlock's own launchers, with parity, mismatch and fault tests (tests/cluster).

    As root on Debian it first installs slurm-wlm, munge and openmpi-bin (once); the
    tests start a single-host SLURM for themselves and stop it afterwards. Launchers
    that are missing are skipped with the reason.
    """
    _install(session, "test")
    if os.name == "posix" and os.geteuid() == 0 and shutil.which("apt-get"):
        session.run("bash", "tests/cluster/services.sh", "install", external=True)
    session.run("pytest", "-m", "cluster", "--typeguard-packages=interlock", *session.posargs)


@nox.session(python=PYTHON)
def slow(session: nox.Session) -> None:
    """The slow tier, left out of the default run: layouts of more ranks than cores (a
    3-D pp x dp_shard x tp mesh on 8 CPU ranks), the suite's meta-runs (the whole suite
    against the broken strategies, and its fault checks), and cases the default tier and
    the conformance suite cover another way. In parallel, a file per worker, as
    ``tests``."""
    _install(session, "test")
    session.run("pytest", "-m", "slow", "-n", _test_workers(), "--dist", "loadfile",
                "--typeguard-packages=interlock", *session.posargs)


#: runs the soak makes unless told otherwise (each is one faulted training launch)
SOAK_RUNS = 5


@nox.session(python=PYTHON)
def soak(session: nox.Session) -> None:
    """Random faults (SIGKILL mid-step or mid-save, an exception in backward) injected
    into real training on ddp_fork with ``launch(max_restarts=1)``; every run must end
    bit for bit where an uninterrupted one does (tests/soak/soak_faults.py). Arguments
    after -- go to the script (``--runs N``, ``--seed S``); the default is
    SOAK_RUNS runs."""
    _install(session, "test")
    arguments = session.posargs or ["--runs", str(SOAK_RUNS)]
    session.run("python", "tests/soak/soak_faults.py", "--out",
                os.path.join(session.create_tmp(), "soak-faults.json"), *arguments)
