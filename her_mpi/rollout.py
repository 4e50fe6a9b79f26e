"""Collect batches of whole episodes from a rank's environments with one batched policy call
per time step.

Episodes are stored episode-major with a fixed horizon T: ``obs``/``ag`` have T+1 entries (the
state after the last action included), ``g``/``actions``/``rewards`` have T. An episode that
terminates early (bit flipping, predator-prey) keeps its true ``length``; the unused tail repeats
the final state so every array stays rectangular. ``g`` also has T+1 entries because some goals
move (the prey in predator-prey); the policy at step t sees ``g[:, t]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from her_mpi.settings import EnvConfig
from her_mpi.envs import EnvSpec, env_spec, make_env

Policy = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (obs [n, od], g [n, gd]) -> actions


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


class RolloutWorker:
    def __init__(self, env_cfg: EnvConfig, n_envs: int, seed_sequence: np.random.SeedSequence):
        seeds = [int(s.generate_state(1)[0]) for s in seed_sequence.spawn(n_envs)]
        self.envs = [make_env(env_cfg, seed) for seed in seeds]
        self.spec: EnvSpec = env_spec(self.envs[0], env_cfg.id)
        spec = self.spec
        self.action_center = (np.add(spec.action_low, spec.action_high) / 2).astype(np.float32)
        self.action_half_range = (np.subtract(spec.action_high, spec.action_low) / 2).astype(np.float32)

    def generate(self, policy: Policy, n_episodes: int | None = None, env_units: bool = False) -> Episodes:
        """Run ``n_episodes`` (default: one per env) episodes in groups of len(envs).

        ``policy`` returns actions in [-1, 1] (what agents use), or in the env's own units when
        ``env_units`` (deployed policies: exported ONNX files, ``Agent.policy()``)."""
        n_episodes = len(self.envs) if n_episodes is None else n_episodes
        parts = []
        while n_episodes > 0:
            k = min(n_episodes, len(self.envs))
            parts.append(self._run(policy, self.envs[:k], env_units))
            n_episodes -= k
        return parts[0] if len(parts) == 1 else Episodes.concatenate(parts)

    def _run(self, policy: Policy, envs: list, env_units: bool) -> Episodes:
        spec, n, T = self.spec, len(envs), self.spec.horizon
        obs = np.zeros((n, T + 1, spec.obs_dim), spec.obs_dtype)  # uint8 for images (memory)
        ag = np.zeros((n, T + 1, spec.goal_dim), np.float32)
        g = np.zeros((n, T + 1, spec.goal_dim), np.float32)
        actions = np.zeros((n, T, spec.action_dim), np.int64 if spec.discrete else np.float32)
        rewards = np.zeros((n, T), np.float32)
        lengths = np.full(n, T, np.int64)
        success = np.zeros(n, np.float32)
        for i, env in enumerate(envs):
            o, _ = env.reset()
            obs[i, 0], ag[i, 0], g[i, 0] = np.ravel(o["observation"]), o["achieved_goal"], o["desired_goal"]
        running = np.ones(n, bool)
        for t in range(T):
            env_act, actions[:, t] = self._split_action(policy(obs[:, t], g[:, t]), env_units, n)
            for i, env in enumerate(envs):
                if not running[i]:
                    obs[i, t + 1], ag[i, t + 1], g[i, t + 1] = obs[i, t], ag[i, t], g[i, t]
                    continue
                o, r, terminated, truncated, info = env.step(env_act[i])
                obs[i, t + 1], ag[i, t + 1] = np.ravel(o["observation"]), o["achieved_goal"]
                g[i, t + 1] = o["desired_goal"]
                rewards[i, t] = r
                success[i] = info.get("is_success", 0.0)
                if terminated or (truncated and t + 1 < T):
                    running[i] = False
                    lengths[i] = t + 1
            if not running.any():
                for array in (obs, ag, g):
                    array[:, t + 2:] = array[:, t + 1: t + 2]
                break
        return Episodes(obs, ag, g, actions, rewards, lengths, success)

    def _split_action(self, act, env_units: bool, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(what env.step gets, what is stored: [-1, 1] units or action indices)."""
        act = np.asarray(act)
        if self.spec.discrete:
            index = act.reshape(n).astype(np.int64)
            return index, index[:, None]
        act = act.reshape(n, self.spec.action_dim).astype(np.float32)
        if env_units:
            return act, (act - self.action_center) / self.action_half_range
        return self.action_center + self.action_half_range * np.clip(act, -1.0, 1.0), act

    def close(self) -> None:
        for env in self.envs:
            env.close()
