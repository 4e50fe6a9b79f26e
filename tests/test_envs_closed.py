"""Training and evaluation close the envs they open (simulators, renderers), however they end, and
leave the process's floating-point mode as they found it."""

from her_mpi import evaluate, train
from her_mpi.rollout import RolloutWorker
from her_mpi.process_tuning import denormals_flushed

BIT_FLIPPING = ["--set", "algo=dqn", "--set", "env.id=BitFlipping-v0", "--set", "env.kwargs={n_bits: 4}",
                "--set", "train.n_epochs=1", "--set", "train.n_cycles=1", "--set", "train.n_batches=2",
                "--set", "train.batch_size=8", "--set", "train.n_test_episodes=2", "--set", "replay.size=100",
                "--set", "log.tensorboard=false"]


def test_training_and_evaluation_close_their_envs(tmp_path, monkeypatch):
    closed = []
    close = RolloutWorker.close
    monkeypatch.setattr(RolloutWorker, "close", lambda worker: (closed.append(worker), close(worker))[1])
    run_dir = tmp_path / "run"
    assert train.main(["--run-dir", str(run_dir), *BIT_FLIPPING]) == 0
    assert len(closed) == 2  # the training and the test envs
    assert not denormals_flushed()  # flushed for speed while training only (hypothesis needs subnormals)
    assert train.main(["--run-dir", str(run_dir), *BIT_FLIPPING]) == train.EXIT_BAD_INPUT  # a run is there
    assert len(closed) == 2  # refused before any env was made
    assert evaluate.main(["--checkpoint", str(run_dir), "--episodes", "2"]) == 0
    assert len(closed) == 3
