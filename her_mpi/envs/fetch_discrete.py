"""Discrete Fetch Reach/Push/Slide: "velocity difference control" (HTRPO's Table 1, after Rauber
et al. 2019), on top of gymnasium-robotics' continuous Fetch v4 envs.

An action index picks a direction +-e_i (Reach: x, y, z; Push and Slide: x, y) and a step size
from {0.1, 1.0}. The chosen vector is *added* to a running 4-D command (x, y, z, gripper), which
is clipped to [-1, 1] and sent to the continuous env as its action; the command starts at zero
each episode and is appended to the observation (Reach 10 + 4, Push/Slide 25 + 4 values), so the
policy sees the velocity it is commanding. Actions are numbered axis by axis, then direction
(+ before -), then step size (0.1 before 1.0): for Reach 0 = +0.1 x, 1 = +1.0 x, 2 = -0.1 x,
3 = -1.0 x, 4 = +0.1 y, ..., 11 = -1.0 z (12 actions); Push/Slide have the first 8.

Goals, achieved goals and the sparse -1/0 reward are the continuous env's (vectorised
``compute_reward``); an episode ends at its first success (``compute_terminated`` = success)
or after 50 steps.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

STEP_SIZES = (0.1, 1.0)
HORIZON = 50
TASKS = {  # our id -> (continuous env, command axes the actions can change)
    "FetchReachDiscrete-v0": ("FetchReach-v4", (0, 1, 2)),
    "FetchPushDiscrete-v0": ("FetchPush-v4", (0, 1)),
    "FetchSlideDiscrete-v0": ("FetchSlide-v4", (0, 1)),
}


def action_table(axes: tuple[int, ...]) -> np.ndarray:
    """[n_actions, 4] command increments, in the documented order."""
    rows = []
    for axis in axes:
        for sign in (1.0, -1.0):
            for size in STEP_SIZES:
                row = np.zeros(4, np.float32)
                row[axis] = sign * size
                rows.append(row)
    return np.stack(rows)


class FetchDiscreteEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}
    timeout_reward = 0.0

    def __init__(self, task: str = "FetchReachDiscrete-v0", render_mode: str | None = None):
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
        continuous_id, axes = TASKS[task]
        from her_mpi.envs import register_envs

        register_envs()  # the continuous Fetch envs come from gymnasium-robotics
        self.inner = gym.make(continuous_id, render_mode=render_mode).unwrapped
        self.actions = action_table(axes)
        self.horizon, self.dt, self.render_mode = HORIZON, float(self.inner.dt), render_mode
        inner_obs = self.inner.observation_space
        base = inner_obs["observation"]
        observation = gym.spaces.Box(-np.inf, np.inf, (base.shape[0] + 4,), np.float32)
        self.observation_space = gym.spaces.Dict(observation=observation,
                                                 achieved_goal=inner_obs["achieved_goal"],
                                                 desired_goal=inner_obs["desired_goal"])
        self.action_space = gym.spaces.Discrete(len(self.actions))
        self.command = np.zeros(4, np.float32)
        self.steps = 0

    @property
    def np_random(self):  # the continuous env draws the goals and the start: its stream is the env's
        return self.inner.np_random

    @np_random.setter
    def np_random(self, value):
        self.inner.np_random = value

    def apply_action(self, action) -> np.ndarray:
        """Add the action's increment to the running command, clip to [-1, 1]; the new command."""
        index = int(np.asarray(action).reshape(()))
        if not 0 <= index < len(self.actions):
            raise ValueError(f"action must be an integer in [0, {len(self.actions)}), got {action!r}")
        self.command = np.clip(self.command + self.actions[index], -1.0, 1.0).astype(np.float32)
        return self.command

    def _obs(self, inner: dict) -> dict:
        observation = np.concatenate([inner["observation"], self.command]).astype(np.float32)
        return {"observation": observation, "achieved_goal": inner["achieved_goal"].astype(np.float32),
                "desired_goal": inner["desired_goal"].astype(np.float32)}

    def reset(self, *, seed=None, options=None):
        inner, info = self.inner.reset(seed=seed, options=options)
        self.command = np.zeros(4, np.float32)
        self.steps = 0
        return self._obs(inner), {"is_success": float(info.get("is_success", 0.0))}

    def step(self, action):
        command = self.apply_action(action)
        inner, reward, _, _, info = self.inner.step(command.copy())
        self.steps += 1
        success = bool(info.get("is_success", 0.0))
        return (self._obs(inner), float(reward), success, self.steps >= self.horizon and not success,
                {"is_success": float(success)})

    def render(self):
        return self.inner.render()

    def close(self):
        self.inner.close()

    def compute_reward(self, achieved_goal, desired_goal, info):
        return self.inner.compute_reward(achieved_goal, desired_goal, info)

    def compute_success(self, achieved_goal, desired_goal):
        return np.asarray(self.inner._is_success(np.asarray(achieved_goal), np.asarray(desired_goal)), np.float32)

    def compute_terminated(self, achieved_goal, desired_goal, info):
        return self.compute_success(achieved_goal, desired_goal) > 0
