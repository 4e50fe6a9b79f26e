"""Shared machinery of the on-policy hindsight algorithms (HTRPO, HPG, PPO-HER).

Each iteration the agent receives this rank's freshly collected episodes and rewrites them for
one or more goals (:func:`relabel`): under a goal g' an episode ends at its first success, and
rewards are recomputed for g'. The rewritten episodes are flattened to rows (goal copy, episode,
step) that exist, together with the policy's log-probability of the taken action under g' and
under the episode's own goal (the per-decision importance weights of hindsight data).

Everything that must agree across ranks goes through :mod:`her_mpi.mpi`: sums for normalising
weights and advantages, and gradients.

The ratio's reference is the policy that collected the batch: an iteration computes every "old"
log-probability (for relabelled copies: the collecting parameters under the copy's goal) before
the normalizers take the batch in. (Computing them after would silently move the reference away
from the collecting policy: the ratio would start at 1 for a policy that never acted.) PPO then
learns in the statistics the batch was collected with and updates the normalizers afterwards
(VecNormalize's semantics); HTRPO updates them first and anchors its trust region at the policy
its step starts from (see HindsightAgent.learn).
"""

from __future__ import annotations

import math
from abc import abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from her_mpi import mpi
from her_mpi.algos.base import Agent
from her_mpi.algos.policies import CategoricalPolicy, GaussianPolicy
from her_mpi.cnn import input_statistics, network_body, preserve_function
from her_mpi.settings import Activation, Unused, check, setting
from her_mpi.envs import EnvSpec
from her_mpi.nets import ActionScaler, DeployablePolicy, GreedyAction
from her_mpi.optim import SyncedAdam
from her_mpi.rollout import Episodes

VALUE_FIT_PIECE = 2048  # rows per piece of a full-batch value gradient (fit_value)


@dataclass
class OnPolicyParams:
    RENAMED = {"critic_lr": "lr_critic"}  # deprecated name -> current name (lr_<network> for every algorithm)

    hidden: list[int] = setting([64, 64], "hidden layer widths of the policy and value networks (image "
                                          "observations: the fully connected layers after the convolutions)")
    activation: Activation = setting("tanh", "hidden-layer activation of the policy and value networks")
    gamma: float = setting(0.98, "discount factor")
    hindsight: bool = setting(True, "learn from hindsight goals too (false: the plain algorithm, TRPO or PPO)")
    lr_critic: float = setting(5e-4, "Adam learning rate of the value network")
    log_std_init: float = setting(0.0, "Gaussian policies: initial log standard deviation")
    init: Literal["xavier", "orthogonal"] = setting(
        "xavier", "initial weights of the fully connected layers (biases 0): xavier (uniform, gain 1) or orthogonal "
                  "(gain sqrt(2), the output layers 0.1, so initial means and logits are near 0: the HTRPO authors' "
                  "networks)")

    def validate(self, path: str) -> None:
        check(len(self.hidden) >= 1 and all(h >= 1 for h in self.hidden), f"{path}.hidden", self.hidden,
              "a non-empty list of positive layer widths")
        check(0.0 <= self.gamma < 1.0, f"{path}.gamma", self.gamma, "a number in [0, 1)")
        check(self.lr_critic > 0, f"{path}.lr_critic", self.lr_critic, "a number > 0")

    # How much an iteration learns, in this algorithm's own keys (train.n_batches, train.batch_size
    # and the replay section are the off-policy schedule's).
    SCHEDULE = "it learns once per cycle from that cycle's episodes"
    BATCH = "it learns from all of a cycle's episodes at once"

    def unused_keys(self, config) -> dict[str, Unused]:
        """Keys of ``config`` this algorithm never reads with these settings (dotted key, or a
        section's name, -> why); a recipe or --set giving one a non-default value is refused."""
        no_replay = "it learns from each cycle's new episodes and keeps no replay buffer"
        return {"replay": Unused(no_replay),
                "checkpoint.save_buffer": Unused(no_replay + " to save"),
                "train.n_batches": Unused(self.SCHEDULE),
                "train.batch_size": Unused(self.BATCH),
                "train.schedule_ranks": Unused(self.SCHEDULE),
                "train.random_steps": Unused("its update needs the probabilities of the policy that collected the "
                                             "episodes; uniformly random actions have none"),
                "train.sync_check_every": Unused("it counts off-policy gradient updates; on-policy ranks are checked "
                                                 "for identical parameters after each epoch")}


@dataclass
class Relabelled:
    """Episodes rewritten for goals: [M, T] grids (one row per copy) plus their valid rows."""

    source: np.ndarray  # [M] episode each copy comes from
    goals: np.ndarray  # [M, T+1, goal_dim]
    mask: np.ndarray  # [M, T] the step exists under this goal
    terminal: np.ndarray  # [M, T] the copy ends here and does not continue (no bootstrap)
    length: np.ndarray  # [M] steps under this goal
    success: np.ndarray  # [M, T] the achieved goal after this step reaches the goal (within the copy)
    rows: tuple[np.ndarray, np.ndarray] = None  # (copy, t) of the valid rows

    def __post_init__(self):
        self.rows = np.nonzero(self.mask)


