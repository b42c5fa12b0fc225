"""`interlock env`: the facts a bug report needs, as Markdown to paste.

Versions (interlock, torch, Python, the platform, the optional packages the engine
consults), what :meth:`Machine.probe` sees, the plan of the default flags (or the
refusal, which is often the bug), and the cluster variables set in this process. The
value of any variable whose name looks secret is left out; so is the password part of
a URL. Nothing here initialises CUDA or starts a process group.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
from collections.abc import Mapping

from interlock.engine.errors import ResolutionError
from interlock.engine.machine import Machine
from interlock.engine.planner import plan
from interlock.engine.registry import current_parts
from interlock.engine.tables import PackageRow

#: Prefixes of the variables launchers, schedulers and communication libraries set,
#: beyond the ones the engine reads (every cluster environment row's variables).
VARIABLE_PREFIXES: tuple[str, ...] = (
    "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "LSB_", "JSM_", "KUBERNETES_",
    "MASTER_", "NCCL_", "GLOO_", "TORCH_", "PJRT_", "TPU_", "XLA_", "INTERLOCK_",
)
#: Single variables that change how training runs.
VARIABLE_NAMES: tuple[str, ...] = (
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "OMP_NUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF",
)
#: A variable whose name contains one of these (any case) has its value left out.
SECRET_MARKERS: tuple[str, ...] = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH", "PRIVATE",
    "COOKIE", "SIGNATURE", "SESSION",
)
#: What replaces a value that is left out.
ELIDED = "<elided>"

_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def is_secret(name: str) -> bool:
    """Whether a variable's name looks like it holds a secret."""
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def shown_value(name: str, value: str) -> str:
    """``value`` as the report shows it: elided for a secret-looking name, and with the
    user and password of any URL in it replaced."""
    if is_secret(name):
        return ELIDED
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{ELIDED}@", value)


def cluster_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher, scheduler and communication variables set in ``environ`` (this
    process's by default), sorted by name, with secret values elided."""
    env = os.environ if environ is None else environ
    engine_reads = frozenset(current_parts().environment_variables)  # registered rows too
    chosen = {
        name: shown_value(name, value) for name, value in env.items()
        if name in engine_reads or name in VARIABLE_NAMES
        or name.startswith(VARIABLE_PREFIXES)
    }
    return dict(sorted(chosen.items()))


def package_versions() -> dict[str, str]:
    """Each optional package's installed version, or ``not installed``."""
    found: dict[str, str] = {}
    # imported here: the registries load plugins' entry points
    from interlock.engine.registry import registered

    for name in registered(PackageRow):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = ("installed (version unknown)"
                           if importlib.util.find_spec(name) is not None else "not installed")
    return found


def _torch_lines() -> list[tuple[str, str]]:
    import torch
    import torch.distributed as dist

    build = [f"CUDA {torch.version.cuda}" if torch.version.cuda else "",
             f"HIP {torch.version.hip}" if getattr(torch.version, "hip", None) else ""]
    backends = [name for name, available in (
        ("gloo", dist.is_available() and dist.is_gloo_available()),
        ("nccl", dist.is_available() and dist.is_nccl_available()),
        ("mpi", dist.is_available() and dist.is_mpi_available()),
    ) if available]
    return [
        ("torch", f"{torch.__version__} ({', '.join(b for b in build if b) or 'CPU build'})"),
        ("torch.distributed backends", ", ".join(backends) or "none"),
    ]


def _table(rows: list[tuple[str, str]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    return ["| | |", "|---|---|", *(f"| {cell(k)} | {cell(v)} |" for k, v in rows)]


def env_report(machine: Machine | None = None,
               environ: Mapping[str, str] | None = None) -> str:
    """The report, as Markdown.

    Args:
        machine: the machine to describe and plan on; this one (probed) by default.
        environ: where cluster variables are read; this process's environment by
            default.
    """
    from interlock import __version__

    if machine is None:
        machine = Machine.probe()
    versions = [
        ("interlock", __version__),
        *_torch_lines(),
        ("Python", f"{platform.python_version()} ({platform.python_implementation()})"),
        ("platform", f"{platform.platform()} ({platform.machine()}, "
                     f"{os.cpu_count()} CPUs)"),
        *package_versions().items(),
    ]
    facts = [
        ("CUDA devices", str(machine.cuda_devices)),
        ("MPS", "available" if machine.mps_available else "not available"),
        ("XLA devices", str(machine.xla_devices)),
        ("interactive", "yes" if machine.interactive else "no"),
        ("start methods", ", ".join(machine.start_methods) or "none"),
        ("optional packages", ", ".join(sorted(machine.packages)) or "none"),
    ]
    try:
        default = plan(machine=machine).explain()
    except ResolutionError as error:
        default = f"refused: {error}"
    variables = cluster_variables(environ)
    out = ["## interlock env", "", "### Versions", "", *_table(versions), "",
           "### Machine (`Machine.probe()`)", "", *_table(facts), "",
           "### Plan of the default flags", "", "```", default, "```", "",
           "### Cluster variables", ""]
    if variables:
        out += ["```", *(f"{k}={v}" for k, v in variables.items()), "```"]
    else:
        out.append("none set")
    out.append("")
    return "\n".join(out)
