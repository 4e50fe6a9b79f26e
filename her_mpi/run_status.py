"""The run record, ``RUN_DIR/status.json``: whether a run reached its budget and, if not, how it stopped.

A launcher's exit status cannot be trusted when a host is lost: Open MPI 5.0's ``mpirun`` can exit
0 when the launcher connection of one host dies with the run unfinished. So the run directory says
it itself, and whatever decides "finished / resume / requeue / failed" (``her_mpi.launch``,
``her_mpi.sweep``, ``launch/slurm_train.sbatch``) reads this record, not the exit status alone.

States (``state``) and the exit status that goes with each (``exit_status``):

========== ==== ==========================================================================================
running    --   training started (written by rank 0 when every rank is ready). A record that still says
                ``running`` after the job ended means a host or rank was lost: resume from the last
                checkpoint. The launcher rewrites it as ``lost``.
finished   0    every rank agreed that the run reached its budget (``n_epochs``, ``max_env_steps``) or
                ``stop_success``; only then does rank 0 write this
stopped    75   a stop signal; every rank finished its cycle and the checkpoint was written
hung       5    a rank waited on its peers longer than ``train.hang_timeout_s``; ``message`` names the
                ranks that did not answer
crashed    1    a rank raised (its traceback is printed) and the job was aborted
non_finite 3    a non-finite loss, gradient or parameter; no checkpoint was written from it
write_failed 4  a checkpoint, replay or log file could not be written
lost       6    (the launcher's verdict) the job ended while the record said ``running``: a host or a
                rank was lost, or the job was killed; or mpirun stopped the ranks by itself (a
                ``stopped`` record with no stop request behind it: it lost a host's daemon). A rank
                that ends after this verdict leaves it in place
========== ==== ==========================================================================================

Bad input (exit 2) is reported before training starts and leaves no record. Every state but
``finished`` keeps the last complete checkpoint: ``--resume RUN_DIR`` continues from it. Those worth
running again unchanged (``retry``) are ``stopped``, ``hung`` and ``lost``.

Imports nothing heavy: launchers read records without torch or MPI.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from her_mpi.files import CheckpointWriteError, atomic_write

RECORD = "status.json"

EXIT_OK, EXIT_CRASHED, EXIT_BAD_INPUT, EXIT_NON_FINITE, EXIT_WRITE_FAILED = 0, 1, 2, 3, 4
EXIT_HUNG, EXIT_LOST, EXIT_PREEMPTED = 5, 6, 75

EXIT_STATUS = {"finished": EXIT_OK, "crashed": EXIT_CRASHED, "non_finite": EXIT_NON_FINITE,
               "write_failed": EXIT_WRITE_FAILED, "hung": EXIT_HUNG, "lost": EXIT_LOST, "stopped": EXIT_PREEMPTED}
# mpirun's exit status when Open MPI's runtime could not start on a host (PMIx -43), known to
# come from a session directory an earlier, killed daemon left behind (docs/clusters.md)
EXIT_OPEN_MPI_START_FAILED = 213
RETRY = {"stopped", "hung", "lost"}  # running again unchanged may succeed: resume from the checkpoint


def record_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / RECORD


def read(run_dir: str | Path, since: float | None = None) -> dict | None:
    """The run's record, or None where there is none (or it cannot be read: written by nothing we know).

    ``since`` (a time.time()): only a record written after it, i.e. by the job that started then; an
    older one is an earlier job's word. A second of slack covers the file system's timestamp rounding."""
    try:
        record = json.loads(record_path(run_dir).read_text())
        if since is not None and record_path(run_dir).stat().st_mtime < since - 1.0:
            return None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("state"), str) else None


def write(run_dir: str | Path, state: str, message: str = "", **details) -> None:
    """Write the record atomically. Best effort for the failure states: a record that cannot be
    written must not hide the failure being recorded (the caller's message still reaches stderr)."""
    if state != "running" and state not in EXIT_STATUS:
        raise ValueError(f"unknown run state {state!r}; expected running or one of {', '.join(EXIT_STATUS)}")
    record = {"state": state, "exit_status": EXIT_STATUS.get(state), "message": message,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(), "pid": os.getpid(),
              **details}
    try:
        atomic_write(record_path(run_dir), lambda f: f.write(json.dumps(record, indent=1) + "\n"), mode="w")
    except CheckpointWriteError:
        if state in ("running", "finished"):
            raise


def judged_by_launcher(run_dir: str | Path, since: float) -> dict | None:
    """The verdict ``her_mpi.launch`` wrote into the record after ``since`` (a time.time()), if any.

    A rank can still be finishing (a checkpoint on mpirun's SIGTERM) after its launcher exited and
    the supervisor judged the job; the rank then leaves the record, and the verdict, as they are."""
    record = read(run_dir, since)
    return record if record is not None and "launcher_exit_status" in record else None


@dataclass(frozen=True)
class Verdict:
    """How a job ended, decided from the run record first and the launcher's exit status second."""

    state: str  # a record state, or "bad_input" (exit 2 before any record)
    exit_status: int
    message: str

    @property
    def retry(self) -> bool:
        """Whether running the job again unchanged (a resume) is the right reaction."""
        return self.state in RETRY

    @property
    def finished(self) -> bool:
        return self.state == "finished"


def verdict(run_dir: str | Path, launcher_status: int | None, started_after: float | None = None) -> Verdict:
    """What happened to the job that trained ``run_dir`` and ended with ``launcher_status``.

    ``started_after`` (a time.time()): a record older than this belongs to an earlier job of the same
    run directory and is not this job's word (the job then failed before it wrote one). Exit 2 is bad
    input, which her_mpi.train reports before it writes any record: a record then is an earlier job's,
    however recent (one written within the timestamps' slack of this job's start)."""
    record = None if launcher_status == EXIT_BAD_INPUT else read(run_dir, started_after)
    if record is None:
        if launcher_status == EXIT_BAD_INPUT:
            return Verdict("bad_input", EXIT_BAD_INPUT, "bad input: nothing was trained (see the error above)")
        if launcher_status == 0:
            return Verdict("lost", EXIT_LOST, f"the launcher exited 0 but {record_path(run_dir)} was never written: "
                                              "the run did not start or a host was lost before it did")
        message = f"the job ended with exit status {launcher_status} before training started"
        if launcher_status == EXIT_OPEN_MPI_START_FAILED:
            message += (": Open MPI's runtime did not start; if the log says \"The PMIx server's listener thread "
                        "failed to start\", a killed earlier job left its session directory on a host (see "
                        "'A host whose daemon was killed may refuse the next one' in docs/clusters.md)")
        return Verdict("crashed" if launcher_status == EXIT_CRASHED else "lost",
                       EXIT_CRASHED if launcher_status == EXIT_CRASHED else EXIT_LOST, message)
    state = record["state"]
    if state == "running":
        return Verdict("lost", EXIT_LOST,
                       f"the job ended (launcher exit status {launcher_status}) while its record still said running: "
                       "a host or rank was lost or the job was killed; the last checkpoint stands, resume from it")
    return Verdict(state, EXIT_STATUS.get(state, EXIT_CRASHED), record.get("message") or state)
