"""Pieces of the on-policy hindsight algorithms: QKL, conjugate gradient, goal filtering,
relabelling and GAE."""

import math

import numpy as np
import pytest
import torch

from her_mpi.algos.htrpo import conjugate_gradient, hindsight_goal_filtering, without_instant_successes
from her_mpi.algos.on_policy import gae, relabel
from her_mpi.algos.policies import CategoricalPolicy, GaussianPolicy
from her_mpi.envs.predator_prey import PredatorPreyEnv
from her_mpi.rollout import Episodes
from her_mpi.settings import ConfigError


def test_qkl_is_half_the_mean_squared_log_ratio_on_known_gaussians():
    # pi_old = N(0, 1), pi_new = N(mu, s^2), a ~ pi_old:
    # log pi_old(a) - log pi_new(a) = c0 + c1 a + c2 a^2, so with E[a^2] = 1, E[a^4] = 3:
    # QKL = 1/2 (c0^2 + c1^2 + 3 c2^2 + 2 c0 c2)
    mu, s = 0.5, 0.8
    c0, c1, c2 = mu ** 2 / (2 * s ** 2) + math.log(s), -mu / s ** 2, -0.5 + 1 / (2 * s ** 2)
    expected = 0.5 * (c0 ** 2 + c1 ** 2 + 3 * c2 ** 2 + 2 * c0 * c2)
    old = (torch.zeros(1, 1), torch.zeros(1, 1))
    new = (torch.full((1, 1), mu), torch.full((1, 1), math.log(s)))
    actions = torch.randn(400_000, 1, generator=torch.Generator().manual_seed(0))
    log_ratio = GaussianPolicy.log_prob_of(old, actions) - GaussianPolicy.log_prob_of(new, actions)
    assert float(0.5 * log_ratio.pow(2).mean()) == pytest.approx(expected, rel=1e-2)


