"""Several "hosts" on one machine, for real ``mpirun --hostfile`` launches across them.

Each host is a UTS namespace with its own hostname, entered by an ssh stand-in that Open MPI runs
as its rsh agent (``--mca plm_rsh_agent``): ``agent HOST COMMAND`` records its pid (the process
that stands for the ssh connection), starts ``unshare --uts`` which sets the hostname and runs
the command (Open MPI's daemon, prted), and waits for it. mpirun runs inside a network namespace
of the test's own, holding ``lo`` and a veth pair with an address the test assigns: prted refuses
loopback for its control traffic, and no packet leaves that namespace. Ranks talk TCP over ``lo``.
Needs root, ``unshare`` and ``ip`` (iproute2).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import mpi_env

AGENT = """#!/bin/bash
# ssh stand-in for Open MPI: run COMMAND on host $1, a UTS namespace named after it
host=$1; shift
echo $$ > "{dir}/$host.agent"
unshare --uts bash -c 'hostname "$0" && readlink /proc/self/ns/uts > "{dir}/$0.host" && eval "$1"' "$host" "$*" &
wait $!
"""
_namespaces = itertools.count()


def missing_requirements() -> str | None:
    """Why fake hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network and UTS namespaces)"
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"simulated hosts need {tool!r} (util-linux, iproute2)"
    return None


def mpirun() -> str:
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.is_file() else "mpirun"


def processes_in_namespaces(uts: str, net: str) -> list[int]:
    """Every process in UTS namespace ``uts`` and network namespace ``net`` (as ``readlink
    /proc/PID/ns/...`` prints them): a host's processes, whichever parent they have (prted
    daemonizes, so it is nobody's child).

    The UTS namespace alone is not enough: once a host's processes are gone, the kernel gives its
    number to the next new namespace, which may be a host of another cluster (another test session
    on this machine). The network namespace is this cluster's own while it exists."""
    found = []
    for directory in Path("/proc").glob("[0-9]*/ns"):
        try:
            if os.readlink(directory / "uts") == uts and os.readlink(directory / "net") == net:
                found.append(int(directory.parent.name))
        except OSError:
            continue
    return found


def send_signal(pids: list[int], signum: int) -> list[int]:
    """Send ``signum`` to each of ``pids`` that still exists; returns ``pids``."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    return pids


class FakeCluster:
    """A network namespace and hosts ``names``: ``with FakeCluster(tmp_path) as cluster: ...``."""

    def __init__(self, directory: Path, names=("node-a", "node-b")):
        self.directory, self.names = Path(directory), list(names)
        self.netns = f"her_mpi_test_{os.getpid()}_{next(_namespaces)}"
        self.agent = self.directory / "agent"
        self.hostfile = self.directory / "hostfile"

    def __enter__(self) -> "FakeCluster":
        self.directory.mkdir(parents=True, exist_ok=True)
        self.agent.write_text(AGENT.format(dir=self.directory))
        self.agent.chmod(0o755)
        self.hostfile.write_text("".join(f"{name} slots=1\n" for name in self.names))
        address = "10.233.0.1/24"  # inside the namespace: no clash with anything outside it
        for command in (["ip", "netns", "add", self.netns],
                        ["ip", "-n", self.netns, "link", "set", "lo", "up"],
                        ["ip", "-n", self.netns, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"],
                        ["ip", "-n", self.netns, "addr", "add", address, "dev", "veth0"],
                        ["ip", "-n", self.netns, "link", "set", "veth0", "up"],
                        ["ip", "-n", self.netns, "link", "set", "veth1", "up"]):
            subprocess.run(command, check=True, capture_output=True)
        self.net_namespace = f"net:[{os.stat(f'/run/netns/{self.netns}').st_ino}]"
        return self

    def __exit__(self, *exc) -> None:
        self.kill_namespace_processes()
        subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True)

    def mpirun(self, n_ranks: int, args: list, hostfile: bool = True, btl: str = "tcp,self") -> list[str]:
        """``ip netns exec NS mpirun ...`` across the hosts (``hostfile=False``: on this host only);
        ``btl``: the transports the ranks may use."""
        placement = ["--hostfile", str(self.hostfile), "--mca", "plm_rsh_agent", str(self.agent)] if hostfile \
            else ["--oversubscribe"]
        return ["ip", "netns", "exec", self.netns, mpirun(), *placement, "-np", str(n_ranks), "--bind-to", "none",
                "--mca", "pml", "ob1", "--mca", "btl_tcp_if_include", "lo", "--mca", "btl", btl,
                sys.executable, *map(str, args)]

    def run(self, command: list[str], timeout: float = 300, cwd=None) -> subprocess.CompletedProcess:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=mpi_env(), cwd=cwd)

    def start(self, command: list[str], log: Path, cwd=None) -> subprocess.Popen:
        with open(log, "w") as out:
            return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=mpi_env(), cwd=cwd,
                                    start_new_session=True)

    def host_pids(self, name: str) -> list[int]:
        """The host's processes: its daemon(s) and ranks (not the agent that launched them)."""
        namespace = self.directory / f"{name}.host"
        return processes_in_namespaces(namespace.read_text().strip(), self.net_namespace) if namespace.is_file() else []

    def agent_pid(self, name: str) -> int:
        return int((self.directory / f"{name}.agent").read_text())

    def signal_host(self, name: str, signum: int) -> list[int]:
        return send_signal(self.host_pids(name), signum)

    def kill_namespace_processes(self) -> None:
        """SIGKILL whatever still runs in the network namespace: mpirun and every host's daemon and
        ranks, frozen or not, whether or not their UTS records were written (a test interrupted while
        the hosts started). A host's processes are in it: ``host_pids`` selects by it too."""
        listed = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True)
        send_signal([int(pid) for pid in listed.stdout.split()], signal.SIGKILL)

    def wait_for_hosts(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not all((self.directory / f"{n}.host").is_file() for n in self.names):
            if time.monotonic() > deadline:
                raise AssertionError(f"the hosts {self.names} did not start within {timeout} s")
            time.sleep(0.1)
