"""The standalone buffer API (cpprb's HindsightReplayBuffer, relabelled at sample time)."""

import subprocess
import sys

import numpy as np
import pytest

from her_mpi.envs.bit_flipping import BitFlippingEnv
from her_mpi.replay.hindsight_buffer import HindsightReplayBuffer

N_BITS = 6
ENV_DICT = {"obs": {"shape": N_BITS}, "act": {"shape": 1, "dtype": np.int64}, "next_obs": {"shape": N_BITS}}


def reward(next_state, action, goal):
    return -1.0 * (next_state != goal).any(axis=1)


def filled(strategy, prioritized=False, episodes=30, seed=0, **kwargs):
    """Buffer with episodes whose states encode (episode, step): state = [e, t+1, 0, ...]."""
    buffer = HindsightReplayBuffer(10_000, ENV_DICT, max_episode_len=N_BITS, reward_func=reward,
                                   strategy=strategy, prioritized=prioritized, seed=seed, **kwargs)
    lengths = []
    for e in range(episodes):
        length = 2 + e % (N_BITS - 1)
        for t in range(length):
            state, next_state = np.zeros(N_BITS), np.zeros(N_BITS)
            state[:2], next_state[:2] = (e, t), (e, t + 1)
            buffer.add(obs=state, act=t % N_BITS, next_obs=next_state)
        buffer.on_episode_end(np.full(N_BITS, -1.0))
        lengths.append(length)
    return buffer, np.array(lengths)


def test_stored_size_counts_each_transition_once():
    buffer, lengths = filled("future", additional_goals=8)
    assert buffer.get_stored_size() == lengths.sum()


def test_final_goals_are_the_episodes_last_achieved_goal():
    buffer, lengths = filled("final", additional_goals=1)
    batch = buffer.sample(4000)
    relabelled = batch["goal"][:, 0] >= 0
    assert 0.4 < relabelled.mean() < 0.6  # k=1: half the goals
    ep = batch["obs"][relabelled, 0].astype(int)
    np.testing.assert_array_equal(batch["goal"][relabelled, 0], ep)
    np.testing.assert_array_equal(batch["goal"][relabelled, 1], lengths[ep])


def test_future_goals_come_from_later_in_the_same_episode():
    buffer, _ = filled("future")
    batch = buffer.sample(4000)
    r = batch["goal"][:, 0] >= 0
    assert abs(r.mean() - 0.8) < 0.03
    np.testing.assert_array_equal(batch["goal"][r, 0], batch["obs"][r, 0])
    assert np.all(batch["goal"][r, 1] >= batch["obs"][r, 1] + 1)


def test_episode_and_random_goals():
    buffer, _ = filled("episode")
    batch = buffer.sample(4000)
    r = batch["goal"][:, 0] >= 0
    np.testing.assert_array_equal(batch["goal"][r, 0], batch["obs"][r, 0])
    assert np.any(batch["goal"][r, 1] <= batch["obs"][r, 1])
    buffer, _ = filled("random")
    batch = buffer.sample(4000)
    r = batch["goal"][:, 0] >= 0
    assert np.mean(batch["goal"][r, 0] != batch["obs"][r, 0]) > 0.8


def test_rewards_are_recomputed_from_next_state_and_goal():
    buffer, _ = filled("future")
    batch = buffer.sample(2000)
    np.testing.assert_array_equal(batch["rew"][:, 0], reward(batch["next_obs"], batch["act"], batch["goal"]))
    assert batch["rew"].shape == (2000, 1) and (batch["rew"] == 0).any()


def test_prioritized_sampling_weights_and_updates():
    buffer, _ = filled("future", prioritized=True)
    batch = buffer.sample(1000, beta=0.4)
    assert {"weights", "indexes"} <= set(batch) and np.allclose(batch["weights"], 1.0)
    buffer.update_priorities(batch["indexes"], np.full(1000, 1e-3))
    buffer.update_priorities(np.array([batch["indexes"][0]]), np.array([50.0]))
    again = buffer.sample(1000, beta=1.0)
    assert np.mean(again["indexes"] == batch["indexes"][0]) > 0.5


