"""Networks for image observations (goal-conditioned Ms. Pac-Man): the HTRPO paper's CNN.

Image observations travel through rollouts and replay as flat uint8 rows (4x84x84 = 28,224
bytes per step instead of 112,896 as float32). They become float only at the network:
:class:`ImageGoalInput` normalises the goal as usual and concatenates it to the raw pixel values
(no running statistics: a pixel's scale is known, and per-pixel normalisation would blow up the
always-black borders), so every algorithm keeps its one input tensor ``x``. The on-policy
algorithms' hindsight batches use :class:`FrameRows` instead: each frame stored once, with an index
per row, so that its goal copies share one convolution.
:class:`ConvGoalNet` splits ``x`` again and scales the pixels to [0, 1] as it copies them into
the layout its convolutions run fastest on; the image goes through three convolutions (8 filters
8x8 stride 4, 16 filters 4x4 stride 2, 16 filters 3x3 stride 2, as in the HTRPO authors' code),
the goal is concatenated to the flattened features, then fully connected layers (3x32 in the
paper). :func:`network_body` picks this or an MLP from the env's spec, for policies, critics
and Q-networks alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from her_mpi.settings import NormalizerConfig
from her_mpi.nets import ACTIVATIONS, GoalConditionedInput, mlp
from her_mpi.normalizer import Normalizer

# (filters, kernel, stride) of the paper's three convolutions
CONV_LAYERS = ((8, 8, 4), (16, 4, 2), (16, 3, 2))
PIXEL_MAX = 255.0


def is_image(spec) -> bool:
    """Whether an env's observations are images (channels, height, width)."""
    return len(getattr(spec, "obs_shape", ()) or ()) == 3


class PixelInput(nn.Module):
    """Stands in for the observation normalizer of image inputs: flat pixel rows, no statistics
    (:class:`ConvGoalNet` scales them).

    ``observe``/``sync`` accept the same calls as :class:`~her_mpi.normalizer.Normalizer` and do
    nothing, so the algorithms' normalizer updates need no special case."""

    def observe(self, x, counts=None) -> None:
        pass

    def sync(self) -> None:
        pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        # uint8 stays uint8 here: the concatenation with the goal converts it in the same pass
        return x if x.dtype == torch.uint8 else x.to(torch.float32)


@dataclass(frozen=True, eq=False)
class FrameRows:
    """Network input rows that share their frames: row i is (frames[index[i]], goals[i]).

    A hindsight batch repeats every frame of an episode under each of its goals (16 to 100 copies
    in the HTRPO recipes); as a dense input each copy would be convolved again and stored again
    (28,224 values per row). :class:`ConvGoalNet` convolves each frame once and hands its features
    to every row that uses it. Indexing selects rows, as on a tensor's first dimension."""

    frames: torch.Tensor  # [n_frames, C*H*W] pixel values 0-255 (uint8 as stored)
    index: torch.Tensor  # [rows] int64: each row's frame
    goals: torch.Tensor  # [rows, goal_dim], normalised

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, rows) -> "FrameRows":
        return FrameRows(self.frames, self.index[rows], self.goals[rows])


class ImageGoalInput(nn.Module):
    """(image observation, desired_goal) -> [pixel values 0-255, normalised goal] as float32.

    The observation may come flat ([batch, C*H*W], as stored) or as images ([batch, C, H, W], as
    exported), uint8 or float with values in [0, 255]."""

    def __init__(self, obs_shape: tuple, goal_dim: int, cfg: NormalizerConfig):
        super().__init__()
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.obs_dim = int(torch.Size(self.obs_shape).numel())
        self.obs_normalizer = PixelInput()
        self.goal_normalizer = Normalizer(goal_dim, eps=cfg.eps, clip=cfg.clip, clip_raw=cfg.clip_obs,
                                          enabled=cfg.enabled)
        self.out_dim = self.obs_dim + goal_dim

    def forward(self, obs: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.obs_normalizer(obs), self.goal_normalizer(goal)], dim=-1)

    def rows(self, frames: torch.Tensor, index: torch.Tensor, goals: torch.Tensor) -> FrameRows:
        """Inputs of the rows (frames[index[i]], goals[i]), the frames kept once (FrameRows)."""
        return FrameRows(frames.flatten(1), index, self.goal_normalizer(goals))

    def observe(self, obs, goal) -> None:
        self.goal_normalizer.observe(goal)

    def sync(self) -> None:
        self.goal_normalizer.sync()


