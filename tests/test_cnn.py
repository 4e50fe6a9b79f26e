"""The image-observation path: uint8 storage, pixel scaling instead of running normalisation, the
paper's CNN for HTRPO and DQN, and ONNX export of image policies."""

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from her_mpi.checkpoint import save_checkpoint
from her_mpi.cnn import ConvGoalNet, FrameRows, ImageGoalInput
from her_mpi.config import EnvConfig, load_config
from her_mpi.envs import EnvSpec, make_env
from her_mpi.export import export_policy, main as export_main, verify
from her_mpi.trainer import build_agent

PACMAN = EnvSpec("MsPacmanGoal-v0", 4 * 84 * 84, 2, True, 1, 4, (), (), 26, 13 / 60, (-1.0, 0.0),
                 obs_shape=(4, 84, 84), obs_dtype="uint8")


def agent_for(algo: str, *overrides):
    replay = ["replay.size=2600"] if algo == "dqn" else []  # on-policy algorithms keep no replay
    config = load_config(None, [f"algo={algo}", "env.id=MsPacmanGoal-v0", "algo.hidden=[32, 32, 32]",
                                "algo.activation=relu", *replay, *overrides])
    return build_agent(config, PACMAN), config


def test_the_papers_cnn_shapes():
    net = ConvGoalNet((4, 84, 84), 2, [32, 32, 32], 4)
    convs = [m for m in net.convs if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (8, (8, 8), (4, 4)), (16, (4, 4), (2, 2)), (16, (3, 3), (2, 2))]
    linears = [m for m in net.head if isinstance(m, nn.Linear)]
    # 84 -> 20 -> 9 -> 4: 16 x 4 x 4 features, then the goal is appended
    assert [(l.in_features, l.out_features) for l in linears] == [(16 * 4 * 4 + 2, 32), (32, 32), (32, 32), (32, 4)]
    image = torch.randint(0, 256, (3, 4 * 84 * 84)).float()
    goals = torch.randn(3, 2)
    out = net(torch.cat([image, goals], -1))
    moved = net(torch.cat([image, goals + 1.0], -1))
    assert out.shape == (3, 4) and not torch.allclose(out, moved)  # the goal reaches the output


def test_images_are_scaled_not_normalised():
    inputs = ImageGoalInput((4, 84, 84), 2, load_config().normalizer)
    obs = np.random.default_rng(0).integers(0, 256, (5, 4 * 84 * 84)).astype(np.uint8)
    goals = np.random.default_rng(1).normal(3.0, 2.0, (5, 2)).astype(np.float32)
    inputs.observe(obs, goals)
    inputs.sync()
    x = inputs(torch.from_numpy(obs), torch.from_numpy(goals))
    assert x.dtype == torch.float32
    torch.testing.assert_close(x[:, :-2], torch.from_numpy(obs).float(), rtol=0, atol=0)  # raw pixel values
    assert float(inputs.goal_normalizer.mean[0]) != 0.0  # goals still get running statistics
    image = inputs(torch.from_numpy(obs).reshape(5, 4, 84, 84), torch.from_numpy(goals))
    torch.testing.assert_close(image, x)  # flat (stored) and image (exported) layouts agree
    # the network scales the pixels to [0, 1] itself: the convolutions of obs / 255 (up to the
    # rounding of its channels-last convolutions)
    net = ConvGoalNet((4, 84, 84), 2, [32], 4)
    features = net.convs(torch.from_numpy(obs).float().reshape(5, 4, 84, 84) / 255)
    torch.testing.assert_close(net(x), net.head(torch.cat([features, x[:, -2:]], -1)))


@pytest.mark.parametrize("algo", ["dqn", "htrpo"])
def test_image_agents_use_the_cnn_and_keep_uint8_observations(algo):
    agent, config = agent_for(algo)
    networks = [agent.q_network] if algo == "dqn" else [agent.policy_net.logits_net, agent.value_net]
    assert all(isinstance(n, ConvGoalNet) for n in networks)
    if algo == "dqn":
        assert agent.buffer.obs.dtype == np.uint8
    env = make_env(EnvConfig("MsPacmanGoal-v0"), seed=0)
    obs, _ = env.reset(seed=0)
    action = agent.act(obs["observation"].reshape(1, -1), obs["desired_goal"][None], explore=True)
    assert action.shape == (1, 1) and 0 <= int(action[0, 0]) < 4


def test_rollouts_store_image_observations_as_uint8():
    from her_mpi.rollout import RolloutWorker

    worker = RolloutWorker(EnvConfig("MsPacmanGoal-v0"), 2, np.random.SeedSequence(0))
    episodes = worker.generate(lambda o, g: np.zeros((len(o), 1), np.int64), 2)
    assert episodes.obs.dtype == np.uint8 and episodes.obs.shape == (2, 27, 4 * 84 * 84)
    assert episodes.obs[:, 1].max() > 0


@pytest.mark.parametrize("algo", ["dqn", "htrpo"])
def test_cnn_export_equals_torch(algo, tmp_path):
    agent, _ = agent_for(algo)
    agent.inputs.goal_normalizer.observe(np.random.default_rng(0).uniform(0, 18, (100, 2)))
    agent.inputs.goal_normalizer.sync()
    policy = agent.policy().eval()
    model = export_policy(policy, PACMAN.obs_dim, PACMAN.goal_dim, {"algo": algo})
    path = tmp_path / "policy.onnx"
    path.write_bytes(model.SerializeToString())
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    observation = session.get_inputs()[0]
    assert observation.name == "observation" and observation.shape[1:] == [4, 84, 84]
    differences = verify(path, policy, PACMAN.obs_dim, PACMAN.goal_dim)
    assert max(differences.values()) <= 1e-5, differences
    # and on real frames: the same greedy actions as the agent
    env = make_env(EnvConfig("MsPacmanGoal-v0"), seed=0)
    frames, goals = [], []
    obs, _ = env.reset(seed=0)
    for step in range(6):
        frames.append(obs["observation"])
        goals.append(obs["desired_goal"])
        obs, *_ = env.step(step % 4)
    frames, goals = np.stack(frames), np.stack(goals)
    (onnx_action,) = session.run(["action"], {"observation": frames.astype(np.float32), "desired_goal": goals})
    np.testing.assert_array_equal(onnx_action, agent.act(frames.reshape(6, -1), goals, explore=False))


