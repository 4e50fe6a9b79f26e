"""Exact resume under real mpirun: a run stopped (by a real signal, at an epoch's end or in the
middle of one) and resumed on as many ranks continues bit-identically to the run never stopped:
parameters, optimizer and K-FAC state, normalizers, replay contents and priorities, every RNG
stream, counters and the progress rows (timing columns aside)."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import yaml

from helpers import PROGRAMS, ROOT, TINY, describe, learning_rows, mpi_env, read_progress, run_mpi

pytestmark = pytest.mark.mpi

EXIT_PREEMPTED = 75
# What differs between an interrupted and an uninterrupted run by design: where files are, when
# they were written, how many saves happened (each stop writes one more).
NOT_COMPARED = {"path", "time_s", "generation", "replay_generation", "elapsed_s", "timing", "new_env_steps"}


def flat_digest(value, prefix="") -> dict[str, str]:
    """Every leaf of a checkpoint, tensors as a digest of their dtype, shape and bytes."""
    out = {}
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in NOT_COMPARED:
                out.update(flat_digest(item, f"{prefix}{key}/"))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            out.update(flat_digest(item, f"{prefix}{i}/"))
    elif isinstance(value, torch.Tensor):
        data = value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b""
        out[prefix] = f"{value.dtype}{tuple(value.shape)}:" + hashlib.sha1(data).hexdigest()
    else:
        out[prefix] = repr(value)
    return out


def replay_contents(run_dir, rank: int, generation: int) -> dict[str, str]:
    """A rank's replay buffer rebuilt from its files (independently of her_mpi's loader)."""
    directory = run_dir / "checkpoints" / f"replay_rank{rank}"
    manifest = json.loads((directory / f"manifest-g{generation:08d}.json").read_text())
    capacity = manifest["ring"]["capacity"]
    arrays = {name: np.zeros([capacity, *shape], dtype) for name, (dtype, shape) in manifest["fields"].items()}
    for segment in manifest["segments"]:
        with np.load(directory / segment["file"], allow_pickle=False) as data:
            for name, array in arrays.items():
                array[data["slots"]] = data[name]
    digest = {name: hashlib.sha1(a.tobytes()).hexdigest() for name, a in arrays.items()}
    digest["ring"] = repr(manifest["ring"])
    if manifest["priorities"]:
        digest["priorities"] = hashlib.sha1(np.load(directory / manifest["priorities"]).tobytes()).hexdigest()
    return digest


def final_state(run_dir) -> dict:
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    digest = flat_digest(state)
    for rank, rank_state in enumerate(state["ranks"]):
        if rank_state["replay_generation"] is not None:
            for key, value in replay_contents(run_dir, rank, rank_state["replay_generation"]).items():
                digest[f"replay{rank}/{key}"] = value
    return digest


def assert_same_run(reference, resumed):
    rows_a, rows_b = learning_rows(reference), learning_rows(resumed)
    assert rows_a == rows_b, f"progress rows differ:\n{rows_a}\n{rows_b}"
    a, b = final_state(reference), final_state(resumed)
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    differing = sorted(k for k in a if a[k] != b[k])
    assert not differing, f"{len(differing)} of {len(a)} checkpoint entries differ: {differing[:20]}"
    return a


def train(run_dir, args, n=2, **environment):
    """Run tests/programs/train_signalled.py under mpirun with SIGNAL_AT etc. in the environment."""
    env = mpi_env()
    env.update(environment)
    cmd = ["mpirun", "--oversubscribe", "-np", str(n), sys.executable, PROGRAMS / "train_signalled.py",
           *map(str, args)]
    started = time.monotonic()
    result = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    result.elapsed = time.monotonic() - started
    return result


OFF_POLICY = ["--set", "algo=td3", "--set", "algo.optimizer=kfac", "--set", "algo.kfac.factor_every=1",
              "--set", "algo.kfac.inverse_every=2", "--set", "replay.prioritized=true", *TINY]


def test_off_policy_resume_is_exact_after_an_epoch_end_and_a_mid_epoch_stop(tmp_path):
    """TD3 + K-FAC + prioritized replay. Stop 1: SIGTERM on rank 1 during the last cycle of epoch 1
    (checkpoint at the epoch's end). Stop 2: SIGINT on rank 0 during the first cycle of epoch 2
    (checkpoint in the middle of the epoch). Then finish, and compare with a run never stopped."""
    schedule = ["--set", "train.n_epochs=3", *OFF_POLICY]
    reference = tmp_path / "reference"
    result = train(reference, ["--run-dir", reference, *schedule])
    assert result.returncode == 0, describe(result)

    run_dir = tmp_path / "stopped"
    result = train(run_dir, ["--run-dir", run_dir, *schedule], SIGNAL_AT="1:2:SIGTERM")
    assert result.returncode == EXIT_PREEMPTED, describe(result)
    assert "stopped by SIGTERM on rank 1" in result.stderr and f"--resume {run_dir}" in result.stderr, describe(result)
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert (state["epoch"], state["cycle"]) == (0, 0)  # epoch 1 finished, nothing of epoch 2

    result = train(run_dir, ["--resume", run_dir], SIGNAL_AT="0:1:SIGINT")
    assert result.returncode == EXIT_PREEMPTED, describe(result)
    assert "stopped by SIGINT on rank 0" in result.stderr, describe(result)
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert (state["epoch"], state["cycle"]) == (0, 1)  # one of epoch 2's two cycles done
    assert [int(r["epoch"]) for r in read_progress(run_dir)] == [0]

    result = run_mpi(2, ["-m", "her_mpi.train", "--resume", run_dir])
    assert result.returncode == 0, describe(result)
    digest = assert_same_run(reference, run_dir)
    # the comparison covered what exact resume promises
    for part in ("agent/nets/critic", "agent/optimizers/critic/factors", "agent/optimizers/actor/optimizer/state",
                 "ranks/1/rng/agent/torch", "ranks/0/rng/train_envs/0/np_random", "ranks/1/rng/torch_global",
                 "replay0/obs", "replay1/priorities", "replay1/ring", "ranks/0/pending"):
        assert any(k.startswith(part) for k in digest), part
    # the resumes are on record, the original config is kept
    resumes = yaml.safe_load((run_dir / "resumes.yaml").read_text())
    assert [r["from_checkpoint"]["cycle"] for r in resumes] == [0, 1]
    assert resumes[0]["n_ranks"] == 2 and resumes[0]["overrides"] == []
    assert (run_dir / "config.yaml").read_text() == (reference / "config.yaml").read_text()
    # and what the run was made with: the versions installed here
    made_with = yaml.safe_load((run_dir / "provenance.yaml").read_text())
    assert made_with["packages"]["numpy"] == np.__version__ and made_with["packages"]["torch"] == torch.__version__
    assert resumes[1]["provenance"]["packages"] == made_with["packages"]


def test_on_policy_resume_is_exact_after_a_mid_epoch_stop(tmp_path):
    """HTRPO on 8-bit flipping, stopped by SIGTERM on both ranks in the middle of epoch 2."""
    schedule = ["--config", "bitflip_8_htrpo", "--set", "train.n_epochs=2", "--set", "train.n_cycles=3",
                "--set", "train.rollouts_per_rank=8", "--set", "train.n_test_episodes=4",
                "--set", "log.tensorboard=false"]
    reference = tmp_path / "reference"
    result = run_mpi(2, ["-m", "her_mpi.train", "--run-dir", reference, *schedule])
    assert result.returncode == 0, describe(result)
    run_dir = tmp_path / "stopped"
    result = train(run_dir, ["--run-dir", run_dir, *schedule], SIGNAL_AT="0:4:SIGTERM,1:4:SIGTERM")
    assert result.returncode == EXIT_PREEMPTED, describe(result)
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert (state["epoch"], state["cycle"]) == (0, 1)
    older = tmp_path / "older"  # the same stop, as written by code that did not report "ess" yet
    shutil.copytree(run_dir, older)
    for rank_state in state["ranks"]:
        for cycle_metrics in rank_state["progress"]["metrics"]:
            del cycle_metrics["ess"]
    torch.save(state, older / "checkpoints" / "latest.pt")
    # asked for fewer epochs than it finished, the stopped run trains nothing and its record says epoch 1 as
    # progress.csv has it (the mid-epoch checkpoint's step count includes part of epoch 2)
    lowered = tmp_path / "lowered"
    shutil.copytree(run_dir, lowered)
    progress = read_progress(lowered)
    result = run_mpi(2, ["-m", "her_mpi.train", "--resume", lowered, "--set", "train.n_epochs=1"])
    assert result.returncode == 0, describe(result)
    assert "the run has 1 epochs done and train.n_epochs = 1: nothing to train" in result.stdout, describe(result)
    record = json.loads((lowered / "status.json").read_text())
    assert read_progress(lowered) == progress
    assert (record["state"], record["epoch"], record["env_steps"]) == ("finished", 1, int(progress[0]["env_steps"]))
    assert record["env_steps"] < state["env_steps"]
    result = run_mpi(2, ["-m", "her_mpi.train", "--resume", run_dir])
    assert result.returncode == 0, describe(result)
    digest = assert_same_run(reference, run_dir)
    assert any(k.startswith("agent/nets/policy") for k in digest)
    assert any(k.startswith("agent/optimizers/value") for k in digest)
    # a metric that the cycles restored from the checkpoint lack still reaches that epoch's row
    result = run_mpi(2, ["-m", "her_mpi.train", "--resume", older])
    assert result.returncode == 0, describe(result)
    assert all(row["ess"] not in ("", "nan") for row in read_progress(older))


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_sigusr1_to_mpirun_and_sigterm_to_a_rank_stop_with_a_checkpoint(tmp_path):
    """From outside, as a scheduler does. Open MPI's mpirun forwards SIGUSR1 to every rank (its
    own SIGTERM kills them at once); SLURM and srun send SIGTERM to the ranks themselves."""
    for how in ("SIGUSR1 to mpirun", "SIGTERM to rank 1"):
        run_dir = tmp_path / how.replace(" ", "_")
        env = mpi_env()
        env["PID_DIR"] = str(tmp_path / "pids")
        cmd = ["mpirun", "--oversubscribe", "-np", "2", sys.executable, PROGRAMS / "train_signalled.py",
               "--run-dir", run_dir, "--set", "train.n_epochs=100", *TINY]
        process = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=env, cwd=ROOT, start_new_session=True)
        try:
            wait_for(lambda: (run_dir / "checkpoints" / "latest.pt").is_file(), 300, "the first checkpoint")
            if how.endswith("mpirun"):
                os.kill(process.pid, signal.SIGUSR1)
            else:
                os.kill(int((tmp_path / "pids" / "rank1.pid").read_text()), signal.SIGTERM)
            stdout, stderr = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        assert process.returncode == EXIT_PREEMPTED, f"{how}: exit {process.returncode}\n{stdout[-2000:]}\n{stderr[-3000:]}"
        name = how.split()[0]
        assert f"stopped by {name}" in stderr and "--resume" in stderr, stderr[-3000:]
        state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
        epochs = [int(r["epoch"]) for r in read_progress(run_dir)]
        assert epochs == list(range(state["epoch"] + 1))  # rows up to the checkpoint, none past it
        assert state["epoch"] + 1 < 100
        result = run_mpi(2, ["-m", "her_mpi.train", "--resume", run_dir, "--set", f"train.n_epochs={state['epoch'] + 2}"])
        assert result.returncode == 0, describe(result)
        assert [int(r["epoch"]) for r in read_progress(run_dir)] == list(range(state["epoch"] + 2))


def test_resume_on_another_number_of_ranks_from_the_middle_of_an_epoch(tmp_path):
    """2 ranks stopped after one of epoch 2's cycles, resumed on 1: it says what it cannot restore,
    keeps old rank 0's replay buffer, and counts every env step once."""
    run_dir = tmp_path / "run"
    result = train(run_dir, ["--run-dir", run_dir, "--set", "train.n_epochs=2", *TINY], SIGNAL_AT="0:3:SIGTERM")
    assert result.returncode == EXIT_PREEMPTED, describe(result)
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert (state["epoch"], state["cycle"], state["env_steps"]) == (0, 1, 600)  # 400 + one cycle of 2 x 2 x 50
    result = run_mpi(1, ["-m", "her_mpi.train", "--resume", run_dir])
    assert result.returncode == 0, describe(result)
    for part in ("resuming on a different number of ranks; not restored", "each rank's random streams",
                 "the replay buffers of old ranks 1..1", "the metrics of the first 1 cycles of epoch 2"):
        assert part in result.stderr, describe(result)
    assert "empty replay buffer" not in result.stderr, describe(result)
    first, second = read_progress(run_dir)
    assert (int(second["env_steps"]), int(second["n_ranks"])) == (700, 1)
    assert int(second["updates"]) == 2 * 3 * 2
    resumes = yaml.safe_load((run_dir / "resumes.yaml").read_text())
    assert resumes[-1]["n_ranks"] == 1 and resumes[-1]["from_checkpoint"]["n_ranks"] == 2
