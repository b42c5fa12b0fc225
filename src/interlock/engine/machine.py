"""A frozen snapshot of the machine facts the engine decides on."""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from interlock.engine.limits import MAX_DEVICES_PER_NODE, short_repr
from interlock.engine.memory import format_bytes
from interlock.engine.memory_probe import cuda_device_memory, host_memory
from interlock.engine.model import MAX_BYTES
from interlock.engine.registration import NAME_PATTERN
from interlock.engine.registry import current_parts, load_reference, registered

# re-exported: the CLI, the profiles and the environment report read them from here
from interlock.engine.tables import ACCELERATORS, PackageRow
from interlock.engine.tables import OPTIONAL_PACKAGES as OPTIONAL_PACKAGES
from interlock.engine.tables import START_METHODS as START_METHODS


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """What the engine knows about a machine; any machine can be simulated.

    Attributes:
        cuda_devices: number of visible CUDA devices.
        mps_available: whether Apple's MPS backend is usable.
        xla_devices: number of XLA devices (TPU cores) addressable from this host.
        environ: the environment variables that matter to cluster detection.
        interactive: whether the code runs in an interactive session (REPL, notebook).
        start_methods: multiprocessing start methods this platform offers.
        packages: importable optional packages among :data:`OPTIONAL_PACKAGES` and the
            registered ones (`interlock.register` of a `PackageRow`).
        extra_devices: devices of registered (third-party) accelerators, by accelerator
            name (see `interlock.engine.registry`); an accelerator not listed
            has none. The built-in accelerators have fields of their own.
        device_memory: bytes of memory of one accelerator device (the smallest, when
            they differ), or None when not known: the memory estimate
            (``plan(model=...)``) refuses nothing on a device of unknown size.
        host_memory: bytes of host memory the job may use (where the CPU runner's ranks
            and offloaded state live), or None when not known.
    """

    cuda_devices: int = 0
    mps_available: bool = False
    xla_devices: int = 0
    environ: Mapping[str, str] = field(default_factory=dict)
    interactive: bool = False
    start_methods: tuple[str, ...] = START_METHODS
    packages: frozenset[str] = frozenset()
    extra_devices: Mapping[str, int] = field(default_factory=dict)
    device_memory: int | None = None
    host_memory: int | None = None
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("cuda_devices", "xla_devices"):
            count = getattr(self, name)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError(
                    f"Machine.{name} must be an int >= 0, got {short_repr(count)}"
                )
            if count > MAX_DEVICES_PER_NODE:
                raise ValueError(
                    f"Machine.{name} must be at most {MAX_DEVICES_PER_NODE} (no host has "
                    f"more devices; see interlock.engine.limits), got {short_repr(count)}"
                )
        for name in ("device_memory", "host_memory"):
            size = getattr(self, name)
            if size is not None and (not isinstance(size, int) or isinstance(size, bool)
                                     or not 1 <= size <= MAX_BYTES):
                raise ValueError(f"Machine.{name} must be None or a size in bytes from 1 to "
                                 f"10**18, got {short_repr(size)}")
        for name in ("mps_available", "interactive"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Machine.{name} must be a bool, got {getattr(self, name)!r}")
        unknown = [m for m in self.start_methods if m not in START_METHODS]
        if unknown:
            raise ValueError(
                f"Machine.start_methods has unknown start methods {unknown}; "
                f"known: {', '.join(START_METHODS)}"
            )
        known = _known_packages(self.packages)
        bad = sorted(set(self.packages) - set(known))
        if bad:
            raise ValueError(
                f"Machine.packages has packages the engine does not consult {bad}; "
                f"known: {', '.join(known)}"
            )
        extra = _extra_devices(self.extra_devices)
        object.__setattr__(self, "extra_devices", MappingProxyType(extra))
        env = {str(k): str(v) for k, v in dict(self.environ).items()}
        object.__setattr__(self, "environ", MappingProxyType(env))
        object.__setattr__(self, "start_methods", tuple(self.start_methods))
        object.__setattr__(self, "packages", frozenset(self.packages))
        # Computed once: plan() looks machines up in its memo on every call.
        key = (
            self.cuda_devices,
            self.mps_available,
            self.xla_devices,
            tuple(sorted(self.environ.items())),
            self.interactive,
            self.start_methods,
            self.packages,
            tuple(sorted(extra.items())),
            self.device_memory,
            self.host_memory,
        )
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[object, ...]:
        # mappingproxy does not pickle; strategies travel to spawned workers
        return (_rebuild_machine, (self.to_dict(),))

    def describe(self) -> str:
        """One line that names every fact, as used in error messages and `doctor`."""
        parts = [
            f"{self.cuda_devices} CUDA device{'s' if self.cuda_devices != 1 else ''}",
            "MPS available" if self.mps_available else "no MPS",
            f"{self.xla_devices} XLA device{'s' if self.xla_devices != 1 else ''}",
            "interactive" if self.interactive else "not interactive",
            "start methods " + (", ".join(self.start_methods) or "none"),
            "packages " + (", ".join(sorted(self.packages)) or "none"),
        ]
        if self.device_memory is not None:
            parts.append(f"device memory {format_bytes(self.device_memory)}")
        if self.host_memory is not None:
            parts.append(f"host memory {format_bytes(self.host_memory)}")
        if self.extra_devices:
            parts.append("extra devices " + ", ".join(
                f"{n}={c}" for n, c in sorted(self.extra_devices.items())))
        if self.environ:
            parts.append("env " + " ".join(f"{k}={v}" for k, v in sorted(self.environ.items())))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly view."""
        return {
            "cuda_devices": self.cuda_devices,
            "mps_available": self.mps_available,
            "xla_devices": self.xla_devices,
            "environ": dict(self.environ),
            "interactive": self.interactive,
            "start_methods": list(self.start_methods),
            "packages": sorted(self.packages),
            # only when set: the JSON of a machine without them stays as it was
            **({"extra_devices": dict(sorted(self.extra_devices.items()))}
               if self.extra_devices else {}),
            **{name: getattr(self, name) for name in ("device_memory", "host_memory")
               if getattr(self, name) is not None},
        }

    @classmethod
    def probe(cls) -> Machine:
        """Read the real machine without initialising CUDA or XLA runtimes.

        Device counts, installed packages and memory sizes are read once per process
        (torch is imported on the first call); the environment and interactivity are read
        on every call because they can change. The variables kept are those of every
        registered cluster environment.

        A registered (third-party) accelerator is counted by the function its row
        names in ``device_count`` (once per process; never its Accelerator class, which
        the engine does not import). A counter that fails or returns something other
        than a device count is reported in a ``RuntimeWarning`` and counts as no
        device. A row without a counter has none here; pass a Machine with
        ``extra_devices`` set (``dataclasses.replace(Machine.probe(),
        extra_devices=...)``) to plan for its devices.
        """
        parts = current_parts()  # the registered cluster environments' variables too
        cuda, mps, xla, packages = _probe_devices(tuple(parts.packages))
        # one pass over the environment's names: asking os.environ for each of the ~40
        # variables (most of them absent) costs five times as much
        present = set(os.environ)
        environ = {k: os.environ[k] for k in parts.environment_variables if k in present}
        extra = {row.name: _count_devices(row.name, row.device_count)
                 for row in parts.added_accelerators if row.device_count is not None}

        return cls(
            cuda_devices=cuda,
            mps_available=mps,
            xla_devices=xla,
            environ=environ,
            interactive=_is_interactive(),
            start_methods=tuple(
                m for m in multiprocessing.get_all_start_methods() if m in START_METHODS
            ),
            packages=packages,
            extra_devices=extra,
            device_memory=cuda_device_memory() if cuda else None,
            host_memory=host_memory(),
        )


def _extra_devices(value: object) -> dict[str, int]:
    """``Machine.extra_devices`` checked and copied.

    Raises:
        ValueError: not a mapping of accelerator names to device counts.
    """
    if isinstance(value, Mapping) and not value:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("Machine.extra_devices must map accelerator names to device "
                         f"counts, got {short_repr(value)}")
    builtin = {row.name: row.machine_fact for row in ACCELERATORS}
    found: dict[str, int] = {}
    for name, count in value.items():
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise ValueError(f"Machine.extra_devices has the key {short_repr(name)}, which "
                             "is not an accelerator name (lowercase letters, digits and "
                             "underscores)")
        if name in builtin:
            where = f"Machine.{builtin[name]}" if builtin[name] else "no field (any number)"
            raise ValueError(f"Machine.extra_devices names the built-in accelerator "
                             f"{name!r}, whose devices are counted in {where}")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"Machine.extra_devices[{name!r}] must be an int >= 0, got "
                             f"{short_repr(count)}")
        if count > MAX_DEVICES_PER_NODE:
            raise ValueError(f"Machine.extra_devices[{name!r}] must be at most "
                             f"{MAX_DEVICES_PER_NODE} (no host has more devices; see "
                             f"interlock.engine.limits), got {short_repr(count)}")
        found[name] = count
    return found


@functools.cache
def _count_devices(name: str, counter: str) -> int:
    """What a registered accelerator's device counter returns (0, with a
    ``RuntimeWarning`` saying why, when it fails or returns no device count)."""
    try:
        value = load_reference("the device counter of accelerator", name, counter)()
    except Exception as exc:
        warnings.warn(f"the accelerator {name!r} counts its devices with {counter}, which "
                      f"failed ({type(exc).__name__}: {exc}); it is planned with no device",
                      RuntimeWarning, stacklevel=3)
        return 0
    if (not isinstance(value, int) or isinstance(value, bool)
            or not 0 <= value <= MAX_DEVICES_PER_NODE):
        warnings.warn(f"the accelerator {name!r} counts its devices with {counter}, which "
                      f"returned {short_repr(value)}, not a count from 0 to "
                      f"{MAX_DEVICES_PER_NODE}; it is planned with no device",
                      RuntimeWarning, stacklevel=3)
        return 0
    return value


def _rebuild_machine(fields: dict[str, object]) -> Machine:
    return Machine(**fields)  # type: ignore[arg-type]


def _is_interactive() -> bool:
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    return callable(get_ipython) and get_ipython() is not None


def _known_packages(given: object) -> tuple[str, ...]:
    """The package names ``Machine.packages`` may hold: the built-in ones, and the
    registered ones when ``given`` names others (the registries are read only then)."""
    if isinstance(given, (set, frozenset, tuple, list)) and all(
            p in OPTIONAL_PACKAGES for p in given):
        return OPTIONAL_PACKAGES
    return tuple(registered(PackageRow))


@functools.lru_cache(maxsize=4)
def _probe_devices(package_names: tuple[str, ...]) -> tuple[int, bool, int, frozenset[str]]:
    packages = frozenset(name for name in package_names if _importable(name))
    with warnings.catch_warnings():
        # A CPU-only torch without numpy warns on import; irrelevant to probing.
        warnings.filterwarnings("ignore", message=".*NumPy.*")
        import torch

    # device_count() asks NVML first, so it does not create a CUDA context and
    # leaves fork usable.
    cuda = int(torch.cuda.device_count())
    mps = bool(torch.backends.mps.is_available())
    xla = _probe_xla_devices() if "torch_xla" in packages else 0
    return cuda, mps, xla, packages


def _importable(name: str) -> bool:
    """Whether a top-level module can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _probe_xla_devices() -> int:  # pragma: no cover - needs torch_xla
    """XLA devices on this host, without starting the XLA runtime: once it runs in a
    process, torch_xla refuses to start worker processes from it."""
    device = os.environ.get("PJRT_DEVICE", "").upper()
    try:
        if device == "CPU":
            # torch_xla's CPU client: one device unless CPU_NUM_DEVICES says more
            return max(1, int(os.environ.get("CPU_NUM_DEVICES", "1")))
        if device in ("", "TPU"):
            from torch_xla._internal import tpu

            return int(tpu.num_available_devices())
        return 0  # other PJRT devices are counted only by starting the runtime
    except Exception:
        return 0
