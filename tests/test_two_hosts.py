"""Training across two hosts, and what happens when one of them is lost, cut off or frozen.

The hosts are simulated on this machine (tests/fake_hosts.py: a UTS namespace each, entered by an
ssh stand-in, inside a network namespace of the test's own); every launch is a real ``mpirun
--hostfile``. The failure tests run the job as users are told to on a cluster, through
``python -m her_mpi.launch``, which decides from the run record how the job ended.
"""

import json
import signal
import time

import pytest
import torch

from helpers import PROGRAMS, TINY, describe, learning_rows, read_progress, run_mpi
from fake_hosts import FakeCluster, missing_requirements

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(missing_requirements() is not None, reason=str(missing_requirements()))]

HANG_TIMEOUT_S = 15


@pytest.fixture
def cluster(tmp_path):
    with FakeCluster(tmp_path / "hosts") as hosts:
        yield hosts


def train_args(run_dir, *extra) -> list:
    return ["-m", "her_mpi.train", "--run-dir", run_dir, *TINY, *extra]


def supervised(command: list, grace: float = 5) -> list:
    import sys
    return [sys.executable, "-m", "her_mpi.launch", "--grace", str(grace), "--", *command]


def record(run_dir) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def wait_for_epochs(run_dir, n: int, job, timeout: float = 180) -> None:
    """Until the checkpoint of epoch ``n`` is on disk (its progress row is written just before)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "progress.csv").is_file() and len(read_progress(run_dir)) > n:
            return
        if job.poll() is not None:
            raise AssertionError(f"the job ended (exit {job.returncode}) before epoch {n}\n{job_log(run_dir)}")
        time.sleep(0.2)
    raise AssertionError(f"no epoch {n + 1} within {timeout} s\n{job_log(run_dir)}")


def job_log(run_dir) -> str:
    """What the job printed (its log lies beside the run directory)."""
    log = run_dir.parent / "job.log"
    return log.read_text() if log.is_file() else "(no job.log)"


def training_job(cluster, tmp_path, *extra):
    """A supervised 100-epoch job across both hosts, once it has checkpointed epoch 1: ``(job, run_dir)``."""
    run_dir = tmp_path / "run"
    job = cluster.start(supervised(cluster.mpirun(2, train_args(run_dir, "--set", "train.n_epochs=100", *extra))),
                        run_dir.parent / "job.log")
    wait_for_epochs(run_dir, 1, job)
    return job, run_dir


def finish(job, timeout: float):
    """Wait for the job; returns seconds waited."""
    started = time.monotonic()
    try:
        job.wait(timeout=timeout)
    except Exception:
        job.kill()
        raise AssertionError(f"the job did not end within {timeout} s")
    return time.monotonic() - started


def left_behind(cluster, *hosts, timeout: float = 10) -> list[int]:
    """The processes still alive on ``hosts`` after ``timeout`` seconds (they should all have ended)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for host in hosts for pid in cluster.host_pids(host)]
        if not alive or time.monotonic() > deadline:
            print(f"left behind on {hosts}: {alive} ({timeout - deadline + time.monotonic():.1f} s)")
            return alive
        time.sleep(0.2)


def test_ranks_on_two_hosts_share_no_memory(cluster):
    result = cluster.run(cluster.mpirun(2, [PROGRAMS / "hosts.py"]))
    assert result.returncode == 0, describe(result)
    line = next(l for l in result.stdout.splitlines() if l.startswith("RESULT "))
    assert json.loads(line[len("RESULT "):])["names"] == ["node-a", "node-b"]
    # the negative control: with shared memory as the only transport, ranks on two hosts cannot meet
    only_shared_memory = cluster.run(cluster.mpirun(2, [PROGRAMS / "hosts.py"], btl="sm,self"))
    assert only_shared_memory.returncode != 0, describe(only_shared_memory)
    assert "RESULT" not in only_shared_memory.stdout


def test_training_across_two_hosts_matches_one_host(cluster, tmp_path):
    two_hosts = cluster.run(cluster.mpirun(2, train_args(tmp_path / "two", "--set", "train.n_epochs=2")))
    assert two_hosts.returncode == 0, describe(two_hosts)
    assert "on 2 rank(s) (2 hosts: node-a x1, node-b x1)" in two_hosts.stdout
    one_host = run_mpi(2, train_args(tmp_path / "one", "--set", "train.n_epochs=2"))
    assert one_host.returncode == 0, describe(one_host)
    two = learning_rows(tmp_path / "two")
    assert len(two) == 2 and two == learning_rows(tmp_path / "one")
    assert record(tmp_path / "two")["state"] == "finished"


def test_a_killed_host_ends_the_job_and_a_resume_continues_on_one_host(cluster, tmp_path):
    job, run_dir = training_job(cluster, tmp_path)
    cluster.signal_host("node-b", signal.SIGKILL)  # its daemon and its rank
    waited = finish(job, timeout=60)
    log = job_log(run_dir)
    assert waited < 30, log
    assert job.returncode == 6, log  # lost: the record still said running
    assert record(run_dir)["state"] == "lost"
    assert not left_behind(cluster, "node-a"), "a rank outlived its job"
    epoch = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["epoch"]
    assert epoch >= 1
    resumed = run_mpi(2, ["-m", "her_mpi.train", "--resume", run_dir, "--set", f"train.n_epochs={epoch + 3}"])
    assert resumed.returncode == 0, describe(resumed)
    assert "empty replay buffer" not in resumed.stderr, describe(resumed)
    assert [int(r["epoch"]) for r in read_progress(run_dir)] == list(range(epoch + 3))
    assert record(run_dir)["state"] == "finished"


def test_a_lost_launcher_connection_is_not_taken_for_a_finished_run(cluster, tmp_path):
    job, run_dir = training_job(cluster, tmp_path)
    import os
    os.kill(cluster.agent_pid("node-b"), signal.SIGKILL)  # the "ssh" to node-b dies; node-b itself lives on
    finish(job, timeout=60)
    log = job_log(run_dir)
    # lost whether the ranks died with their daemon or checkpointed on mpirun's SIGTERM in time: nobody
    # asked them to stop
    assert job.returncode == 6, log
    assert record(run_dir)["state"] == "lost", log
    assert len(read_progress(run_dir)) < 100, log
    assert not left_behind(cluster, "node-a", "node-b"), f"a rank outlived its job\n{log}"


def test_a_frozen_host_ends_the_job_by_itself_naming_the_silent_rank(cluster, tmp_path):
    job, run_dir = training_job(cluster, tmp_path, "--set", f"train.hang_timeout_s={HANG_TIMEOUT_S}")
    checkpoint_before = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["epoch"]
    frozen = cluster.signal_host("node-b", signal.SIGSTOP)  # a hung node: its daemon and rank stop answering
    waited = finish(job, timeout=HANG_TIMEOUT_S + 60)
    log = job_log(run_dir)
    assert frozen and job.returncode == 5, log
    # the timeout, the peers' reply window, the launcher's grace and a few polls
    assert waited < HANG_TIMEOUT_S + 25, log
    status = record(run_dir)
    assert status["state"] == "hung" and status["silent_ranks"] == [1], status
    assert "rank 1 did not answer" in log
    assert not left_behind(cluster, "node-a"), "the healthy host's rank did not end"
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert state["epoch"] >= checkpoint_before
