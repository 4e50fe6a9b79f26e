"""Network building blocks shared by every algorithm.

The input path is the same for all of them: raw observation and goal -> clip -> normalise ->
clip -> concatenate (:class:`GoalConditionedInput`). Heads turn a body's output into actions:
:class:`ActionScaler` maps [-1, 1] to the env's bounds. :class:`DeployablePolicy` chains input,
network and head into the module that acting, evaluation and ONNX export all use, so what runs on
the robot is by construction what ran in training.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from her_mpi.episodes import action_scale, to_env_units
from her_mpi.mlp import ACTIVATIONS, MLP, CriticEnsemble, mlp  # noqa: F401 - the networks' home
from her_mpi.normalizer import Normalizer, normalize
from her_mpi.settings import NormalizerConfig


class GoalConditionedInput(nn.Module):
    """(observation, desired_goal) -> normalised, clipped, concatenated network input."""

    def __init__(self, obs_dim: int, goal_dim: int, cfg: NormalizerConfig):
        super().__init__()
        kwargs = dict(eps=cfg.eps, clip=cfg.clip, clip_raw=cfg.clip_obs, enabled=cfg.enabled)
        self.obs_normalizer = Normalizer(obs_dim, **kwargs)
        self.goal_normalizer = Normalizer(goal_dim, **kwargs)
        self.out_dim = obs_dim + goal_dim
        # The normalizers' mean and std buffers are views of one [2, obs + goal] tensor, so the
        # concatenated statistics need no op per forward; every write to the buffers (sync, state
        # dict load, broadcast) lands in it. State-dict keys and values are unchanged.
        statistics = torch.stack([torch.cat([self.obs_normalizer.mean, self.goal_normalizer.mean]),
                                  torch.cat([self.obs_normalizer.std, self.goal_normalizer.std])])
        self.obs_normalizer.mean, self.goal_normalizer.mean = statistics[0].split([obs_dim, goal_dim])
        self.obs_normalizer.std, self.goal_normalizer.std = statistics[1].split([obs_dim, goal_dim])
        self.concatenated = (statistics[0], statistics[1])  # (mean, std) of the concatenated input

    def forward(self, obs: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
        # One clip-normalise-clip over the concatenation (the same arithmetic as normalising each
        # part): a third of the ops, in training and in the exported graph; the concatenated
        # statistics are views, so nothing is concatenated but the input.
        obs_norm = self.obs_normalizer
        mean, std = self.concatenated
        return normalize(torch.cat([obs, goal], dim=-1), mean, std, obs_norm.clip_raw, obs_norm.clip,
                         obs_norm.enabled)

    def beyond_clip(self, obs: np.ndarray, goal: np.ndarray) -> np.ndarray:
        """[n, obs_dim + goal_dim] booleans for rows obs [n, obs_dim], goal [n, goal_dim]: which
        normalised inputs the clip cuts (the networks see one value for everything beyond it)."""
        norm = self.obs_normalizer
        x = torch.from_numpy(np.concatenate([obs, goal], axis=-1).astype(np.float32))
        if not norm.enabled:
            return np.zeros(x.shape, bool)
        unclipped = normalize(x, *self.concatenated, norm.clip_raw, float("inf"))  # the forward pass's arithmetic
        return (unclipped.abs() > norm.clip).numpy()

    def rows(self, observations: torch.Tensor, index: torch.Tensor, goals: torch.Tensor) -> torch.Tensor:
        """Inputs of the rows (observations[index[i]], goals[i]) (see ImageGoalInput.rows)."""
        return self(observations[index], goals)

    def observe(self, obs, goal) -> None:
        self.obs_normalizer.observe(obs)
        self.goal_normalizer.observe(goal)

    def sync(self) -> None:
        self.obs_normalizer.sync()
        self.goal_normalizer.sync()


class ActionScaler(nn.Module):
    """Clip to [-1, 1] and map to the env's action bounds."""

    def __init__(self, low, high):
        super().__init__()
        center, half_range = action_scale(low, high)
        self.register_buffer("center", torch.from_numpy(center))
        self.register_buffer("half_range", torch.from_numpy(half_range))

    def forward(self, unit_action: torch.Tensor) -> torch.Tensor:
        return to_env_units(unit_action, self.center, self.half_range)


class GreedyAction(nn.Module):
    """Discrete head: action values or logits -> index of the best action, shape [batch, 1]."""

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.argmax(dim=-1, keepdim=True)


class DeployablePolicy(nn.Module):
    """(observation, desired_goal) -> action in env units: what export writes to ONNX."""

    def __init__(self, inputs: GoalConditionedInput, network: nn.Module, head: nn.Module):
        super().__init__()
        self.inputs, self.network, self.head = inputs, network, head

    def forward(self, observation: torch.Tensor, desired_goal: torch.Tensor) -> torch.Tensor:
        return self.head(self.network(self.inputs(observation, desired_goal)))


class FlatParameters:
    """Make a module's parameters (and their gradients) views into two contiguous tensors.

    One flat gradient means one MPI Allreduce per network and one fused optimizer step over a
    single tensor instead of a Python loop over layers. Gradients accumulate in place into the
    views, so ``zero_grad`` must zero them (never set them to None).
    """

    def __init__(self, module: nn.Module, trainable: bool = True):
        params = [p for p in module.parameters()]
        total = sum(p.numel() for p in params)
        self.param = torch.zeros(total)
        self.grad = torch.zeros(total) if trainable else None
        offset = 0
        for p in params:
            n = p.numel()
            self.param[offset: offset + n].copy_(p.detach().reshape(-1))
            p.data = self.param[offset: offset + n].view_as(p)
            if trainable:
                p.grad = self.grad[offset: offset + n].view_as(p)
            else:
                p.requires_grad_(False)
            offset += n
        self.param.grad = self.grad
        self.params = params

    def zero_grad(self) -> None:
        self.grad.zero_()

    def use_gradient_buffer(self, buffer: torch.Tensor) -> None:
        """Keep the gradient in ``buffer`` (e.g. a part of one buffer shared by several networks,
        averaged by one collective); the parameters' ``.grad`` become views of it."""
        offset = 0
        for p in self.params:
            p.grad = buffer[offset: offset + p.numel()].view_as(p)
            offset += p.numel()
        self.grad = self.param.grad = buffer


def flat_target_copy(module: nn.Module) -> tuple[nn.Module, torch.Tensor]:
    """A frozen copy of ``module`` (for targets) and its flat parameter tensor."""
    target = copy.deepcopy(module)
    return target, FlatParameters(target, trainable=False).param
