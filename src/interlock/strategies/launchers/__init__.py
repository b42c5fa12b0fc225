"""Launchers: how processes come into being."""

from interlock.strategies.launchers.base import Launcher, LaunchError, RankFailedError
from interlock.strategies.launchers.external import ExternalLauncher
from interlock.strategies.launchers.multiprocessing import MultiProcessingLauncher
from interlock.strategies.launchers.subprocess_script import SubprocessScriptLauncher
from interlock.strategies.launchers.xla import XLALauncher

__all__ = [
    "ExternalLauncher",
    "LaunchError",
    "Launcher",
    "MultiProcessingLauncher",
    "RankFailedError",
    "SubprocessScriptLauncher",
    "XLALauncher",
]
