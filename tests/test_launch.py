"""The run record (her_mpi.run_status) and the supervisor that reads it (her_mpi.launch)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, mpi_env
from her_mpi import run_status
from her_mpi.launch import training_run_dir


def launch(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "her_mpi.launch", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=mpi_env(), cwd=ROOT)


def test_a_launcher_status_of_0_without_a_finished_record_is_a_lost_run(tmp_path):
    run_status.write(tmp_path, "running", "training")
    verdict = run_status.verdict(tmp_path, 0)
    assert (verdict.state, verdict.exit_status, verdict.retry) == ("lost", 6, True)


@pytest.mark.parametrize("state, status, retry", [("finished", 0, False), ("stopped", 75, True), ("hung", 5, True),
                                                  ("crashed", 1, False), ("non_finite", 3, False),
                                                  ("write_failed", 4, False)])
def test_the_record_decides_whatever_the_launcher_said(tmp_path, state, status, retry):
    run_status.write(tmp_path, state, "why")
    for launcher_status in (0, 1, 137):
        verdict = run_status.verdict(tmp_path, launcher_status)
        assert (verdict.state, verdict.exit_status, verdict.retry) == (state, status, retry)


def test_open_mpis_failed_start_is_a_lost_job_that_points_to_its_known_cause(tmp_path):
    verdict = run_status.verdict(tmp_path, 213)
    assert (verdict.state, verdict.exit_status, verdict.retry) == ("lost", 6, True)
    assert "listener thread failed to start" in verdict.message and "docs/clusters.md" in verdict.message
    assert "docs/clusters.md" not in run_status.verdict(tmp_path, 137).message


def test_a_record_older_than_the_job_is_not_its_word(tmp_path):
    run_status.write(tmp_path, "stopped", "an earlier job")
    os.utime(run_status.record_path(tmp_path), (time.time() - 60, time.time() - 60))
    # this job failed on bad input before writing a record: not "stopped" (a requeue would loop)
    assert run_status.verdict(tmp_path, 2, started_after=time.time()).state == "bad_input"
    # however recent the earlier record: bad input writes none
    run_status.write(tmp_path, "finished", "an earlier job, a moment ago")
    assert run_status.verdict(tmp_path, 2, started_after=time.time()).state == "bad_input"


def test_an_unknown_state_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown run state 'done'"):
        run_status.write(tmp_path, "done")


def test_the_run_directory_is_read_from_the_training_command(tmp_path):
    assert training_run_dir(["mpirun", "python", "-m", "her_mpi.train", "--run-dir", "runs/a"]) == Path("runs/a")
    assert str(training_run_dir(["python", "-m", "her_mpi.train", "--resume=runs/b"])) == "runs/b"
    checkpoint = tmp_path / "run" / "checkpoints" / "latest.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"")
    assert training_run_dir(["--resume", str(checkpoint)]) == tmp_path / "run"
    assert training_run_dir(["mpirun", "python", "-m", "her_mpi.train"]) is None


@pytest.mark.parametrize("args, message", [
    ([], "no command given"),
    (["--", "mpirun", "python", "-m", "her_mpi.train"], "names no run directory"),
    (["--grace", "-1", "--", "true", "--run-dir", "x"], "--grace -1"),
    (["--", "no-such-launcher", "--run-dir", "x"], "cannot run 'no-such-launcher'"),
])
def test_bad_input_is_named(args, message):
    result = launch(*args)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_a_launcher_that_says_0_for_an_unfinished_run_is_reported_lost(tmp_path):
    # a "launcher" that starts the run and exits 0 without finishing it (what mpirun does when it loses a host)
    script = f"from her_mpi import run_status; run_status.write({str(tmp_path)!r}, 'running', 'training')"
    result = launch("--", sys.executable, "-c", script, "--run-dir", tmp_path)
    assert result.returncode == 6, result.stderr
    assert "lost (exit 6; launcher exit 0)" in result.stderr
    assert json.loads(run_status.record_path(tmp_path).read_text())["state"] == "lost"


@pytest.mark.parametrize("signals, state, status", [(["SIGTERM"], "lost", 6), (["SIGUSR1"], "stopped", 75),
                                                    (["SIGTERM", "SIGUSR1"], "stopped", 75)])
def test_a_stop_nobody_asked_for_is_a_lost_host(tmp_path, signals, state, status):
    # mpirun that loses a host's daemon ends every rank with SIGTERM, and they may checkpoint in time:
    # a "stopped" record that no stop request passed through this supervisor is a lost host
    script = (f"from her_mpi import run_status; run_status.write({str(tmp_path)!r}, 'stopped', 'stopped by it', "
              f"signals={signals!r})")
    result = launch("--", sys.executable, "-c", script, "--run-dir", tmp_path)
    assert result.returncode == status, result.stderr
    assert json.loads(run_status.record_path(tmp_path).read_text())["state"] == state
    if state == "lost":
        assert "a signal her_mpi.launch did not pass on (launcher exit status 0)" in result.stderr
        assert "stopped by it" in result.stderr


def test_a_stop_passed_on_by_the_supervisor_stays_a_stop(tmp_path):
    script = f"""
