"""What every algorithm provides to the training loop, and the shared off-policy machinery.

An agent owns its networks (one ``nn.ModuleDict`` so that checkpointing, the cross-rank identity
check and the initial broadcast are generic), acts on batches of observations, and learns from
batches of whole episodes. Off-policy agents add a replay buffer and the baselines schedule:
store the episodes, update the normalizers from a hindsight-relabelled sample of them, run
``n_batches`` gradient updates, then move the target networks.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import nn

from her_mpi import mpi
from her_mpi.cnn import goal_conditioned_input
from her_mpi.settings import Activation, ConfigError, Unused, check, setting
from her_mpi.envs import EnvSpec, GoalFunctions
from her_mpi.nets import DeployablePolicy
from her_mpi.replay.buffer import EpisodeStore, ReplayBuffer
from her_mpi.rollout import Episodes

if TYPE_CHECKING:  # the loader imports the algorithms, never the other way round
    from her_mpi.config import Config


class Agent(ABC):
    """The algorithm interface used by the loop, evaluation, checkpoints and export."""

    Params: type  # dataclass of the algorithm's hyperparameters: the config's `algo` section
    name: str

    def __init__(self, spec: EnvSpec, config: Config, goal_fns: GoalFunctions | None,
                 seed_sequence: np.random.SeedSequence):
        """``goal_fns``: the env's vectorised reward/terminal/success functions (None when the
        agent is only rebuilt to act, e.g. for export)."""
        self.spec, self.config, self.params = spec, config, config.algo
        self.goal_fns = goal_fns
        self.rng = np.random.default_rng(seed_sequence)
        self.torch_rng = torch.Generator().manual_seed(int(seed_sequence.generate_state(1)[0]))
        self.nets = nn.ModuleDict()
        self.inputs = goal_conditioned_input(spec, config.normalizer)  # pixels scaled for images
        self.nets["inputs"] = self.inputs
        self.n_updates = 0

    @abstractmethod
    def act(self, obs: np.ndarray, g: np.ndarray, explore: bool) -> np.ndarray:
        """Actions for a batch: in [-1, 1] for continuous envs, int indices for discrete ones."""

    def start_episodes(self, n: int) -> None:
        """``n`` new episodes begin; the next ``act(..., explore=True)`` calls are their steps (in
        order). Agents whose exploration spans steps reset its state here."""

    def random_actions(self, n: int) -> np.ndarray:
        """Uniformly random actions for n envs, as ``act`` returns them (train.random_steps)."""
        if self.spec.discrete:
            return self.rng.integers(0, self.spec.n_actions, (n, 1))
        return self.rng.uniform(-1.0, 1.0, (n, self.spec.action_dim)).astype(np.float32)

    @abstractmethod
    def learn(self, episodes: Episodes) -> dict[str, float]:
        """Learn from this rank's newly collected episodes (a collective: all ranks call it)."""

    @abstractmethod
    def policy(self) -> DeployablePolicy:
        """The deterministic policy in env units, as deployed."""

    # -- state shared by all agents ------------------------------------------------------------

    def broadcast_parameters(self) -> None:
        """Give every rank rank 0's parameters and buffers (collective)."""
        for tensor in self.nets.state_dict().values():
            if isinstance(tensor, torch.Tensor):
                mpi.broadcast_(tensor.numpy())

    def synced_arrays(self) -> dict[str, np.ndarray]:
        """Everything that must be bit-identical on all ranks."""
        arrays = {name: t.numpy() for name, t in self.nets.state_dict().items()
                  if isinstance(t, torch.Tensor)}
        for name, module in self.nets.named_modules():
            if hasattr(module, "total"):
                arrays[f"{name}.total"] = module.total
        for name, optimizer in self.optimizers().items():
            if hasattr(optimizer, "synced_arrays"):  # K-FAC's curvature factors
                arrays.update({f"{name}.{k}": v for k, v in optimizer.synced_arrays().items()})
        return arrays

    def check_synced(self) -> None:
        mpi.assert_identical_across_ranks(self.synced_arrays())

    def state_dict(self) -> dict:
        return {"nets": self.nets.state_dict(), "n_updates": self.n_updates,
                "optimizers": {k: o.state_dict() for k, o in self.optimizers().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.nets.load_state_dict(state["nets"])
        self.n_updates = state["n_updates"]
        for key, optimizer in self.optimizers().items():
            optimizer.load_state_dict(state["optimizers"][key])

    def optimizers(self) -> dict:
        return {}

    def rng_state(self) -> dict:
        return {"numpy": self.rng.bit_generator.state, "torch": self.torch_rng.get_state()}

    def set_rng_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["numpy"]
        self.torch_rng.set_state(state["torch"])


@dataclass
class OffPolicyParams:
    hidden: list[int] = setting([256, 256, 256], "hidden layer widths of every network (image observations: "
                                                 "the fully connected layers after the convolutions)")
    activation: Activation = setting("relu", "hidden-layer activation of every network")
    gamma: float | None = setting(None, "discount factor; null: 1 - 1/T (0.98 for the 50-step Fetch tasks)")
    polyak: float = setting(0.95, "target networks move as target <- polyak * target + (1 - polyak) * online")
    target_update_every: int = setting(0, "updates between target-network moves (0: once per cycle after its "
                                          "updates, as baselines)")
    clip_target: bool = setting(True, "clip TD targets to the return range, [-1/(1-gamma), 0] for -1/0 rewards")
    # Faster propagation of sparse rewards, biased towards the behaviour's returns.
    n_step: int = setting(1, "TD targets over n stored steps: the rewards under the sampled goal, then the "
                             "target value")
    # With sparse rewards the n-step return of any behaviour plus the value after it is a lower
    # bound of Q*, so it can only raise an underestimate (He et al. 2017, "optimality tightening").
    n_step_correction: Literal["lower_bound", "none"] = setting(
        "lower_bound", "n_step > 1: lower_bound (the larger of the one-step and n-step targets) or none (the n-step "
                       "target)")

    fast_update: bool = setting(True, "run updates through hand-derived passes (her_mpi/algos/fast_updates.py, about a "
                                      "third faster); false: the plain autograd update the algorithm module shows, "
                                      "equal to float tolerance")

    def validate(self, path: str) -> None:
        check(self.gamma is None or 0.0 <= self.gamma < 1.0, f"{path}.gamma", self.gamma,
              "a number in [0, 1) or null")
        check(self.n_step >= 1, f"{path}.n_step", self.n_step, "an integer >= 1")
        check(0.0 <= self.polyak <= 1.0, f"{path}.polyak", self.polyak, "a number in [0, 1]")
        check(self.target_update_every >= 0, f"{path}.target_update_every",
              self.target_update_every, "an integer >= 0")
        check(len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden), f"{path}.hidden",
              self.hidden, "a non-empty list of positive layer widths")

    def unused_keys(self, config: Config) -> dict[str, Unused]:
        """Keys of ``config`` this algorithm never reads with these settings (dotted key, or a
        section's name, -> why); a recipe or --set giving one a non-default value is refused."""
        unused = {}
        if self.n_step == 1:
            unused["algo.n_step_correction"] = Unused("it corrects n-step targets, and algo.n_step is 1")
        if not config.replay.prioritized:
            for name in ("alpha", "beta", "beta_anneal_updates", "priority_eps"):
                unused[f"replay.{name}"] = Unused("it tunes prioritized replay, and replay.prioritized is false")
        if config.replay.episode_priority != "energy":
            unused["replay.energy_clip"] = Unused("it tunes energy-based prioritization, and replay.episode_priority "
                                                  "is not energy")
        if config.replay.strategy == "none":  # an ablation of a recipe's hindsight: warned, not refused
            unused["replay.replay_k"] = Unused("replay.strategy none relabels no transition with an achieved goal",
                                               refuse=False)
        return unused


class OffPolicyAgent(Agent):
    """Replay, hindsight relabelling, normalizer updates and the update schedule of one cycle."""

    def __init__(self, spec, config, goal_fns, seed_sequence):
        super().__init__(spec, config, goal_fns, seed_sequence)
        replay = config.replay
        reward_fn, terminal_fn = (goal_fns.reward, goal_fns.terminal) if goal_fns else (None, None)
        self.gamma = self.params.gamma if self.params.gamma is not None else 1.0 - 1.0 / spec.horizon
        self.n_batches, self.batch_size = config.train.update_schedule(mpi.size())
        # "Once per cycle" means once per cycle of the schedule the recipe was tuned at: under
        # train.schedule_ranks every n_batches (as written) updates, so that the target networks
        # also move as often per env step and per update as at the tuned rank count.
        scheduled = config.train.schedule_ranks is not None
        self.target_every = self.params.target_update_every or (config.train.n_batches if scheduled else 0)
        per_cycle = config.train.rollouts_per_rank * spec.horizon
        if replay.size < per_cycle:  # a cycle's episodes must fit, or the first store() fails mid-run
            raise ConfigError(f"replay.size = {replay.size} transitions cannot hold one cycle's "
                              f"{config.train.rollouts_per_rank} episodes of {spec.horizon} steps; "
                              f"expected replay.size >= {per_cycle}")
        self.buffer = ReplayBuffer(replay.size, spec.horizon, spec.obs_dim, spec.goal_dim,
                                   spec.action_dim, spec.discrete, reward_fn, terminal_fn,
                                   replay.prioritized, replay.alpha, replay.priority_eps,
                                   obs_dtype=np.dtype(spec.obs_dtype),
                                   timeout_reward=goal_fns.timeout_reward if goal_fns else 0.0)
        if replay.episode_priority == "energy":
            try:
                self.buffer.prioritize_by_energy(spec.control_period, replay.energy_clip)
            except ValueError as exc:
                raise ConfigError(f"replay.episode_priority = 'energy' on {spec.env_id}: {exc}; expected "
                                  f"episode_priority none for this env") from None
        self.target_pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (target, online) flat
        self.beta_resumed_at = (0.0, 0)  # (beta progress, n_updates) a resume at another horizon starts from

    @abstractmethod
    def update(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One gradient update; returns (metrics, |TD error| per sample for prioritized replay)."""

    def learn(self, episodes: Episodes) -> dict[str, float]:
        train = self.config.train
        started, started_cpu, waited = time.perf_counter(), time.thread_time(), self.waited_s()
        self.buffer.store(episodes)
        self.update_normalizers(episodes)
        collected, sampling, updating = [], 0.0, 0.0
        for _ in range(self.n_batches):
            tick = time.perf_counter()
            batch = self.sample_batch()
            tensors = self.batch_tensors(batch)
            tock = time.perf_counter()
            metrics, td_error = self.update(tensors)
            sampling, updating = sampling + tock - tick, updating + time.perf_counter() - tock
            if "indices" in batch:
                self.buffer.update_priorities(batch["indices"], td_error.numpy())
            collected.append(metrics)
            self.n_updates += 1
            if self.target_every and self.n_updates % self.target_every == 0:
                self.update_targets()
            if train.sync_check_every and self.n_updates % train.sync_check_every == 0:
                self.check_synced()
        if not self.target_every:
            self.update_targets()
        if not collected:
            return {}
        result = {k: float(torch.stack([m[k] for m in collected]).mean()) for k in collected[0]}
        # Where the learn phase goes, in ms per update: sampling (relabelling, rewards, tensors),
        # the update itself (its wait for the other ranks' gradients included, and also shown on
        # its own) and everything else (storing, normalizers, target networks, sync checks); and
        # the CPU time of it all, which on a shared machine leaves out time spent descheduled.
        n, total = len(collected), time.perf_counter() - started
        result.update(learn_sample_ms=1e3 * sampling / n, learn_update_ms=1e3 * updating / n,
                      learn_wait_ms=1e3 * (self.waited_s() - waited) / n,
                      learn_other_ms=1e3 * (total - sampling - updating) / n,
                      learn_cpu_ms=1e3 * (time.thread_time() - started_cpu) / n)
        return result

    def waited_s(self) -> float:
        """Seconds this agent's optimizers have waited for other ranks so far."""
        return sum(getattr(optimizer, "wait_s", 0.0) for optimizer in self.optimizers().values())

    def input_pair(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Network inputs of (obs, g) and of (obs_next, g_next), the goal after the step (it may
        move), normalised in one pass over both."""
        both = self.inputs(torch.cat([batch["obs"], batch["obs_next"]]), torch.cat([batch["g"], batch["g_next"]]))
        return both.chunk(2)

    def sample_batch(self) -> dict[str, np.ndarray]:
        """One training batch from this rank's replay, relabelled as the recipe says (n-step
        returns and prioritized weights included)."""
        replay = self.config.replay
        return self.buffer.sample(self.batch_size, replay.strategy, replay.replay_k, self.rng, beta=self.beta(),
                                  actual_k=replay.actual_k, n_step=self.params.n_step, gamma=self.gamma)

    @staticmethod
    def batch_tensors(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """A sampled batch as the tensors ``update`` takes (contiguous arrays are not copied)."""
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items() if k != "indices"}

    def update_normalizers(self, episodes: Episodes) -> None:
        """Baselines: statistics of a relabelled sample as large as the new episodes (collective)."""
        replay = self.config.replay
        store = EpisodeStore.from_episodes(episodes, self.goal_fns.reward, self.goal_fns.terminal)
        sample = store.sample(store.n_transitions, replay.strategy, replay.replay_k, self.rng)
        self.inputs.observe(sample["obs"], sample["g"])
        self.inputs.sync()

    @abstractmethod
    def next_value(self, x_next: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The target networks' value of the next input, and a bonus that is not task reward
        (SAC's entropy term) or None."""

    def td_target(self, batch: dict[str, torch.Tensor], x_next: torch.Tensor) -> torch.Tensor:
        """The batch's TD target (no gradient): one-step, the n-step return (``n_step`` > 1), or
        with ``n_step_correction: lower_bound`` the larger of the two (one pass of the target
        networks over both next inputs). SAC's entropy bonus enters at the bootstrap state only."""
        if self.params.n_step == 1:
            return self.bootstrap(batch["rewards"], batch["terminals"], *self.next_value(x_next))
        x_n = self.inputs(batch["obs_n"], batch["g_n"])
        n_step = (batch["rewards_n"], batch["terminals_n"])
        if self.params.n_step_correction == "none":
            return self.bootstrap(*n_step, *self.next_value(x_n), discounts=batch["discounts_n"])
        value, bonus = self.next_value(torch.cat([x_next, x_n]))
        (value_one, value_n), (bonus_one, bonus_n) = value.chunk(2), \
            bonus.chunk(2) if bonus is not None else (None, None)
        one = self.bootstrap(batch["rewards"], batch["terminals"], value_one, bonus_one)
        return torch.maximum(one, self.bootstrap(*n_step, value_n, bonus_n, discounts=batch["discounts_n"]))

    def bootstrap(self, rewards, terminals, next_value, next_bonus=None, discounts=None) -> torch.Tensor:
        """The TD target r + discount * (1 - terminal) * (next_value + next_bonus), the discount
        gamma or, for n-step returns, gamma to the number of steps (``discounts``).

        The return part r + discount * (1 - terminal) * next_value is clipped like baselines; a
        bonus that is not task reward (SAC's entropy term) is added after the clip, since the
        clip's bounds are those of the task return (near success its upper bound 0 would cancel
        it)."""
        discount = (1.0 - terminals).mul_(self.gamma if discounts is None else discounts)
        target = torch.addcmul(rewards, discount, next_value)
        if self.params.clip_target:  # rewards in [lo, hi] bound returns to [lo, hi] / (1 - gamma)
            low, high = self.spec.reward_bounds
            target.clamp_(min(low, 0.0) / (1.0 - self.gamma), max(high, 0.0) / (1.0 - self.gamma))
        if next_bonus is not None:
            target = target + discount * next_bonus
        return target

    def update_targets(self) -> None:
        with torch.no_grad():
            for target, online in self.target_pairs:
                target.lerp_(online, 1.0 - self.params.polyak)

    def beta_horizon(self) -> int:
        """Updates over which beta anneals to 1 at this run's schedule (it depends on the rank count
        when train.schedule_ranks rescales n_batches)."""
        replay, train = self.config.replay, self.config.train
        return replay.beta_anneal_updates or max(1, train.n_epochs * train.n_cycles * self.n_batches)

    def beta_progress(self, horizon: int | None = None) -> float:
        """How far beta's annealing has come, in [0, 1]: n_updates / horizon (this run's unless
        given), continued from where a checkpoint written at another horizon (another rank count,
        another n_epochs) left it."""
        progress, updates = self.beta_resumed_at
        return min(1.0, progress + (self.n_updates - updates) / (horizon or self.beta_horizon()))

    def beta(self) -> float:
        """Importance-weight exponent, annealed linearly from replay.beta to 1."""
        replay = self.config.replay
        return replay.beta + (1.0 - replay.beta) * self.beta_progress()

    def state_dict(self) -> dict:
        return super().state_dict() | {"beta_horizon": self.beta_horizon(), "beta_resumed_at": list(self.beta_resumed_at)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        # The same horizon continues exactly where the checkpoint was (its own rebase included);
        # another one continues the progress it had reached: beta never jumps on a resume at
        # another rank count or length, nor on the resumes after that one.
        progress, updates = state.get("beta_resumed_at", (0.0, 0))
        self.beta_resumed_at = (float(progress), int(updates))
        saved_horizon = state.get("beta_horizon", self.beta_horizon())
        if saved_horizon != self.beta_horizon():
            self.beta_resumed_at = (self.beta_progress(saved_horizon), self.n_updates)

    def buffer_state(self) -> dict:
        return self.buffer.state_dict()

    def load_buffer_state(self, state: dict) -> None:
        self.buffer.load_state_dict(state)