def test_htrpo_constraint_is_the_weighted_qkl_of_its_policy():
    from her_mpi.config import load_config
    from her_mpi.envs import EnvSpec
    from her_mpi.trainer import build_agent

    spec = EnvSpec("PredatorPrey-v0", 2, 1, False, 1, 0, (-1.0,), (1.0,), 20, 0.0)
    agent = build_agent(load_config(None, ["algo=htrpo", "env.id=PredatorPrey-v0"]), spec)
    x = torch.randn(500, 3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        old = tuple(t.detach() for t in agent.policy_net.params(x))
        actions = agent.policy_net.sample(x, torch.Generator().manual_seed(2))
        old_log_prob = agent.policy_net.log_prob_of(old, actions)
        agent.policy_net.log_std.add_(0.3)  # move the policy away from the old one
        new_log_prob = agent.policy_net.log_prob(x, actions)
    batch = {"x": x, "actions": actions, "anchor": old, "anchor_log_prob": old_log_prob,
             "coefficients": torch.full((500,), 1 / 500)}
    # the paper's units: (1 - gamma) * sum of coefficient * QKL (coefficients here: 1/500 per row)
    expected = (1 - agent.params.gamma) * 0.5 * (old_log_prob - new_log_prob).pow(2).mean()
    assert float(agent.divergence(batch).detach()) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("subsample", [1.0, 0.25])
def test_htrpo_curvature_product_is_the_weighted_fisher_of_its_gaussian_policy(subsample):
    """At the step's anchor the QKL's Hessian is (1 - gamma) sum_i c_i g_i g_i^T, g_i the gradient of
    row i's log-probability (log-std included): the product conjugate gradient solves with, from a
    subsample of rows rescaled to the batch when ``hvp_subsample`` < 1."""
    from her_mpi.config import load_config
    from her_mpi.envs import EnvSpec
    from her_mpi.trainer import build_agent

    spec = EnvSpec("PredatorPrey-v0", 2, 2, False, 2, 0, (-1.0, -1.0), (1.0, 1.0), 20, 0.0)
    agent = build_agent(load_config(None, ["algo=htrpo", "env.id=PredatorPrey-v0", "algo.hidden=[16,16]"]), spec)
    n, generator = 200, torch.Generator().manual_seed(3)
    x = torch.randn(n, 4, generator=generator)
    with torch.no_grad():
        anchor = tuple(t.detach() for t in agent.policy_net.params(x))
        actions = agent.policy_net.sample(x, generator)
        anchor_log_prob = agent.policy_net.log_prob_of(anchor, actions)
    batch = {"x": x, "actions": actions, "anchor": anchor, "anchor_log_prob": anchor_log_prob,
             "coefficients": torch.rand(n, generator=generator) / n}
    rows = None if subsample == 1.0 else torch.randperm(n, generator=generator)[: int(n * subsample)]
    hvp = agent.fisher_vector_product(batch, rows)
    vector = torch.randn(agent.policy_flat.param.numel(), generator=generator, dtype=torch.float32)

    used = torch.arange(n) if rows is None else rows
    expected = torch.zeros_like(vector)
    for i in used.tolist():
        log_prob = agent.policy_net.log_prob(x[i: i + 1], actions[i: i + 1]).sum()
        gradient = torch.cat([g.reshape(-1) for g in torch.autograd.grad(log_prob, agent.policy_flat.params)])
        expected += batch["coefficients"][i] * gradient * (gradient @ vector)
    expected *= (1 - agent.params.gamma) * n / len(used)
    log_std = agent.policy_net.log_std
    assert any(p is log_std for p in agent.policy_flat.params)  # the noise is part of the step
    torch.testing.assert_close(hvp(vector), expected + agent.params.cg_damping * vector, rtol=1e-4, atol=1e-7)


def test_analytic_kl_matches_the_closed_forms():
    m0, s0, m1, s1 = 0.3, 0.7, -0.2, 1.3
    old = (torch.tensor([[m0]]), torch.tensor([[math.log(s0)]]))
    new = (torch.tensor([[m1]]), torch.tensor([[math.log(s1)]]))
    expected = math.log(s1 / s0) + (s0 ** 2 + (m0 - m1) ** 2) / (2 * s1 ** 2) - 0.5
    assert float(GaussianPolicy.kl(old, new)) == pytest.approx(expected, rel=1e-6)
    p, q = torch.tensor([[0.2, 0.5, 0.3]]), torch.tensor([[0.4, 0.4, 0.2]])
    assert float(CategoricalPolicy.kl((p.log(),), (q.log(),))) == pytest.approx(float((p * (p / q).log()).sum()))


def test_conjugate_gradient_solves_an_spd_system():
    rng = np.random.default_rng(0)
    m = rng.normal(size=(12, 12))
    H = torch.tensor(m @ m.T + 12 * np.eye(12))
    b = torch.tensor(rng.normal(size=12))
    x = conjugate_gradient(lambda v: H @ v, b, iterations=30, tolerance=1e-24)
    torch.testing.assert_close(H @ x, b, rtol=1e-6, atol=1e-8)


def test_conjugate_gradient_of_a_zero_gradient_is_zero_not_nan():
    x = conjugate_gradient(lambda v: 2 * v, torch.zeros(5), iterations=10)
    torch.testing.assert_close(x, torch.zeros(5))


def test_goal_filtering_keeps_goals_inside_the_desired_goal_box_spread_out():
    original = np.array([[0.0, 0.0, 0.5], [1.0, 1.0, 0.5], [0.5, 0.2, 0.5]])  # z does not vary
    inside = np.array([[0.1, 0.1, 0.4], [0.9, 0.9, 0.7], [0.12, 0.1, 0.4], [0.5, 0.5, 0.6]])
    outside = np.array([[2.0, 2.0, 0.5], [-1.0, 0.5, 0.5]])
    goals = hindsight_goal_filtering(np.concatenate([inside, outside]), original, 3, np.random.default_rng(0))
    assert len(goals) == 3
    assert all(any(np.array_equal(g, c) for c in inside) for g in goals)  # only goals in the box
    chosen = {tuple(g) for g in goals}
    assert (0.9, 0.9, 0.7) in chosen and (0.5, 0.5, 0.6) in chosen  # far-apart ones, not both near (0.1, 0.1)


def test_goal_filtering_falls_back_to_the_nearest_achieved_goals():
    original = np.array([[0.0, 0.0], [1.0, 1.0]])
    achieved = np.array([[5.0, 5.0], [1.5, 1.2], [-3.0, 0.0], [1.1, 1.9]])
    goals = hindsight_goal_filtering(achieved, original, 2, np.random.default_rng(0))
    np.testing.assert_array_equal(goals, [[1.5, 1.2], [1.1, 1.9]])


def test_goal_filtering_measures_in_the_goals_spread_or_in_their_own_units():
    original = np.array([[0.0, 0.0], [1.0, 0.1]])  # spread 0.5 in x, 0.05 in y
    start, far_in_x, far_in_spread = [0.5, 0.05], [0.9, 0.05], [0.5, 0.0]  # 0.4 / 0.05 apart, 0.8 / 1.0 spreads
    achieved = np.array([far_in_x, start, far_in_spread])
    assert np.random.default_rng(1).integers(3) == 1  # the random start is `start`
    spread = hindsight_goal_filtering(achieved, original, 2, np.random.default_rng(1))
    raw = hindsight_goal_filtering(achieved, original, 2, np.random.default_rng(1), scale_by_spread=False)
    np.testing.assert_array_equal(spread, [start, far_in_spread])
    np.testing.assert_array_equal(raw, [start, far_in_x])


def episodes_from(ag: np.ndarray, goal: np.ndarray, lengths=None) -> Episodes:
    n, T1, d = ag.shape
    return Episodes(obs=ag.copy(), ag=ag, g=np.broadcast_to(goal, (n, T1, d)).copy(),
                    actions=np.zeros((n, T1 - 1, d), np.float32), rewards=np.zeros((n, T1 - 1), np.float32),
                    lengths=np.full(n, T1 - 1) if lengths is None else np.asarray(lengths),
                    success=np.zeros(n, np.float32))


def test_relabelled_copies_end_at_their_first_success():
    env = PredatorPreyEnv(dims=1, interception_distance=0.5)
    ag = np.array([[[0.0], [1.0], [2.0], [3.0], [4.0]]], np.float32)  # moves +1 per step
    episodes = episodes_from(ag, np.array([9.0], np.float32))
    goals = np.array([[[9.0]] * 5, [[2.0]] * 5, [[4.0]] * 5], np.float32)
    data = relabel(episodes, np.zeros(3, int), goals, env.compute_success)
    np.testing.assert_array_equal(data.length, [4, 2, 4])  # never / reached after step 2 / after step 4
    np.testing.assert_array_equal(data.terminal.any(axis=1), [False, True, True])
    assert data.terminal[1, 1] and data.mask[1].tolist() == [True, True, False, False]


def test_held_copies_run_the_whole_episode_and_mark_every_step_at_the_goal():
    env = PredatorPreyEnv(dims=1, interception_distance=0.5)
    ag = np.array([[[0.0], [1.0], [2.0], [1.0], [2.0]], [[0.0], [1.0], [2.0], [0.0], [0.0]]], np.float32)
    episodes = episodes_from(ag, np.array([9.0], np.float32), lengths=[4, 3])  # episode 1 ended by its env
    goals = np.array([[[2.0]] * 5] * 2, np.float32)
    data = relabel(episodes, np.array([0, 1]), goals, env.compute_success, end_at_success=False)
    np.testing.assert_array_equal(data.length, [4, 3])  # past the success after step 2 (t = 1)
    assert data.success[0].tolist() == [False, True, False, True]  # there again after step 4 (t = 3)
    assert data.success[1].tolist() == [False, True, False, False]
    assert not data.terminal[0].any()  # truncated at the horizon: bootstrapped
    assert data.terminal[1].tolist() == [False, False, True, False]  # the env ended it: no bootstrap
    first = relabel(episodes, np.array([0, 1]), goals, env.compute_success)
    np.testing.assert_array_equal(first.length, [2, 2])
    np.testing.assert_array_equal(first.success, first.terminal)  # ending at the success, the two agree


def test_htrpo_holding_the_goal_pays_the_sparse_reward_at_every_step_there():
    ag = np.array([[[0.0], [1.0], [2.0], [1.0], [2.0]]], np.float32)  # at 2 after steps 2 and 4
    rewards = {}
    for hold in (False, True):
        agent, _ = predator_prey_agent("htrpo", "algo.original_goals=false", f"algo.hold_goal={hold}")
        batch, data = agent.build_batch(predator_prey_episodes(ag, 9.0), np.array([[2.0]], np.float32))
        rewards[hold] = batch["rewards"].tolist()
    assert rewards[False] == [0.0, 3.0]  # T - t at the first success (T = 4, t = 1), then the copy ends
    assert rewards[True] == [0.0, 3.0, 0.0, 1.0]  # and at t = 3 too: staying at the goal pays


def test_htrpo_binary_reward_pays_one_at_the_first_success_whenever_it_comes():
    ag = np.array([[[0.0], [1.0], [2.0], [1.0], [2.0]]], np.float32)  # at 2 after steps 2 and 4
    agent, _ = predator_prey_agent("htrpo", "algo.original_goals=false", "algo.reward=binary")
    batch, _ = agent.build_batch(predator_prey_episodes(ag, 9.0), np.array([[2.0]], np.float32))
    assert batch["rewards"].tolist() == [0.0, 1.0]  # sparse would pay T - t = 3


def test_evaluation_counts_a_goal_reached_and_left_as_reached_not_as_success():
    from her_mpi.evaluate import at_goal_steps, reached_goal

    env = PredatorPreyEnv(dims=1, interception_distance=0.5)
    ag = np.array([[[0.0], [2.0], [1.0]], [[0.0], [1.0], [1.0]], [[0.0], [0.0], [2.0]]], np.float32)
    episodes = episodes_from(ag, np.array([2.0], np.float32), lengths=[2, 2, 1])  # episode 2 ended after step 1
    np.testing.assert_array_equal(at_goal_steps(episodes, env.compute_success),
                                  [[True, False], [False, False], [False, False]])  # not past an episode's end
    np.testing.assert_array_equal(reached_goal(episodes, env.compute_success), [True, False, False])


def test_gae_bootstraps_truncated_copies_and_stops_at_terminal_steps():
    env = PredatorPreyEnv(dims=1, interception_distance=0.5)
    ag = np.array([[[0.0], [1.0], [2.0]]], np.float32)
    episodes = episodes_from(ag, np.array([9.0], np.float32))
    data = relabel(episodes, np.zeros(2, int), np.array([[[9.0]] * 3, [[2.0]] * 3], np.float32), env.compute_success)
    rewards = np.array([0.0, 0.0, 0.0, 1.0], np.float32)  # rows: copy 0 (t=0,1), copy 1 (t=0,1)
    values = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    next_values = np.array([0.2, 0.5, 0.4, 0.9], np.float32)
    gamma, lam = 0.9, 0.5
    advantages = gae(data, rewards, values, next_values, gamma, lam)
    d = rewards + gamma * next_values * np.array([1, 1, 1, 0]) - values  # copy 1 ends terminal at t=1
    expected = [d[0] + gamma * lam * d[1], d[1], d[2] + gamma * lam * d[3], d[3]]
    np.testing.assert_allclose(advantages, expected, rtol=1e-6)


# -- HTRPO's units, the collecting policy as the ratio's reference, PPO's KL stop ---------------

def predator_prey_agent(algo: str, *overrides, dims: int = 1):
    from her_mpi.config import EnvConfig, load_config
    from her_mpi.envs import env_spec, make_env
    from her_mpi.trainer import build_agent

    env_cfg = EnvConfig("PredatorPrey-v0", {"dims": dims, "interception_distance": 0.5})
    env = make_env(env_cfg, seed=0)
    config = load_config(None, [f"algo={algo}", "env.id=PredatorPrey-v0",
                                f"env.kwargs={{dims: {dims}, interception_distance: 0.5}}", *overrides])
    return build_agent(config, env_spec(env, "PredatorPrey-v0"), env, np.random.SeedSequence(0)), config


def predator_prey_episodes(ag: np.ndarray, goal: float) -> Episodes:
    """1-D predator-prey episodes with the predator at ``ag``, a static prey at ``goal``."""
    episodes = episodes_from(ag, np.array([goal], np.float32))
    episodes.obs = np.concatenate([ag, np.zeros_like(ag)], axis=-1)  # position, prey velocity 0
    return episodes


def test_copies_cut_by_the_time_limit_can_end_in_a_terminal_step():
    from her_mpi.algos.htrpo import ending_at_time_limits

    ag = np.array([[[0.0], [1.0], [2.0], [3.0]], [[0.0], [0.0], [0.0], [0.0]]])
    data = relabel(episodes_from(ag, np.array([2.0])), np.array([0, 1]), np.full((2, 4, 1), 2.0),
                   lambda a, g: (np.abs(a - g) < 0.5).all(-1).astype(np.float32))
    np.testing.assert_array_equal(data.terminal, [[False, True, False], [False, False, False]])
    ended = ending_at_time_limits(data)
    np.testing.assert_array_equal(ended.terminal, [[False, True, False], [False, False, True]])
    values, next_values = np.zeros(5), np.ones(5)  # rows: copy 0 steps 0-1, copy 1 steps 0-2
    np.testing.assert_allclose(gae(data, np.zeros(5), values, next_values, 0.5, 0.0), [0.5, 0.0, 0.5, 0.5, 0.5])
    np.testing.assert_allclose(gae(ended, np.zeros(5), values, next_values, 0.5, 0.0), [0.5, 0.0, 0.5, 0.5, 0.0])


def test_htrpo_weights_are_the_papers_trajectory_normalised_sum():
    # Two 4-step episodes, predator moving +1 / -1 per step, original goal never reached, and two
    # hindsight goals: 2 (episode 0 reaches it after step 2) and -1 (episode 1 after step 1).
    agent, config = predator_prey_agent("htrpo", "algo.gamma=0.9")
    with torch.no_grad():  # a policy that ignores the goal: every importance ratio is 1
        agent.policy_net.mean_net[-2].weight.zero_()
    ag = np.array([[[0.0], [1.0], [2.0], [3.0], [4.0]], [[0.0], [-1.0], [-2.0], [-3.0], [-4.0]]], np.float32)
    episodes = predator_prey_episodes(ag, 9.0)
    batch, data = agent.build_batch(episodes, np.array([[2.0], [-1.0]], np.float32))
    # h: per (goal, t) the ratios (all 1 here) over their sum across the 2 episodes, ended copies
    # included (goal 2: episode 0 ends after 2 steps; goal -1: episode 1 after 1 step), and the
    # episodes' own goals are one more group
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 1],
                     [1, 1, 0, 0], [1, 1, 1, 1],
                     [1, 1, 1, 1], [1, 0, 0, 0]], bool)
    h = 0.5 * mask
    expected = h * 0.9 ** np.arange(4) / (2 * (1 + 2))  # N_traj = 2 episodes x (own goal + 2 goals)
    copy, t = data.rows
    np.testing.assert_array_equal(data.mask, mask)
    np.testing.assert_allclose(batch["coefficients"].numpy(), expected[copy, t], rtol=1e-6)
    # D = (1 - gamma) * sum_rows coefficient * QKL: a constant QKL of k per row gives
    # (1 - gamma) * k * sum(h gamma^t) / N_traj, a sum over time, not a mean over the 18 rows
    with torch.no_grad():
        anchor = tuple(t.detach() for t in agent.policy_net.params(batch["x"]))
        anchor_log_prob = agent.policy_net.log_prob_of(anchor, batch["actions"]) + 0.1  # log-ratio 0.1 per row
        divergence = float(agent.divergence({**batch, "anchor": anchor, "anchor_log_prob": anchor_log_prob}))
    assert divergence == pytest.approx((1 - 0.9) * 0.5 * 0.1 ** 2 * expected.sum(), rel=1e-5)


