"""Mechanics of the sample-efficiency levers: futureactual relabelling, n-step targets and
energy-based episode prioritization."""

import numpy as np
import pytest

from her_mpi.replay.buffer import EpisodeStore
from her_mpi.rollout import Episodes

T = 10


def sparse_reward(achieved, desired):
    return -(np.linalg.norm(achieved - desired, axis=-1) > 1e-6).astype(np.float32)


def tagged_episodes(n=40, horizon=T, lengths=None):
    """ag at (e, t) is (e, t, 0); each episode's own desired goal is (e, -1, 1), never achieved."""
    e = np.arange(n, dtype=np.float32)[:, None]
    t = np.arange(horizon + 1, dtype=np.float32)[None, :]
    ag = np.stack([np.broadcast_to(e, (n, horizon + 1)), np.broadcast_to(t, (n, horizon + 1)),
                   np.zeros((n, horizon + 1), np.float32)], axis=-1)
    g = np.stack([np.broadcast_to(e, (n, horizon + 1)), np.full((n, horizon + 1), -1.0, np.float32),
                  np.ones((n, horizon + 1), np.float32)], axis=-1)
    lengths = np.full(n, horizon) if lengths is None else np.asarray(lengths)
    return Episodes(obs=ag[..., :2].copy(), ag=ag, g=g, actions=np.zeros((n, horizon, 2), np.float32),
                    rewards=np.zeros((n, horizon), np.float32), lengths=lengths,
                    success=np.zeros(n, np.float32))


def within(fraction, expected, n):
    return abs(fraction - expected) <= 4 * np.sqrt(expected * (1 - expected) / n)


@pytest.mark.parametrize("replay_k, actual_k", [(2, 2), (4, 1), (0, 3)])
def test_futureactual_shares_and_sources(replay_k, actual_k):
    store = EpisodeStore.from_episodes(tagged_episodes(), sparse_reward)
    n = 40_000
    batch = store.sample(n, "future", replay_k, np.random.default_rng(0), actual_k=actual_k)
    own_episode, step = batch["ag"][:, 0], batch["ag"][:, 1]
    goal, replaced = batch["g"], batch["relabelled"]
    hindsight = goal[:, 2] == 0  # achieved goals end in 0, desired goals in 1
    actual = replaced & ~hindsight
    total = 1 + replay_k + actual_k
    assert within(hindsight.mean(), replay_k / total, n)
    assert within(actual.mean(), actual_k / total, n)
    assert within((~replaced).mean(), 1 / total, n)
    assert np.all(replaced[hindsight])
    # hindsight goals: later achieved goals of the same episode
    assert np.all(goal[hindsight, 0] == own_episode[hindsight]) and np.all(goal[hindsight, 1] > step[hindsight])
    # kept goals are the transition's own; actual goals are stored desired goals, drawn over all
    # stored transitions, so nearly always another episode's
    assert np.all(goal[~replaced, 0] == own_episode[~replaced]) and np.all(goal[~replaced, 1] == -1)
    assert np.all(goal[actual, 1] == -1) and np.all(goal[actual, 2] == 1)
    if actual_k:
        assert (goal[actual, 0] != own_episode[actual]).mean() > 0.9
    # replaced goals are fixed over the transition
    assert np.all(batch["g_next"][replaced] == goal[replaced])


def test_futureactual_off_is_the_baselines_sampler_draw_for_draw():
    store = EpisodeStore.from_episodes(tagged_episodes(), sparse_reward)
    plain = store.sample(512, "future", 4, np.random.default_rng(3))
    same = store.sample(512, "future", 4, np.random.default_rng(3), actual_k=0)
    for key in plain:
        np.testing.assert_array_equal(plain[key], same[key], err_msg=key)


def hand_made_store(gamma_terminal=False):
    """One episode of length 6 (horizon 8): ag after step i is (i, 0, 0); the goal (3, 0, 0) is
    reached after the third action, so r_t = -1 for t = 0, 1 and 0 for t = 2 (ag[3] = goal), and
    -1 again afterwards (ag moves on)."""
    horizon, length = 8, 6
    ag = np.zeros((1, horizon + 1, 3), np.float32)
    ag[0, :, 0] = np.minimum(np.arange(horizon + 1), length)
    g = np.zeros((1, horizon + 1, 3), np.float32)
    g[0, :, 0] = 3.0
    obs = np.arange(horizon + 1, dtype=np.float32).reshape(1, -1, 1) * 10
    episodes = Episodes(obs=obs, ag=ag, g=g, actions=np.zeros((1, horizon, 1), np.float32),
                        rewards=np.zeros((1, horizon), np.float32), lengths=np.array([length]),
                        success=np.zeros(1, np.float32))
    terminal = (lambda a, d: np.linalg.norm(a - d, axis=-1) < 1e-6) if gamma_terminal else None
    return EpisodeStore.from_episodes(episodes, sparse_reward, terminal)


