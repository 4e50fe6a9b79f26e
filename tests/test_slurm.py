"""launch/slurm_train.sbatch under a real SLURM (tests/slurm_cluster.py: munged, slurmctld and
slurmd on this machine, one node with 2 CPUs): a stop request, scancel, preemption and the time
limit, each ending as the script's header promises, every epoch trained once."""

import os
import time
from pathlib import Path

import pytest

from helpers import ROOT, TINY, read_progress
from slurm_cluster import PARTITION, Slurm, missing_requirements

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements()))]

SCRIPT = ROOT / "launch" / "slurm_train.sbatch"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
PREEMPTION = """PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=60
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2"""


def submit(slurm: Slurm, work: Path, n_epochs: int, *sbatch_args) -> tuple[int, Path]:
    job = slurm.sbatch(["--nodes=1", "--ntasks-per-node=2", "--time=10", *sbatch_args, SCRIPT, "default", *TINY,
                        "--set", f"train.n_epochs={n_epochs}"], cwd=work)
    return job, work / "runs" / f"slurm-{job}"


def wait_for_epochs(run_dir: Path, n: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "progress.csv").is_file() and len(read_progress(run_dir)) >= n:
            return
        time.sleep(0.3)
    raise AssertionError(f"no {n} epochs in {run_dir} within {timeout} s")


def her_mpi_processes(work: Path) -> list[str]:
    """Command lines of the her_mpi processes (launcher, mpirun, ranks) running in ``work``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(proc / "cwd") != str(work):
                continue
            argv = (proc / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if any("her_mpi" in arg for arg in argv):
            found.append(" ".join(argv))
    return found


def log_of(work: Path, job: int) -> str:
    return (work / f"her_mpi-{job}.out").read_text()


def epochs(run_dir: Path) -> list[int]:
    return [int(r["epoch"]) for r in read_progress(run_dir)]


@pytest.fixture
def work(tmp_path):
    directory = tmp_path / "work"  # a fresh working directory: job ids start at 1 with every new SLURM
    directory.mkdir()
    return directory


def test_a_stop_request_checkpoints_requeues_and_resumes_exactly(tmp_path, work):
    with Slurm(tmp_path / "slurm") as slurm:
        job, run_dir = submit(slurm, work, 12)
        wait_for_epochs(run_dir, 2)
        slurm.signal(["--signal=USR1", "--batch", str(job)])
        info = slurm.wait_for(job, ENDED, timeout=240)
    log = log_of(work, job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log
    assert "stopped by SIGUSR1" in log and "requeueing" in log and "resuming" in log
    assert epochs(run_dir) == list(range(12))


def test_scancel_cancels_for_good_and_leaves_no_process_behind(tmp_path, work):
    with Slurm(tmp_path / "slurm") as slurm:
        job, run_dir = submit(slurm, work, 500)
        wait_for_epochs(run_dir, 2)
        assert her_mpi_processes(work)
        slurm.signal([str(job)])
        slurm.wait_for(job, {"CANCELLED"}, timeout=60)  # CANCELLED, no longer COMPLETING: SLURM says it is gone
        left = her_mpi_processes(work)
        rows = len(read_progress(run_dir))
        time.sleep(15)  # a requeue would have started the job again by now
        info = slurm.job(job)
    assert not left, f"processes outlived the job: {left}"
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", info
    assert len(read_progress(run_dir)) == rows < 500
    assert "not requeued" in log_of(work, job)


def test_preemption_with_the_user_signal_checkpoints_and_requeues(tmp_path, work):
    with Slurm(tmp_path / "slurm", extra=PREEMPTION) as slurm:
        job, run_dir = submit(slurm, work, 30, "--partition=low")
        wait_for_epochs(run_dir, 2)
        urgent = slurm.sbatch(["--partition=high", "--ntasks=2", "--wrap", "sleep 2"], cwd=work)
        info = slurm.wait_for(job, ENDED, timeout=300)
        assert slurm.job(urgent)["JobState"] == "COMPLETED"
    log = log_of(work, job)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, log
    assert "stopped by SIGUSR1" in log, log  # the checkpoint within the grace time, not a kill
    assert epochs(run_dir) == list(range(30))


@pytest.mark.slow
def test_the_time_limit_stops_with_a_checkpoint_and_requeues(tmp_path, work):
    # Once training runs, the limit drops to 1 minute: SIGUSR1 is due 60 s before it, i.e. at once, and
    # slurmctld sends it at its next time-limit check (every 30 s), long before 300 epochs are done.
    # Once requeued, the test (as an admin would) lifts the limit, lets the second start train a few
    # epochs from the checkpoint and cancels it: finishing all 300 would only repeat the stop-request test.
    with Slurm(tmp_path / "slurm", extra=PARTITION) as slurm:
        job, run_dir = submit(slurm, work, 300, "--signal=B:USR1@60")
        wait_for_epochs(run_dir, 2)
        slurm.command(["scontrol", "update", f"JobId={job}", "TimeLimit=1"])
        deadline = time.monotonic() + 300
        while slurm.job(job).get("Restarts", "0") == "0":
            assert time.monotonic() < deadline and slurm.job(job)["JobState"] not in ENDED, slurm.job(job)
            time.sleep(0.5)
        slurm.command(["scontrol", "update", f"JobId={job}", "TimeLimit=20"])
        first_start = len(epochs(run_dir))
        wait_for_epochs(run_dir, first_start + 3)
        slurm.signal([str(job)])
        info = slurm.wait_for(job, {"CANCELLED"}, timeout=60)
    log = log_of(work, job)
    assert info["Restarts"] == "1", log
    assert "stopped by SIGUSR1" in log and "requeueing" in log and "resuming" in log, log
    trained = epochs(run_dir)
    assert first_start < 300 and trained == list(range(len(trained))), trained  # each epoch once, none lost
