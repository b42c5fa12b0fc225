"""`LSFEnvironment`: processes started by ``jsrun`` inside an IBM Spectrum LSF job."""

from __future__ import annotations

import socket
from collections.abc import Mapping

from interlock.engine.errors import ResolutionError
from interlock.strategies.environments._external import ExternalEnvironment
from interlock.strategies.environments._variables import (
    port_from_job,
    read_int,
    read_port,
    read_str,
)


class LSFEnvironment(ExternalEnvironment):
    """Ranks from jsrun's ``JSM_NAMESPACE_*`` variables, hosts from LSF's rank file.

    ``LSB_DJOB_RANKFILE`` names a file with one host per line (one line per slot); its
    first line is the launch node, which runs no rank and is skipped. The compute hosts,
    in order of first appearance, define node ranks; this process's node rank is the
    index of its own host name. The main address is ``MASTER_ADDR`` when set, else the
    first compute host; the main port is ``MASTER_PORT`` when set, else
    ``15000 + LSB_JOBID % 5000``, the same for every rank without communication.
    """

    name = "lsf"

    def __init__(
        self, environ: Mapping[str, str] | None = None, *, hostname: str | None = None
    ) -> None:
        super().__init__(environ)
        self._hostname = hostname
        self._hosts: tuple[str, tuple[str, ...]] | None = None  # (rank file, its hosts)

    def hosts(self) -> tuple[str, ...]:
        """The compute hosts of the job, without repeats, in rank-file order."""
        path = read_str(self.name, self.environ, "LSB_DJOB_RANKFILE")
        if self._hosts is None or self._hosts[0] != path:
            self._hosts = (path, self._read_rankfile(path))
        return self._hosts[1]

    def _read_rankfile(self, path: str) -> tuple[str, ...]:
        try:
            with open(path, encoding="utf-8") as file:
                lines = [line.strip() for line in file]
        except OSError as exc:
            raise self._bad_rankfile(path, f"it cannot be read ({exc})") from exc
        hosts = tuple(dict.fromkeys(line for line in lines[1:] if line))
        if not hosts:
            raise self._bad_rankfile(path, "it lists no compute host after the launch node")
        return hosts

    def _bad_rankfile(self, path: str, why: str) -> ResolutionError:
        return ResolutionError(
            "invalid-environment",
            flag="environment",
            value=f"LSB_DJOB_RANKFILE={path}",
            reason=f"the lsf environment reads its hosts from LSB_DJOB_RANKFILE, but {why}.",
        )

    @property
    def main_address(self) -> str:
        address = self.environ.get("MASTER_ADDR", "").strip()
        return address or self.hosts()[0]

    @property
    def main_port(self) -> int:
        if "MASTER_PORT" in self.environ:
            return read_port(self.name, self.environ, "MASTER_PORT")
        return port_from_job(self.name, self.environ, "LSB_JOBID")

    def world_size(self) -> int:
        return read_int(self.name, self.environ, "JSM_NAMESPACE_SIZE", minimum=1)

    def global_rank(self) -> int:
        return read_int(self.name, self.environ, "JSM_NAMESPACE_RANK")

    def local_rank(self) -> int:
        return read_int(self.name, self.environ, "JSM_NAMESPACE_LOCAL_RANK")

    def node_rank(self) -> int:
        hosts = self.hosts()
        me = self._hostname if self._hostname is not None else socket.gethostname()
        if me in hosts:
            return hosts.index(me)
        # The rank file and gethostname() may disagree on the domain part.
        short = [host.split(".", 1)[0] for host in hosts]
        if me.split(".", 1)[0] in short:
            return short.index(me.split(".", 1)[0])
        raise self._bad_rankfile(
            self.environ["LSB_DJOB_RANKFILE"],
            f"this host ({me}) is not among its compute hosts ({', '.join(hosts)})",
        )