def test_effective_sample_size_is_the_row_count_for_equal_weights_and_less_when_they_spread():
    from her_mpi.algos.htrpo import effective_sample_size

    assert effective_sample_size(torch.full((18,), 0.5)) == pytest.approx(18)
    assert effective_sample_size(torch.tensor([1.0, 1.0, 2.0])) == pytest.approx(16 / 6)
    assert effective_sample_size(torch.zeros(3)) == 0.0


@pytest.mark.parametrize("algo", ["htrpo", "hpg"])
def test_hindsight_learning_reports_the_effective_sample_size_and_the_copies_that_reach_their_goal(algo):
    agent, _ = predator_prey_agent(algo)
    ag = np.array([[[0.0], [1.0], [2.0], [3.0]], [[0.0], [-1.0], [-2.0], [-3.0]]], np.float32)
    episodes = predator_prey_episodes(ag, 9.0)
    episodes.actions[:] = np.random.default_rng(0).normal(size=episodes.actions.shape)
    # goal 2: episode 0 reaches it after its second step; goal -3: episode 1 after its third; the
    # other two copies and the original goal 9 are never reached
    agent.select_goals = lambda _: np.array([[2.0], [-3.0]], np.float32)
    metrics = agent.learn(episodes)
    assert metrics["copies_reached"] == 2
    assert 1.0 <= metrics["ess"] <= metrics["rows"]


