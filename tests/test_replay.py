"""Hindsight relabelling at sample time: where goals come from, how often, and their rewards."""

import numpy as np
import pytest
import torch

from her_mpi.replay.buffer import EpisodeStore, ReplayBuffer
from her_mpi.rollout import Episodes

T, N_EPISODES = 10, 40


def sparse_reward(achieved, desired):
    return -(np.linalg.norm(achieved - desired, axis=-1) > 1e-6).astype(np.float32)


def tagged_episodes(n=N_EPISODES, horizon=T, lengths=None, first_id=0):
    """Achieved goal at (episode e, step t) is (e, t, 0), so a goal reveals where it came from."""
    e = np.arange(first_id, first_id + n, dtype=np.float32)[:, None]
    t = np.arange(horizon + 1, dtype=np.float32)[None, :]
    ag = np.stack([np.broadcast_to(e, (n, horizon + 1)), np.broadcast_to(t, (n, horizon + 1)),
                   np.zeros((n, horizon + 1), np.float32)], axis=-1)
    g = np.full((n, horizon + 1, 3), -7.0, np.float32)  # never achieved: reward -1
    obs = ag[..., :2].copy()
    lengths = np.full(n, horizon) if lengths is None else np.asarray(lengths)
    return Episodes(obs=obs, ag=ag, g=g, actions=np.zeros((n, horizon, 2), np.float32),
                    rewards=np.zeros((n, horizon), np.float32), lengths=lengths,
                    success=np.zeros(n, np.float32))


def sample(strategy, k=4, batch=20000, seed=0, episodes=None):
    store = EpisodeStore.from_episodes(episodes or tagged_episodes(), sparse_reward)
    return store, store.sample(batch, strategy, k, np.random.default_rng(seed))


def source(batch):
    """(episode, step) each transition came from and its goal came from."""
    return batch["ag"][:, 0], batch["ag"][:, 1], batch["g"][:, 0], batch["g"][:, 1]


@pytest.mark.parametrize("k", [1, 4, 8])
def test_relabelled_fraction_matches_replay_k(k):
    _, batch = sample("future", k)
    expected = 1 - 1 / (1 + k)
    fraction = batch["relabelled"].mean()
    assert abs(fraction - expected) < 4 * np.sqrt(expected * (1 - expected) / len(batch["relabelled"]))
    assert np.all(batch["g"][~batch["relabelled"]] == -7.0)


def test_future_goal_is_a_later_achieved_goal_of_the_same_episode():
    _, batch = sample("future")
    ep, t, goal_ep, goal_t = source(batch)
    r = batch["relabelled"]
    assert np.all(goal_ep[r] == ep[r])
    assert np.all(goal_t[r] >= t[r] + 1) and np.all(goal_t[r] <= T)
    # uniform over the later steps: for t = 0 every one of ag[1..T] appears
    at_start = r & (t == 0)
    assert set(goal_t[at_start].astype(int)) == set(range(1, T + 1))


def test_final_goal_is_the_last_achieved_goal():
    lengths = np.random.default_rng(1).integers(3, T + 1, N_EPISODES)
    _, batch = sample("final", episodes=tagged_episodes(lengths=lengths))
    ep, t, goal_ep, goal_t = source(batch)
    r = batch["relabelled"]
    assert np.all(goal_ep[r] == ep[r]) and np.all(goal_t[r] == lengths[ep[r].astype(int)])


def test_episode_goal_is_any_achieved_goal_of_the_same_episode():
    _, batch = sample("episode")
    ep, t, goal_ep, goal_t = source(batch)
    r = batch["relabelled"]
    assert np.all(goal_ep[r] == ep[r])
    assert set(goal_t[r].astype(int)) == set(range(1, T + 1))
    assert np.any(goal_t[r] <= t[r])  # unlike future, earlier states too


def test_random_goal_comes_from_any_stored_episode():
    _, batch = sample("random")
    ep, _, goal_ep, goal_t = source(batch)
    r = batch["relabelled"]
    assert np.mean(goal_ep[r] != ep[r]) > 0.9
    assert set(goal_ep[r].astype(int)) == set(range(N_EPISODES)) and goal_t[r].min() >= 1


def test_rewards_are_recomputed_for_the_relabelled_goal():
    _, batch = sample("future")
    np.testing.assert_array_equal(batch["rewards"], sparse_reward(batch["ag_next"], batch["g"]))
    # a goal equal to the next achieved goal is a success
    hit = np.all(batch["g"] == batch["ag_next"], axis=-1)
    assert hit.any() and np.all(batch["rewards"][hit] == 0) and np.all(batch["rewards"][~hit] == -1)


def test_none_strategy_never_relabels():
    _, batch = sample("none")
    assert not batch["relabelled"].any()


def test_transitions_are_uniform_over_variable_length_episodes():
    lengths = np.where(np.arange(N_EPISODES) % 2 == 0, 2, T)
    store, batch = sample("none", episodes=tagged_episodes(lengths=lengths), batch=50000)
    ep, t = batch["ag"][:, 0].astype(int), batch["ag"][:, 1].astype(int)
    assert np.all(t < lengths[ep])  # never a padded step
    short_share = np.mean(lengths[ep] == 2)
    assert abs(short_share - 2 / (2 + T)) < 0.01  # episodes weighted by their length


def test_ring_buffer_overwrites_oldest_episodes():
    buffer = ReplayBuffer(5 * T, T, 2, 3, 2, False, sparse_reward)
    buffer.store(tagged_episodes(n=4))
    buffer.store(tagged_episodes(n=3, first_id=100))
    assert buffer.n_episodes == 5
    stored = sorted(buffer.ag[:, 0, 0].astype(int))
    assert stored == [2, 3, 100, 101, 102]


def test_memory_holds_raw_episodes_only():
    buffer = ReplayBuffer(1000 * T, T, 2, 3, 2, False, sparse_reward)
    buffer.store(tagged_episodes())
    assert buffer.n_transitions == N_EPISODES * T  # not (1 + k) copies


@pytest.mark.parametrize("env_id, kwargs, low, high", [
    ("BitFlipping-v0", {"n_bits": 4}, -1.0, 0.0),  # -1 until the goal, 0 there
    ("PredatorPrey-v0", {}, -1.0, 1.0),  # +1 on a catch, -1 when time runs out
])
def test_td_targets_are_clipped_to_the_envs_return_range(env_id, kwargs, low, high):
    from her_mpi.config import load_config
    from her_mpi.envs import env_spec, make_env
    from her_mpi.trainer import build_agent

    algo = "dqn" if env_id == "BitFlipping-v0" else "ddpg"
    config = load_config(None, [f"env.id={env_id}", f"env.kwargs={kwargs}", f"algo={algo}"])
    env = make_env(config.env)
    agent = build_agent(config, env_spec(env, env_id), env)
    assert agent.spec.reward_bounds == (low, high)
    horizon = 1.0 / (1.0 - agent.gamma)
    huge = torch.tensor([-1e6, 1e6])
    clipped = agent.bootstrap(torch.zeros(2), torch.zeros(2), huge)
    assert clipped.tolist() == pytest.approx([low * horizon, high * horizon])
