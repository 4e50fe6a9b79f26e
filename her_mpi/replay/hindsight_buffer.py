"""A standalone hindsight replay buffer for people who bring their own agent.

It mirrors cpprb's ``HindsightReplayBuffer`` (its manual is one of the project's sources): construct it with a size, the
fields of a transition, the maximum episode length, a batched reward function and optionally a
goal function; ``add`` transitions, call ``on_episode_end(goal)``, ``sample`` batches with a
``goal`` and a recomputed ``rew``, and ``update_priorities`` when prioritized. Unlike cpprb it
stores each transition once and relabels at sample time, so ``get_stored_size`` counts real
transitions and memory does not grow with ``additional_goals``.

    buffer = HindsightReplayBuffer(10**6, {"obs": {"shape": 10}, "act": {"shape": 1, "dtype": np.int64},
                                           "next_obs": {"shape": 10}},
                                   max_episode_len=10, reward_func=lambda s, a, g: -1.0 * (s != g).any(axis=1))
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from her_mpi.replay.buffer import STRATEGIES, PrioritySampler, hindsight_sources, uniform_transitions


class HindsightReplayBuffer:
    def __init__(self, size: int, env_dict: dict, max_episode_len: int,
                 reward_func: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
                 goal_func: Callable[[np.ndarray], np.ndarray] | None = None, goal_shape=None,
                 state: str = "obs", action: str = "act", next_state: str = "next_obs",
                 strategy: str = "future", additional_goals: int = 4, prioritized: bool = True,
                 alpha: float = 0.6, eps: float = 1e-4, seed: int | None = None):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        for name in (state, action, next_state):
            if name not in env_dict:
                raise ValueError(f"env_dict must describe {name!r} (fields: {', '.join(env_dict)})")
        if "goal" in env_dict or "rew" in env_dict:
            raise ValueError("'goal' and 'rew' are added by the buffer; do not put them in env_dict")
        if int(max_episode_len) < 1 or int(size) < max_episode_len:
            raise ValueError(f"need size >= max_episode_len >= 1, got size={size}, max_episode_len={max_episode_len}")
        self.max_episode_len, self.capacity = int(max_episode_len), int(size) // int(max_episode_len)
        self.reward_func, self.goal_func = reward_func, goal_func or (lambda s: s)
        self.state, self.action, self.next_state = state, action, next_state
        self.strategy, self.additional_goals = strategy, int(additional_goals)
        self.rng = np.random.default_rng(seed)
        self.shapes = {name: tuple(int(d) for d in np.atleast_1d(spec.get("shape", 1)))
                       for name, spec in env_dict.items()}
        L, N = self.max_episode_len, self.capacity
        self.fields = {name: np.zeros((N, L) + self.shapes[name], np.dtype(spec.get("dtype", np.float32)))
                       for name, spec in env_dict.items()}
        goal_shape = tuple(int(d) for d in np.atleast_1d(goal_shape)) if goal_shape is not None else self.shapes[state]
        self.goal_shape = goal_shape
        self.achieved = np.zeros((N, L + 1) + goal_shape, np.float32)  # achieved[e, i]: after i actions
        self.goals = np.zeros((N,) + goal_shape, np.float32)
        self.lengths = np.zeros(N, np.int64)
        self.n_episodes = self.next_slot = 0
        self.episode: dict[str, list] = {name: [] for name in env_dict}
        self.priorities = PrioritySampler(N * L, alpha, eps) if prioritized else None
        self._cumulative = None

    # -- writing -------------------------------------------------------------------------------

    def add(self, **transition) -> None:
        """Add one transition, or several along the first axis, to the current episode."""
        missing = set(self.fields) - set(transition)
        if missing:
            raise ValueError(f"add() is missing {', '.join(sorted(missing))}")
        rows, batches = None, {}  # validate everything before appending: a rejected add() changes nothing
        for name, value in transition.items():
            if name not in self.fields:
                raise ValueError(f"add() got unknown field {name!r}; env_dict has {', '.join(self.fields)}")
            value, shape = np.asarray(value), self.shapes[name]
            if value.size % int(np.prod(shape)) or value.size == 0:
                raise ValueError(f"{name} has shape {value.shape}, expected {shape} per transition")
            batch = value.reshape((-1,) + shape)
            rows = len(batch) if rows is None else rows
            if len(batch) != rows:
                raise ValueError("all fields of add() must hold the same number of transitions")
            batches[name] = batch
        if len(self.episode[self.state]) + rows > self.max_episode_len:
            raise ValueError(f"episode longer than max_episode_len={self.max_episode_len}; "
                             f"call on_episode_end(goal) at the end of each episode")
        for name, batch in batches.items():
            self.episode[name].extend(batch)

    def on_episode_end(self, goal) -> None:
        """Store the current episode, pursued towards ``goal``, and start a new one."""
        length = len(self.episode[self.state])
        if length == 0:
            return
        slot = self.next_slot
        for name, rows in self.episode.items():
            self.fields[name][slot, :length] = np.stack(rows)
            self.fields[name][slot, length:] = 0
        states = self.fields[self.state][slot, :1]
        next_states = self.fields[self.next_state][slot, :length]
        self.achieved[slot, 0] = np.asarray(self.goal_func(states), np.float32).reshape((1,) + self.goal_shape)[0]
        self.achieved[slot, 1: length + 1] = np.asarray(self.goal_func(next_states), np.float32).reshape(
            (length,) + self.goal_shape)
        self.achieved[slot, length + 1:] = self.achieved[slot, length]
        self.goals[slot] = np.asarray(goal, np.float32).reshape(self.goal_shape)
        self.lengths[slot] = length
        if self.priorities is not None:
            steps = np.arange(self.max_episode_len)
            self.priorities.add(slot * self.max_episode_len + steps, steps < length)
        self.next_slot = (slot + 1) % self.capacity
        self.n_episodes = min(self.capacity, self.n_episodes + 1)
        self.episode = {name: [] for name in self.fields}
        self._cumulative = None

    # -- reading -------------------------------------------------------------------------------

    def get_stored_size(self) -> int:
        """Transitions stored (each once: hindsight goals are drawn when sampling)."""
        return int(self.lengths[: self.n_episodes].sum())

    def _uniform(self, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
        if self._cumulative is None:
            self._cumulative = np.cumsum(self.lengths[: self.n_episodes])
        return uniform_transitions(self._cumulative, self.lengths, n, rng)

    def sample(self, batch_size: int, beta: float = 0.4) -> dict:
        """A batch of the env_dict fields plus ``goal`` and its recomputed ``rew``; with
        prioritized replay also ``weights`` (importance weights) and ``indexes``."""
        if self.get_stored_size() == 0:
            raise ValueError("the buffer is empty: add transitions and call on_episode_end(goal) first")
        if self.priorities is not None:
            indexes = self.priorities.sample(batch_size, self.rng)
            episode, t = np.divmod(indexes, self.max_episode_len)
        else:
            episode, t = self._uniform(batch_size, self.rng)
        goal = self.goals[episode].copy()
        relabel, source_ep, source_t, _ = hindsight_sources(
            episode, t, self.lengths, self.strategy, self.additional_goals, self.rng, self._uniform)
        goal[relabel] = self.achieved[source_ep, source_t]
        batch = {name: array[episode, t] for name, array in self.fields.items()}
        batch["goal"] = goal
        rew = self.reward_func(batch[self.next_state], batch[self.action], goal)
        batch["rew"] = np.asarray(rew, np.float32).reshape(batch_size, 1)
        if self.priorities is not None:
            batch["weights"] = self.priorities.weights(indexes, self.get_stored_size(), beta)
            batch["indexes"] = indexes
        return batch

    def update_priorities(self, indexes, priorities) -> None:
        """Set the priorities (e.g. |TD error|) of sampled transitions."""
        if self.priorities is None:
            raise ValueError("update_priorities needs prioritized=True")
        self.priorities.update(np.asarray(indexes), np.asarray(priorities))