@pytest.mark.parametrize("algo", ["htrpo", "hpg"])
@pytest.mark.parametrize("weighting", ["surrogate", "uniform"])
def test_entropy_bonus_adds_each_rows_weighted_entropy_to_the_objective(algo, weighting):
    ag = np.array([[[0.0], [1.0], [2.0], [3.0], [4.0]], [[0.0], [-1.0], [-2.0], [-3.0], [-4.0]]], np.float32)
    plain, _ = predator_prey_agent(algo, "algo.gamma=0.9")
    bonus, _ = predator_prey_agent(algo, "algo.gamma=0.9", "algo.entropy_coef=0.3",
                                   f"algo.entropy_weighting={weighting}")
    goals = np.array([[2.0], [-1.0]], np.float32)
    batch, _ = plain.build_batch(predator_prey_episodes(ag, 9.0), goals)
    batch["advantages"] = torch.linspace(-1.0, 1.0, len(batch["x"]))
    # surrogate: as the row's surrogate term, h gamma^t / N_traj; uniform: 1 / N_traj, N_traj = 2 x (1 + 2)
    weight = batch["coefficients"] if weighting == "surrogate" else torch.full((len(batch["x"]),), 1 / 6)
    with torch.no_grad():
        entropy = plain.policy_net.entropy(batch["x"])
        expected = plain.surrogate(batch) + 0.3 * (weight * entropy).sum()
        torch.testing.assert_close(bonus.surrogate(batch), expected)  # same seed: same networks
    assert float((weight * entropy).sum()) != 0


def test_entropy_weighting_without_an_entropy_bonus_is_refused():
    with pytest.raises(ConfigError, match="entropy_weighting"):
        predator_prey_agent("htrpo", "algo.entropy_weighting=uniform")


def test_dropping_instant_successes_removes_those_copies_and_their_share_of_the_normaliser():
    # Episode 0 moves +1 per step, episode 1 stays at 0. Goal 2: episode 0 reaches it after step 2.
    # Goal 0: episode 1's copy "succeeds" after its first step whatever it did (it never moved).
    ag = np.array([[[0.0], [1.0], [2.0], [3.0], [4.0]], [[0.0], [0.0], [0.0], [0.0], [0.0]]], np.float32)
    goals = np.array([[2.0], [0.0]], np.float32)
    results = {}
    for drop in (False, True):
        agent, _ = predator_prey_agent("htrpo", "algo.gamma=0.9", f"algo.drop_instant_successes={drop}")
        with torch.no_grad():  # a policy that ignores the goal: every importance ratio is 1
            agent.policy_net.mean_net[-2].weight.zero_()
        results[drop] = agent.build_batch(predator_prey_episodes(ag, 9.0), goals)
    # copies: own goals (episodes 0, 1), goal 2 (0, 1), goal 0 (0, 1); copy 5 is the instant success
    (kept, kept_data), (dropped, dropped_data) = results[False], results[True]
    assert kept_data.mask[5].tolist() == [True, False, False, False] and kept_data.terminal[5, 0]
    assert not dropped_data.mask[5].any() and not dropped_data.terminal[5].any()
    np.testing.assert_array_equal(dropped_data.mask[:5], kept_data.mask[:5])
    assert len(dropped["x"]) == len(kept["x"]) - 1
    assert float(kept["rewards"].max()) == 4.0 and float(dropped["rewards"].max()) == 3.0  # T - t at the success (t = 0 and 1)

    def h(batch, data):
        grid = np.zeros(data.mask.shape)
        copy, t = data.rows
        grid[copy, t] = batch["hindsight_weights"].numpy()
        return grid
    # goal 0's normaliser: kept, the ended copy 5 stays in it with ratio 1 (h = 1/2 for copy 4);
    # dropped, copy 4 is goal 0's only trajectory (h = 1)
    np.testing.assert_allclose(h(kept, kept_data)[4], 0.5, rtol=1e-6)
    np.testing.assert_allclose(h(dropped, dropped_data)[4], 1.0, rtol=1e-6)
    np.testing.assert_allclose(h(dropped, dropped_data)[:4], h(kept, kept_data)[:4], rtol=1e-6)
    for batch, data in results.values():  # a dropped copy still counts in N_traj = 2 x (1 + 2)
        np.testing.assert_allclose(batch["coefficients"].numpy(),
                                   batch["hindsight_weights"].numpy() * 0.9 ** data.rows[1] / 6, rtol=1e-6)


def test_instant_successes_under_the_episodes_own_goals_are_kept():
    env = PredatorPreyEnv(dims=1, interception_distance=0.5)
    ag = np.zeros((1, 4, 1), np.float32)  # never moves: every copy for goal 0 succeeds at its first step
    data = relabel(episodes_from(ag, np.array([0.0], np.float32)), np.zeros(2, int),
                   np.zeros((2, 4, 1), np.float32), env.compute_success)
    kept = without_instant_successes(data, first=1)
    assert kept.mask[0].tolist() == [True, False, False] and not kept.mask[1].any()
    np.testing.assert_array_equal(kept.length, [1, 0])


def test_htrpo_ended_copies_stay_in_the_normaliser_with_their_last_ratio():
    agent, _ = predator_prey_agent("htrpo")
    ag = np.array([[[0.0], [1.0], [2.0], [3.0]], [[0.0], [-1.0], [-2.0], [-3.0]]], np.float32)
    episodes = predator_prey_episodes(ag, 9.0)
    episodes.actions[:] = np.random.default_rng(0).normal(size=episodes.actions.shape)
    batch, data = agent.build_batch(episodes, np.array([[1.0]], np.float32))  # episode 0 ends after step 1
    copy, t = data.rows
    h = np.zeros(data.mask.shape)
    h[copy, t] = batch["hindsight_weights"].numpy()
    with torch.no_grad():
        x_goal = agent.inputs(torch.from_numpy(episodes.obs[:, :-1].reshape(-1, 2)), torch.ones(6, 1))
        x_own = agent.inputs(torch.from_numpy(episodes.obs[:, :-1].reshape(-1, 2)), torch.full((6, 1), 9.0))
        actions = torch.from_numpy(episodes.actions.reshape(-1, 1))
        log_ratio = (agent.policy_net.log_prob(x_goal, actions) - agent.policy_net.log_prob(x_own, actions)).numpy()
    rho = np.exp(np.cumsum(log_ratio.reshape(2, 3), axis=1))
    rho[0, 1:] = rho[0, 0]  # episode 0's copy ended after its first step: its ratio stays
    np.testing.assert_allclose(h[2, 0], rho[0, 0] / rho[:, 0].sum(), rtol=1e-5)
    np.testing.assert_allclose(h[3], rho[1] / rho.sum(axis=0), rtol=1e-5)
    assert h[2, 1:].sum() == 0
    # is_normaliser: running (the authors' code): after copy 2 ended, copy 3 is its goal's only trajectory
    agent.params.is_normaliser = "running"
    batch, data = agent.build_batch(episodes, np.array([[1.0]], np.float32))
    running = np.zeros(data.mask.shape)
    running[data.rows] = batch["hindsight_weights"].numpy()
    np.testing.assert_allclose(running[2:, 0], h[2:, 0], rtol=1e-5)
    np.testing.assert_allclose(running[3, 1:], 1.0, rtol=1e-5)


