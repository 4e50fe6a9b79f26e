"""HTRPO's other environments: discrete Fetch (velocity-difference control) and goal-conditioned
Ms. Pac-Man, on the real MuJoCo and ALE emulators."""

import numpy as np
import pytest

from her_mpi.config import EnvConfig
from her_mpi.envs import env_spec, goal_functions, make_env
from her_mpi.envs.fetch_discrete import action_table
from her_mpi.envs.ms_pacman import (COL_EDGES, HORIZON, REACHABLE, ROW_EDGES, cell_distances,
                                    derive_reachable_cells, make_ale, pacman_cell)


# -- discrete Fetch ---------------------------------------------------------------------------

def test_action_table_is_axis_then_direction_then_step_size():
    table = action_table((0, 1, 2))
    assert table.shape == (12, 4)
    np.testing.assert_allclose(table[:4], [[0.1, 0, 0, 0], [1.0, 0, 0, 0], [-0.1, 0, 0, 0], [-1.0, 0, 0, 0]])
    np.testing.assert_allclose(table[4], [0, 0.1, 0, 0])
    np.testing.assert_array_equal(table[11], [0, 0, -1.0, 0])
    assert not table[:, 3].any()  # no action touches the gripper
    push = action_table((0, 1))
    assert push.shape == (8, 4) and not push[:, 2:].any()


@pytest.mark.parametrize("env_id, n_actions, obs_dim", [("FetchReachDiscrete-v0", 12, 14),
                                                        ("FetchPushDiscrete-v0", 8, 29),
                                                        ("FetchSlideDiscrete-v0", 8, 29)])
def test_discrete_fetch_spaces_and_goal_env_contract(env_id, n_actions, obs_dim):
    env = make_env(EnvConfig(env_id), seed=0)  # make_env checks the contract (vectorised reward)
    spec = env_spec(env, env_id)
    assert spec.discrete and spec.n_actions == n_actions and spec.obs_dim == obs_dim
    assert spec.goal_dim == 3 and spec.horizon == 50 and spec.control_period == pytest.approx(0.04)
    ag = np.zeros((5, 3), np.float32)
    g = np.zeros((5, 3), np.float32)
    g[::2, 0] = 1.0
    np.testing.assert_array_equal(env.unwrapped.compute_reward(ag, g, None), [-1, 0, -1, 0, -1])
    np.testing.assert_array_equal(goal_functions(env).terminal(ag, g), [0, 1, 0, 1, 0])


def test_commands_accumulate_and_clip_on_hand_computed_cases():
    env = make_env(EnvConfig("FetchReachDiscrete-v0"), seed=0)
    env.reset(seed=0)
    # the desired goal far away, so no step ends the episode
    env.unwrapped.inner.goal = np.array([10.0, 10.0, 10.0])
    expected = [
        (1, [1.0, 0, 0, 0]),  # +1.0 x
        (1, [1.0, 0, 0, 0]),  # +1.0 x again: clipped at 1
        (2, [0.9, 0, 0, 0]),  # -0.1 x
        (4, [0.9, 0.1, 0, 0]),  # +0.1 y
        (11, [0.9, 0.1, -1.0, 0]),  # -1.0 z
        (10, [0.9, 0.1, -1.0, 0]),  # -0.1 z: clipped at -1
        (9, [0.9, 0.1, 0.0, 0]),  # +1.0 z
        (7, [0.9, -0.9, 0.0, 0]),  # -1.0 y
    ]
    for action, command in expected:
        obs, reward, terminated, truncated, _ = env.step(action)
        np.testing.assert_allclose(obs["observation"][-4:], command, atol=1e-6)
        np.testing.assert_allclose(env.unwrapped.command, command, atol=1e-6)
        assert reward == -1.0 and not terminated
    with pytest.raises(ValueError, match=r"action must be an integer in \[0, 12\)"):
        env.step(12)


