"""What a rollout produces and what replay stores: batches of whole episodes, and the one map
from the policies' actions in [-1, 1] to an env's action bounds.

Numpy only, so that the standalone replay buffer needs neither gymnasium nor torch.

Episodes are stored episode-major with a fixed horizon T: ``obs``/``ag`` have T+1 entries (the
state after the last action included), ``g``/``actions``/``rewards`` have T. An episode that
terminates early (bit flipping, predator-prey) keeps its true ``length``; the unused tail repeats
the final state so every array stays rectangular. ``g`` also has T+1 entries because some goals
move (the prey in predator-prey); the policy at step t sees ``g[:, t]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Episodes:
    obs: np.ndarray  # [n, T+1, obs_dim]
    ag: np.ndarray  # [n, T+1, goal_dim] achieved goal
    g: np.ndarray  # [n, T+1, goal_dim] desired goal (constant unless the env moves it)
    actions: np.ndarray  # [n, T, action_dim] in [-1, 1] (continuous) or int64 indices (discrete)
    rewards: np.ndarray  # [n, T] as the env returned them
    lengths: np.ndarray  # [n] steps actually taken
    success: np.ndarray  # [n] info["is_success"] at the last step taken

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def n_steps(self) -> int:
        return int(self.lengths.sum())

    @staticmethod
    def concatenate(parts: list["Episodes"]) -> "Episodes":
        return Episodes(*(np.concatenate([getattr(p, f) for p in parts])
                          for f in Episodes.__dataclass_fields__))


def action_scale(low, high) -> tuple[np.ndarray, np.ndarray]:
    """(center, half_range), float32, of the map from [-1, 1] to the bounds [low, high]."""
    low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
    return (low + high) / 2, (high - low) / 2


def to_env_units(unit_action, center, half_range):
    """Clip actions to [-1, 1] and map them to the env's bounds; numpy arrays and torch tensors
    alike, so the rollout and the exported policy (:class:`~her_mpi.nets.ActionScaler`) share it."""
    return center + half_range * unit_action.clip(-1.0, 1.0)
