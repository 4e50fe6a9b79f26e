"""Normalizer arithmetic on one rank (the cross-rank sync is tested under mpirun)."""

import numpy as np
import torch

from her_mpi.normalizer import Normalizer


def test_mean_std_match_numpy_after_several_batches():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, (1000, 4))
    norm = Normalizer(4, eps=0.01, clip=5.0)
    for chunk in np.array_split(data, 7):
        norm.observe(chunk)
        norm.sync()
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.std.numpy(), data.std(0), rtol=1e-4)


def test_std_floor_clip_and_raw_clip():
    norm = Normalizer(2, eps=0.5, clip=2.0, clip_raw=10.0)
    norm.observe(np.array([[1.0, 1.0], [1.0, 1.0]]))
    norm.sync()
    assert np.allclose(norm.std.numpy(), 0.5)  # constant input: std floored at eps
    out = norm(torch.tensor([[1.5, 1000.0]]))
    assert np.allclose(out.numpy(), [[1.0, 2.0]])  # (1.5-1)/0.5 = 1; 1000 -> 10 -> clipped to 2


def test_pending_statistics_only_apply_at_sync():
    norm = Normalizer(1)
    norm.observe(np.array([[4.0], [6.0]]))
    assert norm.mean.item() == 0.0
    norm.sync()
    assert norm.mean.item() == 5.0


def test_state_dict_round_trip_restores_totals():
    norm = Normalizer(3)
    norm.observe(np.random.default_rng(1).normal(size=(50, 3)))
    norm.sync()
    copy = Normalizer(3)
    copy.load_state_dict(norm.state_dict())
    np.testing.assert_array_equal(copy.total, norm.total)
    np.testing.assert_array_equal(copy.mean.numpy(), norm.mean.numpy())


def test_beyond_clip_marks_the_inputs_the_clip_cuts_and_agrees_with_the_forward_pass():
    from her_mpi.nets import GoalConditionedInput
    from her_mpi.settings import NormalizerConfig

    inputs = GoalConditionedInput(2, 1, NormalizerConfig(clip=2.0))
    inputs.observe(np.array([[0.0, 0.0], [2.0, 2.0]]), np.array([[0.0], [2.0]]))  # mean 1, std 1
    inputs.sync()
    obs, goal = np.array([[1.5, 3.5], [-1.5, 1.0]]), np.array([[1.0], [4.0]])
    marked = inputs.beyond_clip(obs, goal)
    assert marked.tolist() == [[False, True, False], [True, False, True]]
    out = inputs(torch.tensor(obs, dtype=torch.float32), torch.tensor(goal, dtype=torch.float32)).numpy()
    assert np.array_equal(np.abs(out) == 2.0, marked)


def test_training_says_once_when_test_inputs_stay_beyond_the_clip(tmp_path, capsys):
    import csv

    from her_mpi.config import load_config
    from her_mpi.trainer import CLIPPED_INPUTS_EPOCHS, Trainer

    # a clip of 0.01 std cuts nearly every input of every step
    config = load_config("fetch_reach_ddpg", ["train.n_epochs=5", "train.n_cycles=1", "train.n_batches=1",
                                              "train.n_test_episodes=2", "normalizer.clip=0.01",
                                              "log.tensorboard=false"])
    trainer = Trainer(config, tmp_path / "run")
    try:
        trainer.run()
    finally:
        trainer.close()
    warnings = [line for line in capsys.readouterr().out.splitlines() if "beyond normalizer.clip=0.01" in line]
    assert len(warnings) == 1 and f"for {CLIPPED_INPUTS_EPOCHS} epochs" in warnings[0]
    assert f"in epoch {CLIPPED_INPUTS_EPOCHS})" in warnings[0] and "observation[" in warnings[0]
    rows = list(csv.DictReader(open(tmp_path / "run" / "progress.csv")))
    assert len(rows) == 5 and all(float(row["inputs_clipped"]) > 0.9 for row in rows)
