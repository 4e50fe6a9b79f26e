"""Off-policy replay on a moving goal: transitions are judged as the env judged them.

Predator-prey's env moves the prey (the desired goal) after the predator, then rewards step t
against the goal after the move, g[t+1], and pays -1 when time runs out. Replay must give the
same rewards and terminal flags for the stored goals, and use g[t+1] in the next input.
"""

import numpy as np
import pytest
import torch

from her_mpi.config import EnvConfig, load_config
from her_mpi.envs import env_spec, goal_functions, make_env
from her_mpi.replay.buffer import EpisodeStore
from her_mpi.rollout import Episodes
from her_mpi.trainer import build_agent

HORIZON = 4


def play(env, predator, prey, velocity, actions) -> dict:
    """One hand-made episode: place predator and prey, then step the real env."""
    unwrapped = env.unwrapped
    unwrapped.predator, unwrapped.prey = np.array([predator], float), np.array([prey], float)
    unwrapped.velocity, unwrapped.steps = np.array([velocity], float), 0
    o = unwrapped._obs()
    record = {"obs": [o["observation"]], "ag": [o["achieved_goal"]], "g": [o["desired_goal"]],
              "actions": [], "rewards": [], "terminated": []}
    for action in actions:
        o, reward, terminated, truncated, _ = env.step(np.array([action], np.float32))
        for key in ("obs", "ag", "g"):
            record[key].append(o[{"obs": "observation", "ag": "achieved_goal", "g": "desired_goal"}[key]])
        record["actions"].append([action])
        record["rewards"].append(reward)
        record["terminated"].append(terminated)
        if terminated or truncated:
            break
    return record


def episodes_of(records) -> Episodes:
    n, T = len(records), HORIZON
    arrays = {k: np.zeros((n, T + 1, 2 if k == "obs" else 1), np.float32) for k in ("obs", "ag", "g")}
    actions, rewards = np.zeros((n, T, 1), np.float32), np.zeros((n, T), np.float32)
    lengths = np.array([len(r["actions"]) for r in records])
    for i, r in enumerate(records):
        for key in arrays:
            values = np.asarray(r[key], np.float32)
            arrays[key][i, : len(values)] = values
            arrays[key][i, len(values):] = values[-1]  # the rollout's padding: the final state repeats
        actions[i, : lengths[i]] = r["actions"]
        rewards[i, : lengths[i]] = r["rewards"]
    return Episodes(arrays["obs"], arrays["ag"], arrays["g"], actions, rewards, lengths,
                    np.array([float(r["terminated"][-1]) for r in records], np.float32))


@pytest.fixture
def env():
    env = make_env(EnvConfig("PredatorPrey-v0", {"dims": 1, "interception_distance": 0.5, "horizon": HORIZON,
                                                  "prey_mode": "random_direction", "prey_speed": 1.0}), seed=0)
    env.reset(seed=0)
    return env


@pytest.fixture
def records(env):
    return [
        # the prey moves 2.0 -> 1.5 while the predator moves 0 -> 1: caught against g[1], not g[0]
        play(env, 0.0, 2.0, -0.5, [1.0, 1.0]),
        # the prey flees 1.2 -> 2.2 -> ...: close to g[t] after each step, never to g[t+1]; time-out
        play(env, 0.0, 1.2, 1.0, [1.0, 1.0, 1.0, 1.0]),
    ]


def test_the_hand_made_episodes_are_what_the_test_needs(records):
    assert records[0]["rewards"] == [1.0] and records[0]["terminated"] == [True]
    assert records[1]["rewards"] == [0.0, 0.0, 0.0, -1.0] and not any(records[1]["terminated"])


def test_replayed_rewards_and_terminals_are_the_envs(env, records):
    episodes = episodes_of(records)
    fns = goal_functions(env)
    store = EpisodeStore.from_episodes(episodes, fns.reward, fns.terminal, timeout_reward=fns.timeout_reward)
    episode = np.array([0, 1, 1, 1, 1])
    t = np.array([0, 0, 1, 2, 3])
    batch = store.transitions(episode, t, store.g[episode, t], relabelled=np.zeros(5, bool))
    np.testing.assert_array_equal(batch["rewards"], [1.0, 0.0, 0.0, 0.0, -1.0])
    np.testing.assert_array_equal(batch["terminals"], [1.0, 0.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(batch["g"], episodes.g[episode, t])  # the policy's input at t
    np.testing.assert_array_equal(batch["g_next"], episodes.g[episode, t + 1])  # the next input's goal
    assert not np.array_equal(batch["g"], batch["g_next"])


def test_relabelled_goals_stay_fixed(env, records):
    episodes = episodes_of(records)
    fns = goal_functions(env)
    store = EpisodeStore.from_episodes(episodes, fns.reward, fns.terminal, timeout_reward=fns.timeout_reward)
    goals = np.array([[2.0], [3.0]], np.float32)  # the predator reaches 2 after step 1 of episode 1
    batch = store.transitions(np.array([1, 1]), np.array([1, 3]), goals, relabelled=np.ones(2, bool))
    np.testing.assert_array_equal(batch["g_next"], goals)
    np.testing.assert_array_equal(batch["rewards"], [1.0, -1.0])  # reached; the last step ran out of time
    np.testing.assert_array_equal(batch["terminals"], [1.0, 0.0])


def test_off_policy_agents_replay_with_the_envs_time_out_reward(env, records):
    config = load_config(None, ["algo=sac", "env.id=PredatorPrey-v0", "replay.size=400",
                                "env.kwargs={dims: 1, interception_distance: 0.5, horizon: 4}"])
    agent = build_agent(config, env_spec(env, "PredatorPrey-v0"), env)
    episodes = episodes_of(records)
    agent.buffer.store(episodes)
    batch = agent.buffer.sample(256, "none", 0, np.random.default_rng(0))
    # every sampled transition's reward is one the env paid (the time-out's -1 included), found by
    # matching its (achieved goal, next achieved goal) to the hand-made steps
    paid = {(float(episodes.ag[e, t, 0]), float(episodes.ag[e, t + 1, 0])): float(episodes.rewards[e, t])
            for e in range(2) for t in range(episodes.lengths[e])}
    replayed = {(float(a), float(b)): float(r) for a, b, r in zip(batch["ag"][:, 0], batch["ag_next"][:, 0],
                                                                  batch["rewards"])}
    assert replayed == paid
    # TD targets are clipped to the return range: it must include the time-out's -1
    assert agent.spec.reward_bounds == (-1.0, 1.0)
    target = agent.bootstrap(torch.tensor([-1.0]), torch.tensor([0.0]), torch.tensor([0.0]))
    assert float(target[0]) == -1.0
