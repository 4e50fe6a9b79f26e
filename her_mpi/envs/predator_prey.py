"""Predator-prey (the PPO-HER paper's environment): steer a predator onto a moving prey.

The predator's position is the achieved goal, the prey's position the desired goal, and the
observation is the predator's position followed by the prey's velocity. (The paper's
observation is the prey velocity alone, but its SB3 policy also reads the achieved goal; here
the policy reads observation and desired goal, the usual goal-env convention, so the predator's
position is part of the observation.) Each step the predator moves by the action (in [-1, 1]^d,
clipped to the arena), then the prey moves by its velocity. Reaching the prey (distance <=
``interception_distance``) gives +1 and ends the episode; running out of time (``horizon``
steps) gives ``timeout_reward`` (-1); every other step gives 0.

Prey modes: ``static``; ``random`` (a new random velocity each step); ``attract`` / ``repel``
(towards / away from the predator); ``straight_away`` (a fixed velocity pointing away from the
predator's start); ``random_direction`` (a fixed random velocity).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from her_mpi.envs.drawing import FAILURE_COLOR, banner_height, caption_font, check_render_size

PREY_MODES = ("static", "random", "attract", "repel", "straight_away", "random_direction")


class PredatorPreyEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}
    timeout_reward = -1.0

    def __init__(self, dims: int = 3, arena_size: float = 10.0, interception_distance: float = 1.0,
                 prey_mode: str = "random_direction", prey_speed: float = 0.5, horizon: int = 20,
                 render_mode: str | None = None, width: int = 256, height: int = 256):
        if not isinstance(dims, (int, np.integer)) or dims < 1:
            raise ValueError(f"PredatorPrey-v0: dims must be an integer >= 1, got {dims!r}")
        if not arena_size > 0:
            raise ValueError(f"PredatorPrey-v0: arena_size must be > 0, got {arena_size!r}")
        if not 0 < interception_distance < 2 * arena_size:
            raise ValueError(f"PredatorPrey-v0: interception_distance must be in (0, 2 * arena_size), "
                             f"got {interception_distance!r}")
        if prey_mode not in PREY_MODES:
            raise ValueError(f"PredatorPrey-v0: prey_mode must be one of {', '.join(PREY_MODES)}, got {prey_mode!r}")
        if not prey_speed >= 0:
            raise ValueError(f"PredatorPrey-v0: prey_speed must be >= 0, got {prey_speed!r}")
        if not isinstance(horizon, (int, np.integer)) or horizon < 1:
            raise ValueError(f"PredatorPrey-v0: horizon must be an integer >= 1, got {horizon!r}")
        self.dims, self.arena_size = int(dims), float(arena_size)
        self.interception_distance, self.prey_mode = float(interception_distance), prey_mode
        self.prey_speed, self.horizon = float(prey_speed), int(horizon)
        box = gym.spaces.Box(-self.arena_size, self.arena_size, (self.dims,), np.float32)
        observation = gym.spaces.Box(-np.inf, np.inf, (2 * self.dims,), np.float32)
        self.observation_space = gym.spaces.Dict(observation=observation, achieved_goal=box, desired_goal=box)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (self.dims,), np.float32)
        self.dt = 0.0
        self.predator = self.prey = self.velocity = None
        self.steps = 0
        self.render_mode = render_mode
        self.render_size = check_render_size("PredatorPrey-v0", width, height)

    def _obs(self) -> dict:
        observation = np.concatenate([self.predator, self.velocity]).astype(np.float32)
        return {"observation": observation, "achieved_goal": self.predator.astype(np.float32),
                "desired_goal": self.prey.astype(np.float32)}

    def _direction(self, vector: np.ndarray) -> np.ndarray:
        norm = np.linalg.norm(vector)
        return vector / norm if norm > 1e-9 else np.zeros_like(vector)

    def _random_velocity(self) -> np.ndarray:
        return self.prey_speed * self._direction(self.np_random.normal(size=self.dims))

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        size, d = self.arena_size, self.interception_distance
        self.predator = self.np_random.uniform(-size, size, self.dims)
        self.prey = self.predator
        while np.linalg.norm(self.prey - self.predator) <= d:  # never start caught
            self.prey = self.np_random.uniform(-size, size, self.dims)
        self.velocity = np.zeros(self.dims)
        if self.prey_mode == "straight_away":
            self.velocity = self.prey_speed * self._direction(self.prey - self.predator)
        elif self.prey_mode == "random_direction":
            self.velocity = self._random_velocity()
        self.steps = 0
        return self._obs(), {"is_success": 0.0}

    def step(self, action):
        action = np.clip(np.asarray(action, np.float64).reshape(self.dims), -1.0, 1.0)
        size = self.arena_size
        self.predator = np.clip(self.predator + action, -size, size)
        if self.prey_mode == "random":
            self.velocity = self._random_velocity()
        elif self.prey_mode in ("attract", "repel"):
            sign = 1.0 if self.prey_mode == "attract" else -1.0
            self.velocity = sign * self.prey_speed * self._direction(self.predator - self.prey)
        self.prey = np.clip(self.prey + self.velocity, -size, size)
        self.steps += 1
        caught = bool(self.compute_terminated(self.predator, self.prey, None))
        timeout = self.steps >= self.horizon and not caught
        reward = 1.0 if caught else (self.timeout_reward if timeout else 0.0)
        return self._obs(), reward, caught, timeout, {"is_success": float(caught)}

    def compute_reward(self, achieved_goal, desired_goal, info):
        """+1 where the predator is within the interception distance of the prey, else 0 (the
        timeout penalty depends on time, not on goals, so it is not part of this function)."""
        return self.compute_terminated(achieved_goal, desired_goal, info).astype(np.float32)

    def compute_terminated(self, achieved_goal, desired_goal, info):
        distance = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return distance <= self.interception_distance

    def compute_success(self, achieved_goal, desired_goal):
        return self.compute_terminated(achieved_goal, desired_goal, None).astype(np.float32)

    def render(self) -> np.ndarray:
        """The arena from above (dimensions 1 and 2): predator blue, prey red inside its interception
        circle (the goal region)."""
        from PIL import Image, ImageDraw

        width, height = self.render_size
        image = Image.new("RGB", (width, height), (30, 34, 40))
        draw = ImageDraw.Draw(image)
        top = banner_height(height)  # the video's caption goes there
        side = min(width, height - top) - 8
        x0, y0 = (width - side) / 2, top + (height - top - side) / 2
        size = self.arena_size

        def to_pixels(point):
            point = np.asarray(point, np.float64)
            px = point[0] if len(point) > 0 else 0.0
            py = point[1] if len(point) > 1 else 0.0
            return x0 + (px + size) / (2 * size) * side, y0 + (size - py) / (2 * size) * side

        draw.rectangle([x0, y0, x0 + side, y0 + side], outline=(150, 150, 150), width=2)
        prey, predator = to_pixels(self.prey), to_pixels(self.predator)
        r = self.interception_distance * side / (2 * size)
        draw.ellipse([prey[0] - r, prey[1] - r, prey[0] + r, prey[1] + r], outline=FAILURE_COLOR, width=2)
        dot = max(3.0, side / 60)
        draw.ellipse([prey[0] - dot, prey[1] - dot, prey[0] + dot, prey[1] + dot], fill=FAILURE_COLOR)
        draw.ellipse([predator[0] - dot, predator[1] - dot, predator[0] + dot, predator[1] + dot], fill=(90, 150, 255))
        if self.dims != 2:
            note = f"showing dimension 1 of {self.dims}" if self.dims == 1 else f"showing dimensions 1-2 of {self.dims}"
            draw.text((x0 + 4, y0 + side - 4), note, fill=(200, 200, 200), font=caption_font(max(8, height // 40)),
                      anchor="ld")
        return np.asarray(image)