def test_htrpo_max_log_ratio_truncates_each_copys_cumulative_ratio():
    agent, _ = predator_prey_agent("htrpo")
    ag = np.array([[[0.0], [1.0], [2.0], [3.0]], [[0.0], [-1.0], [-2.0], [-3.0]]], np.float32)
    episodes = predator_prey_episodes(ag, 9.0)
    episodes.actions[:] = np.random.default_rng(0).normal(size=episodes.actions.shape)
    agent.params.weighted_is = False  # the ratios themselves
    goals = np.array([[-3.0]], np.float32)  # far from both episodes for their first steps: every row has a ratio
    batch, data = agent.build_batch(episodes, goals)
    rho = np.zeros(data.mask.shape)
    rho[data.rows] = batch["hindsight_weights"].numpy()
    log_rho = np.log(rho[2:])
    cap = float(np.abs(log_rho).max()) / 2
    assert cap > 0
    agent.params.max_log_ratio = cap
    batch, data = agent.build_batch(episodes, goals)
    capped = np.zeros(data.mask.shape)
    capped[data.rows] = batch["hindsight_weights"].numpy()
    np.testing.assert_allclose(capped[2:], np.exp(np.clip(log_rho, -cap, cap)), rtol=1e-5)
    assert not np.allclose(capped[2:], rho[2:])


def test_htrpo_weighted_importance_sampling_is_normalised_over_episodes_per_goal_and_step():
    agent, _ = predator_prey_agent("htrpo")
    ag = np.array([[[0.0], [1.0], [2.0], [3.0]], [[0.0], [-1.0], [-2.0], [-3.0]], [[0.0], [1.0], [1.0], [1.0]]],
                  np.float32)
    episodes = predator_prey_episodes(ag, 9.0)
    episodes.actions[:] = np.random.default_rng(0).normal(size=episodes.actions.shape)  # ratios != 1
    batch, data = agent.build_batch(episodes, np.array([[3.0], [-3.0]], np.float32))
    copy, t = data.rows
    h = np.zeros(data.mask.shape)
    h[copy, t] = batch["hindsight_weights"].numpy()
    # the trust region's coefficients: h times gamma^t over the 3 x (1 + 2) trajectories
    np.testing.assert_allclose(batch["coefficients"].numpy(), h[copy, t] * agent.params.gamma ** t / 9, rtol=1e-6)
    np.testing.assert_allclose(h[:3][data.mask[:3]], 1 / 3, rtol=1e-6)  # own goals: ratio 1 over 3 episodes
    assert data.mask.all()  # no copy ends early here: every (goal, t) column is a full normalisation
    for goal in range(2):  # each (goal, t) column sums to 1
        block = h[3 + 3 * goal: 6 + 3 * goal]
        np.testing.assert_allclose(block.sum(axis=0), 1.0, rtol=1e-5)


def test_critic_free_advantages_are_the_discounted_importance_weighted_returns():
    # The authors' value_type None: row t's advantage is sum_k gamma^(k-t) h_k r_k over the rest of its
    # copy, and the objective weighs it by gamma^t / N_traj only (the ratio sits on the reward's step).
    agent, _ = predator_prey_agent("htrpo", "algo.gamma=0.9", "algo.critic=false")
    with torch.no_grad():  # a policy that ignores the goal: every importance ratio is 1
        agent.policy_net.mean_net[-2].weight.zero_()
    ag = np.array([[[0.0], [1.0], [2.0], [3.0], [4.0]], [[0.0], [-1.0], [-2.0], [-3.0], [-4.0]]], np.float32)
    batch, data = agent.build_batch(predator_prey_episodes(ag, 9.0), np.array([[2.0], [-1.0]], np.float32))
    agent.return_advantages(batch, data)
    advantages = np.zeros(data.mask.shape)
    copy, t = data.rows
    advantages[copy, t] = batch["advantages"].numpy()
    # goal 2: episode 0 (copy 2) reaches it at t = 1, reward T - t = 3, h = 1/2 (2 episodes, ratio 1);
    # goal -1: episode 1 (copy 5) at t = 0, reward 4, h = 1/2; no other copy has a reward
    expected = np.zeros((6, 4))
    expected[2, :2] = [0.9 * 0.5 * 3, 0.5 * 3]
    expected[5, 0] = 0.5 * 4
    np.testing.assert_allclose(advantages, expected, rtol=1e-6)
    np.testing.assert_allclose(batch["surrogate_coefficients"].numpy(), 0.9 ** t / 6, rtol=1e-6)
    assert not torch.equal(batch["surrogate_coefficients"], batch["coefficients"])  # the trust region keeps h


