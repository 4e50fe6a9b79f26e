"""Episode-major replay with hindsight relabelling at sample time.

Memory holds raw episodes only. Each sampled transition (episode e, step t) keeps its stored
goal or, with probability ``1 - 1/(1 + replay_k)``, gets a hindsight goal: an achieved goal of
the same episode (``future``: a later step; ``final``: its last step; ``episode``: any step) or of
any stored episode (``random``). Rewards and terminal flags are recomputed for the whole batch in
one vectorised call to the env's functions, so relabelled rewards are always consistent.

Goals may move during an episode (the prey in predator-prey): ``g`` has T+1 entries and the env
judges step t against the goal after it, g[t+1]. A transition that keeps its stored goal is
therefore pursued towards g[t] (the policy's input) but rewarded against g[t+1], which is also
the goal of its next input; a relabelled goal stays fixed. At the horizon's last step of an
episode that ran out of time, the env's time-out reward (predator-prey: -1) is added, as the env
paid it.

Energy-based prioritization (Zhao & Tresp, CoRL 2018) replays whole episodes in proportion to
the energy their achieved goal gained (:func:`trajectory_energy`): on Fetch the object's, so the
few early episodes in which the gripper moved the object are replayed far more often than the
many in which it never touched it. Steps within a chosen episode stay uniform, and there are no
importance weights (as in the paper).

Prioritized replay keeps one priority per stored transition (slot ``e * T + t``). A relabelled
goal is drawn afresh every time the transition is sampled, so its priority is the latest |TD|
of that transition under whichever goal it was replayed with: an estimate of how much the
transition still has to teach over its goal distribution.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from her_mpi.episodes import Episodes
from her_mpi.replay.sum_tree import SumTree

GoalFunction = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (achieved, desired) -> [batch]
STRATEGIES = ("future", "final", "episode", "random", "none")


GRAVITY = 9.81  # m/s^2; every point of the achieved goal has unit mass


def trajectory_energy(ag: np.ndarray, lengths: np.ndarray, dt: float, clip: float) -> np.ndarray:
    """Energy-based prioritization's trajectory energy of each episode [n], from its achieved
    goals ``ag`` [n, T+1, goal_dim] read as 3-D positions of unit masses (z up).

    E_i = potential (g times the height gained since ag[0]) + kinetic (1/2 v^2, v = the step's
    displacement / dt) after i actions, summed over the points; a transition's energy is what
    it added, E_1 for the first and E_{i+1} - E_i after, clipped to [0, clip]; the trajectory's
    is the sum over its ``lengths`` steps."""
    n, T1, goal_dim = ag.shape
    if goal_dim % 3:
        raise ValueError(f"trajectory energy needs achieved goals made of 3-D positions; goal_dim is {goal_dim}")
    points = ag.reshape(n, T1, goal_dim // 3, 3).astype(np.float64)
    potential = GRAVITY * (points[:, 1:, :, 2] - points[:, :1, :, 2]).sum(axis=2)
    kinetic = 0.5 * ((np.diff(points, axis=1) / dt) ** 2).sum(axis=(2, 3))
    energy = potential + kinetic  # [n, T]: after 1 .. T actions
    gained = np.concatenate([energy[:, :1], np.diff(energy, axis=1)], axis=1).clip(0.0, clip)
    return (gained * (np.arange(T1 - 1)[None, :] < np.asarray(lengths)[:, None])).sum(axis=1)


def weighted_transitions(cumulative_weights: np.ndarray, lengths: np.ndarray, batch_size: int,
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(episode, t): episodes in proportion to their weights (cumulative), t uniform within."""
    episode = np.searchsorted(cumulative_weights, rng.random(batch_size) * cumulative_weights[-1], side="right")
    episode = np.minimum(episode, len(cumulative_weights) - 1)  # rng.random() < 1, but float roundoff
    return episode, (rng.random(batch_size) * lengths[episode]).astype(np.int64)


