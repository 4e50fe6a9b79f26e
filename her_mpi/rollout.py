"""Collect batches of whole episodes (:class:`~her_mpi.episodes.Episodes`, their layout is
described there) from a rank's environments with one batched policy call per time step."""

from __future__ import annotations

from typing import Callable

import numpy as np

from her_mpi.envs import EnvSpec, env_spec, make_env
from her_mpi.episodes import Episodes, action_scale, to_env_units
from her_mpi.settings import EnvConfig

Policy = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (obs [n, od], g [n, gd]) -> actions


class RolloutWorker:
    def __init__(self, env_cfg: EnvConfig, n_envs: int, seed_sequence: np.random.SeedSequence):
        seeds = [int(s.generate_state(1)[0]) for s in seed_sequence.spawn(n_envs)]
        self.envs = [make_env(env_cfg, seed) for seed in seeds]
        self.spec: EnvSpec = env_spec(self.envs[0], env_cfg.id)
        self.action_center, self.action_half_range = action_scale(self.spec.action_low, self.spec.action_high)

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
        return to_env_units(act, self.action_center, self.action_half_range), act

    def close(self) -> None:
        for env in self.envs:
            env.close()
