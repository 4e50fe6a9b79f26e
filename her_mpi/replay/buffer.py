"""Episode-major replay with hindsight relabelling at sample time.

Memory holds raw episodes only. Each sampled transition (episode e, step t) keeps its stored
goal or, with probability ``1 - 1/(1 + replay_k)``, gets a hindsight goal: an achieved goal of
the same episode (``future``: a later step; ``final``: its last step; ``episode``: any step) or of
any stored episode (``random``). Rewards and terminal flags are recomputed for the whole batch in
one vectorised call to the env's functions, so relabelled rewards are always consistent.

Prioritized replay keeps one priority per stored transition (slot ``e * T + t``). A relabelled
goal is drawn afresh every time the transition is sampled, so its priority is the latest |TD|
of that transition under whichever goal it was replayed with: an estimate of how much the
transition still has to teach over its goal distribution.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from her_mpi.replay.sum_tree import SumTree
from her_mpi.rollout import Episodes

GoalFunction = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (achieved, desired) -> [batch]
STRATEGIES = ("future", "final", "episode", "random", "none")


class EpisodeStore:
    """Rectangular episode arrays (capacity episodes x horizon) with HER transition sampling."""

    def __init__(self, capacity: int, horizon: int, obs_dim: int, goal_dim: int, action_dim: int,
                 discrete: bool, reward_fn: GoalFunction, terminal_fn: GoalFunction | None = None):
        self.capacity, self.horizon = int(capacity), int(horizon)
        self.reward_fn, self.terminal_fn = reward_fn, terminal_fn
        T = self.horizon
        self.obs = np.zeros((capacity, T + 1, obs_dim), np.float32)
        self.ag = np.zeros((capacity, T + 1, goal_dim), np.float32)
        self.g = np.zeros((capacity, T + 1, goal_dim), np.float32)
        self.actions = np.zeros((capacity, T, action_dim), np.int64 if discrete else np.float32)
        self.lengths = np.zeros(capacity, np.int64)
        self.n_episodes = 0  # stored episodes (<= capacity)
        self.next_slot = 0  # ring position of the next insertion
        self._cumulative_lengths = None

    @classmethod
    def from_episodes(cls, episodes: Episodes, reward_fn: GoalFunction,
                      terminal_fn: GoalFunction | None = None) -> "EpisodeStore":
        n, T1, od = episodes.obs.shape
        store = cls(n, T1 - 1, od, episodes.g.shape[-1], episodes.actions.shape[-1],
                    episodes.actions.dtype.kind == "i", reward_fn, terminal_fn)
        store.store(episodes)
        return store

    @property
    def n_transitions(self) -> int:
        return int(self.lengths[: self.n_episodes].sum())

    def store(self, episodes: Episodes) -> np.ndarray:
        """Insert episodes (oldest overwritten first); returns the episode slots used."""
        n = len(episodes)
        if n > self.capacity:
            raise ValueError(f"cannot store {n} episodes in a buffer of {self.capacity}")
        slots = (self.next_slot + np.arange(n)) % self.capacity
        self.obs[slots], self.ag[slots], self.g[slots] = episodes.obs, episodes.ag, episodes.g
        self.actions[slots], self.lengths[slots] = episodes.actions, episodes.lengths
        self.next_slot = int((self.next_slot + n) % self.capacity)
        self.n_episodes = min(self.capacity, self.n_episodes + n)
        self._cumulative_lengths = None
        return slots

    # -- sampling -----------------------------------------------------------------------------

    def sample_indices(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(episode, t) pairs uniform over all stored transitions."""
        if self.n_episodes == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if self._cumulative_lengths is None:
            self._cumulative_lengths = np.cumsum(self.lengths[: self.n_episodes])
        cumulative = self._cumulative_lengths
        flat = rng.integers(0, cumulative[-1], size=batch_size)
        episode = np.searchsorted(cumulative, flat, side="right")
        t = flat - (cumulative[episode] - self.lengths[episode])
        return episode, t

    def hindsight_goals(self, episode: np.ndarray, t: np.ndarray, strategy: str, replay_k: int,
                        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Goals for transitions (episode, t): stored or hindsight. Returns (goals, relabelled)."""
        goals = self.g[episode, t].copy()
        if strategy == "none" or replay_k == 0:
            return goals, np.zeros(len(episode), bool)
        relabel = rng.random(len(episode)) < 1.0 - 1.0 / (1.0 + replay_k)
        ep, step, length = episode[relabel], t[relabel], self.lengths[episode[relabel]]
        if strategy == "future":  # uniform over the achieved goals after this step: ag[t+1..len]
            source_ep, source_t = ep, step + 1 + (rng.random(len(ep)) * (length - step)).astype(np.int64)
        elif strategy == "final":
            source_ep, source_t = ep, length
        elif strategy == "episode":  # any achieved goal the episode reached: ag[1..len]
            source_ep, source_t = ep, 1 + (rng.random(len(ep)) * length).astype(np.int64)
        elif strategy == "random":
            source_ep, source_t = self.sample_indices(len(ep), rng)
            source_t = source_t + 1
        else:
            raise ValueError(f"unknown hindsight strategy {strategy!r}; expected one of {STRATEGIES}")
        goals[relabel] = self.ag[source_ep, source_t]
        return goals, relabel

    def transitions(self, episode: np.ndarray, t: np.ndarray, goals: np.ndarray) -> dict:
        """The batch for transitions (episode, t) pursued towards ``goals``."""
        ag_next = self.ag[episode, t + 1]
        batch = {
            "obs": self.obs[episode, t], "obs_next": self.obs[episode, t + 1],
            "ag": self.ag[episode, t], "ag_next": ag_next,
            "g": goals, "actions": self.actions[episode, t],
            "rewards": np.asarray(self.reward_fn(ag_next, goals), np.float32),
        }
        terminals = self.terminal_fn(ag_next, goals) if self.terminal_fn is not None else 0.0
        batch["terminals"] = np.broadcast_to(np.asarray(terminals, np.float32), (len(t),)).copy()
        return batch

    def sample(self, batch_size: int, strategy: str, replay_k: int, rng: np.random.Generator) -> dict:
        episode, t = self.sample_indices(batch_size, rng)
        goals, relabelled = self.hindsight_goals(episode, t, strategy, replay_k, rng)
        batch = self.transitions(episode, t, goals)
        batch["relabelled"] = relabelled
        return batch


class ReplayBuffer(EpisodeStore):
    """A rank's replay memory: an :class:`EpisodeStore` sized in transitions, optionally prioritized."""

    def __init__(self, size_transitions: int, horizon: int, obs_dim: int, goal_dim: int,
                 action_dim: int, discrete: bool, reward_fn: GoalFunction,
                 terminal_fn: GoalFunction | None = None, prioritized: bool = False,
                 alpha: float = 0.6, priority_eps: float = 1e-6):
        capacity = max(1, size_transitions // horizon)
        super().__init__(capacity, horizon, obs_dim, goal_dim, action_dim, discrete, reward_fn, terminal_fn)
        self.prioritized, self.alpha, self.priority_eps = prioritized, alpha, priority_eps
        self.tree = SumTree(capacity * horizon) if prioritized else None
        self.max_priority = 1.0

    def store(self, episodes: Episodes) -> np.ndarray:
        slots = super().store(episodes)
        if self.tree is not None:  # new transitions get the highest priority seen so far
            T = self.horizon
            steps = np.arange(T)
            flat = (slots[:, None] * T + steps).ravel()
            valid = (steps[None, :] < self.lengths[slots][:, None]).ravel()
            self.tree.update(flat, np.where(valid, self.max_priority ** self.alpha, 0.0))
        return slots

    def sample(self, batch_size: int, strategy: str, replay_k: int, rng: np.random.Generator,
               beta: float = 0.4) -> dict:
        if self.tree is None:
            return super().sample(batch_size, strategy, replay_k, rng)
        flat = self.tree.sample(batch_size, rng)
        episode, t = np.divmod(flat, self.horizon)
        goals, relabelled = self.hindsight_goals(episode, t, strategy, replay_k, rng)
        batch = self.transitions(episode, t, goals)
        batch["relabelled"] = relabelled
        batch["indices"] = flat
        batch["weights"] = self.importance_weights(flat, beta)
        return batch

    def importance_weights(self, flat_indices: np.ndarray, beta: float) -> np.ndarray:
        """w_i = (N P(i))^-beta / max_j w_j, where the max is over every stored transition."""
        total, n = self.tree.total, self.n_transitions
        probabilities = self.tree.get(flat_indices) / total
        max_weight = (n * self.tree.min / total) ** -beta
        return ((n * probabilities) ** -beta / max_weight).astype(np.float32)

    def update_priorities(self, flat_indices: np.ndarray, td_errors: np.ndarray) -> None:
        priorities = np.abs(np.asarray(td_errors, np.float64)) + self.priority_eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(flat_indices, priorities ** self.alpha)

    # -- persistence (optional part of a checkpoint) ---------------------------------------------

    def state_dict(self) -> dict:
        n = self.n_episodes
        state = {"obs": self.obs[:n], "ag": self.ag[:n], "g": self.g[:n], "actions": self.actions[:n],
                 "lengths": self.lengths[:n], "next_slot": self.next_slot, "max_priority": self.max_priority}
        if self.tree is not None:
            state["priorities"] = self.tree.get(np.arange(n * self.horizon))
        return state

    def load_state_dict(self, state: dict) -> None:
        n = len(state["lengths"])
        if n > self.capacity or state["obs"].shape[1:] != self.obs.shape[1:]:
            raise ValueError(f"saved replay buffer ({n} episodes of shape {state['obs'].shape[1:]}) "
                             f"does not fit this buffer ({self.capacity} of {self.obs.shape[1:]})")
        for name in ("obs", "ag", "g", "actions", "lengths"):
            getattr(self, name)[:n] = state[name]
        self.n_episodes, self.next_slot = n, int(state["next_slot"])
        self.max_priority = float(state["max_priority"])
        self._cumulative_lengths = None
        if self.tree is not None and "priorities" in state:
            self.tree.update(np.arange(n * self.horizon), state["priorities"])
