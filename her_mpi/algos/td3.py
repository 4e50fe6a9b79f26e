"""TD3+HER: twin critics, clipped double-Q target, target policy smoothing, delayed actor updates.

DDPG+HER (``algos/ddpg.py``) is this update with one critic, no target smoothing and a policy
delay of 1, exactly as Stable-Baselines3 writes it. All actions inside the agent are in [-1, 1]
(noise scales are fractions of the action range); the env's bounds are applied only at the env
boundary and in the exported policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from her_mpi.algos import fast_updates
from her_mpi.algos.actor_critic import ActorCriticAgent, ActorCriticParams
from her_mpi.settings import Unused, check, setting
from her_mpi.nets import mlp
from her_mpi.optim.kfac import KFACParams


@dataclass
class TD3Params(ActorCriticParams):
    optimizer: Literal["adam", "kfac"] = setting(
        "adam", "optimizer of actor and critics: adam, or kfac (natural gradient: HER+KFAC, TDHER+KFAC; its settings "
                "are algo.kfac.*)")
    kfac: KFACParams = setting(help="K-FAC settings (optimizer: kfac)", factory=KFACParams)
    action_l2: float = setting(1.0, "penalty on the squared [-1, 1] action in the actor loss")
    noise_eps: float = setting(0.2, "exploration: Gaussian noise std, as a fraction of the action range")
    policy_delay: int = setting(2, "critic updates per actor update")
    target_noise: float = setting(0.2, "target policy smoothing: noise std, as a fraction of the action range")
    target_noise_clip: float = setting(0.5, "target policy smoothing: the noise is clipped to +-this")
    # Targets move when the actor does; polyak 0.99 every 2 updates is SB3's tau = 0.005 per
    # update (a lag of ~200 updates; the baselines DDPG schedule lags ~800).
    target_update_every: int = 2
    polyak: float = 0.99

    def validate(self, path: str) -> None:
        super().validate(path)
        for name in ("action_l2", "noise_eps", "target_noise", "target_noise_clip"):
            check(getattr(self, name) >= 0, f"{path}.{name}", getattr(self, name), "a number >= 0")
        check(self.policy_delay >= 1, f"{path}.policy_delay", self.policy_delay, "an integer >= 1")
        check(self.fast_update or self.optimizer == "adam", f"{path}.fast_update", self.fast_update,
              "true with optimizer kfac (K-FAC takes its curvature from the hand-derived training passes)")

    def unused_keys(self, config) -> dict[str, Unused]:
        unused = super().unused_keys(config)
        if self.optimizer == "adam":
            unused["algo.kfac"] = Unused("it is a K-FAC setting, and algo.optimizer is adam")
        else:  # K-FAC steps with kfac.lr
            for name in ("lr_actor", "lr_critic"):
                unused[f"algo.{name}"] = Unused(f"{name} is Adam's learning rate, and algo.optimizer kfac steps with "
                                                f"algo.kfac.lr")
        if self.target_noise == 0:
            unused["algo.target_noise_clip"] = Unused("it clips the target policy's smoothing noise, and "
                                                      "algo.target_noise is 0")
        return unused


class TD3(ActorCriticAgent):
    name = "td3"
    Params = TD3Params

    def __init__(self, spec, config, goal_fns, seed_sequence):
        super().__init__(spec, config, goal_fns, seed_sequence)
        p = self.params
        self.add_actor(mlp(self.inputs.out_dim, p.hidden, spec.action_dim, p.activation,
                           output_activation=nn.Tanh, layer_norm=p.layer_norm), with_target=True)
        self.n_critic_updates = 0
        self.last_actor_loss = torch.zeros(())
        self.share_gradient_averaging()

    def act(self, obs: np.ndarray, g: np.ndarray, explore: bool) -> np.ndarray:
        with torch.inference_mode():
            action = self.actor(self.inputs(torch.from_numpy(obs), torch.from_numpy(g))).numpy()
        if not explore:
            return action
        noise = self.params.noise_eps * self.rng.standard_normal(action.shape, np.float32)
        return self.explore(np.clip(action + noise, -1.0, 1.0))

    def next_value(self, x_next):
        p = self.params
        action_next = self.actor_target(x_next)
        if p.target_noise > 0:
            noise = torch.randn(action_next.shape, generator=self.torch_rng) * p.target_noise
            action_next = (action_next + noise.clamp(-p.target_noise_clip, p.target_noise_clip)).clamp(-1, 1)
        return self.critic_target(torch.cat([x_next, action_next], -1)).min(0).values, None

    def actor_due(self, metrics: dict) -> bool:
        """Whether this critic update is followed by an actor update (every policy_delay-th); the
        metric logged on the others is the last actor loss."""
        self.n_critic_updates += 1
        metrics["actor_loss"] = self.last_actor_loss
        return self.n_critic_updates % self.params.policy_delay == 0

    def actor_step(self, x, metrics):
        if not self.actor_due(metrics):
            return []
        action = self.actor(x)
        q_pi = self.critic.member(0)(torch.cat([x, action], -1)).squeeze(-1)  # the first critic, as TD3
        actor_loss = -q_pi.mean() + self.params.action_l2 * action.pow(2).mean()
        self.actor_optimizer.backward(actor_loss, action)
        self.last_actor_loss = metrics["actor_loss"] = actor_loss.detach()
        return [self.actor_optimizer]

    def fast_actor_step(self, x, metrics):
        return fast_updates.td3_actor_step(self, x, metrics) if self.actor_due(metrics) else []

    def state_dict(self) -> dict:
        # last_actor_loss: the metric logged on updates that skip the actor (an exact resume logs it too)
        return {**super().state_dict(), "n_critic_updates": self.n_critic_updates,
                "last_actor_loss": self.last_actor_loss}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.n_critic_updates = state["n_critic_updates"]
        self.last_actor_loss = state["last_actor_loss"]