def test_critic_free_learning_leaves_the_value_network_alone():
    agent, config = predator_prey_agent("htrpo", "algo.critic=false", dims=2)
    episodes, _ = collect(agent, config)
    agent.inputs.obs_normalizer.observe(episodes.obs.reshape(-1, 4))  # statistics in which no input
    agent.inputs.goal_normalizer.observe(episodes.g.reshape(-1, 2))  # clips: learn() then preserves
    agent.inputs.sync()  # the networks' functions exactly
    obs, goals = torch.from_numpy(episodes.obs[:, 0]), torch.from_numpy(episodes.g[:, 0])

    def functions():  # V and the policy on raw inputs (learn() rewrites both for the new normalizer)
        with torch.no_grad():
            x = agent.inputs(obs, goals)
            return agent.value_net(x), agent.policy_net.params(x)[0]
    value_before, policy_before = functions()
    metrics = agent.learn(episodes)
    value_after, policy_after = functions()
    assert "critic_loss" not in metrics
    torch.testing.assert_close(value_after, value_before, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(policy_after, policy_before, rtol=1e-4, atol=1e-5)


def collect(agent, config, n_episodes=4):
    from her_mpi.rollout import RolloutWorker

    worker = RolloutWorker(config.env, n_episodes, np.random.SeedSequence(1))
    episodes = worker.generate(lambda o, g: agent.act(o, g, explore=True), n_episodes)
    valid = np.arange(episodes.actions.shape[1])[None, :] < episodes.lengths[:, None]
    with torch.no_grad():  # what the collecting policy gave each taken action
        x = agent.inputs(torch.from_numpy(episodes.obs[:, :-1][valid]), torch.from_numpy(episodes.g[:, :-1][valid]))
        log_prob = agent.policy_net.log_prob(x, torch.from_numpy(episodes.actions[valid])).numpy()
    return episodes, log_prob


@pytest.mark.parametrize("algo, step", [("htrpo", "policy_step"), ("ppo", "optimize")])
def test_old_log_probs_are_the_collecting_policys(algo, step, monkeypatch):
    agent, config = predator_prey_agent(algo, dims=2)
    agent.inputs.obs_normalizer.observe(np.zeros((1, 4)))  # some statistics already: a later
    agent.inputs.goal_normalizer.observe(np.zeros((1, 2)))  # update moves them
    agent.inputs.sync()
    episodes, collecting = collect(agent, config)
    seen = {}

    def capture(batch):
        seen.update(batch)
        return {}

    monkeypatch.setattr(agent, step, capture)
    agent.learn(episodes)
    n_original = int(episodes.lengths.sum())  # the original goals' rows come first
    np.testing.assert_allclose(seen["old_log_prob"][:n_original].numpy(), collecting, rtol=1e-5, atol=1e-5)
    assert agent.inputs.obs_normalizer.total[-1] > 1  # the normalizers did take the batch in


def test_relabelled_copies_reference_the_collecting_parameters_under_their_goal(monkeypatch):
    agent, config = predator_prey_agent("htrpo", "algo.n_goals=3", dims=2)
    episodes, _ = collect(agent, config)
    with torch.no_grad():
        policy_before = {k: v.clone() for k, v in agent.policy_net.state_dict().items()}
        inputs_before = {k: v.clone() for k, v in agent.inputs.state_dict().items() if isinstance(v, torch.Tensor)}
    seen = {}
    monkeypatch.setattr(agent, "policy_step", lambda batch: seen.update(batch) or {})
    goals = agent.select_goals(episodes)
    monkeypatch.setattr(agent, "select_goals", lambda _: goals)
    agent.learn(episodes)
    reference, _ = predator_prey_agent("htrpo", "algo.n_goals=3", dims=2)
    reference.policy_net.load_state_dict(policy_before)
    reference.inputs.load_state_dict(inputs_before, strict=False)
    n, T = len(episodes), episodes.actions.shape[1]
    source = np.concatenate([np.arange(n), np.tile(np.arange(n), len(goals))])
    all_goals = np.concatenate([episodes.g, np.repeat(goals, n, axis=0)[:, None, :].repeat(T + 1, axis=1)])
    data = relabel(episodes, source, all_goals, agent.goal_fns.success)
    copy, t = data.rows
    with torch.no_grad():
        x = reference.inputs(torch.from_numpy(episodes.obs[source[copy], t]), torch.from_numpy(all_goals[copy, t]))
        expected = reference.policy_net.log_prob(x, torch.from_numpy(episodes.actions[source[copy], t]))
    np.testing.assert_allclose(seen["old_log_prob"].numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_ppo_stops_before_the_step_that_would_exceed_the_target_kl():
    agent, _ = predator_prey_agent("ppo", "algo.target_kl=0.01", "algo.minibatch_size=16", dims=2)
    x = torch.randn(64, agent.inputs.out_dim, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        actions = agent.policy_net.sample(x, torch.Generator().manual_seed(1))
        log_prob = agent.policy_net.log_prob(x, actions)
    before = agent.policy_optimizer.flat.param.clone()
    # the policy already differs from the batch's reference by a KL far above 1.5 x target_kl
    batch = {"x": x, "actions": actions, "old_log_prob": log_prob - 1.0, "advantages": torch.randn(64),
             "returns": torch.zeros(64)}
    metrics = agent.optimize(batch)
    assert metrics["minibatch_steps"] == 0 and metrics["approx_kl"] > 1.5 * 0.01
    torch.testing.assert_close(agent.policy_optimizer.flat.param, before, rtol=0, atol=0)


def test_ppo_steps_while_the_kl_is_below_the_target():
    agent, _ = predator_prey_agent("ppo", "algo.target_kl=0.01", "algo.minibatch_size=16", "algo.n_epochs=1", dims=2)
    x = torch.randn(64, agent.inputs.out_dim, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        actions = agent.policy_net.sample(x, torch.Generator().manual_seed(1))
        log_prob = agent.policy_net.log_prob(x, actions)
    batch = {"x": x, "actions": actions, "old_log_prob": log_prob, "advantages": torch.randn(64),
             "returns": torch.zeros(64)}
    metrics = agent.optimize(batch)
    assert metrics["minibatch_steps"] >= 1


def moving_prey_episode() -> Episodes:
    """One 1-D episode of 4 steps: the predator moves +1 per step from 0, the prey flees at +0.5 from 6."""
    ag = np.array([[[0.0], [1.0], [2.0], [3.0], [4.0]]], np.float32)
    episodes = predator_prey_episodes(ag, 0.0)
    episodes.g = np.array([[[6.0], [6.5], [7.0], [7.5], [8.0]]], np.float32)
    episodes.obs[..., 1] = 0.5  # the prey's velocity, as the observation reports it
    return episodes


def test_ppo_final_copies_hold_the_last_achieved_goal_still():
    agent, _ = predator_prey_agent("ppo")
    source, goals = agent.hindsight_goals(moving_prey_episode())
    np.testing.assert_array_equal(source, [0])
    np.testing.assert_array_equal(goals[0, :, 0], [4.0] * 5)


def test_ppo_shifted_copies_keep_the_goals_motion_and_reach_it_at_the_chosen_step():
    agent, _ = predator_prey_agent("ppo", "algo.shift_goals=true")
    episodes = moving_prey_episode()
    _, goals = agent.hindsight_goals(episodes)
    # the prey's trajectory moved back by 4 (8 -> 4): still +0.5 per step, as the observation says
    np.testing.assert_array_equal(goals[0, :, 0], [2.0, 2.5, 3.0, 3.5, 4.0])
    data = relabel(episodes, np.zeros(1, int), goals, agent.goal_fns.success)
    assert data.length[0] == 3 and data.terminal[0, 2]  # caught one step early: 3 is within 0.5 of 3.5
    episodes.g[:] = 6.0  # a prey that stands still: shifted copies are the final ones
    _, still = agent.hindsight_goals(episodes)
    np.testing.assert_array_equal(still[0, :, 0], [4.0] * 5)


def test_ppo_clipped_shifted_copies_stay_in_the_arena_and_still_reach_the_achieved_goal():
    agent, _ = predator_prey_agent("ppo", "algo.shift_goals=true", "algo.clip_shifted_goals=true")
    episodes = moving_prey_episode()
    episodes.ag[0, :, 0] = [-7.0, -8.0, -9.0, -10.0, -10.0]  # the predator ends at the arena's wall (size 10)
    _, goals = agent.hindsight_goals(episodes)
    # translated by -18 the prey's trajectory would start at -12, outside; the env would hold it at the wall
    np.testing.assert_array_equal(goals[0, :, 0], [-10.0] * 5)
    agent.params.clip_shifted_goals = False
    _, unclipped = agent.hindsight_goals(episodes)
    np.testing.assert_array_equal(unclipped[0, :, 0], [-12.0, -11.5, -11.0, -10.5, -10.0])


def test_ppo_clipping_shifted_goals_needs_a_bounded_goal_space():
    import dataclasses

    from her_mpi.trainer import build_agent
    agent, config = predator_prey_agent("ppo", "algo.shift_goals=true", "algo.clip_shifted_goals=true")
    unbounded = dataclasses.replace(agent.spec, goal_low=(), goal_high=())
    with pytest.raises(ConfigError, match="clip_shifted_goals = true on PredatorPrey-v0"):
        build_agent(config, unbounded, None, np.random.SeedSequence(0))


def test_ppo_shifted_future_copies_pass_through_the_achieved_goal_of_their_step():
    agent, _ = predator_prey_agent("ppo", "algo.shift_goals=true", "algo.strategy=future", "algo.replay_k=8")
    episodes = moving_prey_episode()
    source, goals = agent.hindsight_goals(episodes)
    assert len(source) == 8
    for copy in range(8):  # the prey's trajectory moved by a constant, meeting the predator at one step >= 1
        assert np.ptp(goals[copy, :, 0] - episodes.g[0, :, 0]) == 0
        meets = np.flatnonzero(episodes.ag[0, :, 0] == goals[copy, :, 0])
        assert len(meets) == 1 and meets[0] >= 1


def test_normalizer_updates_preserve_the_on_policy_networks_functions():
    agent, config = predator_prey_agent("htrpo", dims=2)
    episodes, _ = collect(agent, config)
    agent.update_normalizers(episodes)  # statistics of the data: no input near the clip range
    episodes, _ = collect(agent, config, n_episodes=2)
    obs = torch.from_numpy(episodes.obs[:, :-1].reshape(-1, 4))
    goals = torch.from_numpy(episodes.g[:, :-1].reshape(-1, 2))
    with torch.no_grad():
        before = agent.policy_net(agent.inputs(obs, goals)), agent.value_net(agent.inputs(obs, goals))
        normalised_before = agent.inputs(obs, goals)
    for _ in range(2):
        with agent.functions_preserved():
            agent.update_normalizers(episodes)
    with torch.no_grad():
        after = agent.policy_net(agent.inputs(obs, goals)), agent.value_net(agent.inputs(obs, goals))
        assert not torch.allclose(agent.inputs(obs, goals), normalised_before)  # the statistics did change
    torch.testing.assert_close(after[0], before[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(after[1], before[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("adopt", [False, True])
def test_the_first_statistics_are_adopted_or_preserved(adopt, monkeypatch):
    """adopt_first_statistics: the first batch's statistics reach the initial networks unrewritten
    (they then see normalised inputs), and the batch's log-probabilities are the re-normalised
    policy's; later updates keep the networks' functions either way."""
    agent, config = predator_prey_agent("htrpo", f"algo.adopt_first_statistics={str(adopt).lower()}", dims=2)
    episodes, collecting = collect(agent, config)
    first_layer = next(m for m in agent.policy_net.modules() if isinstance(m, torch.nn.Linear))
    initial = first_layer.weight.detach().clone()
    seen = {}
    monkeypatch.setattr(agent, "policy_step", lambda batch: seen.update(batch) or {})
    agent.learn(episodes)
    assert agent.inputs.obs_normalizer.total[-1] > 1  # the statistics were taken in
    assert torch.equal(first_layer.weight, initial) == adopt  # rewritten only to keep the function
    n_original = int(episodes.lengths.sum())
    matches_collecting = np.allclose(seen["old_log_prob"][:n_original].numpy(), collecting, rtol=1e-5, atol=1e-5)
    assert matches_collecting != adopt
    before = first_layer.weight.detach().clone()
    agent.learn(collect(agent, config)[0])  # the second iteration preserves in both settings
    assert not torch.equal(first_layer.weight, before)


def test_lagged_statistics_are_taken_in_after_the_step_and_leave_the_networks_as_they_are(monkeypatch):
    """statistics=lagged (the authors' code): the step is taken in the statistics the batch was
    collected with (its log-probabilities are the collecting policy's); the batch's statistics
    arrive afterwards, and only the optimiser changes the weights."""
    agent, config = predator_prey_agent("htrpo", "algo.statistics=lagged", dims=2)
    agent.learn(collect(agent, config)[0])  # a first iteration: statistics away from their initial values
    episodes, collecting = collect(agent, config)
    first_layer = next(m for m in agent.policy_net.modules() if isinstance(m, torch.nn.Linear))
    before = first_layer.weight.detach().clone()
    count = agent.inputs.obs_normalizer.total[-1].copy()
    seen = {}
    monkeypatch.setattr(agent, "policy_step", lambda batch: seen.update(
        count=agent.inputs.obs_normalizer.total[-1].copy(), **batch) or {})
    agent.learn(episodes)
    assert seen["count"] == count  # the step saw the statistics the batch was collected with
    assert agent.inputs.obs_normalizer.total[-1] > count  # ... which took the batch in after it
    n_original = int(episodes.lengths.sum())
    np.testing.assert_allclose(seen["old_log_prob"][:n_original].numpy(), collecting, rtol=1e-5, atol=1e-5)
    assert torch.equal(first_layer.weight, before)  # no step was taken (patched), and nothing rewrote them


@pytest.mark.parametrize("original_goals", [True, False])
def test_hindsight_statistics_count_each_state_once_per_running_copy_and_each_goal_once_per_row(original_goals):
    """statistics_rows=hindsight (the authors' code): the normalizers see the rewritten copies' rows,
    not the collected steps; the episodes' own-goal rows are left out."""
    agent, config = predator_prey_agent("htrpo", "algo.statistics_rows=hindsight",
                                        f"algo.original_goals={str(original_goals).lower()}", dims=2)
    episodes, _ = collect(agent, config)
    goals = np.array([[1.0, 2.0], [-1.0, 0.5], [3.0, -2.0]], np.float32)
    data = agent.relabelled(episodes, goals)
    copy, t = data.rows
    hindsight = copy >= (len(episodes) if original_goals else 0)
    rows_obs = episodes.obs[data.source[copy[hindsight]], t[hindsight]].astype(np.float64)
    rows_goals = data.goals[copy[hindsight], t[hindsight]].astype(np.float64)
    agent.take_in_statistics(episodes, goals, data)
    obs_stats, goal_stats = agent.inputs.obs_normalizer, agent.inputs.goal_normalizer
    assert obs_stats.total[-1] == goal_stats.total[-1] == hindsight.sum() > len(episodes)
    np.testing.assert_allclose(obs_stats.mean.numpy(), rows_obs.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(goal_stats.mean.numpy(), rows_goals.mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(goal_stats.std.numpy(), np.maximum(rows_goals.std(axis=0), 0.01), rtol=1e-4)


def test_line_search_accepts_only_steps_that_deliver_the_asked_share_of_the_predicted_improvement():
    from her_mpi.config import load_config
    from her_mpi.envs import env_spec, make_env
    from her_mpi.trainer import build_agent

    def first_step(accept_ratio):
        # a trust region far too large for the surrogate's linear prediction to hold at the full step
        config = load_config(None, ["algo=htrpo", "env.id=BitFlipping-v0", "env.kwargs={n_bits: 6}",
                                    "algo.hidden=[16]", "algo.max_kl=1.0",
                                    f"algo.line_search_accept_ratio={accept_ratio}"])
        env = make_env(config.env, seed=0)
        agent = build_agent(config, env_spec(env, "BitFlipping-v0"), env, np.random.SeedSequence(0))
        return agent.learn(collect(agent, config, n_episodes=8)[0])

    steps = {}
    for accept_ratio in (0.0, 0.9):
        metrics = first_step(accept_ratio)
        k = steps[accept_ratio] = int(metrics["line_search_step"])
        assert k >= 1  # accepted: improvement > accept_ratio * the gradient's prediction for that step
        assert metrics["surrogate_improvement"] > accept_ratio * 0.5 ** (k - 1) * metrics["expected_improvement"]
    assert steps[0.0] < steps[0.9]  # the same batch and step: only the asked share made it halve further


BITS_6 = ("env.id=BitFlipping-v0", "env.kwargs={n_bits: 6}")


def measured_htrpo_step(monkeypatch, uniform_policy: bool = False, env=BITS_6) -> tuple[dict, dict, float]:
    """An HTRPO agent (on 6 bits unless ``env`` says otherwise): HTRPO.gradient_measures on learn()'s
    hindsight batch, taken just before the real step on that batch, the step's metrics, and the agent's max_kl."""
    from her_mpi.config import load_config
    from her_mpi.envs import env_spec, make_env
    from her_mpi.trainer import build_agent

    config = load_config(None, ["algo=htrpo", *env, "algo.hidden=[16]"])
    env = make_env(config.env, seed=0)
    agent = build_agent(config, env_spec(env, config.env.id), env, np.random.SeedSequence(0))
    if uniform_policy:  # zero logits: every action equally likely, the entropy at its maximum
        last = [m for m in agent.policy_net.modules() if isinstance(m, torch.nn.Linear)][-1]
        with torch.no_grad():
            last.weight.zero_(), last.bias.zero_()
    episodes, _ = collect(agent, config, n_episodes=8)
    seen, step = {}, type(agent).policy_step

    def measure_then_step(batch):
        seen["measures"] = agent.gradient_measures(batch)
        seen["terms"] = {w: terms_against_the_bonus(agent, batch, w) for w in ("uniform", "surrogate")}
        return step(agent, batch)

    monkeypatch.setattr(agent, "policy_step", measure_then_step)
    metrics = agent.learn(episodes)
    return seen["measures"] | {"terms": seen["terms"]}, metrics, agent.params.max_kl


def terms_against_the_bonus(agent, batch, weighting: str) -> tuple[float, float, float]:
    """The entropy term entropy_gradient.py differentiates, and the same from HTRPO's surrogate() with
    a bonus of 0.5 and without (difference / 0.5); its objective term, and surrogate() without the bonus."""
    import dataclasses

    surrogate, entropy = agent.importance_sampled_objective(batch), agent.entropy_term(batch, weighting)
    params = agent.params
    with torch.no_grad():
        agent.params = dataclasses.replace(params, entropy_coef=0.0)
        plain = float(agent.surrogate(batch))
        agent.params = dataclasses.replace(params, entropy_coef=0.5, entropy_weighting=weighting)
        with_bonus = float(agent.surrogate(batch))
    agent.params = params
    return float(entropy), (with_bonus - plain) / 0.5, float(surrogate) - plain


def test_entropy_gradient_diagnostic_measures_in_the_steps_own_fisher_metric(monkeypatch):
    measures, metrics, max_kl = measured_htrpo_step(monkeypatch)
    assert measures["fisher_norm_entropy"] > 0 and -1 <= measures["fisher_cosine"] <= 1
    for weighting, (entropy, from_the_bonus, objective_gap) in measures["terms"].items():
        assert entropy == pytest.approx(from_the_bonus, rel=1e-4), weighting  # the bonus training would add
        assert objective_gap == pytest.approx(0, abs=1e-6), weighting
    assert measures["terms"]["uniform"][0] != pytest.approx(measures["terms"]["surrogate"][0], rel=1e-3)
    # the trust-region step s = sqrt(2 max_kl / d.Fd) d with d = F^-1 g, so g.s = sqrt(2 max_kl) |g|_F
    np.testing.assert_allclose(metrics["expected_improvement"],
                               math.sqrt(2 * max_kl) * measures["fisher_norm_surrogate"], rtol=1e-3)


def test_entropy_gradient_diagnostic_on_a_gaussian_policy(monkeypatch):
    """A Gaussian's entropy depends on its log-std only: the other parameters' gradient is zero, not an error."""
    measures, _, _ = measured_htrpo_step(monkeypatch, env=("env.id=PredatorPrey-v0", "env.kwargs={dims: 2}"))
    assert measures["fisher_norm_entropy"] > 0 and measures["fisher_norm_surrogate"] > 0
    assert -1 <= measures["fisher_cosine"] <= 1


def test_entropy_gradient_vanishes_at_the_uniform_policy(monkeypatch):
    measures, _, _ = measured_htrpo_step(monkeypatch, uniform_policy=True)
    assert measures["euclid_norm_entropy"] < 1e-4 * measures["euclid_norm_surrogate"]
    assert measures["fisher_norm_entropy"] < 1e-4 * measures["fisher_norm_surrogate"]


@pytest.mark.parametrize("algo, env_id, discrete", [("htrpo", "PredatorPrey-v0", False), ("ppo", "BitFlipping-v0", True)])
def test_orthogonal_init_starts_the_policy_near_zero(algo, env_id, discrete):
    from her_mpi.config import load_config
    from her_mpi.envs import EnvSpec
    from her_mpi.trainer import build_agent

    spec = EnvSpec(env_id, 8, 8, discrete, 1 if discrete else 2, 8 if discrete else 0,
                   None if discrete else (-1.0,) * 2, None if discrete else (1.0,) * 2, 20, 0.0)
    outputs = {}
    for init in ("xavier", "orthogonal"):
        agent = build_agent(load_config(None, [f"algo={algo}", f"env.id={env_id}", "algo.hidden=[64, 64]",
                                               f"algo.init={init}"]), spec)
        for network in (agent.policy_net, agent.value_net):
            linears = [m for m in network.modules() if isinstance(m, torch.nn.Linear)]
            if init == "orthogonal":
                for k, layer in enumerate(linears):
                    gain = 0.1 if k == len(linears) - 1 else math.sqrt(2)
                    w = layer.weight.detach() / gain
                    small = min(w.shape)
                    gram = w @ w.T if w.shape[0] == small else w.T @ w
                    assert torch.allclose(gram, torch.eye(small), atol=1e-5)
                    assert not layer.bias.any()
        x = torch.randn(512, agent.inputs.out_dim, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            outputs[init] = agent.policy_net(x).abs().mean()  # means, or logits
    assert outputs["orthogonal"] < 0.3 * outputs["xavier"]


def test_a_full_batch_value_fit_in_pieces_takes_the_whole_batchs_steps(monkeypatch):
    import copy

    import her_mpi.algos.on_policy as on_policy

    agent, _ = predator_prey_agent("htrpo")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1000, agent.inputs.out_dim, generator=generator)
    targets = torch.randn(1000, generator=generator)
    whole = copy.deepcopy(agent.value_net)
    optimizer = torch.optim.Adam(whole.parameters(), lr=agent.params.lr_critic, eps=1e-8)
    for _ in range(3):
        optimizer.zero_grad()
        expected_loss = (whole(x).squeeze(-1) - targets).pow(2).mean()
        expected_loss.backward()
        optimizer.step()
    monkeypatch.setattr(on_policy, "VALUE_FIT_PIECE", 300)  # 4 pieces, the last one short
    loss = agent.fit_value(x, targets, iterations=3)
    assert loss == pytest.approx(float(expected_loss), rel=1e-5)
    for fitted, reference in zip(agent.value_net.parameters(), whole.parameters()):
        torch.testing.assert_close(fitted, reference, rtol=1e-4, atol=1e-6)