def relabel(episodes: Episodes, source: np.ndarray, goals: np.ndarray, success_fn,
            end_at_success: bool = True) -> Relabelled:
    """Rewrite episodes ``source`` for goal sequences ``goals`` [M, T+1, goal_dim]: each copy
    ends at its first success (achieved goal after step t reaching the goal at t+1), or with
    ``end_at_success=False`` runs the whole episode (for envs that go on after a success and
    judge the last step: the policy must also learn to stay at the goal); then only an
    episode that ended before the horizon (the env terminated it) ends in a terminal step."""
    M, T = len(source), episodes.actions.shape[1]
    ag_next, goal_next = episodes.ag[source, 1:], goals[:, 1:]
    success = success_fn(ag_next.reshape(M * T, -1), goal_next.reshape(M * T, -1)).reshape(M, T) > 0
    steps = np.arange(T)[None, :]
    lengths = episodes.lengths[source]
    success &= steps < lengths[:, None]
    if end_at_success:
        reached = success.any(axis=1)
        length = np.where(reached, success.argmax(axis=1) + 1, lengths)
        ended = reached
    else:
        length, ended = lengths, lengths < T
    mask = steps < length[:, None]
    terminal = ended[:, None] & (steps == length[:, None] - 1)
    return Relabelled(source, goals, mask, terminal, length, success & mask)


def gae(data: Relabelled, rewards, values, next_values, gamma: float, lam: float) -> np.ndarray:
    """Generalised advantage estimates for the valid rows of relabelled copies (lam = 0: TD(0)).
    A copy's last step bootstraps from V(s') unless it is terminal."""
    copy, t = data.rows
    M, T = data.mask.shape
    terminal = data.terminal[copy, t]
    delta = np.zeros((M, T))
    delta[copy, t] = rewards + gamma * (1.0 - terminal) * next_values - values
    carry = np.zeros((M, T + 1))
    mask = np.concatenate([data.mask, np.zeros((M, 1), bool)], axis=1)
    continues = np.zeros((M, T))
    continues[copy, t] = gamma * lam * (1.0 - terminal)
    for step in reversed(range(T)):
        carry[:, step] = (delta[:, step] + continues[:, step] * carry[:, step + 1] * mask[:, step + 1]) * mask[:, step]
    return carry[copy, t].astype(np.float32)


def orthogonal_init(network: torch.nn.Module, output_gain: float) -> None:
    """Orthogonal weights with gain sqrt(2) in every fully connected layer but the last, which gets
    ``output_gain``; biases 0. Convolutions keep their initialisation."""
    linears = [module for module in network.modules() if isinstance(module, torch.nn.Linear)]
    for k, layer in enumerate(linears):
        torch.nn.init.orthogonal_(layer.weight, math.sqrt(2.0) if k < len(linears) - 1 else output_gain)
        torch.nn.init.zeros_(layer.bias)


def global_sum(*values) -> np.ndarray:
    return mpi.allreduce_sum_(np.asarray(values, dtype=np.float64))


