"""Optimizers that keep every rank's network identical: the flat gradient is averaged over ranks
before each step, so all ranks apply the same update to the same parameters.

The two phases are separate so an agent can compute all its gradients from the same parameters
(as baselines does), then step every network: ``backward(loss)`` (or ``backward_pass``) computes
this network's gradient and starts its Allreduce, ``step()`` finishes the average and applies it.

An agent with several networks puts their optimizers in one :class:`GradientGroup`: their
gradients share one buffer and one Allreduce per update averages all of them. Every collective is
a point where each rank waits for the slowest, so one per update instead of one per network
halves the waiting of an actor-critic update (and more for SAC's three networks).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable

import torch
from torch import nn

from her_mpi import mpi
from her_mpi.nets import FlatParameters


class NonFiniteValue(ArithmeticError):
    """A non-finite averaged gradient. It is averaged over ranks (a NaN on one rank reaches all),
    so every rank raises this at the same update, without another collective."""

    def __init__(self, optimizer: "SyncedOptimizer", what: str):
        super().__init__(f"non-finite {what}")
        self.optimizer, self.what = optimizer, what


class SyncedOptimizer(ABC):
    """One network's flat gradient, averaged over ranks between ``backward`` and ``step``."""

    def __init__(self, module: nn.Module):
        self.flat = FlatParameters(module)
        self._pending = None
        self.group: GradientGroup | None = None  # set by GradientGroup
        self.wait_s = 0.0  # time spent waiting for other ranks' gradients (a learn-phase metric)

    def backward(self, loss: torch.Tensor, output: torch.Tensor | None = None) -> None:
        """This network's gradient of ``loss`` (only it, even when the loss flows through other
        networks, like the actor's through the critic), then start averaging it over ranks.
        ``output`` is the network's prediction; curvature-aware optimizers (K-FAC) use it."""
        self.prepare(output)
        self.flat.zero_grad()
        loss.backward(inputs=self.flat.params)
        self._gradient_ready()

    def backward_pass(self, network_pass, output_grad: torch.Tensor) -> None:
        """This network's gradient by its hand-written backward (her_mpi.mlp): ``network_pass`` is
        its training forward, ``output_grad`` = d loss / d output. The gradient is written straight
        into the flat buffer (nothing to zero), then its average over ranks starts."""
        self.prepare_pass(network_pass)
        network_pass.backward(output_grad)
        self._gradient_ready()

    def set_gradient(self, gradient: torch.Tensor) -> None:
        """A gradient known in closed form (all of this network's, flattened), then start
        averaging it like :meth:`backward` does."""
        self.flat.grad.copy_(gradient.reshape(-1))
        self._gradient_ready()

    def _gradient_ready(self) -> None:
        if self.group is not None:
            self.group.ready(self)
        else:
            self._pending = mpi.start_allreduce_mean_(self.flat.grad.numpy())

    def step(self) -> None:
        started = time.perf_counter()
        if self.group is not None:
            self.group.average(self)
        else:
            mpi.finish_allreduce_mean_(self._pending, self.flat.grad.numpy())
        self.wait_s += time.perf_counter() - started
        self._pending = None
        # One reduction (NaN and Inf propagate through a sum): cheap enough for every update; a
        # group checks all its members' gradients in one, before any of them steps. The
        # parameters are checked once per cycle by the training loop, before any checkpoint.
        if self.group is None:
            check_finite([self])
        self.apply()

    def minimize(self, loss: torch.Tensor, output: torch.Tensor | None = None) -> None:
        self.backward(loss, output)
        self.step()

    def minimize_sum(self, losses: Iterable[torch.Tensor]) -> torch.Tensor:
        """Step on the gradient of a sum of losses, each term backpropagated as soon as it is made, so one
        term's graph is alive at a time (a large batch taken in pieces); returns the sum. First-order
        optimizers: no network output reaches :meth:`prepare`."""
        self.flat.zero_grad()
        total = torch.zeros(())
        for loss in losses:
            loss.backward(inputs=self.flat.params)  # accumulates into the flat gradient's views
            total += loss.detach()
        self._gradient_ready()
        self.step()
        return total

    def prepare(self, output: torch.Tensor | None) -> None:
        """Before the gradient: nothing for first-order optimizers."""

    def prepare_pass(self, network_pass) -> None:
        """Before the gradient of a hand-written pass: nothing for first-order optimizers."""

    def exchange_buffer(self) -> torch.Tensor | None:
        """A buffer that ranks fill in parts and sum after the gradients are averaged (K-FAC's
        natural gradient, each layer computed by one rank), or None."""
        return None

    def before_exchange(self) -> None:
        """With the averaged gradient, fill this rank's parts of :meth:`exchange_buffer`."""

    def shares_exchange(self) -> bool:
        """Whether the ranks' exchange buffers are to be summed (the same answer on every rank)."""
        return False

    @abstractmethod
    def apply(self) -> None:
        """Update the parameters from the averaged gradient in ``self.flat.grad``."""