def test_the_command_is_what_the_continuous_env_receives():
    env = make_env(EnvConfig("FetchPushDiscrete-v0"), seed=0)
    env.reset(seed=3)
    received = []
    inner_step = env.unwrapped.inner.step
    env.unwrapped.inner.step = lambda a: received.append(np.array(a)) or inner_step(a)
    for action in (0, 0, 5, 3):  # +0.1 x, +0.1 x, +1.0 y, -1.0 x
        env.step(action)
    np.testing.assert_allclose(received, [[0.1, 0, 0, 0], [0.2, 0, 0, 0], [0.2, 1.0, 0, 0], [-0.8, 1.0, 0, 0]],
                               atol=1e-6)


def test_episode_ends_at_the_first_success():
    env = make_env(EnvConfig("FetchReachDiscrete-v0"), seed=0)
    obs, _ = env.reset(seed=0)
    env.unwrapped.inner.goal = obs["achieved_goal"].astype(np.float64).copy()  # already within 5 cm
    obs, reward, terminated, truncated, info = env.step(0)  # a 0.1 command moves the gripper ~5 mm
    assert terminated and not truncated and reward == 0.0 and info["is_success"] == 1.0
    np.testing.assert_allclose(env.unwrapped.command, [0.1, 0, 0, 0])
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs["observation"][-4:], 0.0)  # a new episode starts at rest


def test_episode_times_out_after_50_steps():
    env = make_env(EnvConfig("FetchReachDiscrete-v0"), seed=0)
    env.reset(seed=0)
    env.unwrapped.inner.goal = np.array([10.0, 10.0, 10.0])
    for step in range(50):
        _, _, terminated, truncated, _ = env.step(2 if step % 2 else 0)
        assert not terminated and truncated == (step == 49)


# -- Ms. Pac-Man ------------------------------------------------------------------------------

def blank_frame() -> np.ndarray:
    return np.full((210, 160), 32, np.uint8)  # the corridors' grey


def test_cell_detector_on_hand_constructed_frames():
    frame = blank_frame()
    frame[50:59, 21:27] = 167  # a 9x6 blob inside rows 48-60 (band 4), columns 20-28 (cell 2)
    assert pacman_cell(frame) == (4, 2)
    frame = blank_frame()
    frame[100:108, 86:92] = 167  # columns 86-87 in cell 10 (80-88), 88-91 in cell 11: most wins
    assert pacman_cell(frame) == (8, 11)
    frame[100:108, 86:92] = 172  # outside Ms. Pac-Man's grey (160, 170): not her
    assert pacman_cell(frame) is None
    frame = blank_frame()
    frame[160:166, 150:156] = 165  # the last column runs from 144 to the edge
    assert pacman_cell(frame) == (13, 18)
    with pytest.raises(ValueError, match="raw grey frame"):
        pacman_cell(np.zeros((84, 84), np.uint8))


def grid_cell_of_box(top, bottom, left, right):
    """The cell holding most of a filled pixel box (rows top..bottom, columns left..right)."""
    rows = [max(0, min(bottom, ROW_EDGES[i + 1] - 1) - max(top, ROW_EDGES[i]) + 1) for i in range(14)]
    cols = [max(0, min(right, COL_EDGES[j + 1] - 1) - max(left, COL_EDGES[j]) + 1) for j in range(19)]
    return int(np.argmax(rows)), int(np.argmax(cols))


# RAM positions (x, y) chosen so that the sprite's box lies clearly in one cell
KNOWN_POSITIONS = [(30, 48), (100, 24), (40, 96), (132, 156), (112, 72), (20, 120)]


@pytest.mark.parametrize("x, y", KNOWN_POSITIONS)
def test_cell_detector_on_frames_rendered_from_known_positions(x, y):
    # The emulator draws Ms. Pac-Man from her RAM position (bytes 10 and 16): write a position,
    # let three frames render it, and compare the detector with the cell of the sprite's known
    # 8x10 box at pixel rows y+1..y+10 and columns x-12..x-5 (measured on this ROM).
    ale, _, noop = make_ale()
    ale.reset_game()
    for _ in range(240):
        ale.act(noop)
    ale.setRAM(10, x)
    ale.setRAM(16, y)
    for _ in range(3):
        ale.act(noop)
    grey = ale.getScreenGrayscale()
    rows, cols = np.nonzero((grey[:170] > 160) & (grey[:170] < 170))
    assert rows.min() >= y + 1 and rows.max() <= y + 10 and cols.min() >= x - 12 and cols.max() <= x - 5
    assert pacman_cell(grey) == grid_cell_of_box(y + 1, y + 10, x - 12, x - 5)


