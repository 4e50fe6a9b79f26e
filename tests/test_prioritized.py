"""Sum tree and prioritized replay: sampling frequencies, totals, importance weights."""

import numpy as np
import pytest

from her_mpi.replay.buffer import PrioritySampler, ReplayBuffer
from her_mpi.replay.sum_tree import SumTree
from test_replay import sparse_reward, tagged_episodes


def test_sampled_frequencies_match_priorities():
    priorities = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 0.5, 0.0, 9.5])
    tree = SumTree(len(priorities))
    tree.update(np.arange(len(priorities)), priorities)
    rng = np.random.default_rng(0)
    n = 200_000
    counts = np.bincount(np.concatenate([tree.sample(1000, rng) for _ in range(n // 1000)]), minlength=8)
    expected = n * priorities / priorities.sum()
    assert counts[0] == counts[6] == 0  # zero priority: never sampled
    chi2 = np.sum((counts - expected)[expected > 0] ** 2 / expected[expected > 0])
    assert chi2 < 25.0, (counts, expected)  # 5 dof: p ~ 1e-4


def test_total_and_min_stay_right_through_updates():
    rng = np.random.default_rng(1)
    tree = SumTree(1000)  # not a power of two
    values = np.zeros(1000)
    for _ in range(200):
        idx = rng.integers(0, 1000, 37)  # duplicates included: the last write wins
        new = rng.random(37) * 10
        tree.update(idx, new)
        for i, v in zip(idx, new):
            values[i] = v
    assert tree.total == pytest.approx(values.sum(), rel=1e-12)
    assert tree.min == pytest.approx(values[values > 0].min())
    np.testing.assert_allclose(tree.get(np.arange(1000)), values)


def test_find_is_the_prefix_sum_search():
    tree = SumTree(5)
    tree.update(np.arange(5), [1.0, 0.0, 2.0, 3.0, 1.0])
    # intervals: [0,1) -> 0, [1,3) -> 2, [3,6) -> 3, [6,7) -> 4
    np.testing.assert_array_equal(tree.find(np.array([0.0, 0.99, 1.0, 2.99, 3.0, 5.99, 6.0, 6.99])),
                                  [0, 0, 2, 2, 3, 3, 4, 4])


def test_bad_priorities_are_rejected():
    tree = SumTree(4)
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.update([0], [-1.0])
    with pytest.raises(IndexError, match=r"out of range \[0, 4\)"):
        tree.update([4], [1.0])
    with pytest.raises(IndexError, match=r"out of range \[0, 5\)"):  # a leaf the tree has room for, past capacity
        SumTree(5).update([5], [1.0])
    with pytest.raises(ValueError, match="all zero"):
        tree.sample(3, np.random.default_rng(0))


def test_importance_weights_match_the_formula():
    sampler = PrioritySampler(6, alpha=0.7, priority_eps=1e-6)
    sampler.add(np.arange(6), np.array([True] * 5 + [False]))
    td = np.array([0.5, 2.0, 0.1, 1.0, 3.0])
    sampler.update(np.arange(5), td)
    beta, n = 0.4, 5
    p = (td + 1e-6) ** 0.7
    probabilities = p / p.sum()
    weights = (n * probabilities) ** -beta
    np.testing.assert_allclose(sampler.weights(np.arange(5), n, beta), weights / weights.max(), rtol=1e-5)
    assert sampler.max_priority == pytest.approx(3.0 + 1e-6)


def test_replay_buffer_samples_by_priority_and_never_padding():
    lengths = np.full(20, 10)
    lengths[::2] = 4
    buffer = ReplayBuffer(20 * 10, 10, 2, 3, 2, False, sparse_reward, prioritized=True, alpha=1.0)
    buffer.store(tagged_episodes(n=20, lengths=lengths))
    rng = np.random.default_rng(0)
    batch = buffer.sample(5000, "future", 4, rng, beta=0.5)
    ep, t = batch["ag"][:, 0].astype(int), batch["ag"][:, 1].astype(int)
    assert np.all(t < lengths[ep])
    np.testing.assert_allclose(batch["weights"], 1.0)  # new transitions share the max priority
    # make one transition 1000x more important than any other
    buffer.update_priorities(batch["indices"], np.full(5000, 0.01))
    buffer.update_priorities(np.array([3 * 10 + 2]), np.array([10.0]))
    batch = buffer.sample(5000, "future", 4, rng, beta=0.5)
    assert np.mean(batch["indices"] == 32) > 0.5
    assert batch["weights"][batch["indices"] == 32].max() < batch["weights"].max()


def test_beta_continues_across_a_resume_at_another_schedule():
    """beta anneals over n_epochs * n_cycles * n_batches updates; a checkpoint resumed where that
    horizon differs (another rank count under train.schedule_ranks, a longer n_epochs) goes on
    from the progress it reached instead of jumping, and the same horizon resumes it exactly."""
    from her_mpi.config import load_config
    from her_mpi.envs import EnvSpec
    from her_mpi.trainer import build_agent

    spec = EnvSpec("BitFlipping-v0", 6, 6, True, 1, 6, (), (), 6, 0.0)

    def agent(n_epochs):
        return build_agent(load_config(None, ["algo=dqn", "env.id=BitFlipping-v0", "replay.size=1000",
                                              "replay.prioritized=true", f"train.n_epochs={n_epochs}"]), spec)

    first = agent(10)
    horizon = first.beta_horizon()
    first.n_updates = horizon // 2
    assert first.beta() == pytest.approx(0.4 + 0.6 * 0.5)
    same, longer = agent(10), agent(20)
    same.load_state_dict(first.state_dict())
    longer.load_state_dict(first.state_dict())
    assert same.beta() == first.beta()  # bit for bit: n_updates / horizon
    assert longer.beta() == pytest.approx(first.beta())  # no jump
    longer.n_updates += longer.beta_horizon() // 4
    assert longer.beta() == pytest.approx(0.4 + 0.6 * 0.75)
    again = agent(20)  # resumed once more at the new schedule: still no jump back
    again.load_state_dict(longer.state_dict())
    assert again.beta() == longer.beta()
    longer.n_updates += longer.beta_horizon()
    assert longer.beta() == 1.0