def uniform_transitions(cumulative_lengths: np.ndarray, lengths: np.ndarray, batch_size: int,
                        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(episode, t) uniform over transitions, given the cumulative episode lengths."""
    if len(cumulative_lengths) == 0 or cumulative_lengths[-1] == 0:
        raise ValueError("cannot sample from an empty replay buffer")
    flat = rng.integers(0, cumulative_lengths[-1], size=batch_size)
    episode = np.searchsorted(cumulative_lengths, flat, side="right")
    return episode, flat - (cumulative_lengths[episode] - lengths[episode])


def hindsight_sources(episode: np.ndarray, t: np.ndarray, lengths: np.ndarray, strategy: str,
                      replay_k: float, rng: np.random.Generator, sample_any: Callable,
                      actual_k: float = 0.0):
    """Which transitions get a hindsight goal, and where in ``ag`` [episodes, T+1] it comes from.

    ``ag[e, i]`` is the goal achieved after i actions of episode e (i = 0 before any action).
    Of the transitions, a share replay_k / (1 + replay_k + actual_k) gets a hindsight goal and a
    share actual_k / (1 + replay_k + actual_k) the desired goal of another stored transition
    (mrl's "futureactual": real goals, most of them far from this episode's outcomes); the rest
    keep their own. With actual_k = 0 this is baselines' 1 - 1/(1 + replay_k), with the same
    random draws. Returns (relabel mask, source episode, source index, actual mask) with the
    sources for the relabelled transitions only; the caller draws the actual goals' sources
    with ``sample_any(n, rng)``, which draws (episode, t) uniformly over all transitions (also
    the ``random`` strategy's sources).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown hindsight strategy {strategy!r}; expected one of {STRATEGIES}")
    if strategy == "none":
        replay_k = 0
    no_one = np.zeros(len(episode), bool)
    if replay_k == 0 and actual_k == 0:
        empty = np.zeros(0, np.int64)
        return no_one, empty, empty, no_one
    draw = rng.random(len(episode))
    p_hindsight = 1.0 - (1.0 + actual_k) / (1.0 + replay_k + actual_k)
    relabel = draw < p_hindsight
    actual = (draw >= p_hindsight) & (draw < 1.0 - 1.0 / (1.0 + replay_k + actual_k)) if actual_k else no_one
    ep, step = episode[relabel], t[relabel]
    length = lengths[ep]
    if strategy == "future" or replay_k == 0:  # uniform over the goals achieved after this step: ag[t+1 .. len]
        return relabel, ep, step + 1 + (rng.random(len(ep)) * (length - step)).astype(np.int64), actual
    if strategy == "final":
        return relabel, ep, length, actual
    if strategy == "episode":  # any goal the episode achieved: ag[1 .. len]
        return relabel, ep, 1 + (rng.random(len(ep)) * length).astype(np.int64), actual
    source_ep, source_t = sample_any(len(ep), rng)  # random: any stored transition's outcome
    return relabel, source_ep, source_t + 1, actual


class PrioritySampler:
    """Proportional prioritized sampling over transition slots, with importance weights."""

    def __init__(self, n_slots: int, alpha: float, priority_eps: float):
        self.tree = SumTree(n_slots)
        self.alpha, self.priority_eps = alpha, priority_eps
        self.max_priority = 1.0

    def add(self, slots: np.ndarray, valid: np.ndarray) -> None:
        """New transitions get the highest priority seen so far; unused slots get zero."""
        self.tree.update(slots, np.where(valid, self.max_priority ** self.alpha, 0.0))

    def sample(self, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        return self.tree.sample(batch_size, rng)

    def weights(self, slots: np.ndarray, n_stored: int, beta: float) -> np.ndarray:
        """w_i = (N P(i))^-beta / max_j w_j, where the max is over every stored transition."""
        total = self.tree.total
        probabilities = self.tree.get(slots) / total
        max_weight = (n_stored * self.tree.min / total) ** -beta
        return ((n_stored * probabilities) ** -beta / max_weight).astype(np.float32)

    def update(self, slots: np.ndarray, td_errors: np.ndarray) -> None:
        priorities = np.abs(np.asarray(td_errors, np.float64)).ravel() + self.priority_eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.update(slots, priorities ** self.alpha)


class EpisodeStore:
    """Rectangular episode arrays (capacity episodes x horizon) with HER transition sampling."""

    def __init__(self, capacity: int, horizon: int, obs_dim: int, goal_dim: int, action_dim: int,
                 discrete: bool, reward_fn: GoalFunction, terminal_fn: GoalFunction | None = None,
                 obs_dtype=np.float32, timeout_reward: float = 0.0):
        """``obs_dtype``: uint8 keeps image observations at a quarter of float32's memory;
        ``timeout_reward``: the env's reward for running out of time (module docstring)."""
        self.capacity, self.horizon = int(capacity), int(horizon)
        self.reward_fn, self.terminal_fn = reward_fn, terminal_fn
        self.timeout_reward = float(timeout_reward)
        T = self.horizon
        self.obs = np.zeros((capacity, T + 1, obs_dim), obs_dtype)
        self.ag = np.zeros((capacity, T + 1, goal_dim), np.float32)
        self.g = np.zeros((capacity, T + 1, goal_dim), np.float32)
        self.actions = np.zeros((capacity, T, action_dim), np.int64 if discrete else np.float32)
        self.lengths = np.zeros(capacity, np.int64)
        self.n_episodes = 0  # stored episodes (<= capacity)
        self.next_slot = 0  # ring position of the next insertion
        self.n_stored = 0  # episodes ever stored: checkpoints save the ones added since their last save
        self._cumulative_lengths = None
        self.energy = None  # per episode slot, with energy-based prioritization (prioritize_by_energy)
        self._cumulative_energy = None

    def prioritize_by_energy(self, dt: float, clip: float) -> None:
        """Sample episodes in proportion to their trajectory energy (:func:`trajectory_energy`,
        ``dt`` the env's control period in seconds, ``clip`` the largest energy one transition
        adds); until some stored episode has energy, sampling stays uniform."""
        goal_dim = self.ag.shape[-1]
        if goal_dim % 3 or not dt > 0:
            raise ValueError(f"energy-based prioritization needs goals that are 3-D positions and the env's control "
                             f"period (env.dt > 0); got goal_dim {goal_dim} and dt {dt}")
        self.energy_dt, self.energy_clip = float(dt), float(clip)
        self.energy = np.zeros(self.capacity)
        self.update_energy(np.arange(self.n_episodes))

    def update_energy(self, slots: np.ndarray) -> None:
        if self.energy is not None and len(slots):
            self.energy[slots] = trajectory_energy(self.ag[slots], self.lengths[slots], self.energy_dt, self.energy_clip)
            self._cumulative_energy = None

    @classmethod
    def from_episodes(cls, episodes: Episodes, reward_fn: GoalFunction,
                      terminal_fn: GoalFunction | None = None, timeout_reward: float = 0.0) -> "EpisodeStore":
        n, T1, od = episodes.obs.shape
        store = cls(n, T1 - 1, od, episodes.g.shape[-1], episodes.actions.shape[-1],
                    episodes.actions.dtype.kind == "i", reward_fn, terminal_fn,
                    obs_dtype=episodes.obs.dtype, timeout_reward=timeout_reward)
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
        self.n_stored += n
        self._cumulative_lengths = None
        self.update_energy(slots)
        return slots

    # -- sampling -----------------------------------------------------------------------------

    def sample_indices(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(episode, t) pairs uniform over all stored transitions."""
        if self._cumulative_lengths is None:
            self._cumulative_lengths = np.cumsum(self.lengths[: self.n_episodes])
        return uniform_transitions(self._cumulative_lengths, self.lengths, batch_size, rng)

    def sample_batch_indices(self, batch_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The (episode, t) pairs of a batch: uniform over transitions, or with energy-based
        prioritization episodes in proportion to their energy. (Goals of other transitions,
        futureactual's and the ``random`` strategy's, stay uniform: :meth:`sample_indices`.)"""
        if self.energy is not None:
            if self._cumulative_energy is None:
                self._cumulative_energy = np.cumsum(self.energy[: self.n_episodes])
            if self._cumulative_energy[-1] > 0:
                return weighted_transitions(self._cumulative_energy, self.lengths, batch_size, rng)
        return self.sample_indices(batch_size, rng)

    def hindsight_goals(self, episode: np.ndarray, t: np.ndarray, strategy: str, replay_k: float,
                        rng: np.random.Generator, actual_k: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Goals for transitions (episode, t): stored, hindsight or another transition's desired
        goal (:func:`hindsight_sources`). Returns (goals, replaced), ``replaced`` marking the
        goals that are not the transition's own (they stay fixed over the transition)."""
        goals = self.g[episode, t].copy()
        relabel, source_ep, source_t, actual = hindsight_sources(
            episode, t, self.lengths, strategy, replay_k, rng, self.sample_indices, actual_k)
        goals[relabel] = self.ag[source_ep, source_t]
        if actual.any():
            actual_ep, actual_t = self.sample_indices(int(actual.sum()), rng)
            goals[actual] = self.g[actual_ep, actual_t]
        return goals, relabel | actual

    def transitions(self, episode: np.ndarray, t: np.ndarray, goals: np.ndarray,
                    relabelled: np.ndarray | None = None, n_step: int = 1, gamma: float = 1.0) -> dict:
        """The batch for transitions (episode, t) pursued towards ``goals``.

        ``relabelled`` marks the goals that replaced the stored ones (fixed goals); the others are
        the stored g[t], and their reward, terminal flag and next input use the stored g[t+1].
        None: every goal is relabelled (fixed).

        With ``n_step`` > 1 the batch also holds the n-step return from t (:meth:`returns`):
        ``rewards_n``, ``terminals_n``, ``discounts_n`` (gamma to the number of steps taken) and
        the input to bootstrap from, ``obs_n`` and ``g_n``."""
        one = self.returns(episode, t, goals, relabelled, 1, gamma)
        batch = {
            "obs": self.obs[episode, t], "obs_next": one["obs"],
            "ag": self.ag[episode, t], "ag_next": self.ag[episode, t + 1],
            "g": goals, "g_next": one["g"], "actions": self.actions[episode, t],
            "rewards": one["rewards"], "terminals": one["terminals"],
        }
        if n_step > 1:
            batch.update({f"{k}_n": v for k, v in self.returns(episode, t, goals, relabelled, n_step, gamma).items()})
        return batch

    def returns(self, episode: np.ndarray, t: np.ndarray, goals: np.ndarray, relabelled: np.ndarray | None,
                n_step: int, gamma: float) -> dict:
        """Discounted rewards of the (up to) ``n_step`` steps from t, under each transition's goal.

        The steps stop at the episode's end and after a terminal step (the goal reached, where
        the env ends episodes). Returns ``rewards`` (sum of gamma^k r_{t+k}), ``terminals``
        (a terminal step was reached), ``discounts`` (gamma^steps taken: what the bootstrap value
        is multiplied by unless terminal) and the bootstrap input ``obs``/``g`` after the last
        step taken."""
        if n_step == 1:  # every batch needs it: a quarter of a sample's time less than below
            return self.one_step_returns(episode, t, goals, relabelled, gamma)
        return self.n_step_returns(episode, t, goals, relabelled, n_step, gamma)

    def one_step_returns(self, episode: np.ndarray, t: np.ndarray, goals: np.ndarray,
                         relabelled: np.ndarray | None, gamma: float) -> dict:
        """:meth:`returns` for one step: the transition's own reward, terminal flag and next input
        (a sampled transition's step always exists)."""
        g_next = goals
        if relabelled is not None and not relabelled.all():
            g_next = np.where(relabelled[:, None], goals, self.g[episode, t + 1])
        ag_next = self.ag[episode, t + 1]
        rewards = np.asarray(self.reward_fn(ag_next, g_next), np.float32).reshape(len(t))
        terminals = np.zeros(len(t), np.float32)
        if self.terminal_fn is not None:
            terminals[:] = np.asarray(self.terminal_fn(ag_next, g_next), bool).reshape(-1)
        if self.timeout_reward:
            length = self.lengths[episode]
            timed_out = (length == self.horizon) & (t == length - 1) & (terminals == 0)
            rewards = rewards + np.where(timed_out, np.float32(self.timeout_reward), np.float32(0))
        return {"rewards": rewards, "terminals": terminals, "discounts": np.full(len(t), np.float32(gamma)),
                "obs": self.obs[episode, t + 1], "g": g_next}

    def n_step_returns(self, episode: np.ndarray, t: np.ndarray, goals: np.ndarray,
                       relabelled: np.ndarray | None, n_step: int, gamma: float) -> dict:
        """:meth:`returns` for any number of steps."""
        batch, rows = len(t), np.arange(len(t))
        length = self.lengths[episode]
        step = t[:, None] + np.arange(n_step)[None, :]  # [batch, n] action indices
        exists = step < length[:, None]
        step = np.minimum(step, length[:, None] - 1)
        ag_next = self.ag[episode[:, None], step + 1]
        g_next = np.broadcast_to(goals[:, None, :], ag_next.shape)
        if relabelled is not None and not relabelled.all():
            g_next = np.where(relabelled[:, None, None], g_next, self.g[episode[:, None], step + 1])
        flat_ag, flat_g = ag_next.reshape(-1, ag_next.shape[-1]), g_next.reshape(-1, g_next.shape[-1])
        rewards = np.asarray(self.reward_fn(flat_ag, flat_g), np.float32).reshape(batch, n_step)
        terminal = np.zeros((batch, n_step), bool)
        if self.terminal_fn is not None:
            terminal = np.broadcast_to(np.asarray(self.terminal_fn(flat_ag, flat_g), bool).reshape(-1),
                                       (batch * n_step,)).reshape(batch, n_step)
        if self.timeout_reward:
            timed_out = (length[:, None] == self.horizon) & (step == length[:, None] - 1) & ~terminal
            rewards = rewards + np.where(timed_out, np.float32(self.timeout_reward), np.float32(0))
        taken = exists & (np.cumsum(terminal, axis=1) - terminal == 0)  # no terminal before step k
        n_taken = taken.sum(axis=1)
        last = step[rows, n_taken - 1] + 1
        if n_step == 1:  # the exact one-step values, no arithmetic on them
            summed = rewards[:, 0]
        else:
            summed = (rewards * np.float32(gamma) ** np.arange(n_step, dtype=np.float32) * taken).sum(axis=1)
        return {"rewards": summed.astype(np.float32), "terminals": (terminal & taken).any(axis=1).astype(np.float32),
                "discounts": (np.float32(gamma) ** n_taken).astype(np.float32),
                "obs": self.obs[episode, last], "g": g_next[rows, n_taken - 1]}

    def sample(self, batch_size: int, strategy: str, replay_k: float, rng: np.random.Generator,
               actual_k: float = 0.0, n_step: int = 1, gamma: float = 1.0) -> dict:
        episode, t = self.sample_batch_indices(batch_size, rng)
        goals, relabelled = self.hindsight_goals(episode, t, strategy, replay_k, rng, actual_k)
        batch = self.transitions(episode, t, goals, relabelled, n_step, gamma)
        batch["relabelled"] = relabelled
        return batch


class ReplayBuffer(EpisodeStore):
    """A rank's replay memory: an :class:`EpisodeStore` sized in transitions, optionally prioritized."""

    def __init__(self, size_transitions: int, horizon: int, obs_dim: int, goal_dim: int,
                 action_dim: int, discrete: bool, reward_fn: GoalFunction,
                 terminal_fn: GoalFunction | None = None, prioritized: bool = False,
                 alpha: float = 0.6, priority_eps: float = 1e-6, obs_dtype=np.float32,
                 timeout_reward: float = 0.0):
        capacity = max(1, size_transitions // horizon)
        super().__init__(capacity, horizon, obs_dim, goal_dim, action_dim, discrete, reward_fn, terminal_fn,
                         obs_dtype=obs_dtype, timeout_reward=timeout_reward)
        self.priorities = PrioritySampler(capacity * horizon, alpha, priority_eps) if prioritized else None

    def store(self, episodes: Episodes) -> np.ndarray:
        slots = super().store(episodes)
        if self.priorities is not None:
            steps = np.arange(self.horizon)
            self.priorities.add((slots[:, None] * self.horizon + steps).ravel(),
                                (steps[None, :] < self.lengths[slots][:, None]).ravel())
        return slots

    def sample(self, batch_size: int, strategy: str, replay_k: float, rng: np.random.Generator,
               beta: float = 0.4, actual_k: float = 0.0, n_step: int = 1, gamma: float = 1.0) -> dict:
        if self.priorities is None:
            return super().sample(batch_size, strategy, replay_k, rng, actual_k, n_step, gamma)
        flat = self.priorities.sample(batch_size, rng)
        episode, t = np.divmod(flat, self.horizon)
        goals, relabelled = self.hindsight_goals(episode, t, strategy, replay_k, rng, actual_k)
        batch = self.transitions(episode, t, goals, relabelled, n_step, gamma)
        batch.update(relabelled=relabelled, indices=flat,
                     weights=self.priorities.weights(flat, self.n_transitions, beta))
        return batch

    def update_priorities(self, flat_indices: np.ndarray, td_errors: np.ndarray) -> None:
        self.priorities.update(flat_indices, td_errors)

    # -- persistence (her_mpi.checkpoint.ReplayStore: each save writes only what changed) --------

    # The per-episode arrays, capacity-major (row = episode slot); a new per-episode array must be
    # listed here to survive a resume.
    EPISODE_FIELDS = ("obs", "ag", "g", "actions", "lengths")

    def episode_fields(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in self.EPISODE_FIELDS}

    def slots_stored_since(self, n_stored_before: int) -> np.ndarray:
        """Slots written since ``n_stored`` was ``n_stored_before``, oldest first."""
        n = min(self.n_stored - int(n_stored_before), self.n_episodes)
        return (self.next_slot - n + np.arange(n)) % self.capacity

    def ring_state(self) -> dict:
        """The ring's position and counters (plain numbers)."""
        state = {"capacity": self.capacity, "horizon": self.horizon, "next_slot": int(self.next_slot),
                 "n_episodes": int(self.n_episodes), "n_stored": int(self.n_stored)}
        if self.priorities is not None:
            state["max_priority"] = float(self.priorities.max_priority)
        return state

    def priority_leaves(self) -> np.ndarray | None:
        """Every stored transition's priority (None without prioritized replay). The sum tree's
        inner nodes are sums of their children, so the leaves determine the tree exactly."""
        if self.priorities is None:
            return None
        return self.priorities.tree.get(np.arange(self.n_episodes * self.horizon)).copy()

    def restore_ring(self, ring: dict, priority_leaves: np.ndarray | None) -> None:
        """After the episode arrays were filled: the ring position, counters and priorities."""
        self.next_slot, self.n_episodes = int(ring["next_slot"]), int(ring["n_episodes"])
        self.n_stored = int(ring.get("n_stored", self.n_episodes))
        self._cumulative_lengths = None
        self.update_energy(np.arange(self.n_episodes))  # a function of the stored episodes: not saved
        if self.priorities is not None and priority_leaves is not None:
            self.priorities.tree.update(np.arange(len(priority_leaves)), priority_leaves)
            self.priorities.max_priority = float(ring["max_priority"])

    def state_dict(self) -> dict:
        """The whole buffer as arrays (the stored episodes only)."""
        n = self.n_episodes
        state = {name: array[:n] for name, array in self.episode_fields().items()}
        state.update({k: v for k, v in self.ring_state().items() if k not in ("capacity", "horizon")})
        leaves = self.priority_leaves()
        if leaves is not None:
            state["priorities"] = leaves
        return state

    def load_state_dict(self, state: dict) -> None:
        n = len(state["lengths"])
        if n > self.capacity or state["obs"].shape[1:] != self.obs.shape[1:]:
            raise ValueError(f"saved replay buffer ({n} episodes of shape {state['obs'].shape[1:]}) "
                             f"does not fit this buffer ({self.capacity} of {self.obs.shape[1:]})")
        for name, array in self.episode_fields().items():
            array[:n] = state[name]
        self.restore_ring({**state, "n_episodes": n}, state.get("priorities"))
