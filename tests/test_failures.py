"""Hard failures under real mpirun: a rank killed with SIGKILL (also in the middle of a checkpoint
write), a NaN in one rank's loss, a checkpoint or replay write that fails like a full disk, and
ranks that pass different keys to mean_over_ranks. Every one ends the whole job promptly with a
clear message and leaves the last complete checkpoint loadable."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import PROGRAMS, ROOT, TINY, describe, mpi_env, read_progress, run_mpi

pytestmark = pytest.mark.mpi

EXIT_NON_FINITE, EXIT_WRITE_FAILED = 3, 4


def train(args, n=2, timeout=300, **environment):
    env = mpi_env()
    env.update({k: str(v) for k, v in environment.items()})
    cmd = ["mpirun", "--oversubscribe", "-np", str(n), sys.executable, PROGRAMS / "train_signalled.py", *args]
    started = time.monotonic()
    process = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=ROOT, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # only this test's own job
        stdout, stderr = process.communicate()
        raise AssertionError(f"job still running after {timeout}s\n{stdout[-2000:]}\n{stderr[-3000:]}")
    result = subprocess.CompletedProcess(cmd, process.returncode, stdout, stderr)
    result.finished_at, result.elapsed = time.time(), time.monotonic() - started
    return result


def latest(run_dir) -> dict:
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)


def assert_resumable(run_dir, epochs: int):
    """The checkpoint on disk is complete: its replay files exist and a resume trains on from it."""
    state = latest(run_dir)
    for rank, rank_state in enumerate(state["ranks"]):
        generation = rank_state["replay_generation"]
        assert (run_dir / "checkpoints" / f"replay_rank{rank}" / f"manifest-g{generation:08d}.json").is_file()
    result = run_mpi(2, ["-m", "her_mpi.train", "--resume", run_dir, "--set", f"train.n_epochs={epochs}"])
    assert result.returncode == 0, describe(result)
    assert "empty replay buffer" not in result.stderr, describe(result)
    assert [int(r["epoch"]) for r in read_progress(run_dir)] == list(range(epochs))
    assert not list((run_dir / "checkpoints").glob(".*.tmp")), "debris of the killed write was not removed"


def test_a_rank_killed_with_sigkill_stops_the_job_within_30s(tmp_path):
    run_dir = tmp_path / "run"
    # rank 1 dies in its third cycle: epoch 2, after epoch 1's checkpoint
    result = train(["--run-dir", run_dir, "--set", "train.n_epochs=50", *TINY], KILL_AT="1:3", PID_DIR=tmp_path)
    assert result.returncode != 0, describe(result)
    killed_at = float((tmp_path / "killed_at").read_text())
    assert result.finished_at - killed_at < 30, f"the job took {result.finished_at - killed_at:.0f}s to stop"
    state = latest(run_dir)
    assert (state["epoch"], state["cycle"]) == (0, 0)
    assert_resumable(run_dir, 2)


def test_a_rank_killed_while_writing_the_checkpoint_leaves_the_previous_one(tmp_path):
    run_dir = tmp_path / "run"
    # rank 0 dies halfway through writing epoch 2's latest.pt (its second write of it)
    result = train(["--run-dir", run_dir, "--set", "train.n_epochs=50", *TINY], FAIL_WRITE="0:latest.pt:2:kill")
    assert result.returncode != 0, describe(result)
    assert list((run_dir / "checkpoints").glob(".latest.pt.*.tmp")), "the write was not interrupted"
    state = latest(run_dir)
    assert state["epoch"] == 0
    assert_resumable(run_dir, 2)


def test_a_nan_on_one_rank_stops_every_rank_without_a_poisoned_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    # TINY: 3 updates per cycle, 2 cycles per epoch, so update 8 is in epoch 2, cycle 1
    result = train_nan(run_dir, rank=1, update=8, mode="reward")
    assert result.returncode == EXIT_NON_FINITE, describe(result)
    message = result.stderr
    for part in ("non-finite gradient in network 'critic'", "epoch 2 (cycle 1/2)", "update 8",
                 "without writing a checkpoint", "latest.pt"):
        assert part in message, describe(result)
    assert "Traceback" not in message, describe(result)
    state = latest(run_dir)
    assert state["epoch"] == 0  # epoch 1's checkpoint is still latest
    for name, tensor in state["agent"]["nets"].items():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            assert torch.isfinite(tensor).all(), name
    assert [int(r["epoch"]) for r in read_progress(run_dir)] == [0]


def test_a_nan_parameter_on_one_rank_stops_every_rank(tmp_path):
    """Only rank 1 can see it: the once-per-cycle agreement makes every rank stop together.
    (Written after the last update of epoch 2's first cycle, so no gradient carries it first.)"""
    run_dir = tmp_path / "run"
    result = train_nan(run_dir, rank=1, update=9, mode="parameter")
    assert result.returncode == EXIT_NON_FINITE, describe(result)
    for part in ("non-finite parameter 'actor.", "in network 'actor' on rank 1", "epoch 2 (cycle 1/2)",
                 "found after update 9"):
        assert part in result.stderr, describe(result)
    assert latest(run_dir)["epoch"] == 0


def train_nan(run_dir, rank, update, mode):
    cmd = [PROGRAMS / "inject_nan.py", str(rank), str(update), mode, "--run-dir", run_dir,
           "--set", "train.n_epochs=3", *TINY]
    return run_mpi(2, cmd, timeout=300)


@pytest.mark.parametrize("failing, where", [("0:latest.pt:2:enospc", "latest.pt"),
                                            ("1:segment:2:enospc", "replay_rank1")])
def test_a_failing_write_names_the_path_and_keeps_the_previous_checkpoint(tmp_path, failing, where):
    run_dir = tmp_path / "run"
    result = train(["--run-dir", run_dir, "--set", "train.n_epochs=3", *TINY], FAIL_WRITE=failing)
    assert result.returncode == EXIT_WRITE_FAILED, describe(result)
    assert "No space left on device" in result.stderr and where in result.stderr, describe(result)
    assert "nothing there was replaced" in result.stderr and "Traceback" not in result.stderr, describe(result)
    assert "latest.pt (after epoch 1), is unchanged" in result.stderr, describe(result)
    state = latest(run_dir)
    assert state["epoch"] == 0
    assert not list(run_dir.rglob(".*.tmp"))
    assert_resumable(run_dir, 2)


def test_mean_over_ranks_names_keys_that_differ_between_ranks():
    result = run_mpi(2, [PROGRAMS / "mean_keys.py"], timeout=120)
    assert result.returncode == 0, describe(result)
    line = next(l for l in result.stdout.splitlines() if l.startswith("RESULT "))
    report = json.loads(line[len("RESULT "):])
    assert report["same_keys"] == {"loss": 0.5, "q": 1.0}
    first, second = report["errors"]
    assert first == second and first is not None
    assert "rank 0 lacks 'test_return'" in first and "rank 1 lacks 'q_mean'" in first


def test_a_run_directory_that_cannot_be_written_is_a_clear_error(tmp_path):
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("a file where the run directory should be")  # fails even for root
    result = run_mpi(2, ["-m", "her_mpi.train", "--run-dir", blocker / "run", "--set", "train.n_epochs=1", *TINY],
                     timeout=120)
    assert result.returncode == EXIT_WRITE_FAILED, describe(result)
    assert str(blocker / "run") in result.stderr and "Traceback" not in result.stderr, describe(result)


def start_watched_job(tmp_path, hang_timeout_s: float, n_epochs: int) -> subprocess.Popen:
    """A tiny 2-rank training with a short hang timeout, its rank pids in tmp_path, two epochs done."""
    env = mpi_env()
    env["PID_DIR"] = str(tmp_path)
    cmd = ["mpirun", "--oversubscribe", "-np", "2", sys.executable, PROGRAMS / "train_signalled.py", "--run-dir",
           tmp_path / "run", "--set", f"train.n_epochs={n_epochs}", "--set", f"train.hang_timeout_s={hang_timeout_s}",
           *TINY]
    process = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 120
    while not ((tmp_path / "run" / "progress.csv").is_file() and len(read_progress(tmp_path / "run")) >= 2):
        if time.monotonic() > deadline or process.poll() is not None:
            os.killpg(process.pid, signal.SIGKILL)
            raise AssertionError(f"training did not start: {process.communicate()}")
        time.sleep(0.2)
    return process


def rank_pid(tmp_path, rank: int) -> int:
    return int((tmp_path / f"rank{rank}.pid").read_text())


def test_a_frozen_rank_ends_the_job_with_exit_5_naming_it(tmp_path):
    run_dir, timeout = tmp_path / "run", 10
    process = start_watched_job(tmp_path, timeout, 200)
    try:
        os.kill(rank_pid(tmp_path, 1), signal.SIGSTOP)  # a hung rank
        stopped = time.monotonic()
        stdout, stderr = process.communicate(timeout=timeout + 60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    waited = time.monotonic() - stopped
    assert process.returncode == 5, stderr
    assert waited < timeout + 15, f"{waited:.0f} s"
    assert "rank 1 did not answer" in stderr and "train.hang_timeout_s" in stderr
    record = json.loads((run_dir / "status.json").read_text())
    assert record["state"] == "hung" and record["silent_ranks"] == [1]
    assert latest(run_dir)["epoch"] >= 1  # the last checkpoint, intact


def test_a_job_suspended_as_a_whole_for_longer_than_the_timeout_trains_on(tmp_path):
    # SLURM's scontrol suspend (gang scheduling) stops every process of a job: the time every rank
    # spent stopped is nobody's silence. Rank 0 is stopped while it waits for rank 1 in a collective,
    # and resumed first: its watchdog wakes to a wait far longer than the timeout, nearly all of it
    # spent stopped itself.
    process = start_watched_job(tmp_path, hang_timeout_s=4, n_epochs=5)
    try:
        rank0, rank1 = rank_pid(tmp_path, 0), rank_pid(tmp_path, 1)
        os.kill(rank1, signal.SIGSTOP)
        time.sleep(2)  # rank 0 reaches its next collective and waits there
        os.kill(rank0, signal.SIGSTOP)
        time.sleep(10)
        os.kill(rank0, signal.SIGCONT)
        time.sleep(0.5)
        os.kill(rank1, signal.SIGCONT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, stderr
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "finished"