def test_goal_function_and_shape():
    buffer = HindsightReplayBuffer(100, ENV_DICT, N_BITS, reward_func=lambda s, a, g: -1.0 * (s[:, :2] != g).any(1),
                                   goal_func=lambda s: s[:, :2], goal_shape=2, strategy="final", prioritized=False, seed=1)
    for t in range(3):
        buffer.add(obs=np.full(N_BITS, t), act=0, next_obs=np.full(N_BITS, t + 1))
    buffer.on_episode_end(np.array([9.0, 9.0]))
    batch = buffer.sample(200)
    assert batch["goal"].shape == (200, 2) and set(map(tuple, batch["goal"])) == {(9.0, 9.0), (3.0, 3.0)}


def test_user_mistakes_are_explained():
    with pytest.raises(ValueError, match="strategy must be one of"):
        HindsightReplayBuffer(100, ENV_DICT, 5, reward, strategy="later")
    with pytest.raises(ValueError, match="'goal' and 'rew' are added by the buffer"):
        HindsightReplayBuffer(100, {**ENV_DICT, "rew": {}}, 5, reward)
    buffer = HindsightReplayBuffer(100, ENV_DICT, 2, reward, prioritized=False)
    with pytest.raises(ValueError, match="empty"):
        buffer.sample(4)
    with pytest.raises(ValueError, match="missing next_obs"):
        buffer.add(obs=np.zeros(N_BITS), act=0)
    with pytest.raises(ValueError, match="expected \\(6,\\)"):
        buffer.add(obs=np.zeros(5), act=0, next_obs=np.zeros(5))
    with pytest.raises(ValueError, match="update_priorities needs prioritized=True"):
        buffer.update_priorities([0], [1.0])


def test_a_rejected_add_leaves_the_episode_unchanged():
    buffer = HindsightReplayBuffer(100, ENV_DICT, 2, reward, strategy="final")
    state = np.zeros(N_BITS)
    with pytest.raises(ValueError, match="next_obs has shape"):
        buffer.add(obs=state, act=0, next_obs=np.zeros(N_BITS + 1))
    buffer.add(obs=state, act=0, next_obs=state + 1)
    with pytest.raises(ValueError, match="longer than max_episode_len=2"):
        buffer.add(obs=np.zeros((2, N_BITS)), act=[1, 1], next_obs=np.zeros((2, N_BITS)))
    buffer.add(obs=state + 1, act=1, next_obs=state + 2)
    buffer.on_episode_end(np.full(N_BITS, 5.0))
    assert buffer.get_stored_size() == 2
    batch = buffer.sample(16)
    np.testing.assert_array_equal(batch["next_obs"] - batch["obs"], np.ones((16, N_BITS)))


def test_seed_example_bit_flipping_with_double_dqn_buffer_loop():
    """cpprb's manual's usage pattern: add per step, on_episode_end(goal), sample for learning."""
    env = BitFlippingEnv(N_BITS)
    buffer = HindsightReplayBuffer(10_000, ENV_DICT, N_BITS, reward, prioritized=True, seed=0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
        for _ in range(N_BITS):
            action = int(rng.integers(N_BITS))
            next_obs, _, terminated, truncated, _ = env.step(action)
            buffer.add(obs=obs["observation"], act=action, next_obs=next_obs["observation"])
            obs = next_obs
            if terminated or truncated:
                break
        buffer.on_episode_end(obs["desired_goal"])
    batch = buffer.sample(64, beta=0.4)
    assert batch["obs"].shape == (64, N_BITS) and batch["act"].shape == (64, 1)
    assert (batch["rew"] == 0).mean() > 0.1  # relabelled goals make successes


def test_the_buffer_is_standalone():
    """Importing the buffers pulls in neither gymnasium nor torch nor the training code."""
    code = ("import sys, her_mpi.replay.buffer, her_mpi.replay.hindsight_buffer; "
            "print(sorted(m for m in ('gymnasium', 'torch', 'her_mpi.rollout', 'her_mpi.config') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
