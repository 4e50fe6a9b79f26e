"""Run a training job's launcher and report how the run ended from its record, not mpirun's exit status.

    python -m her_mpi.launch -- mpirun --hostfile hosts -np 16 python -m her_mpi.train --config fetch_push_ddpg --run-dir runs/push

Across hosts, Open MPI 5.0's ``mpirun`` is not a reliable witness: it can exit 0 when the launcher
connection of one host dies with the run unfinished, and it waits forever for the daemon of a frozen
host even after every healthy rank has stopped. This supervisor runs the command in a session of its
own, forwards SIGINT, SIGTERM and SIGUSR1 to it (SIGUSR1: checkpoint and stop), watches the run
record (``RUN_DIR/status.json``, :mod:`her_mpi.run_status`), ends a launcher that outlives its
run's final record by ``--grace`` seconds, gives a record that still says ``running`` when the
launcher exits a few seconds to change (mpirun does not wait for a rank writing its checkpoint on
its SIGTERM), and exits with the record's status:

* 0 finished; 1 crashed; 2 bad input; 3 non-finite; 4 a write failed; 5 hung (a rank stopped
  answering); 75 stopped by a signal with a checkpoint;
* 6 lost: the job ended while the record still said ``running`` (a lost host or rank, a killed
  job), whatever mpirun's own status; or the ranks were stopped by a SIGTERM or SIGINT this
  supervisor did not pass on (mpirun's own teardown when it loses a host's daemon: the ranks
  checkpoint, but nobody asked them to stop). The record is rewritten to say so.

After 5, 6 and 75, ``--resume RUN_DIR`` continues from the last checkpoint. ``her_mpi.sweep`` and
``launch/slurm_train.sbatch`` run their jobs through this supervisor. The training command must
name its run directory (``--run-dir`` or ``--resume``): that is where the record is.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from her_mpi import run_status

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
POLL_S = 0.5
# mpirun can exit while a rank it sent SIGTERM is still writing its checkpoint: a record that says
# "running" when the launcher exits gets this long to say how the ranks ended before it is judged.
SETTLE_S = 10.0


def training_run_dir(command: list[str]) -> Path | None:
    """The run directory a ``her_mpi.train`` command line names with ``--run-dir`` or ``--resume``."""
    for i, arg in enumerate(command):
        for flag in ("--run-dir", "--resume"):
            if arg == flag and i + 1 < len(command):
                value = command[i + 1]
            elif arg.startswith(flag + "="):
                value = arg[len(flag) + 1:]
            else:
                continue
            path = Path(value)
            if flag == "--resume" and path.is_file() and path.parent.name == "checkpoints":
                return path.parent.parent  # --resume RUN_DIR/checkpoints/latest.pt
            return path
    return None


def die_with_parent() -> None:
    """In the launcher's process, before exec: the kernel kills it when this supervisor dies, so a
    launcher in a session of its own never outlives the supervisor (nor escapes a batch system)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Supervisor:
    """One launcher process and the run record it should produce."""

    def __init__(self, command: list[str], run_dir: Path, grace_s: float = 30.0, settle_s: float = SETTLE_S,
                 **popen):
        self.command, self.run_dir, self.grace_s, self.settle_s = command, Path(run_dir), grace_s, settle_s
        self.popen = popen
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0
        self.launcher_ended_at: float | None = None
        self.record_final_since: float | None = None  # when the record first said the run ended
        self.ended_launcher = False
        self.stop_requests: set[str] = set()  # the stop signals this supervisor received to pass on

    def start(self) -> "Supervisor":
        self.started_at = time.time()
        self.process = subprocess.Popen(self.command, start_new_session=True, preexec_fn=die_with_parent,
                                        **self.popen)
        return self

    def send(self, signum: int) -> None:
        """Pass a stop request (SIGINT, SIGTERM, SIGUSR1) on to the launcher."""
        self.stop_requests.add(signal.Signals(signum).name)
        self._signal_launcher(signum)

    def _signal_launcher(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.send_signal(signum)
            except ProcessLookupError:
                pass

    def poll(self) -> run_status.Verdict | None:
        """None while the job runs; its verdict once the launcher is gone. Call every ~second."""
        if self.process.poll() is None:
            self._end_launcher_that_outlives_its_run()
            return None
        if self._ranks_may_still_be_finishing():
            return None
        result = self._unrequested_stop_is_lost(
            run_status.verdict(self.run_dir, self.process.returncode, started_after=self.started_at))
        if result.state == "lost" and run_status.read(self.run_dir) is not None:
            run_status.write(self.run_dir, "lost", result.message, launcher_exit_status=self.process.returncode)
        return result

    def _ranks_may_still_be_finishing(self) -> bool:
        """The launcher is gone, this job's record still says running, and the settle time has not passed.
        Not after a stop this supervisor passed on: a scheduler that sent it kills what is left soon
        (SLURM's KillWait), and the verdict must be out before then."""
        if self.stop_requests:
            return False
        now = time.monotonic()
        if self.launcher_ended_at is None:
            self.launcher_ended_at = now
        if now - self.launcher_ended_at >= self.settle_s:
            return False
        record = run_status.read(self.run_dir, since=self.started_at)
        return record is not None and record["state"] == "running"

    def _unrequested_stop_is_lost(self, result: run_status.Verdict) -> run_status.Verdict:
        """A "stopped" record although this supervisor passed on no stop signal and no rank got
        SIGUSR1 (the deliberate "checkpoint and stop", which mpirun never sends by itself): mpirun
        ended the ranks with SIGTERM because it lost a host's daemon or launcher connection. That is
        a lost host (6: requeued a bounded number of times), not a stop a user or scheduler asked
        for (75: always requeued)."""
        if result.state != "stopped" or self.stop_requests:
            return result
        record = run_status.read(self.run_dir) or {}
        if "SIGUSR1" in record.get("signals", ["SIGUSR1"]):  # a record without the list: keep its word
            return result
        return run_status.Verdict(
            "lost", run_status.EXIT_LOST,
            f"the ranks were stopped by a signal her_mpi.launch did not pass on (launcher exit status "
            f"{self.process.returncode}): mpirun ends every rank so when it loses a host's daemon or its "
            f"launcher connection; {result.message}")

    def _end_launcher_that_outlives_its_run(self) -> None:
        """A record that says the run ended (hung, crashed, ...) while the launcher still runs after
        the grace time: Open MPI waits for a frozen host's daemon forever. A second SIGINT is its
        "forcibly terminate"; whatever is left of the launcher's session is then killed."""
        record = run_status.read(self.run_dir, since=self.started_at)
        final = record is not None and record["state"] not in ("running", "finished")
        if not final:
            return
        now = time.monotonic()
        if self.record_final_since is None:
            self.record_final_since = now
        elif now - self.record_final_since > self.grace_s and not self.ended_launcher:
            self.ended_launcher = True
            print(f"her_mpi.launch: the run ended ({record['state']}) but the launcher is still running "
                  f"after {self.grace_s:g} s (a frozen host?); ending it", file=sys.stderr, flush=True)
            for _ in range(2):
                self._signal_launcher(signal.SIGINT)
                time.sleep(1.0)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def wait(self) -> run_status.Verdict:
        while True:
            result = self.poll()
            if result is not None:
                return result
            time.sleep(POLL_S)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m her_mpi.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grace", type=float, default=30.0, metavar="SECONDS",
                        help="how long the launcher may outlive its run's final record before it is ended "
                             "(default 30)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the launcher command after --, e.g. -- mpirun -np 8 python -m her_mpi.train ...")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("her_mpi.launch: error: no command given; expected -- mpirun ... python -m her_mpi.train ...",
              file=sys.stderr)
        return run_status.EXIT_BAD_INPUT
    if args.grace < 0:
        print(f"her_mpi.launch: error: --grace {args.grace:g}: expected a number of seconds >= 0", file=sys.stderr)
        return run_status.EXIT_BAD_INPUT
    run_dir = training_run_dir(command)
    if run_dir is None:
        print("her_mpi.launch: error: the training command names no run directory; add --run-dir DIR (or "
              "--resume DIR): the run's record, DIR/status.json, says how it ended", file=sys.stderr)
        return run_status.EXIT_BAD_INPUT
    supervisor = Supervisor(command, run_dir, args.grace)
    for signum in FORWARDED:
        signal.signal(signum, lambda signum, frame: supervisor.send(signum))
    try:
        supervisor.start()
    except OSError as exc:
        print(f"her_mpi.launch: error: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return run_status.EXIT_BAD_INPUT
    result = supervisor.wait()
    print(f"her_mpi.launch: {result.state} (exit {result.exit_status}; launcher exit "
          f"{supervisor.process.returncode}): {result.message}", file=sys.stderr, flush=True)
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main())
