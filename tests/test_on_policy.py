"""Pieces of the on-policy hindsight algorithms: QKL, conjugate gradient, goal filtering,
relabelling and GAE."""

import math

import numpy as np
import pytest
import torch

from her_mpi.algos.htrpo import conjugate_gradient, hindsight_goal_filtering
from her_mpi.algos.on_policy import gae, relabel
from her_mpi.algos.policies import CategoricalPolicy, GaussianPolicy
from her_mpi.envs.predator_prey import PredatorPreyEnv
from her_mpi.rollout import Episodes


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
    batch = {"x": x, "actions": actions, "old": old, "old_log_prob": old_log_prob,
             "coefficients": torch.full((500,), 1 / 500)}
    expected = 0.5 * (old_log_prob - new_log_prob).pow(2).mean()
    assert float(agent.divergence(batch)) == pytest.approx(float(expected), rel=1e-5)


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
