"""Stochastic policies for the on-policy algorithms (HTRPO, HPG, PPO-HER).

Both take the normalised (observation, goal) input. ``forward`` is the deterministic action
(what evaluation and ONNX export use); ``log_prob``, ``sample``, ``entropy`` and ``kl`` serve the
updates. Distribution parameters are plain tensors so an "old" policy is just a detached copy
of them (``params``), with no second network. Each wraps a network built for the env (an MLP, or
a CNN for image observations: :func:`her_mpi.cnn.network_body`) from the shared input path to
the distribution's parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class GaussianPolicy(nn.Module):
    """Diagonal Gaussian with a tanh-bounded mean and a state-independent log-std (HTRPO).

    ``mean_net`` maps the input to the mean and must end in tanh."""

    def __init__(self, mean_net: nn.Module, action_dim: int, log_std_init: float = 0.0,
                 log_std_min: float = math.log(0.1)):
        super().__init__()
        self.mean_net = mean_net
        self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))
        self.log_std_min = log_std_min

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mean_net(x)

    def params(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.mean_net(x)
        return mean, self.log_std.clamp_min(self.log_std_min).expand_as(mean)

    @staticmethod
    def log_prob_of(params, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = params
        z = (actions - mean) / log_std.exp()
        return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def log_prob(self, x, actions):
        return self.log_prob_of(self.params(x), actions)

    def sample(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        mean, log_std = self.params(x)
        return mean + log_std.exp() * torch.randn(mean.shape, generator=generator)

    def entropy(self, x) -> torch.Tensor:
        _, log_std = self.params(x)
        return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)

    @staticmethod
    def kl(old, new) -> torch.Tensor:
        """KL(old || new) per row, analytically."""
        (m0, s0), (m1, s1) = old, new
        return (s1 - s0 + ((s0.exp().pow(2) + (m0 - m1).pow(2)) / (2 * s1.exp().pow(2))) - 0.5).sum(-1)


class CategoricalPolicy(nn.Module):
    """Softmax over discrete actions, mixed with a small uniform floor so no probability is 0.

    ``logits_net`` maps the input to one logit per action."""

    def __init__(self, logits_net: nn.Module, n_actions: int, probability_floor: float = 1e-3):
        super().__init__()
        self.logits_net = logits_net
        self.n_actions, self.floor = n_actions, probability_floor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits_net(x)  # greedy action = argmax (the export head)

    def params(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        probabilities = torch.softmax(self.logits_net(x), -1)
        return ((1 - self.floor * self.n_actions) * probabilities + self.floor).log(),

    @staticmethod
    def log_prob_of(params, actions: torch.Tensor) -> torch.Tensor:
        (log_p,) = params
        return log_p.gather(-1, actions.long().reshape(-1, 1)).squeeze(-1)

    def log_prob(self, x, actions):
        return self.log_prob_of(self.params(x), actions)

    def sample(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        (log_p,) = self.params(x)
        return torch.multinomial(log_p.exp(), 1, generator=generator)

    def entropy(self, x) -> torch.Tensor:
        (log_p,) = self.params(x)
        return -(log_p.exp() * log_p).sum(-1)

    @staticmethod
    def kl(old, new) -> torch.Tensor:
        (lp0,), (lp1,) = old, new
        return (lp0.exp() * (lp0 - lp1)).sum(-1)


def detach_params(params) -> tuple:
    return tuple(p.detach() for p in params)
