"""K-FAC: Kronecker-factored natural-gradient steps for the ``nn.Linear`` layers of a network,
with the curvature averaged over MPI ranks (HER+KFAC and TDHER+KFAC of the HER+KFAC paper).

For a layer with weight W [out, in] and bias b, the gradient G_W = [dW | db] is preconditioned
with the Fisher block F ~ A (x) G, where A = E[a a^T] is the second moment of the layer input
with a 1 appended (the bias column) and G = E[g g^T] the second moment of the gradient of the
per-sample loss w.r.t. the layer output. ``g`` comes from a sampled loss, separate from the
training gradient (ACKTR, and the HER+KFAC paper's "sampling the loss by adding random noise"): the
network's prediction is pulled towards itself plus N(0, 1) noise, i.e. the Gauss-Newton matrix of
a unit-variance Gaussian (critic: targets q + N(0,1); actor: its action perturbed likewise).
``g`` is the per-sample gradient (not divided by the batch size), so G is a per-sample average.

Damping: ``plain`` solves (A (x) G + lambda I)^-1 vec(G_W) exactly in the Kronecker eigenbasis;
``factored`` uses (A + pi sqrt(lambda) I)^-1 and (G + sqrt(lambda)/pi I)^-1 with
pi = sqrt((tr A / dim A) / (tr G / dim G)) (Martens & Grosse's factored Tikhonov damping).
The step is scaled by nu = min(1, sqrt(kl_clip / |lr^2 <V, grad>|)) and applied with momentum.

Low rank (``rank: k``, factored damping): a factor of dimension n > 4k is inverted as its top k
eigen-directions plus the mean of the remaining eigenvalues on the rest, (F + d I)^-1 ~
c I + U diag(1 / (s + d) - c) U^T with c = 1 / (mean tail eigenvalue + d). Applying it costs two
n x k multiplies instead of one n x n: about 4k / n of the exact preconditioning (a quarter at
k = 32, n = 257). The damping makes this accurate: the eigenvalues beyond the 32nd of FetchPush's
factors are ~100x smaller than d, and the action on gradient-like vectors (weighted by the factor)
differs from the exact inverse's by 0.2-2.5% (experiments/results/kfac_low_rank.json). The eigenbasis
is refined from the previous one by two steps of subspace iteration (a full eigh at the first
refresh), so a refresh costs little more than the Cholesky inverse it replaces.

Under MPI every rank computes factors on its own batch; the factors are allreduce-averaged (one
collective) and the gradient is averaged as usual before preconditioning, so all ranks take the
identical step. The eigen-decompositions or inverses (the n^3 part) are split across ranks,
largest first to the least loaded rank, and each result is broadcast from the rank that made it.
The per-step preconditioning (two multiplies per layer, as costly as the gradient's own) is split
the same way (``split_preconditioning``): each layer's natural gradient is computed by the rank
that owns its preconditioner, and one more allreduce per update (a sum in which the other ranks
contribute zeros; one for all networks of a :class:`~her_mpi.optim.GradientGroup`) gives every
rank all of them, bit for bit. That pays when every rank has a core to itself; when ranks take
turns on the cores, the extra collective's wait costs more than the halved multiplies save
(measured at np=2 on 2 cores shared with other jobs: 159 ms per update split, 139 not). By default
(auto) it is used unless a node runs more ranks than cores; other jobs on the node it cannot see,
so on a shared machine set ``split_preconditioning: false``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from her_mpi import mpi
from her_mpi.settings import check, setting
from her_mpi.optim import SyncedOptimizer


@dataclass
class KFACParams:
    lr: float = setting(0.05, "natural-gradient step size of actor and critics (replaces Adam's lr_actor and "
                              "lr_critic)")
    damping: float = setting(0.8, "Tikhonov damping lambda (the HER+KFAC paper's best runs: 0.8; 0.01 did not learn FetchPush)")
    damping_mode: Literal["factored", "plain"] = setting(
        "factored", "damping: factored (split between the two Kronecker factors) or plain")
    momentum: float = setting(0.8, "SGD momentum of the preconditioned step (the HER+KFAC paper's best runs: 0.8)")
    kl_clip: float = setting(1e-3, "steps are scaled by min(1, sqrt(kl_clip / |lr^2 <natural gradient, gradient>|))")
    stat_decay: float = setting(0.95, "running-average decay of the Kronecker factors")
    factor_every: int = setting(10, "updates between factor refreshes (each costs a sampled backward pass)")
    inverse_every: int = setting(100, "updates between eigen-decompositions / inverses of the factors")
    rank: int | None = setting(None, "low-rank preconditioning: keep each factor's top `rank` eigen-directions (factors "
                                     "of dimension > 4 x rank; the rest at their mean eigenvalue), ~4 rank / dim of "
                                     "the exact multiplies; null: exact inverses")
    # Split: each layer's natural gradient computed by one rank and shared (one more collective
    # per update). auto: true unless a node runs more ranks than it has cores, where the extra
    # wait for a descheduled rank costs more than the halved multiplies save.
    split_preconditioning: bool | Literal["auto"] = setting(
        "auto", "each layer preconditioned on one rank and shared: true, false or auto (unless a node has more ranks "
                "than cores)")

    def validate(self, path: str) -> None:
        for name in ("lr", "damping", "kl_clip"):
            check(getattr(self, name) > 0, f"{path}.{name}", getattr(self, name), "a number > 0")
        check(0 <= self.momentum < 1, f"{path}.momentum", self.momentum, "a number in [0, 1)")
        check(0 <= self.stat_decay < 1, f"{path}.stat_decay", self.stat_decay, "a number in [0, 1)")
        for name in ("factor_every", "inverse_every"):
            check(getattr(self, name) >= 1, f"{path}.{name}", getattr(self, name), "an integer >= 1")
        if self.rank is not None:
            check(self.rank >= 1, f"{path}.rank", self.rank, "an integer >= 1 or null (exact inverses)")
            check(self.damping_mode == "factored", f"{path}.rank", self.rank,
                  "null with damping_mode plain (low rank needs the factored damping)")


class KFACLayer:
    """One nn.Linear: its running factors and preconditioner."""

    def __init__(self, module: nn.Linear):
        self.module = module
        n_in, n_out = module.in_features + 1, module.out_features
        self.A, self.G = torch.zeros(n_in, n_in), torch.zeros(n_out, n_out)
        self.preconditioner: list[torch.Tensor] = []  # eigen: Q_A, d_A, Q_G, d_G; inverse: A^-1, G^-1
        self.initialized = False

    @property
    def cost(self) -> int:
        return self.A.shape[0] ** 3 + self.G.shape[0] ** 3


def kronecker_factors(layer_input: torch.Tensor, output_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch estimates of A and G from a layer's input and the sampled gradient of its output."""
    a = layer_input.reshape(-1, layer_input.shape[-1])
    a = torch.cat([a, a.new_ones(a.shape[0], 1)], dim=1)
    g = output_grad.reshape(-1, output_grad.shape[-1])
    return a.T @ a / a.shape[0], g.T @ g / g.shape[0]