import signal, sys, time
from her_mpi import run_status
def stop(signum, frame):
    run_status.write({str(tmp_path)!r}, "stopped", "stopped by SIGTERM", signals=["SIGTERM"])
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
run_status.write({str(tmp_path)!r}, "running", "training")
time.sleep(60)
"""
    job = subprocess.Popen([sys.executable, "-m", "her_mpi.launch", "--", sys.executable, "-c", script,
                            "--run-dir", str(tmp_path)], stderr=subprocess.PIPE, text=True, env=mpi_env(), cwd=ROOT)
    deadline = time.monotonic() + 30
    while run_status.read(tmp_path) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=30)
    assert job.returncode == 75, stderr
    assert run_status.read(tmp_path)["state"] == "stopped"


def test_a_rank_still_checkpointing_when_its_launcher_exits_is_waited_for(tmp_path):
    # mpirun exits 0 while the rank it sent SIGTERM still writes its checkpoint; the rank's word lands
    # after the launcher is gone, and the verdict must be made from it, not from "running"
    late_stop = (f"import time; from her_mpi import run_status; time.sleep(2); "
                 f"run_status.write({str(tmp_path)!r}, 'stopped', 'checkpointed late', signals=['SIGTERM'])")
    script = (f"import subprocess, sys; from her_mpi import run_status; "
              f"run_status.write({str(tmp_path)!r}, 'running', 'training'); "
              f"subprocess.Popen([sys.executable, '-c', {late_stop!r}], start_new_session=True)")
    result = launch("--", sys.executable, "-c", script, "--run-dir", tmp_path)
    assert result.returncode == 6, result.stderr
    assert "checkpointed late" in result.stderr, result.stderr  # judged from the rank's record
    assert run_status.read(tmp_path)["state"] == "lost"


def test_a_rank_finishing_after_the_launchers_verdict_leaves_it_standing(tmp_path, capsys):
    from her_mpi.train import RunRecord

    run_status.write(tmp_path, "lost", "an earlier job", launcher_exit_status=0)
    os.utime(run_status.record_path(tmp_path), (time.time() - 60, time.time() - 60))
    run = RunRecord()
    run.run_dir = tmp_path
    run.write("stopped", "stopped by SIGTERM")  # an earlier job's verdict is no word on this one
    assert run_status.read(tmp_path)["state"] == "stopped"
    run_status.write(tmp_path, "lost", "the job ended while its record said running", launcher_exit_status=0)
    run.write("stopped", "stopped by SIGTERM")
    assert run_status.read(tmp_path)["state"] == "lost"
    assert "already recorded this job as lost; not replacing it with stopped" in capsys.readouterr().err
