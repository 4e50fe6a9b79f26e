"""How a run stops on every rank at the same point: stop signals, non-finite values and failed writes.

Once per cycle the ranks agree (one small allreduce) on whether any of them was asked to stop or
saw a non-finite loss or parameter. A stop finishes the cycle, writes a checkpoint and raises
:class:`Preempted`; a non-finite value raises :class:`NonFiniteError` before any checkpoint is
written from it; a failed write raises :class:`CheckpointFailed`, the previous checkpoint intact.
The messages say what happened, where, and what to do.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from her_mpi import mpi


class TrainingHalted(Exception):
    """The run stopped on every rank at the same point; ``str()`` says why and what to do."""


class Preempted(TrainingHalted):
    """A stop signal: the checkpoint of the last finished cycle is written; ``--resume`` continues.
    ``signals``: the names of the signals the ranks received (``SIGTERM``, ``SIGUSR1``, ...)."""

    def __init__(self, message: str, signals=()):
        super().__init__(message)
        self.signals = tuple(signals)


class NonFiniteError(TrainingHalted):
    """A non-finite loss, gradient or parameter; no checkpoint was written from it."""


class CheckpointFailed(TrainingHalted):
    """A checkpoint or replay file could not be written; the previous checkpoint is intact."""


class HaltAgreement:
    """The Trainer's agreement on halts (a mixin: it reads the trainer's agent, signals and position)."""

    def _agree_after_cycle(self, epoch: int, cycle: int, metrics: dict) -> bool:
        """One small allreduce per cycle: did any rank get a stop signal or a non-finite value?
        Returns whether to stop; raises NonFiniteError on every rank if any rank saw one."""
        problem = self._local_non_finite(metrics)
        flags = np.array([self.signals.received is not None, problem is not None], np.float64)
        mpi.allreduce_sum_(flags)
        if flags[1]:
            reports = mpi.allgather_object(problem)
            rank, what = next((r, p) for r, p in enumerate(reports) if p is not None)
            where = f" on rank {rank}" if self.size > 1 else ""
            raise NonFiniteError(self._non_finite_message(what + where, epoch, cycle))
        if flags[0] and self.preempted_by is None:
            names = mpi.allgather_object(self.signals.received)
            self.preempted_signals = sorted({n for n in names if n})
            self.preempted_by = ", ".join(sorted({f"{n} on rank {r}" for r, n in enumerate(names) if n}))
        return bool(flags[0])

    def _local_non_finite(self, metrics: dict) -> str | None:
        """The first non-finite logged loss (this rank's) or parameter (identical on all ranks)."""
        for key, value in metrics.items():
            if not math.isfinite(value):
                return f"non-finite {key} ({value})"
        for name, tensor in self.agent.nets.state_dict().items():
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() \
                    and not math.isfinite(float(tensor.sum())):
                return f"non-finite parameter {name!r} in network {name.split('.')[0]!r}"
        return None

    def _non_finite_message(self, what: str, epoch: int, cycle: int, during: bool = False) -> str:
        """``during``: found in the update in progress; otherwise after the cycle's last one."""
        agent, train = self.agent, self.config.train
        count, unit = (agent.n_iterations, "iteration") if hasattr(agent, "n_iterations") else (agent.n_updates, "update")
        step = f"{unit} {count + 1}" if during else f"found after {unit} {count}"
        return (f"{what} at epoch {epoch + 1} (cycle {cycle + 1}/{train.n_cycles}), {step}; stopped every "
                f"rank without writing a checkpoint from it ({self.last_checkpoint_text()}). Lower the learning rates, "
                f"check the env's observations and rewards for NaN/Inf, then --resume or start again")

    def last_checkpoint_text(self) -> str:
        if not self.generation:
            return "no checkpoint was written before"
        epoch, cycle = self.saved_position
        after = f"epoch {epoch + 2}, cycle {cycle}" if cycle else f"epoch {epoch + 1}"
        return f"the last good checkpoint, {self.checkpoint_dir / 'latest.pt'} (after {after}), is unchanged"

    def _preempted(self, epoch: int, cycle: int) -> Preempted:
        """The halt to raise once the stop's checkpoint is written (resuming at ``epoch``, ``cycle``)."""
        where = f"epoch {epoch + 1}, cycle {cycle}/{self.config.train.n_cycles}" if cycle else f"epoch {epoch + 1}"
        return Preempted(f"stopped by {self.preempted_by}: wrote {self.checkpoint_dir / 'latest.pt'} after the last "
                         f"finished cycle; continue exactly with --resume {self.run_dir} (from {where})",
                         self.preempted_signals)
