"""n-bit flipping (Andrychowicz et al. 2017): flip one bit per step to match a random target.

A gymnasium goal env: dict observations (``observation`` = ``achieved_goal`` = the bits,
``desired_goal`` = the target bits), ``Discrete(n)`` actions, reward -1 until the bits match the
goal and 0 when they do, which ends the episode. Episodes last at most ``horizon`` (default n)
steps. ``start`` picks the initial bits: ``"random"`` (the HER paper's task) or ``"zeros"`` (the
HTRPO paper's: "the first array is initialized with all 0's"), the target uniform either way.
``compute_reward`` and ``compute_terminated`` are vectorised over batches of goals.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from her_mpi.envs.drawing import FAILURE_COLOR, SUCCESS_COLOR, banner_height, caption_font, check_render_size
from her_mpi.envs.exact_goal import ExactGoal


class BitFlippingEnv(ExactGoal, gym.Env):
    metadata = {"render_modes": ["rgb_array"]}

    STARTS = ("random", "zeros")

    def __init__(self, n_bits: int = 10, horizon: int | None = None, start: str = "random",
                 render_mode: str | None = None, width: int = 256, height: int = 256):
        if not isinstance(n_bits, (int, np.integer)) or isinstance(n_bits, bool) or n_bits < 1:
            raise ValueError(f"BitFlipping-v0: n_bits must be an integer >= 1, got {n_bits!r}")
        if horizon is not None and (not isinstance(horizon, (int, np.integer)) or horizon < 1):
            raise ValueError(f"BitFlipping-v0: horizon must be an integer >= 1 or None, got {horizon!r}")
        if start not in self.STARTS:
            raise ValueError(f"BitFlipping-v0: start must be one of {', '.join(self.STARTS)}, got {start!r}")
        self.start = start
        self.n_bits = int(n_bits)
        self.horizon = int(horizon) if horizon is not None else self.n_bits
        bits = gym.spaces.Box(0.0, 1.0, (self.n_bits,), np.float32)
        self.observation_space = gym.spaces.Dict(observation=bits, achieved_goal=bits, desired_goal=bits)
        self.action_space = gym.spaces.Discrete(self.n_bits)
        self.dt = 0.0
        self.state = self.goal = None
        self.steps = 0
        self.render_mode = render_mode
        self.render_size = check_render_size("BitFlipping-v0", width, height)

    def _obs(self) -> dict:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.start == "zeros":
            self.state = np.zeros(self.n_bits, np.float32)
        else:
            self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self.goal = self.state
        while np.array_equal(self.goal, self.state):  # never start at the goal
            self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self.steps = 0
        return self._obs(), {"is_success": 0.0}

    def step(self, action):
        action = int(action)
        if not 0 <= action < self.n_bits:
            raise ValueError(f"BitFlipping-v0: action must be in [0, {self.n_bits}), got {action}")
        self.state[action] = 1.0 - self.state[action]
        self.steps += 1
        success = bool(np.array_equal(self.state, self.goal))
        reward = float(self.compute_reward(self.state, self.goal, None))
        return self._obs(), reward, success, self.steps >= self.horizon and not success, {"is_success": float(success)}

    def render(self) -> np.ndarray:
        """Two rows of cells: the bits (edged green where they match the goal, red where not) and the goal."""
        from PIL import Image, ImageDraw

        width, height = self.render_size
        image = Image.new("RGB", (width, height), (40, 40, 48))
        draw = ImageDraw.Draw(image)
        top = banner_height(height)  # the video's caption goes there
        label_width = width // 6
        cell = max(1.0, min((width - label_width - 8) / self.n_bits, (height - top) / 3))
        font = caption_font(max(8, int(min(cell, height / 10) * 0.6)))
        for row, (name, bits) in enumerate((("bits", self.state), ("goal", self.goal))):
            y0 = top + (height - top) / 2 + (row - 1) * cell * 1.2
            draw.text((4, y0 + cell / 2), name, fill=(230, 230, 230), font=font, anchor="lm")
            for i, bit in enumerate(bits):
                x0 = label_width + i * cell
                fill = (235, 235, 235) if bit > 0.5 else (20, 20, 20)
                edge = (200, 200, 200) if row else (SUCCESS_COLOR if bit == self.goal[i] else FAILURE_COLOR)
                draw.rectangle([x0 + 1, y0 + 1, x0 + cell - 1, y0 + cell - 1], fill=fill, outline=edge,
                               width=max(1, int(cell // 8)))
        return np.asarray(image)