GAMMA = 0.9


@pytest.mark.parametrize("t, n, expected_rewards, expected_steps", [
    (0, 3, -1 + GAMMA * -1 + GAMMA ** 2 * 0, 3),  # r0 + g r1 + g^2 r2
    (0, 1, -1.0, 1),
    (2, 3, 0 + GAMMA * -1 + GAMMA ** 2 * -1, 3),
    (4, 3, -1 + GAMMA * -1, 2),  # only steps 4 and 5 exist: truncated at the episode's end
    (5, 4, -1.0, 1),
])
def test_n_step_return_on_a_hand_made_episode_equals_the_formula(t, n, expected_rewards, expected_steps):
    store = hand_made_store()
    episode, step = np.array([0]), np.array([t])
    goals = store.g[episode, step]
    out = store.returns(episode, step, goals, np.array([False]), n, GAMMA)
    assert out["rewards"][0] == pytest.approx(expected_rewards, abs=1e-6)
    assert out["discounts"][0] == pytest.approx(GAMMA ** expected_steps)
    assert out["terminals"][0] == 0.0
    assert out["obs"][0, 0] == 10 * (t + expected_steps)  # the state after the last step taken


def test_n_step_return_stops_at_a_terminal_step():
    store = hand_made_store(gamma_terminal=True)
    out = store.returns(np.array([0]), np.array([0]), store.g[[0], [0]], None, 5, GAMMA)
    # the goal is reached after the third action: three rewards, then nothing to bootstrap
    assert out["rewards"][0] == pytest.approx(-1 + GAMMA * -1 + GAMMA ** 2 * 0)
    assert out["terminals"][0] == 1.0 and out["discounts"][0] == pytest.approx(GAMMA ** 3)
    assert out["obs"][0, 0] == 30


def test_n_step_rewards_use_the_moving_goal_of_each_step():
    store = hand_made_store()
    store.g[0, :, 0] = [9, 1, 9, 9, 9, 9, 9, 9, 9]  # the goal equals ag only after the first action
    out = store.returns(np.array([0]), np.array([0]), store.g[[0], [0]], np.array([False]), 2, GAMMA)
    assert out["rewards"][0] == pytest.approx(0 + GAMMA * -1)
    fixed = store.returns(np.array([0]), np.array([0]), store.g[[0], [0]], np.array([True]), 2, GAMMA)
    assert fixed["rewards"][0] == pytest.approx(-1 + GAMMA * -1)  # a relabelled goal stays g[t]


def test_n_step_batch_keeps_the_one_step_fields_unchanged():
    store = EpisodeStore.from_episodes(tagged_episodes(), sparse_reward)
    one = store.sample(256, "future", 4, np.random.default_rng(5))
    both = store.sample(256, "future", 4, np.random.default_rng(5), n_step=3, gamma=GAMMA)
    for key in one:
        np.testing.assert_array_equal(one[key], both[key], err_msg=key)
    assert {"rewards_n", "terminals_n", "discounts_n", "obs_n", "g_n"} <= set(both)
    assert np.all(both["discounts_n"] <= GAMMA)


# -- n-step targets in the agents ---------------------------------------------------------------

def agent_and_batch(algo: str, n_step: int, correction: str):
    import torch

    from her_mpi.config import load_config
    from her_mpi.rollout import RolloutWorker
    from her_mpi.trainer import build_agent

    config = load_config("fetch_reach_td3", [f"algo={algo}", f"algo.n_step={n_step}",
                                             f"algo.n_step_correction={correction}"])
    worker = RolloutWorker(config.env, 2, np.random.SeedSequence(0))
    agent = build_agent(config, worker.spec, worker.envs[0], np.random.SeedSequence(1))
    episodes = worker.generate(lambda o, g: agent.act(o, g, explore=True), 4)
    agent.buffer.store(episodes)
    batch = agent.buffer.sample(64, "future", 4, np.random.default_rng(2), n_step=n_step, gamma=agent.gamma)
    return agent, agent.batch_tensors(batch), torch


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_n_step_target_is_the_n_step_return_plus_the_discounted_value(algo):
    agent, batch, torch = agent_and_batch(algo, 3, "none")
    x_next = agent.inputs(batch["obs_next"], batch["g_next"])
    with torch.no_grad():
        state = agent.torch_rng.get_state()
        target = agent.td_target(batch, x_next)
        agent.torch_rng.set_state(state)  # the same target-policy noise for the reference
        value, bonus = agent.next_value(agent.inputs(batch["obs_n"], batch["g_n"]))
    expected = (batch["rewards_n"] + batch["discounts_n"] * (1 - batch["terminals_n"]) * value).clamp(-1 / (1 - agent.gamma), 0)
    if bonus is not None:
        expected = expected + batch["discounts_n"] * (1 - batch["terminals_n"]) * bonus
    torch.testing.assert_close(target, expected)
    assert np.all(batch["discounts_n"].numpy() <= agent.gamma + 1e-6)