def check_finite(optimizers: list[SyncedOptimizer], gradients: torch.Tensor | None = None) -> None:
    """Raise :class:`NonFiniteValue` (naming the first offending optimizer) unless ``gradients``
    (default: the one optimizer's) sum to a finite number."""
    total = gradients if gradients is not None else optimizers[0].flat.grad
    if not math.isfinite(float(total.sum())):
        bad = next((o for o in optimizers if not math.isfinite(float(o.flat.grad.sum()))), optimizers[0])
        raise NonFiniteValue(bad, "gradient")


class GradientGroup:
    """Several optimizers' gradients in one buffer, averaged by one Allreduce per update.

    Members are laid out in the given order. An update averages the span from the first to the
    last member that computed a gradient (TD3's critic-only updates: the critic's part alone),
    at the first ``step()`` of the update; then, for members with an exchange buffer (K-FAC), each
    fills its parts and one more collective sums those buffers, also laid out back to back."""

    def __init__(self, optimizers: list[SyncedOptimizer]):
        self.members = list(optimizers)
        self.gradients = torch.zeros(sum(o.flat.grad.numel() for o in self.members))
        self.spans = self._share(self.gradients, [o.flat.grad for o in self.members],
                                 [o.flat.use_gradient_buffer for o in self.members])
        exchanging = [o for o in self.members if o.exchange_buffer() is not None]
        self.exchanges = torch.zeros(sum(o.exchange_buffer().numel() for o in exchanging))
        self.exchange_spans = dict(zip(map(id, exchanging), self._share(
            self.exchanges, [o.exchange_buffer() for o in exchanging], [o.use_exchange_buffer for o in exchanging])))
        for optimizer in self.members:
            optimizer.group = self
        self._ready: list[SyncedOptimizer] = []
        self._stepped = 0

    @staticmethod
    def _share(buffer: torch.Tensor, tensors: list[torch.Tensor], users) -> list[tuple[int, int]]:
        spans, offset = [], 0
        for tensor, use in zip(tensors, users):
            view = buffer[offset: offset + tensor.numel()]
            view.copy_(tensor.reshape(-1))
            use(view)
            spans.append((offset, offset + tensor.numel()))
            offset += tensor.numel()
        return spans

    def ready(self, optimizer: SyncedOptimizer) -> None:
        if optimizer not in self._ready:
            self._ready.append(optimizer)

    def average(self, optimizer: SyncedOptimizer) -> None:
        """At the update's first step: average the gradients (one collective), then exchange."""
        if optimizer not in self._ready:
            raise RuntimeError("step() without a gradient computed in this update")
        if self._stepped == 0:
            spans = [self.spans[self.members.index(o)] for o in self._ready]
            part = self.gradients[min(lo for lo, _ in spans):max(hi for _, hi in spans)]
            mpi.finish_allreduce_mean_(mpi.start_allreduce_mean_(part.numpy()), part.numpy())
            check_finite(self._ready, part)
            exchanging = [o for o in self._ready if id(o) in self.exchange_spans]
            for member in exchanging:
                member.before_exchange()
            shared = [o for o in exchanging if o.shares_exchange()]
            if shared:
                lo = min(self.exchange_spans[id(o)][0] for o in shared)
                hi = max(self.exchange_spans[id(o)][1] for o in shared)
                mpi.allreduce_sum_(self.exchanges[lo:hi].numpy())
        self._stepped += 1
        if self._stepped == len(self._ready):  # the update's last step: the next update starts
            self._ready, self._stepped = [], 0


class SyncedAdam(SyncedOptimizer):
    """Adam on one network's flat parameters with the gradient averaged over MPI ranks."""

    def __init__(self, module: nn.Module, lr: float, max_grad_norm: float = 0.0):
        super().__init__(module)
        self.optimizer = torch.optim.Adam([self.flat.param], lr=lr, fused=True)  # one kernel
        self.max_grad_norm = max_grad_norm  # clip the averaged gradient's norm (0: never)

    def apply(self) -> None:
        if self.max_grad_norm:
            norm = float(self.flat.grad.norm())
            if norm > self.max_grad_norm:
                self.flat.grad.mul_(self.max_grad_norm / norm)
        state = self.optimizer.state.get(self.flat.param)
        if not state:  # the first step creates the moments (a loaded checkpoint brings its own)
            self.optimizer.step()
            return
        # What Adam.step does for one fused CPU tensor, without its per-call Python (hooks,
        # grouping by device and dtype, profiler scopes): ~90 us less per step at 140k parameters.
        group = self.optimizer.param_groups[0]
        state["step"] += 1
        torch._fused_adam_([self.flat.param], [self.flat.grad], [state["exp_avg"]], [state["exp_avg_sq"]],
                           [], [state["step"]], lr=group["lr"], beta1=group["betas"][0],
                           beta2=group["betas"][1], weight_decay=group["weight_decay"], eps=group["eps"],
                           amsgrad=group["amsgrad"], maximize=group["maximize"])

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
