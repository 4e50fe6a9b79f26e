"""Sparse rewards for goals reached only exactly (bit strings, grid cells): shared by the envs that have them."""

from __future__ import annotations

import numpy as np


class ExactGoal:
    """Goal-env reward functions, vectorised over leading axes: reward 0 when every coordinate of the
    achieved goal equals the desired one, else -1; the episode ends (and succeeds) there."""

    @staticmethod
    def compute_reward(achieved_goal, desired_goal, info):
        return -np.any(np.asarray(achieved_goal) != np.asarray(desired_goal), axis=-1).astype(np.float32)

    @staticmethod
    def compute_terminated(achieved_goal, desired_goal, info):
        return np.all(np.asarray(achieved_goal) == np.asarray(desired_goal), axis=-1)

    def compute_success(self, achieved_goal, desired_goal):
        return self.compute_terminated(achieved_goal, desired_goal, None).astype(np.float32)