def test_lower_bound_correction_takes_the_larger_of_the_one_and_n_step_targets():
    agent, batch, torch = agent_and_batch("ddpg", 3, "lower_bound")  # no target noise: deterministic
    x_next = agent.inputs(batch["obs_next"], batch["g_next"])
    with torch.no_grad():
        # a pessimistic critic (as early in training): then the n-step return often wins
        list(agent.critic_target.parameters())[-1].fill_(-30.0)
        target = agent.td_target(batch, x_next)
        one = agent.bootstrap(batch["rewards"], batch["terminals"], agent.next_value(x_next)[0])
        many = agent.bootstrap(batch["rewards_n"], batch["terminals_n"],
                               agent.next_value(agent.inputs(batch["obs_n"], batch["g_n"]))[0],
                               discounts=batch["discounts_n"])
    torch.testing.assert_close(target, torch.maximum(one, many))
    assert (many > one).any() and (one > many).any()  # both sides matter on real data


def test_n_step_off_gives_the_one_step_target():
    agent, batch, torch = agent_and_batch("ddpg", 1, "lower_bound")
    x_next = agent.inputs(batch["obs_next"], batch["g_next"])
    with torch.no_grad():
        expected = (batch["rewards"] + agent.gamma * (1 - batch["terminals"]) * agent.next_value(x_next)[0]).clamp(-50, 0)
        torch.testing.assert_close(agent.td_target(batch, x_next), expected)


# -- energy-based prioritization (Zhao & Tresp 2018) -------------------------------------------

def path_episodes(paths, lengths=None):
    """Episodes whose achieved goals follow ``paths`` [n, T+1, 3]; everything else is zero."""
    paths = np.asarray(paths, np.float32)
    n, T1, _ = paths.shape
    lengths = np.full(n, T1 - 1) if lengths is None else np.asarray(lengths)
    return Episodes(obs=paths.copy(), ag=paths, g=np.zeros_like(paths), actions=np.zeros((n, T1 - 1, 4), np.float32),
                    rewards=np.zeros((n, T1 - 1), np.float32), lengths=lengths, success=np.zeros(n, np.float32))


def test_trajectory_energy_of_a_hand_made_path_equals_the_formula():
    from her_mpi.replay.buffer import trajectory_energy

    dt = 0.04
    # still, then 1 cm along x, then 2 cm up, then 1 cm back down, then still
    path = np.array([[0, 0, 0], [0, 0, 0], [0.01, 0, 0], [0.01, 0, 0.02], [0.01, 0, 0.01], [0.01, 0, 0.01]])
    kinetic = [0, 0.5 * (0.01 / dt) ** 2, 0.5 * (0.02 / dt) ** 2, 0.5 * (0.01 / dt) ** 2, 0]
    potential = [0, 0, 9.81 * 0.02, 9.81 * 0.01, 9.81 * 0.01]
    energy = np.add(kinetic, potential)
    gained = np.clip(np.diff(energy, prepend=0.0), 0, 0.1)  # E_1, then E_{i+1} - E_i, clipped to [0, 0.1]
    assert gained[1] > 0 and gained[2] == 0.1 and gained[3] == 0  # the clip binds, a loss counts 0
    values = trajectory_energy(path[None], np.array([5]), dt, clip=0.1)
    np.testing.assert_allclose(values, [gained.sum()])
    # steps beyond an episode's length do not count; a still episode has none
    np.testing.assert_allclose(trajectory_energy(path[None], np.array([2]), dt, 0.1), [gained[:2].sum()])
    assert trajectory_energy(np.zeros((1, 6, 3)), np.array([5]), dt, 0.1)[0] == 0
    # several 3-D points in one goal (HandReach's fingertips) add up (before the clip)
    np.testing.assert_allclose(trajectory_energy(np.tile(path, 2)[None], np.array([5]), dt, 10.0),
                               2 * trajectory_energy(path[None], np.array([5]), dt, 10.0))
    with pytest.raises(ValueError, match="goal_dim is 2"):
        trajectory_energy(np.zeros((1, 6, 2)), np.array([5]), dt, 0.1)


