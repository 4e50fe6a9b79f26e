"""Optimizers that keep every rank's network identical: the flat gradient is averaged over ranks
before each step, so all ranks apply the same update to the same parameters."""

from __future__ import annotations

import torch
from torch import nn

from her_mpi import mpi
from her_mpi.nets import FlatParameters


class SyncedAdam:
    """Adam on one network's flat parameters with the gradient averaged over MPI ranks."""

    def __init__(self, module: nn.Module, lr: float):
        self.flat = FlatParameters(module)
        self.optimizer = torch.optim.Adam([self.flat.param], lr=lr)

    def minimize(self, loss: torch.Tensor, output: torch.Tensor | None = None) -> None:
        """One step on ``loss``. Only this network's gradient is computed, even when the loss
        flows through other networks (the actor's loss through the critic). ``output`` is the
        network's prediction, used by curvature-aware optimizers (K-FAC) and ignored here."""
        self.flat.zero_grad()
        loss.backward(inputs=self.flat.params)
        mpi.allreduce_mean_(self.flat.grad.numpy())
        self.optimizer.step()

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