class OnPolicyAgent(Agent):
    """Policy (Gaussian or categorical) and value network V(s, g) on the shared input path."""

    def __init__(self, spec: EnvSpec, config, goal_fns, seed_sequence):
        super().__init__(spec, config, goal_fns, seed_sequence)
        p = self.params
        if spec.discrete:
            logits = network_body(spec, self.inputs.out_dim, p.hidden, spec.n_actions, p.activation)
            self.policy_net = CategoricalPolicy(logits, spec.n_actions)
            self.head = GreedyAction()
        else:
            mean = network_body(spec, self.inputs.out_dim, p.hidden, spec.action_dim, p.activation,
                                output_activation=torch.nn.Tanh)
            self.policy_net = GaussianPolicy(mean, spec.action_dim, log_std_init=p.log_std_init)
            self.head = ActionScaler(spec.action_low, spec.action_high)
        self.value_net = network_body(spec, self.inputs.out_dim, p.hidden, 1, p.activation)
        if p.init == "orthogonal":
            for network in (self.policy_net, self.value_net):
                orthogonal_init(network, output_gain=0.1)
        self.value_optimizer = SyncedAdam(self.value_net, p.lr_critic)
        self.nets.update({"policy": self.policy_net, "value": self.value_net})
        self.n_iterations = 0

    def optimizers(self) -> dict:
        return {"value": self.value_optimizer}

    def policy(self) -> DeployablePolicy:
        return DeployablePolicy(self.inputs, self.policy_net, self.head)

    def act(self, obs: np.ndarray, g: np.ndarray, explore: bool) -> np.ndarray:
        with torch.inference_mode():
            x = self.inputs(torch.from_numpy(obs), torch.from_numpy(g))
            if explore:
                return self.policy_net.sample(x, self.torch_rng).numpy()
            if self.spec.discrete:
                return self.policy_net(x).argmax(-1, keepdim=True).numpy()
            return self.policy_net(x).numpy()

    # -- helpers shared by the algorithms ------------------------------------------------------

    def update_normalizers(self, episodes: Episodes, extra_goals: np.ndarray | None = None) -> None:
        """Statistics of the observations and of every goal the policy will be conditioned on
        (collective). Called once the collecting policy's log-probabilities are taken (HTRPO's
        adopt_first_statistics calls it before, on its first batch)."""
        valid = np.arange(episodes.obs.shape[1])[None, :] <= episodes.lengths[:, None]
        goals = [episodes.g[valid], episodes.ag[valid]]
        if extra_goals is not None and len(extra_goals):
            goals.append(extra_goals)
        self.observe_inputs(episodes.obs[valid], np.concatenate(goals))

    def observe_inputs(self, obs, goals: np.ndarray, obs_counts=None) -> None:
        """Add these observations (each once, or ``obs_counts`` times) and goals to the normalizers'
        statistics (collective)."""
        self.inputs.obs_normalizer.observe(obs, obs_counts)
        self.inputs.goal_normalizer.observe(goals)
        self.inputs.sync()

    @contextmanager
    def functions_preserved(self):
        """Around a normalizer update: rewrite the first layers of the policy and value networks
        so that both compute the same functions of the raw inputs as before (collective).

        The policy that collected the batch is then also the policy the update starts from, in
        the new statistics: importance ratios start at 1 and the trust region measures the step,
        not the normalizer's drift (which would otherwise move the policy, unconstrained, by
        several nats per action early in training)."""
        old = input_statistics(self.inputs)
        yield
        preserve_function([self.policy_net, self.value_net], old, input_statistics(self.inputs))

    def row_tensors(self, episodes: Episodes, data: Relabelled, next_inputs: bool = True) -> dict:
        """Network inputs of the valid rows under the copy's goal, and at the next state
        (``x_next``, for a critic's bootstrap) when ``next_inputs``; tensors, but for image
        observations ``x`` and ``x_next`` are FrameRows (indexable like tensors)."""
        copy, t = data.rows
        ep = data.source[copy]
        rows = {"x": self.inputs_at(episodes, ep, t, data.goals[copy, t])}
        if next_inputs:
            rows["x_next"] = self.inputs_at(episodes, ep, t + 1, data.goals[copy, t + 1])
        return rows | {"actions": torch.from_numpy(episodes.actions[ep, t]),
                       "terminal": torch.from_numpy(data.terminal[copy, t].astype(np.float32)),
                       "t": torch.from_numpy(t)}

    @torch.no_grad()
    def inputs_at(self, episodes: Episodes, ep: np.ndarray, t: np.ndarray, goals: np.ndarray):
        """Network inputs of the rows (episode ep, step t) under ``goals``: a tensor, or for image
        observations rows that share the episodes' frames (her_mpi.cnn.FrameRows)."""
        stride = episodes.obs.shape[1]  # observations per episode (T + 1)
        observations = torch.from_numpy(episodes.obs.reshape(len(episodes) * stride, -1))
        return self.inputs.rows(observations, torch.from_numpy(ep * stride + t), torch.from_numpy(goals))

    def fit_value(self, x, targets: torch.Tensor, iterations: int, batch_size: int = 0) -> float:
        """Regress V(x) on fixed targets; full batch (batch_size 0) or minibatches per iteration.

        A full batch's gradient is summed over pieces of ``VALUE_FIT_PIECE`` rows: the same step, but no
        layer's activations for every row at once. Those are tens of MB per layer on a Fetch batch, which
        glibc maps and unmaps on every pass; paging them in cost a quarter of the fit's time. Image rows
        stay whole, since their rows share each frame's convolution (her_mpi.cnn.FrameRows)."""
        loss = torch.zeros(())
        n = len(x)
        piece = VALUE_FIT_PIECE if isinstance(x, torch.Tensor) else max(n, 1)
        for _ in range(iterations):
            if batch_size and n > batch_size:
                index = torch.randint(0, n, (batch_size,), generator=self.torch_rng)
                loss = (self.value_net(x[index]).squeeze(-1) - targets[index]).pow(2).mean()
                self.value_optimizer.minimize(loss)
            else:
                loss = self.value_optimizer.minimize_sum(
                    (self.value_net(x[i:i + piece]).squeeze(-1) - targets[i:i + piece]).pow(2).sum() / n
                    for i in range(0, n, piece))
        return float(loss)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "n_iterations": self.n_iterations}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.n_iterations = state["n_iterations"]

    @abstractmethod
    def learn(self, episodes: Episodes) -> dict[str, float]:
        """One policy iteration on this rank's new episodes (collective)."""