def test_energy_prioritization_samples_episodes_in_proportion_to_their_energy():
    rng = np.random.default_rng(0)
    n_episodes, horizon = 6, 8
    paths = np.zeros((n_episodes, horizon + 1, 3))
    speeds = np.array([0.0, 0.0, 0.002, 0.004, 0.006, 0.0])  # m per step along x; three still episodes
    paths[:, :, 0] = speeds[:, None] * np.arange(horizon + 1)[None, :]
    lengths = np.array([8, 8, 8, 4, 8, 8])
    store = EpisodeStore.from_episodes(path_episodes(paths, lengths), sparse_reward)
    uniform_t = store.sample(4000, "future", 4, np.random.default_rng(1))["ag"]  # before: uniform
    assert len(np.unique(uniform_t[:, 0] / 0.002)) > 3
    store.prioritize_by_energy(dt=0.04, clip=10.0)
    energy = store.energy[:n_episodes]
    assert np.all(energy[[0, 1, 5]] == 0) and np.all(energy[2:5] > 0)
    n = 60_000
    episode, t = store.sample_batch_indices(n, rng)
    for e in range(n_episodes):
        assert within((episode == e).mean(), energy[e] / energy.sum(), n)
    assert np.all(t < lengths[episode]) and set(t[episode == 4]) == set(range(8))  # steps uniform within
    # a batch comes from those episodes; other transitions' goals (futureactual) stay uniform
    batch = store.sample(2000, "future", 2, rng, actual_k=2)
    assert np.all(batch["ag_next"][:, 0] > 0)  # only the moving episodes' transitions
    sources = store.sample_indices(n, rng)[0]
    assert within((sources == 0).mean(), 8 / 44, n)


def test_energy_prioritization_stays_uniform_until_an_episode_has_energy_and_survives_a_resume():
    from her_mpi.replay.buffer import ReplayBuffer

    still = path_episodes(np.zeros((3, T + 1, 3)))
    buffer = ReplayBuffer(100 * T, T, 3, 3, 4, False, sparse_reward)
    buffer.prioritize_by_energy(dt=0.04, clip=0.5)
    buffer.store(still)
    episode, _ = buffer.sample_batch_indices(3000, np.random.default_rng(0))
    assert set(episode) == {0, 1, 2}
    moving = np.zeros((1, T + 1, 3))
    moving[0, :, 2] = 0.01 * np.arange(T + 1)  # rising: potential energy
    buffer.store(path_episodes(moving))
    episode, _ = buffer.sample_batch_indices(3000, np.random.default_rng(0))
    assert set(episode) == {3}
    restored = ReplayBuffer(100 * T, T, 3, 3, 4, False, sparse_reward)
    restored.prioritize_by_energy(dt=0.04, clip=0.5)
    restored.load_state_dict(buffer.state_dict())
    np.testing.assert_array_equal(restored.energy, buffer.energy)


def test_energy_prioritization_settings_are_checked():
    from her_mpi.config import load_config
    from her_mpi.envs import env_spec, make_env
    from her_mpi.settings import ConfigError
    from her_mpi.trainer import build_agent

    with pytest.raises(ConfigError, match="episode_priority"):
        load_config("fetch_push_td3", ["replay.episode_priority=energy", "replay.prioritized=true"])
    with pytest.raises(ConfigError, match="energy_clip"):
        load_config("fetch_push_td3", ["replay.energy_clip=1.0"])  # without episode_priority energy
    with pytest.raises(ConfigError, match="energy_clip"):
        load_config("fetch_push_td3", ["replay.episode_priority=energy", "replay.energy_clip=0"])
    config = load_config("bitflip_10_dqn", ["replay.episode_priority=energy"])
    env = make_env(config.env, 0)
    with pytest.raises(ConfigError, match="goal_dim 10"):
        build_agent(config, env_spec(env, config.env.id), env, np.random.SeedSequence(0))
    env.close()


# -- random warm-up actions (train.random_steps) ------------------------------------------------


