"""Learning tests on HTRPO's other environments (real MuJoCo and ALE, mpirun): a few minutes each."""

import json

import numpy as np
import pytest
import torch

from helpers import describe, read_progress, run_mpi, run_python
from her_mpi.checkpoint import load_checkpoint
from her_mpi.config import EnvConfig, config_from_dict
from her_mpi.envs import EnvSpec, make_env
from her_mpi.trainer import agent_from_checkpoint, build_agent

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def train(run_dir, recipe, *overrides):
    result = run_mpi(2, ["-m", "her_mpi.train", "--config", recipe, "--run-dir", run_dir,
                         "--set", "log.tensorboard=false", *overrides], timeout=1100)
    assert result.returncode == 0, describe(result)
    return [float(r["test_success_rate"]) for r in read_progress(run_dir)]


# fetch_reach_discrete_htrpo_fast: 800-step iterations, 16 hindsight goals, 2x64 networks, max_kl
# 1e-4 (paper units) and an entropy bonus of 0.1, 60 epochs of <= 4k steps (~70k steps in all, about
# 2 minutes at np=2 on a quiet machine). The bar: an evaluation (100 greedy episodes) at 0.9 or
# more, and the final policy at 0.85 or more on 200 episodes the trainer never saw, so that a lucky
# evaluation cannot pass alone; an untrained policy succeeds on 5-6 % of episodes (greedy and sampled,
# 3 inits). Screened on seeds 0-4: best evaluation 0.97-1.00, final policy on the 200 held-out
# episodes 0.915-0.985 (this test's seed 0: 0.985). With max_kl 2e-4 (the recipe's earlier value)
# the same budget gave 0.815-0.945, and a fresh machine once learned it slower and deterministically
# so (0.85 at best within 30 epochs): the margin below 0.9 is for that.
def test_htrpo_reaches_0_9_on_fetch_reach_discrete(tmp_path):
    run = tmp_path / "run"
    success = train(run, "fetch_reach_discrete_htrpo_fast")
    assert max(success) >= 0.9, success
    result = run_python(["-m", "her_mpi.evaluate", "--checkpoint", run, "--episodes", "200", "--seed", "12345"])
    assert result.returncode == 0, describe(result)
    held_out = json.loads(result.stdout)["success_rate"]
    assert held_out >= 0.85, (held_out, success)


# Ms. Pac-Man, DQN+HER: two goals on the start corridor (row 8), five cells left and five right of
# the start cell (8, 10), so that no single direction reaches both; every episode starts from the
# same state and the emulator is deterministic, so a greedy policy's success on each goal is exact,
# not sampled. Held exploration (algo.epsilon_hold): Ms. Pac-Man starts moving left and keeps her
# direction until a new one takes, so single random steps (plain epsilon-greedy) rarely carry her
# right; the right-hand goal then hardly ever appears in replay and some seeds never learn it.
GOALS = [[8, 5], [8, 15]]
# 4 epochs x 15 cycles x 2 episodes x <= 26 steps x 2 ranks <= 6,240 steps and 1,200 updates of 128
# transitions; the trainer's own test episodes are skipped (the test evaluates both goals itself).
PACMAN = ["--set", f"env.kwargs={{goal_cells: {GOALS}}}", "--set", "train.n_epochs=4",
          "--set", "train.n_cycles=15", "--set", "train.rollouts_per_rank=2", "--set", "train.n_batches=20",
          "--set", "train.batch_size=128", "--set", "replay.size=20000", "--set", "algo.lr_q=5.0e-4",
          "--set", "train.n_test_episodes=0", "--set", "algo.epsilon=0.3", "--set", "algo.epsilon_hold=10",
          "--set", "algo.polyak=0.5", "--set", "algo.n_step=3"]


def greedy_success(agent, goals) -> list[bool]:
    """Whether the greedy policy reaches each goal (deterministic: same start, same emulator)."""
    env = make_env(EnvConfig("MsPacmanGoal-v0", {"goal_cells": goals}), seed=0)
    reached = []
    for goal in goals:
        obs, _ = env.reset(seed=0)
        env.unwrapped.goal = np.array(goal, np.float32)
        success = False
        for _ in range(env.unwrapped.horizon):
            action = agent.act(obs["observation"].reshape(1, -1), env.unwrapped.goal[None], explore=False)
            obs, _, terminated, truncated, info = env.step(int(action[0, 0]))
            success = bool(info["is_success"])
            if terminated or truncated:
                break
        reached.append(success)
    return reached


# Why these settings (trials at np=2; trained greedy success on [left, right]; the
# untrained inits reach one side or neither): at 4 epochs, held exploration up to 10 steps with
# batch 128 reached both goals on every one of seeds 0-7 (all it was tried on); with batch 32 it
# failed seeds 4, 6 and 7 (one side or neither), and seeds 6 and 7 still failed at twice the
# budget; holding up to 6 steps failed seeds 3 and 5. Greedy traces of the failures show the start
# state's Q-values within 0.1-0.3 of each other: too few samples per update, not too few updates.
# Without held exploration (algo.epsilon 0.1, 0.3 or 1.0, 3x the updates, faster targets with
# 3-step returns, or goals 3 cells away) at least one of seeds 0-2 reached one side only.
# Since the CNN convolves a channels-last copy (other float rounding, the same
# arithmetic), seeds 0-6 still reach both goals but seed 7 only the right one, at 4 and at 5
# epochs: the margin is thinner than 8 of 8 suggested, and the test pins seed 0.
def test_dqn_her_on_ms_pacman_beats_the_untrained_policy(tmp_path):
    train(tmp_path / "run", "ms_pacman_goal_dqn", *PACMAN)
    state = load_checkpoint(tmp_path / "run")
    trained = agent_from_checkpoint(state)
    untrained = build_agent(config_from_dict(state["config"]), EnvSpec(**state["spec"]))  # same seed: same init
    assert not torch.equal(trained.q_network.state_dict()["head.0.weight"], untrained.q_network.state_dict()["head.0.weight"])
    after, before = greedy_success(trained, GOALS), greedy_success(untrained, GOALS)
    assert after == [True, True] and sum(before) < 2, (after, before)
