"""A real single-node SLURM for the tests: munged, slurmctld and slurmd from Debian's slurm-wlm,
started from a slurm.conf written into a temporary directory, on ports of their own, and stopped
by PID. Needs root and the packages (``apt-get install slurm-wlm munge``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from helpers import mpi_env

INSTALL = "apt-get install -y slurm-wlm munge"

CONF = """ClusterName=her_mpi_test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
# credentials that expire quickly let a requeued job start again in seconds, not ~120 s
AuthInfo=socket={dir}/munge/munge.socket.2,cred_expire=10
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd.log
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
SchedulerParameters=bf_interval=1,sched_interval=2
ReturnToService=2
KillWait=10
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
{extra}
"""
PARTITION = "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"


def missing_requirements() -> str | None:
    if os.geteuid() != 0:
        return "the SLURM daemons run as root here"
    for program in ("munged", "slurmctld", "slurmd", "sbatch"):
        if shutil.which(program) is None:
            return f"SLURM is not installed ({program} not found): {INSTALL}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Slurm:
    """``with Slurm(tmp_path / "slurm") as slurm: job = slurm.sbatch([...], cwd=...)``.

    ``extra``: slurm.conf lines (partitions; the default is one partition ``debug``)."""

    def __init__(self, directory: Path, extra: str = PARTITION):
        self.directory, self.extra = Path(directory), extra
        self.daemons: list[subprocess.Popen] = []
        self.conf = self.directory / "slurm.conf"

    def __enter__(self) -> "Slurm":
        d = self.directory
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "munge").chmod(0o755)  # munged refuses a socket directory others may write to
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        host = socket.gethostname()
        self.conf.write_text(CONF.format(host=host, dir=d, ctld_port=free_port(), d_port=free_port(), extra=self.extra))
        try:
            self._start(["munged", "--foreground", "--force", f"--socket={d}/munge/munge.socket.2",
                         f"--key-file={key}", f"--pid-file={d}/munge/munged.pid", f"--log-file={d}/log/munged.log",
                         f"--seed-file={d}/munge/seed"], d / "log" / "munged.out")
            self._wait(lambda: (d / "munge" / "munge.socket.2").exists(), "munged")
            self._start(["slurmctld", "-D", "-i", "-f", str(self.conf)], d / "log" / "slurmctld.out")
            self._start(["slurmd", "-D", "-f", str(self.conf), "-N", host], d / "log" / "slurmd.out")
            self._wait(lambda: "idle" in self.command(["sinfo", "-h", "-o", "%T"]).stdout, "an idle node")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["scancel", "--full", "--user=root"], env=self.env(), capture_output=True, timeout=30)
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
        for daemon in reversed(self.daemons):
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()

    def _start(self, command: list[str], log: Path) -> None:
        with open(log, "w") as out:
            self.daemons.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.env()))

    def _wait(self, ready, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [d.args[0] for d in self.daemons if d.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((self.directory / "log").iterdir()))
                raise RuntimeError(f"SLURM did not come up ({what}; exited: {dead})\n{logs}")
            time.sleep(0.2)

    def env(self) -> dict:
        env = mpi_env()
        env["SLURM_CONF"] = str(self.conf)
        # the batch script runs the python that runs the tests, with this checkout importable
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        return env

    def command(self, args: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, env=self.env(), timeout=60, **kw)

    def sbatch(self, args: list, cwd: Path) -> int:
        result = self.command(["sbatch", "--parsable", *map(str, args)], cwd=cwd)
        if result.returncode != 0:
            raise RuntimeError(f"sbatch failed: {result.stderr}")
        return int(result.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...); {} once SLURM forgot it."""
        out = self.command(["scontrol", "show", "job", "-o", str(job_id)]).stdout
        fields = {}
        for item in out.split():
            key, _, value = item.partition("=")
            fields.setdefault(key, value)
        return fields if "JobState" in fields else {}

    def wait_for(self, job_id: int, states: set[str], timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {self.job(job_id)}\n"
                             + (self.directory / "log" / "slurmctld.log").read_text()[-3000:])

    def signal(self, args: list[str]) -> None:
        result = self.command(["scancel", *args])
        assert result.returncode == 0, result.stderr