class ConvGoalNet(nn.Module):
    """x = [image pixel values 0-255 (flat), goal] (or FrameRows) -> convolutions on the scaled
    image, goal appended, FC layers."""

    def __init__(self, obs_shape: tuple, goal_dim: int, hidden: list[int], out_dim: int,
                 activation: str = "relu", output_activation: type[nn.Module] | None = None):
        super().__init__()
        channels, height, width = (int(d) for d in obs_shape)
        self.obs_shape, self.obs_dim = (channels, height, width), channels * height * width
        layers, last = [], channels
        for filters, kernel, stride in CONV_LAYERS:
            conv = nn.Conv2d(last, filters, kernel, stride)
            nn.init.xavier_uniform_(conv.weight)
            nn.init.zeros_(conv.bias)
            layers += [conv, ACTIVATIONS[activation]()]
            last = filters
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
            if height < 1 or width < 1:
                raise ValueError(f"image observations of shape {tuple(obs_shape)} are too small for "
                                 f"the convolutions {CONV_LAYERS}; expected at least 36x36")
        self.convs = nn.Sequential(*layers, nn.Flatten())
        self.features = last * height * width
        self.head = mlp(self.features + goal_dim, hidden, out_dim, activation, output_activation)

    def input_layer(self) -> tuple[nn.Linear, int, int]:
        """(first layer that sees x directly, x's first column it sees, its first such input):
        the goal columns x[:, obs_dim:] enter the FC head after the conv features."""
        return next(m for m in self.head.modules() if isinstance(m, nn.Linear)), self.obs_dim, self.features

    def forward(self, x: torch.Tensor | FrameRows) -> torch.Tensor:
        if isinstance(x, FrameRows):  # each frame convolved once, its features indexed per row
            used, inverse = torch.unique(x.index, return_inverse=True)
            features = self.conv_features(x.frames[used])[inverse]
            return self.head(torch.cat([features, x.goals], dim=-1))
        return self.head(torch.cat([self.conv_features(x[:, : self.obs_dim]), x[:, self.obs_dim:]], dim=-1))

    def conv_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """[n, C*H*W] pixel values 0-255 -> [n, features]."""
        # The image columns of a dense x are a strided view (each row also holds the goal); convolving
        # that view directly made the update ~2x slower (a hidden copy per call, a slow weight-gradient
        # path). One channels-last float copy, scaled in place, is cheaper than either: the standalone
        # DQN update at batch 128 went from 188 to 145 ms (bench/epoch_time.py, two ranks, quiet).
        image = pixels.reshape(-1, *self.obs_shape)
        image = image.to(torch.float32, memory_format=torch.channels_last, copy=True).div_(PIXEL_MAX)
        return self.convs(image)


def input_layer(network: nn.Module) -> tuple[nn.Linear, int, int]:
    """(first linear layer reading the input x, first x column it reads, its matching input
    column): an MLP reads all of x from its first layer; the CNN reads the goal part in its head,
    also when it sits inside a policy (a categorical policy's ``logits_net``)."""
    for module in network.modules():
        if isinstance(module, ConvGoalNet):
            return module.input_layer()
        if isinstance(module, nn.Linear):
            return module, 0, 0
    raise TypeError(f"{type(network).__name__} has no linear layer reading its input")


@torch.no_grad()
def preserve_function(networks: list[nn.Module], old: tuple, new: tuple) -> None:
    """Rewrite each network's first layer so that it computes on inputs normalised with the
    ``new`` (mean, std) what it computed with the ``old`` ones: W' = W diag(std_new / std_old),
    b' = b + W (mean_new - mean_old) / std_old (exact wherever the clip at +-clip is inactive).
    ``old``/``new``: per x column, from ``input_statistics``; columns with fixed scaling (image
    pixels) are absent from both. In place, so flat parameter views stay valid."""
    (mean_old, std_old, start), (mean_new, std_new, _) = old, new
    if mean_old is None:
        return
    scale, shift = std_new / std_old, (mean_new - mean_old) / std_old
    for network in networks:
        layer, x_start, column = input_layer(network)
        columns = slice(column + start - x_start, column + start - x_start + len(scale))
        weight = layer.weight[:, columns]
        if weight.shape[1] != len(scale):  # a layer that does not read these columns: never rewrite it silently
            raise ValueError(f"{type(network).__name__}'s first layer has {layer.in_features} inputs; "
                             f"expected the normalised columns {columns.start}..{columns.stop - 1} among them")
        layer.bias.add_(weight @ shift)
        weight.mul_(scale)


def input_statistics(inputs: nn.Module) -> tuple:
    """(mean, std, first x column) of the normalised part of an input path's output (copies)."""
    if isinstance(inputs, ImageGoalInput):
        norm = inputs.goal_normalizer
        return (norm.mean.clone(), norm.std.clone(), inputs.obs_dim) if norm.enabled else (None, None, 0)
    obs, goal = inputs.obs_normalizer, inputs.goal_normalizer
    if not obs.enabled:
        return None, None, 0
    return torch.cat([obs.mean, goal.mean]), torch.cat([obs.std, goal.std]), 0


def network_body(spec, in_dim: int, hidden: list[int], out_dim: int, activation: str = "relu",
                 output_activation: type[nn.Module] | None = None) -> nn.Module:
    """The network from the input path's output to ``out_dim`` values: the CNN for image
    observations (``hidden`` = its FC layers), else an MLP."""
    if is_image(spec):
        return ConvGoalNet(spec.obs_shape, spec.goal_dim, hidden, out_dim, activation, output_activation)
    return mlp(in_dim, hidden, out_dim, activation, output_activation)


def goal_conditioned_input(spec, cfg: NormalizerConfig) -> nn.Module:
    """The input path for an env: pixels scaled for images, running normalisation otherwise."""
    if is_image(spec):
        return ImageGoalInput(spec.obs_shape, spec.goal_dim, cfg)
    return GoalConditionedInput(spec.obs_dim, spec.goal_dim, cfg)
