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
