"""Running mean/std normalisation whose statistics are shared by all ranks.

Each rank accumulates the sum, sum of squares and count of the inputs it saw since the last
sync; :meth:`Normalizer.sync` allreduces them and adds them to the running totals, so after a
sync every rank's mean and std equal those computed on the union of all ranks' data. The
statistics are kept in float64 numpy; the float32 ``mean``/``std`` buffers are what the network
input path (and the exported ONNX graph) uses.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from her_mpi import mpi


def normalize(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, clip_raw: float, clip: float,
              enabled: bool = True) -> torch.Tensor:
    """Every network's input path: clip raw values to +-clip_raw, then (when ``enabled``)
    normalise and clip to +-clip."""
    x = x.clamp(-clip_raw, clip_raw)
    if not enabled:
        return x
    return ((x - mean) / std).clamp(-clip, clip)


class Normalizer(nn.Module):
    def __init__(self, size: int, eps: float = 0.01, clip: float = 5.0, clip_raw: float = 200.0,
                 enabled: bool = True):
        super().__init__()
        self.size, self.eps, self.clip, self.clip_raw, self.enabled = size, eps, clip, clip_raw, enabled
        self.pending = np.zeros(2 * size + 1, dtype=np.float64)  # [sum, sumsq, count] since sync
        self.total = np.zeros(2 * size + 1, dtype=np.float64)
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("std", torch.ones(size))

    def observe(self, x: np.ndarray, counts: np.ndarray | None = None) -> None:
        """Accumulate a batch [n, size] locally, each row once or ``counts`` [n] times; it takes
        effect at the next :meth:`sync`."""
        x = np.clip(np.asarray(x, dtype=np.float64).reshape(-1, self.size), -self.clip_raw, self.clip_raw)
        if counts is None:
            self.pending[: self.size] += x.sum(axis=0)
            self.pending[self.size: 2 * self.size] += np.square(x).sum(axis=0)
            self.pending[-1] += x.shape[0]
            return
        counts = np.asarray(counts, dtype=np.float64).reshape(-1)
        self.pending[: self.size] += counts @ x
        self.pending[self.size: 2 * self.size] += counts @ np.square(x)
        self.pending[-1] += counts.sum()

    def sync(self) -> None:
        """Collective: merge every rank's pending statistics into the running totals."""
        mpi.allreduce_sum_(self.pending)
        self.total += self.pending
        self.pending[:] = 0.0
        self._refresh()

    def _refresh(self) -> None:
        count = self.total[-1]
        if count <= 0 or not self.enabled:
            return
        mean = self.total[: self.size] / count
        var = self.total[self.size: 2 * self.size] / count - np.square(mean)
        std = np.sqrt(np.maximum(self.eps ** 2, var))
        self.mean.copy_(torch.from_numpy(mean))
        self.std.copy_(torch.from_numpy(std))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return normalize(x, self.mean, self.std, self.clip_raw, self.clip, self.enabled)

    # The totals are plain numpy, so they travel through extra state, not buffers.
    def get_extra_state(self):
        return {"total": self.total.copy()}

    def set_extra_state(self, state) -> None:
        self.total[:] = state["total"]
        self.pending[:] = 0.0
        self._refresh()