def test_random_steps_act_uniformly_for_whole_cycles_then_hand_over_to_the_policy(tmp_path):
    from her_mpi.config import load_config
    from her_mpi.trainer import Trainer

    # FetchReach: 2 episodes of 50 steps per cycle; 150 random steps -> cycles 1 and 2 are random
    config = load_config("fetch_reach_ddpg", ["train.n_epochs=1", "train.n_cycles=4", "train.n_batches=1",
                                              "train.n_test_episodes=0", "train.random_steps=150",
                                              "log.tensorboard=false"])
    trainer = Trainer(config, tmp_path / "run")
    calls, acting = [], []
    act, random_actions = trainer.agent.act, trainer.agent.random_actions

    def counted_act(obs, g, explore):
        calls.append("policy")
        acting.append(True)
        try:
            return act(obs, g, explore)
        finally:
            acting.pop()

    def counted_random_actions(n):  # the ones act() draws for its random_eps share are not warm-up
        if not acting:
            calls.append("random")
        return random_actions(n)

    trainer.agent.act, trainer.agent.random_actions = counted_act, counted_random_actions
    try:
        trainer.run()
    finally:
        trainer.close()
    assert calls == ["random"] * 100 + ["policy"] * 100
    warm_up = trainer.agent.buffer.actions[:4]  # the first two cycles' episodes
    assert warm_up.min() >= -1 and warm_up.max() <= 1
    assert abs(warm_up.mean()) < 0.05 and abs(warm_up.std() - 1 / np.sqrt(3)) < 0.03  # U(-1, 1)


def test_random_actions_of_a_discrete_agent_cover_every_action():
    from her_mpi.config import load_config
    from her_mpi.envs import env_spec, make_env
    from her_mpi.trainer import build_agent

    config = load_config("bitflip_10_dqn", [])
    env = make_env(config.env, 0)
    agent = build_agent(config, env_spec(env, config.env.id), env)
    actions = agent.random_actions(5000)
    assert actions.shape == (5000, 1) and actions.dtype.kind == "i"
    assert set(np.unique(actions)) == set(range(10))


def test_on_policy_algorithms_refuse_random_steps():
    from her_mpi.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="train.random_steps"):
        load_config("fetch_reach_htrpo", ["train.random_steps=1000"])


def dqn_agent(*overrides):
    from her_mpi.config import load_config
    from her_mpi.envs import env_spec, make_env
    from her_mpi.trainer import build_agent

    config = load_config("bitflip_10_dqn", list(overrides))
    env = make_env(config.env, 0)
    return build_agent(config, env_spec(env, config.env.id), env)


def test_held_exploration_keeps_each_random_action_for_1_to_hold_steps():
    hold, n_envs, steps = 5, 400, 60
    agent = dqn_agent("algo.epsilon=0.2", f"algo.epsilon_hold={hold}")
    greedy = np.full(n_envs, -1)  # no real action: every non-greedy step is visible
    agent.start_episodes(n_envs)
    taken = np.stack([agent.explore(greedy) for _ in range(steps)], axis=1)
    explored = taken >= 0
    assert taken.max() < 10
    runs = []  # (length, action kept throughout) of every maximal run of exploring steps
    for row, mask in zip(taken, explored):
        edges = np.flatnonzero(np.diff(np.r_[0, mask.astype(int), 0]))
        runs += [(b - a, len(set(row[a:b]))) for a, b in zip(edges[::2], edges[1::2]) if b < steps]
    lengths = np.array([length for length, _ in runs])
    # back-to-back holds merge into longer runs; a lone hold lasts 1..5 steps (mean 3)
    assert lengths.min() == 1 and np.mean(lengths <= hold) > 0.8
    assert np.mean([kinds == 1 for length, kinds in runs if length <= hold]) > 0.85  # one action kept
    # a hold starts on a free step with probability epsilon: steady-state share eps*3 / (1 + eps*2)
    assert within(explored[:, 20:].mean(), 0.2 * 3 / (1 + 0.2 * 2), explored[:, 20:].size / 3)


def test_held_exploration_restarts_with_new_episodes_and_plain_epsilon_is_unchanged():
    agent = dqn_agent("algo.epsilon=1.0", "algo.epsilon_hold=50")
    agent.start_episodes(3)
    first = agent.explore(np.zeros(3, np.int64))
    assert np.array_equal(agent.explore(np.zeros(3, np.int64)), first)  # held
    agent.start_episodes(3)
    assert agent.hold_left.sum() == 0
    # epsilon_hold = 1 draws exactly as plain epsilon-greedy always did: random actions, then coins
    plain = dqn_agent("algo.epsilon=0.3")
    rng = np.random.default_rng()
    rng.bit_generator.state = plain.rng.bit_generator.state
    greedy = np.full(1000, 7)
    random_action = rng.integers(0, 10, (1000, 1))[:, 0]
    expected = np.where(rng.random(1000) < 0.3, random_action, greedy)
    assert np.array_equal(plain.explore(greedy), expected)


def test_held_exploration_setting_is_checked():
    from her_mpi.config import ConfigError

    with pytest.raises(ConfigError, match="epsilon_hold.*0.*integer >= 1"):
        dqn_agent("algo.epsilon_hold=0")