def test_export_command_writes_and_verifies_an_image_policy(tmp_path):
    agent, config = agent_for("dqn")
    state = {"algo": "dqn", "config": config.to_dict(), "spec": dataclasses.asdict(PACMAN), "epoch": 0,
             "env_steps": 0, "n_ranks": 1, "test_success_rate": 0.0, "agent": agent.state_dict()}
    checkpoint = tmp_path / "latest.pt"
    save_checkpoint(checkpoint, state)
    assert export_main(["--checkpoint", str(checkpoint), "--output", str(tmp_path / "p.onnx")]) == 0
    assert (tmp_path / "p.onnx").stat().st_size > 0


def pacman_episodes(agent, n_episodes=4):
    from her_mpi.rollout import RolloutWorker

    worker = RolloutWorker(EnvConfig("MsPacmanGoal-v0"), n_episodes, np.random.SeedSequence(3))
    return worker.generate(lambda o, g: agent.act(o, g, explore=True), n_episodes)


def test_htrpo_normalizer_updates_preserve_the_cnn_policy_and_value():
    # the CNN sits inside the categorical policy: its goal columns are in the head, not at x[:, 0]
    agent, _ = agent_for("htrpo")
    agent.update_normalizers(pacman_episodes(agent))  # some statistics first: the next update moves them
    episodes = pacman_episodes(agent, n_episodes=2)
    obs = torch.from_numpy(episodes.obs[:, :-1].reshape(-1, PACMAN.obs_dim))
    goals = torch.from_numpy(episodes.g[:, :-1].reshape(-1, 2) + np.float32(2.0))  # shifted: new statistics
    with torch.no_grad():
        x_before = agent.inputs(obs, goals)
        before = agent.policy_net(x_before), agent.value_net(x_before)
    with agent.functions_preserved():
        agent.update_normalizers(episodes, extra_goals=goals.numpy())
    with torch.no_grad():
        x_after = agent.inputs(obs, goals)
        after = agent.policy_net(x_after), agent.value_net(x_after)
    assert not torch.allclose(x_after[:, -2:], x_before[:, -2:])  # the goal statistics did change
    torch.testing.assert_close(after[0], before[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(after[1], before[1], rtol=1e-4, atol=1e-5)


def test_htrpo_takes_an_improving_step_on_ms_pacman_episodes():
    config = load_config(None, ["algo=htrpo", "env.id=MsPacmanGoal-v0", "algo.hidden=[32, 32, 32]",
                                "algo.activation=relu", "algo.n_goals=4"])
    agent = build_agent(config, PACMAN, make_env(config.env, seed=0), np.random.SeedSequence(0))
    episodes = pacman_episodes(agent)
    params_before = torch.cat([p.detach().flatten().clone() for p in agent.policy_net.parameters()])
    metrics = agent.learn(episodes)
    params_after = torch.cat([p.detach().flatten() for p in agent.policy_net.parameters()])
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert not torch.equal(params_before, params_after)  # the trust-region step moved the policy
    assert metrics["surrogate_improvement"] > 0 and metrics["line_search_step"] >= 1  # an accepted, improving step


def test_rows_sharing_frames_compute_what_dense_rows_do():
    # hindsight copies repeat each frame under other goals: convolving each frame once must give the
    # dense input's outputs, gradients and (HTRPO's conjugate gradient) Hessian-vector products
    agent, _ = agent_for("htrpo")
    episodes = pacman_episodes(agent, n_episodes=3)
    rng = np.random.default_rng(0)
    ep, t = rng.integers(0, 3, 200), rng.integers(0, episodes.lengths.min(), 200)
    goals = rng.uniform(0, 18, (200, 2)).astype(np.float32)
    shared = agent.inputs_at(episodes, ep, t, goals)
    dense = agent.inputs(torch.from_numpy(episodes.obs[ep, t]), torch.from_numpy(goals))
    assert isinstance(shared, FrameRows) and len(shared) == 200 and len(shared[:10]) == 10
    actions = torch.from_numpy(rng.integers(0, 4, (200, 1)))
    params = list(agent.policy_net.parameters())
    vector = [torch.randn_like(q) for q in params]
    results = []
    for x in (shared, dense):
        log_prob = agent.policy_net.log_prob(x, actions)
        grads = torch.autograd.grad(log_prob.square().sum(), params, create_graph=True)
        hvp = torch.autograd.grad(sum((g * v).sum() for g, v in zip(grads, vector)), params)
        results.append((log_prob.detach(), agent.value_net(x).detach(), [g.detach() for g in grads], hvp))
    for a, b in zip(results[0][:2], results[1][:2]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # gradients sum the rows in another order (per frame first): equal up to float32 rounding
    for a, b in zip(results[0][2] + list(results[0][3]), results[1][2] + list(results[1][3])):
        assert float((a - b).norm()) <= 1e-4 * float(b.norm()) + 1e-6, (float((a - b).norm()), float(b.norm()))