def test_ms_pacman_env_observations_goals_and_rewards():
    env = make_env(EnvConfig("MsPacmanGoal-v0"), seed=0)
    spec = env_spec(env, "MsPacmanGoal-v0")
    assert spec.obs_shape == (4, 84, 84) and spec.obs_dtype == "uint8" and spec.obs_dim == 4 * 84 * 84
    assert spec.n_actions == 4 and spec.goal_dim == 2 and spec.horizon == 26
    obs, _ = env.reset(seed=1)
    assert obs["observation"].dtype == np.uint8 and obs["observation"].shape == (4, 84, 84)
    np.testing.assert_array_equal(obs["achieved_goal"], [8, 10])  # the start cell, every episode
    goal = obs["desired_goal"].astype(int)
    assert REACHABLE[tuple(goal)] and tuple(goal) != (8, 10)
    goals = {tuple(env.reset()[0]["desired_goal"].astype(int)) for _ in range(30)}
    assert len(goals) > 10 and all(REACHABLE[g] for g in goals)
    # LEFT along the start row: the achieved cell moves left, reward -1 until the goal
    env.unwrapped.goal = np.array([8.0, 5.0], np.float32)
    env.reset(seed=2)
    env.unwrapped.goal = np.array([8.0, 5.0], np.float32)
    cells = []
    for _ in range(8):
        obs, reward, terminated, truncated, info = env.step(2)
        cells.append(tuple(obs["achieved_goal"].astype(int)))
        if terminated:
            break
    assert cells[-1] == (8, 5) and reward == 0.0 and info["is_success"] == 1.0
    assert [c[1] for c in cells] == sorted((c[1] for c in cells), reverse=True)
    assert obs["observation"][-1].any() and not np.array_equal(obs["observation"][0], obs["observation"][-1])


def test_reachable_cells_include_every_cell_a_random_walk_reports():
    env = make_env(EnvConfig("MsPacmanGoal-v0"), seed=0)
    rng = np.random.default_rng(0)
    for episode in range(3):
        obs, _ = env.reset(seed=episode)
        for _ in range(26):
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(4)))
            assert REACHABLE[tuple(obs["achieved_goal"].astype(int))]
            if terminated or truncated:
                break


@pytest.mark.slow
def test_reachable_mask_is_the_derivation():
    np.testing.assert_array_equal(derive_reachable_cells(), REACHABLE)


@pytest.mark.slow
def test_every_goal_cell_can_be_reached_within_an_episode():
    distance = cell_distances()
    assert [tuple(c) for c in np.argwhere(distance == 0)] == [(8, 10)]  # the start cell only
    assert distance[8, 9] == 2  # she stands still for the first step, then one step left
    assert distance[REACHABLE].min() == 0 and distance[~REACHABLE].max() == -1
    assert distance.max() < HORIZON  # a ghost-free path to every goal fits in the 26 steps


@pytest.mark.parametrize("start", ["random", "zeros"])
def test_bit_flipping_starts_where_its_paper_does(start):
    """HER's task starts from random bits, HTRPO's from all zeros; the target is never the start."""
    env = make_env(EnvConfig("BitFlipping-v0", {"n_bits": 6, "start": start}))
    starts = []
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        assert not np.array_equal(obs["achieved_goal"], obs["desired_goal"])
        starts.append(obs["observation"])
    starts = np.array(starts)
    assert (starts.sum() == 0) == (start == "zeros")
    env.close()


def test_bit_flipping_names_a_bad_start():
    with pytest.raises(ValueError, match="start must be one of random, zeros, got 'ones'"):
        make_env(EnvConfig("BitFlipping-v0", {"n_bits": 6, "start": "ones"}))
