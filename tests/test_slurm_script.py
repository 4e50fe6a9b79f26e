"""launch/slurm_train.sbatch's requeue decisions over many restarts, which a real SLURM test would
need a lost host for each time: the script runs under bash as SLURM would start it, with
her_mpi.launch's verdict given (``python`` on PATH exits with the status a test sets) and
``scontrol`` on PATH recording each requeue. tests/test_slurm.py runs the script under a real
SLURM for the stops themselves."""

import os
import subprocess

import pytest

from helpers import ROOT

SCRIPT = ROOT / "launch" / "slurm_train.sbatch"


@pytest.fixture
def job(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/bin/bash\nexit "$VERDICT"\n')
    (bin_dir / "scontrol").write_text('#!/bin/bash\necho "$@" >> "$REQUEUES"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)

    requeues = tmp_path / "requeues"

    def requeued() -> int:
        return len(requeues.read_text().splitlines()) if requeues.is_file() else 0

    def run(verdict: int, new_submission: bool = False, **env) -> tuple[int, str, int]:
        """One start of the job ending with ``verdict``: its exit status, its log, requeues so far. SLURM
        counts a job's requeues in SLURM_RESTART_COUNT; a new submission of the same run starts at 0."""
        if new_submission:
            requeues.unlink(missing_ok=True)
        result = subprocess.run(["bash", str(SCRIPT), "default"], cwd=tmp_path, capture_output=True, text=True,
                                timeout=60, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                                 "SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": str(requeued()),
                                                 "VERDICT": str(verdict), "REQUEUES": str(requeues), **env})
        return result.returncode, result.stdout + result.stderr, requeued()
    return run


def test_lost_hosts_are_requeued_at_most_the_cap_in_a_row(job):
    for n in (1, 2, 3):
        status, log, requeues = job(6)
        assert (status, requeues) == (6, n) and "requeueing job 7" in log, log
    status, log, requeues = job(5)
    assert (status, requeues) == (5, 3), log
    assert "exit 5 after 3 requeues for lost or hung hosts in a row (HER_MPI_MAX_REQUEUES=3): not requeued" in log
    assert "resume with: sbatch --export=ALL,HER_MPI_RUN_DIR=runs/slurm-7 launch/slurm_train.sbatch" in log


def test_time_limit_stops_requeue_always_and_reset_the_count(job):
    for verdict in (75, 6, 6, 75, 75, 75, 6, 6, 6):
        status, log, _ = job(verdict)
        assert status == verdict and "requeueing job 7" in log, log
    status, log, requeues = job(6, HER_MPI_MAX_REQUEUES="3")
    assert (status, requeues) == (6, 9) and "not requeued" in log, log


def test_a_new_submission_of_the_run_starts_counting_afresh(job, tmp_path):
    for _ in range(3):
        job(6)
    status, log, _ = job(6)
    assert "not requeued" in log and not (tmp_path / "runs/slurm-7/slurm_failed_restarts").exists()
    status, log, requeues = job(6, new_submission=True)  # the "resume with: sbatch ..." line, run by hand
    assert (status, requeues) == (6, 1) and "requeueing job 7" in log, log
    (tmp_path / "runs/slurm-7/slurm_failed_restarts").write_text("garbled\n")
    status, log, requeues = job(6)
    assert (status, requeues) == (6, 2) and "requeueing job 7" in log, log  # unreadable counts as none


@pytest.mark.parametrize("verdict", [0, 1, 2, 3, 4])
def test_other_verdicts_end_the_job(job, verdict):
    status, log, requeues = job(verdict)
    assert (status, requeues) == (verdict, 0) and "requeue" not in log, log
