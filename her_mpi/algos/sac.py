"""SAC+HER: tanh-squashed Gaussian actor, twin critics, automatic entropy temperature.

log(alpha) is a one-parameter network with its own optimizer, so its gradient is averaged over
ranks like every other gradient and all ranks hold the same alpha. Evaluation and export use the
deterministic action tanh(mean).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from her_mpi.algos import fast_updates
from her_mpi.algos.actor_critic import ActorCriticAgent, ActorCriticParams
from her_mpi.settings import check, setting
from her_mpi.nets import ACTIVATIONS, mlp

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


@dataclass
class SACParams(ActorCriticParams):
    lr_alpha: float = setting(1e-3, "Adam learning rate of the entropy temperature (its log)")
    init_alpha: float = setting(0.1, "initial entropy temperature alpha")
    target_entropy: float | None = setting(None, "entropy the temperature steers the policy to; null: -|A|")
    # Uniformly random actions as in the baselines recipe: once the temperature has settled, the
    # policy's own noise at the target entropy -|A| is about 0.09 per action dimension (TD3: 0.2
    # plus 30% random actions), too little to move the object in FetchPush.
    random_eps: float = 0.3
    target_update_every: int = 2  # with polyak 0.99: SB3's tau = 0.005 per update
    polyak: float = 0.99

    def validate(self, path: str) -> None:
        super().validate(path)
        check(self.lr_alpha > 0, f"{path}.lr_alpha", self.lr_alpha, "a number > 0")
        check(self.init_alpha > 0, f"{path}.init_alpha", self.init_alpha, "a number > 0")


class SquashedGaussianActor(nn.Module):
    """forward: the deterministic action tanh(mean); sample: a reparameterised action + log-prob."""

    log_std_bounds = (LOG_STD_MIN, LOG_STD_MAX)  # log-std is clamped to these

    def __init__(self, in_dim: int, hidden: list[int], action_dim: int, activation: str, layer_norm: bool = False):
        super().__init__()
        # every hidden layer, the body's last one included, uses the configured activation (and LayerNorm)
        last_activation = type(ACTIVATIONS[activation]())  # the module class of that name
        self.body = mlp(in_dim, hidden[:-1], hidden[-1], activation, output_activation=last_activation,
                        layer_norm=layer_norm, norm_last=True)
        self.mean = nn.Linear(hidden[-1], action_dim)
        self.log_std = nn.Linear(hidden[-1], action_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.mean(self.body(x)))

    def sample(self, x: torch.Tensor, generator: torch.Generator | None = None):
        action, log_prob, _, _ = self.squash(self.body(x), generator)
        return action, log_prob

    def squash(self, h: torch.Tensor, generator: torch.Generator | None):
        """(action, log-prob, std * noise, log-std before its clamp) from the body's output."""
        mean, raw_log_std = self.mean(h), self.log_std(h)
        log_std = raw_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        std = log_std.exp()
        scaled_noise = std * torch.randn(mean.shape, generator=generator)
        u = mean + scaled_noise
        # log N(u; mean, std) minus log|d tanh(u)/du| = 2 (log 2 - u - softplus(-2u)), stable form
        log_prob = (-0.5 * ((u - mean) / std).pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - (2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))).sum(-1)
        return torch.tanh(u), log_prob, scaled_noise, raw_log_std

    def train_forward(self, x: torch.Tensor, generator: torch.Generator | None) -> "fast_updates.SquashedGaussianPass":
        """A sampled action and its log-prob, kept for the hand-derived backward (fast_updates)."""
        body_pass = self.body.train_forward(x)
        with torch.no_grad():
            return fast_updates.SquashedGaussianPass(self, body_pass, *self.squash(body_pass.output, generator))


class Temperature(nn.Module):
    def __init__(self, init_alpha: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor([math.log(init_alpha)]))

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.exp().detach()


class SAC(ActorCriticAgent):
    name = "sac"
    Params = SACParams

    def __init__(self, spec, config, goal_fns, seed_sequence):
        super().__init__(spec, config, goal_fns, seed_sequence)
        p = self.params
        self.add_actor(SquashedGaussianActor(self.inputs.out_dim, p.hidden, spec.action_dim, p.activation, p.layer_norm),
                       with_target=False)
        self.temperature = Temperature(p.init_alpha)
        self.temperature_optimizer = self.make_optimizer(self.temperature, p.lr_alpha)
        self.nets["temperature"] = self.temperature
        self.target_entropy = p.target_entropy if p.target_entropy is not None else -float(spec.action_dim)
        self.share_gradient_averaging(self.temperature_optimizer)

    def optimizers(self) -> dict:
        return {**super().optimizers(), "temperature": self.temperature_optimizer}

    def act(self, obs: np.ndarray, g: np.ndarray, explore: bool) -> np.ndarray:
        with torch.inference_mode():
            x = self.inputs(torch.from_numpy(obs), torch.from_numpy(g))
            if not explore:
                return self.actor(x).numpy()
            action = self.actor.sample(x, self.torch_rng)[0].numpy()
        return self.explore(action)

    def next_value(self, x_next):
        action_next, log_prob_next = self.actor.sample(x_next, self.torch_rng)
        q_next = self.critic_target(torch.cat([x_next, action_next], -1)).min(0).values
        return q_next, -self.temperature.alpha * log_prob_next

    def actor_step(self, x, metrics):
        action, log_prob = self.actor.sample(x, self.torch_rng)
        q_pi = self.critic(torch.cat([x, action], -1)).min(0).values  # the smaller of the twin critics
        alpha = self.temperature.alpha
        actor_loss = (alpha * log_prob - q_pi).mean()
        self.actor_optimizer.backward(actor_loss)
        # the temperature steers the policy's entropy -log_prob towards target_entropy
        alpha_loss = -(self.temperature.log_alpha * (log_prob.detach() + self.target_entropy)).mean()
        self.temperature_optimizer.backward(alpha_loss)
        metrics.update(actor_loss=actor_loss.detach(), alpha=alpha[0], entropy=-log_prob.detach().mean())
        return [self.actor_optimizer, self.temperature_optimizer]

    def fast_actor_step(self, x, metrics):
        return fast_updates.sac_actor_step(self, x, metrics)