def preconditioner(A: torch.Tensor, G: torch.Tensor, damping: float, mode: str, rank: int | None = None,
                   previous: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """plain: [Q_A, d_A, Q_G, d_G]; factored: [A side, G side], each side the damped inverse or,
    with ``rank``, its low-rank form (see low_rank_inverse; ``previous`` seeds its eigenbasis)."""
    if mode == "plain":
        d_A, Q_A = torch.linalg.eigh(A.double())
        d_G, Q_G = torch.linalg.eigh(G.double())
        return [t.float() for t in (Q_A, d_A.clamp_min(0), Q_G, d_G.clamp_min(0))]
    pi = factored_pi(A, G)
    root = math.sqrt(damping)
    previous = previous if previous and len(previous) == 2 else [None, None]
    return [damped_inverse(A, pi * root, rank, previous[0]), damped_inverse(G, root / pi, rank, previous[1])]


def damped_inverse(F: torch.Tensor, delta: float, rank: int | None, previous: torch.Tensor | None) -> torch.Tensor:
    n = F.shape[0]
    if rank is None or n <= 4 * rank:  # small factors: the exact inverse costs as little
        eye = torch.eye(n, dtype=torch.float64)
        return torch.cholesky_inverse(torch.linalg.cholesky(F.double() + delta * eye)).float()
    return low_rank_inverse(F, delta, rank, previous)


SUBSPACE_ITERATIONS = 2


def low_rank_inverse(F: torch.Tensor, delta: float, k: int, previous: torch.Tensor | None = None) -> torch.Tensor:
    """(F + delta I)^-1 ~ c I + U diag(e) U^T from F's top k eigenpairs (U [n, k], values s):
    e = 1 / (s + delta) - c, c = 1 / (mean of the other n - k eigenvalues + delta).

    Packed as one [n + 2, k] tensor (rows: U, then e, then c) so that it is broadcast and
    checkpointed like an inverse. ``previous`` (the last packed result) seeds a subspace
    iteration; without it, a full eigendecomposition."""
    n = F.shape[0]
    F64 = F.double()
    if previous is not None and tuple(previous.shape) == (n + 2, k):
        basis = previous[:n].double()
        for _ in range(SUBSPACE_ITERATIONS):
            basis = torch.linalg.qr(F64 @ basis).Q
        s, W = torch.linalg.eigh(basis.T @ F64 @ basis)  # Rayleigh-Ritz in the refined subspace
        U = basis @ W
    else:
        s, U = torch.linalg.eigh(F64)
        s, U = s[-k:], U[:, -k:]
    s = s.clamp_min(0)
    tail = max(float(torch.trace(F64) - s.sum()) / (n - k), 0.0)
    c = 1.0 / (tail + delta)
    packed = torch.empty(n + 2, k)
    packed[:n] = U
    packed[n] = 1.0 / (s + delta) - c
    packed[n + 1] = c
    return packed


def is_low_rank(part: torch.Tensor) -> bool:
    return part.shape[0] != part.shape[1]


def factored_pi(A: torch.Tensor, G: torch.Tensor) -> float:
    """pi = sqrt((tr A / dim A) / (tr G / dim G)): splits the damping between the two factors."""
    trace_A = float(torch.trace(A)) / A.shape[0]
    trace_G = float(torch.trace(G)) / G.shape[0]
    if trace_A <= 0 or trace_G <= 0:
        return 1.0
    return math.sqrt(trace_A / trace_G)


def precondition(gradient: torch.Tensor, parts: list[torch.Tensor], damping: float, mode: str) -> torch.Tensor:
    """The natural gradient of [dW | db] ([out, in + 1])."""
    natural = torch.empty_like(gradient)
    precondition_into(gradient[:, :-1], gradient[:, -1], parts, damping, mode, natural[:, :-1], natural[:, -1])
    return natural


def precondition_into(weight_grad, bias_grad, parts, damping: float, mode: str, out_weight, out_bias) -> None:
    """The natural gradient of [dW | db], written into ``out_weight`` and ``out_bias``.

    The layer's gradient and its natural gradient stay apart, as the flat buffers hold them (no
    [dW | db] copy either way): a right factor M multiplies [dW | db] as dW M[:-1] + db M[-1]^T,
    and the result's bias column is a separate matrix-vector product."""
    if mode == "plain":  # (A (x) G + lambda I)^-1 vec(grad), exactly, in the Kronecker eigenbasis
        Q_A, d_A, Q_G, d_G = parts
        rotated = torch.mm(Q_G.t(), times_augmented(weight_grad, bias_grad, Q_A))
        rotated.div_(d_G[:, None] * d_A[None, :] + damping)
        left = torch.mm(Q_G, rotated)
        torch.mm(left, Q_A[:-1].t(), out=out_weight)
        torch.mv(left, Q_A[-1], out=out_bias)
        return
    A_inv, G_inv = parts  # G^-1 [dW | db] A^-1
    right = times_augmented(weight_grad, bias_grad, A_inv)
    if not is_low_rank(G_inv):
        torch.mm(G_inv, right[:, :-1], out=out_weight)
        torch.mv(G_inv, right[:, -1], out=out_bias)
        return
    n = G_inv.shape[0] - 2  # c right + U (e * (U^T right))
    U, c = G_inv[:n], float(G_inv[n + 1, 0])
    coefficients = torch.mm(U.t(), right).mul_(G_inv[n][:, None])
    torch.addmm(right[:, :-1], U, coefficients[:, :-1], beta=c, out=out_weight)
    torch.addmv(right[:, -1], U, coefficients[:, -1], beta=c, out=out_bias)


def times_augmented(weight_grad: torch.Tensor, bias_grad: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """[dW | db] @ matrix, matrix [in + 1, k], or @ (c I + U diag(e) U^T) for a low-rank inverse."""
    if is_low_rank(matrix):
        n = matrix.shape[0] - 2
        U, c = matrix[:n], float(matrix[n + 1, 0])
        coefficients = torch.mm(weight_grad, U[:-1]).addr_(bias_grad, U[-1]).mul_(matrix[n])
        result = torch.mm(coefficients, U.t())
        result[:, :-1].add_(weight_grad, alpha=c)
        result[:, -1].add_(bias_grad, alpha=c)
        return result
    return torch.mm(weight_grad, matrix[:-1]).addr_(bias_grad, matrix[-1])


class KFAC(SyncedOptimizer):
    """Drop-in for :class:`~her_mpi.optim.SyncedAdam`: ``backward_pass(network_pass, output_grad)``
    then ``step()``."""

    def __init__(self, module: nn.Module, params: KFACParams, generator: torch.Generator | None = None):
        if not hasattr(module, "train_forward"):  # the curvature pass comes from the network's own pass
            raise ValueError(f"K-FAC preconditions networks of nn.Linear layers only (her_mpi.mlp.MLP or "
                             f"CriticEnsemble); got {type(module).__name__}")
        super().__init__(module)
        self.module, self.params = module, params
        self.layers = [KFACLayer(m) for m in module.modules() if isinstance(m, nn.Linear)]
        self.use_exchange_buffer(torch.zeros_like(self.flat.grad))
        self.owners = [0] * len(self.layers)  # which rank preconditions each layer
        self.split: bool | None = None  # decided (collectively) at the first step
        self.optimizer = torch.optim.SGD([self.flat.param], lr=params.lr, momentum=params.momentum)
        # Fisher samples differ per rank; agents pass their own (seeded, checkpointed) generator.
        self.generator = generator if generator is not None else torch.Generator().manual_seed(7919 + mpi.rank())
        self.n_steps = 0
        self.last_nu = 1.0

    # -- the two phases (backward and step come from SyncedOptimizer) ---------------------------

    def prepare(self, output: torch.Tensor | None) -> None:
        raise RuntimeError("K-FAC takes its curvature from the network's training pass: use "
                           "backward_pass(network.train_forward(x), d loss / d output)")

    def prepare_pass(self, network_pass) -> None:
        if self.n_steps % self.params.factor_every == 0:
            self._update_factors(network_pass)

    # -- the natural gradient: each layer's computed by the rank that owns its preconditioner (the
    # multiplies are as costly as the gradient's own), the others contribute zeros to one sum

    def exchange_buffer(self) -> torch.Tensor:
        return self.natural

    def use_exchange_buffer(self, buffer: torch.Tensor) -> None:
        """The natural gradient lives in ``buffer``, laid out like the flat gradient (a
        :class:`~her_mpi.optim.GradientGroup` sums several networks' in one collective)."""
        self.natural = buffer
        self.natural_views = [tuple(buffer[p.storage_offset(): p.storage_offset() + p.numel()].view_as(p)
                                    for p in (layer.module.weight, layer.module.bias)) for layer in self.layers]

    def shares_exchange(self) -> bool:
        if self.split is None:
            setting = self.params.split_preconditioning
            self.split = mpi.size() > 1 and (setting is True or setting == "auto" and not mpi.oversubscribed())
        return self.split

    def before_exchange(self) -> None:
        p = self.params
        if self.n_steps % p.inverse_every == 0 or not self.layers[0].preconditioner:
            self._refresh_preconditioners()
        mine, split = mpi.rank(), self.shares_exchange()
        for layer, owner, (out_weight, out_bias) in zip(self.layers, self.owners, self.natural_views):
            if owner == mine or not split:
                precondition_into(layer.module.weight.grad, layer.module.bias.grad, layer.preconditioner,
                                  p.damping, p.damping_mode, out_weight, out_bias)
            else:
                out_weight.zero_()
                out_bias.zero_()

    def apply(self) -> None:
        p = self.params
        if self.group is None:  # in a group, the group has exchanged the natural gradients
            self.before_exchange()
            if self.split:
                started = time.perf_counter()
                mpi.allreduce_sum_(self.natural.numpy())
                self.wait_s += time.perf_counter() - started
        # KL clip: nu = min(1, sqrt(kl_clip / |lr^2 <V, grad>|))
        quadratic = float(torch.dot(self.natural, self.flat.grad)) * p.lr ** 2
        self.last_nu = min(1.0, math.sqrt(p.kl_clip / abs(quadratic))) if quadratic != 0 else 1.0
        torch.mul(self.natural, self.last_nu, out=self.flat.grad)
        self._momentum_step()
        self.n_steps += 1

    def _momentum_step(self) -> None:
        """torch.optim.SGD's step (momentum, no dampening) on the one flat tensor, without its
        per-call Python; the buffer lives in the SGD optimizer's state, as checkpoints expect."""
        group = self.optimizer.param_groups[0]
        step = self.flat.grad
        if group["momentum"]:
            state = self.optimizer.state[self.flat.param]
            buffer = state.get("momentum_buffer")
            if buffer is None:
                state["momentum_buffer"] = buffer = step.clone()
            else:
                buffer.mul_(group["momentum"]).add_(step)
            step = buffer
        self.flat.param.add_(step, alpha=-group["lr"])

    # -- curvature -----------------------------------------------------------------------------

    def _update_factors(self, network_pass) -> None:
        """Sampled-loss backward pass -> batch factors -> averaged over ranks -> running average.

        The sampled pass backpropagates N(0, 1) noise from the output through the layers of the
        training forward (its kept activations): no autograd graph, no weight gradients."""
        noise = torch.randn(network_pass.output.shape, generator=self.generator)
        batch = [kronecker_factors(a, g) for a, g in network_pass.output_gradients(noise)]
        flat = torch.cat([f.reshape(-1) for pair in batch for f in pair])
        mpi.allreduce_mean_(flat.numpy())
        offset, decay = 0, self.params.stat_decay
        for layer in self.layers:
            for factor in (layer.A, layer.G):
                size = factor.numel()
                new = flat[offset: offset + size].view_as(factor)
                offset += size
                if layer.initialized:
                    factor.mul_(decay).add_(new, alpha=1 - decay)
                else:
                    factor.copy_(new)
            layer.initialized = True

    def _refresh_preconditioners(self) -> None:
        """Eigen-decompositions / inverses, split across ranks and broadcast from their owner."""
        p = self.params
        self.owners = owners = assign_to_ranks([layer.cost for layer in self.layers], mpi.size())
        for layer, owner in zip(self.layers, owners):
            if not layer.initialized:  # no curvature yet: identity (a plain gradient step)
                layer.A.copy_(torch.eye(layer.A.shape[0]))
                layer.G.copy_(torch.eye(layer.G.shape[0]))
            if owner == mpi.rank():
                parts = preconditioner(layer.A, layer.G, p.damping, p.damping_mode, p.rank, layer.preconditioner)
            else:
                parts = [torch.empty_like(t) for t in preconditioner_shapes(layer, p.damping_mode, p.rank)]
            layer.preconditioner = [t.contiguous() for t in parts]
        for layer, owner in zip(self.layers, owners):
            for tensor in layer.preconditioner:
                mpi.broadcast_(tensor.numpy(), root=owner)

    # -- checkpoints ---------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "n_steps": self.n_steps,
                "factors": [(l.A.clone(), l.G.clone(), l.initialized) for l in self.layers],
                "preconditioners": [[t.clone() for t in l.preconditioner] for l in self.layers]}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.n_steps = state["n_steps"]
        for layer, (A, G, initialized) in zip(self.layers, state["factors"]):
            layer.A.copy_(A)
            layer.G.copy_(G)
            layer.initialized = initialized
        # The inverses of the last refresh (older checkpoints: recomputed at the next step).
        for layer, preconditioner in zip(self.layers, state.get("preconditioners", [[]] * len(self.layers))):
            expected = [t.shape for t in preconditioner_shapes(layer, self.params.damping_mode, self.params.rank)]
            # Saved with another rank or damping mode: recomputed at the next step instead.
            same = [t.shape for t in preconditioner] == expected
            layer.preconditioner = [t.clone() for t in preconditioner] if same else []

    def synced_arrays(self) -> dict[str, np.ndarray]:
        return {f"kfac.{i}.{name}": t.numpy() for i, l in enumerate(self.layers) for name, t in (("A", l.A), ("G", l.G))}


def preconditioner_shapes(layer: KFACLayer, mode: str, rank: int | None = None) -> list[torch.Tensor]:
    n_in, n_out = layer.A.shape[0], layer.G.shape[0]
    if mode == "plain":
        return [torch.empty(n_in, n_in), torch.empty(n_in), torch.empty(n_out, n_out), torch.empty(n_out)]
    return [torch.empty(n + 2, rank) if rank is not None and n > 4 * rank else torch.empty(n, n) for n in (n_in, n_out)]


def assign_to_ranks(costs: list[int], n_ranks: int) -> list[int]:
    """Greedy longest-processing-time split: largest job first to the least loaded rank."""
    load, owners = [0] * n_ranks, [0] * len(costs)
    for index in sorted(range(len(costs)), key=lambda i: -costs[i]):
        rank = min(range(n_ranks), key=lambda r: load[r])
        owners[index] = rank
        load[rank] += costs[index]
    return owners
