"""The continuous actor-critic update shared by TD3 (and DDPG) and SAC.

One update: the TD target from the target networks (algorithm-specific), the critic ensemble's
regression onto it, then the actor's (and SAC's temperature's) losses from the same parameters.
Every gradient starts averaging over ranks as soon as it is computed; all networks step at the end.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from her_mpi.algos import fast_updates
from her_mpi.algos.base import OffPolicyAgent, OffPolicyParams
from her_mpi.settings import ConfigError, check, setting
from her_mpi.nets import ActionScaler, CriticEnsemble, DeployablePolicy, flat_target_copy
from her_mpi.optim import GradientGroup, SyncedAdam
from her_mpi.optim.kfac import KFAC


@dataclass
class ActorCriticParams(OffPolicyParams):
    lr_actor: float = setting(1e-3, "Adam learning rate of the actor")
    lr_critic: float = setting(1e-3, "Adam learning rate of the critics")
    n_critics: int = setting(2, "critics: 2 for the clipped double-Q target (TD3, SAC), 1 (DDPG)")
    random_eps: float = setting(0.3, "exploration: probability of a uniformly random action per step")
    layer_norm: bool = setting(False, "a LayerNorm (no parameters of its own) after every hidden layer's linear map of "
                                      "the actor and critics, before the activation (mrl's best Fetch networks)")

    def validate(self, path: str) -> None:
        super().validate(path)
        for name in ("lr_actor", "lr_critic"):
            check(getattr(self, name) > 0, f"{path}.{name}", getattr(self, name), "a number > 0")
        check(self.n_critics in (1, 2), f"{path}.n_critics", self.n_critics, "1 or 2")
        check(0.0 <= self.random_eps <= 1.0, f"{path}.random_eps", self.random_eps, "a number in [0, 1]")


class ActorCriticAgent(OffPolicyAgent):
    """Owns the critic ensemble, its target and optimizer; subclasses add the actor."""

    def __init__(self, spec, config, goal_fns, seed_sequence):
        super().__init__(spec, config, goal_fns, seed_sequence)
        if spec.discrete:
            raise ConfigError(f"algo: {self.name} needs continuous actions but {spec.env_id} has "
                              f"{spec.n_actions} discrete actions (use algo: dqn)")
        p = self.params
        self.critic = CriticEnsemble(self.inputs.out_dim + spec.action_dim, p.hidden, p.n_critics, p.activation,
                                     p.layer_norm)
        self.critic_target, critic_target_flat = flat_target_copy(self.critic)  # before any optimizer hooks
        self.critic_optimizer = self.make_optimizer(self.critic, p.lr_critic)
        self.target_pairs.append((critic_target_flat, self.critic_optimizer.flat.param))
        self.nets.update({"critic": self.critic, "critic_target": self.critic_target})
        self.scaler = ActionScaler(spec.action_low, spec.action_high)

    def make_optimizer(self, module, lr):
        """Adam, or K-FAC when the algorithm offers ``optimizer: kfac`` (DDPG, TD3)."""
        if getattr(self.params, "optimizer", "adam") == "kfac":
            return KFAC(module, self.params.kfac, generator=self.torch_rng)
        return SyncedAdam(module, lr)

    def add_actor(self, actor, with_target: bool) -> None:
        self.actor = actor
        self.nets["actor"] = actor
        if with_target:
            self.actor_target, actor_target_flat = flat_target_copy(actor)
            self.nets["actor_target"] = self.actor_target
        self.actor_optimizer = self.make_optimizer(actor, self.params.lr_actor)
        if with_target:
            self.target_pairs.append((actor_target_flat, self.actor_optimizer.flat.param))

    def share_gradient_averaging(self, *others) -> None:
        """One Allreduce per update for all the networks' gradients, the critic's first (a
        critic-only update averages that part alone); subclasses call this once all exist."""
        GradientGroup([self.critic_optimizer, self.actor_optimizer, *others])

    def optimizers(self) -> dict:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer}

    def policy(self) -> DeployablePolicy:
        return DeployablePolicy(self.inputs, self.actor, self.scaler)

    def explore(self, action: np.ndarray) -> np.ndarray:
        """With probability random_eps per env, a uniformly random action instead."""
        random_action = self.random_actions(len(action))
        use_random = self.rng.random((len(action), 1)) < self.params.random_eps
        return np.where(use_random, random_action, action)

    # -- one update ----------------------------------------------------------------------------

    @abstractmethod
    def actor_step(self, x: torch.Tensor, metrics: dict) -> list:
        """The actor's (and temperature's) losses and gradients in autograd, from the critics as they
        are before this update's step; returns the optimizers to step."""

    @abstractmethod
    def fast_actor_step(self, x: torch.Tensor, metrics: dict) -> list:
        """The same through hand-derived passes (her_mpi/algos/fast_updates.py)."""

    def update(self, batch):
        """One update, as the papers write it, in plain autograd. ``algo.fast_update`` (the default)
        runs the same update through hand-derived passes instead, equal to float tolerance."""
        if self.params.fast_update:
            return fast_updates.actor_critic_update(self, batch)
        x, x_next = self.input_pair(batch)
        with torch.no_grad():
            target = self.td_target(batch, x_next)  # r + gamma * (target networks' value of s'), clipped
        q = self.critic(torch.cat([x, batch["actions"]], -1))  # [n_critics, batch]
        td_error = target - q
        weights = batch.get("weights", 1.0)  # prioritized replay's importance weights, else 1
        critic_loss = (weights * td_error.pow(2)).mean(-1).sum()  # every critic regresses onto the target
        self.critic_optimizer.backward(critic_loss, q)
        metrics = {"critic_loss": critic_loss.detach(), "q_mean": q.detach().mean(), "target_mean": target.mean()}
        # the actor's gradient uses the same (not yet updated) critic, as in baselines
        for optimizer in [self.critic_optimizer] + self.actor_step(x, metrics):
            optimizer.step()
        return self.with_kfac_scales(metrics), td_error[0].detach().abs()

    def with_kfac_scales(self, metrics: dict) -> dict:
        for name, optimizer in self.optimizers().items():
            if isinstance(optimizer, KFAC):  # the KL clip's scale: ~1 means steps are not clipped
                metrics[f"kfac_nu_{name}"] = torch.tensor(optimizer.last_nu)
        return metrics
