"""K-FAC: the preconditioner against explicit Kronecker algebra, and that it optimizes better."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from her_mpi.mlp import mlp
from her_mpi.config import ConfigError
from her_mpi.optim.kfac import (KFAC, KFACParams, assign_to_ranks, factored_pi, kronecker_factors,
                                low_rank_inverse, precondition, preconditioner)


def spd(n, rng, scale=1.0):
    m = rng.normal(size=(n, n + 3))
    return scale * m @ m.T / (n + 3) + 0.1 * np.eye(n)


@pytest.mark.parametrize("mode", ["plain", "factored"])
def test_preconditioned_gradient_equals_explicit_kronecker_solve(mode):
    rng = np.random.default_rng(0)
    n_in, n_out, damping = 4, 3, 0.05  # a Linear(3 -> 3): A is (3 + 1)^2 with the bias column
    A, G = spd(n_in, rng, 2.0), spd(n_out, rng, 0.3)
    grad = rng.normal(size=(n_out, n_in))
    parts = preconditioner(torch.tensor(A, dtype=torch.float32), torch.tensor(G, dtype=torch.float32), damping, mode)
    ours = precondition(torch.tensor(grad, dtype=torch.float32), parts, damping, mode).numpy()

    vec = grad.flatten(order="F")  # column-stacking: (A (x) G) vec(X) = vec(G X A)
    if mode == "plain":
        explicit = np.linalg.solve(np.kron(A, G) + damping * np.eye(n_in * n_out), vec)
    else:
        pi = math.sqrt((np.trace(A) / n_in) / (np.trace(G) / n_out))
        root = math.sqrt(damping)
        explicit = np.linalg.solve(np.kron(A + pi * root * np.eye(n_in), G + root / pi * np.eye(n_out)), vec)
    np.testing.assert_allclose(ours, explicit.reshape((n_out, n_in), order="F"), rtol=1e-4, atol=1e-6)
    if mode == "factored":
        assert factored_pi(torch.tensor(A), torch.tensor(G)) == pytest.approx(pi)


def low_rank_factor(n, k, rng):
    """A factor whose eigenvalues beyond the k-th are all equal (0.02): exactly what the low-rank
    form represents."""
    basis, _ = np.linalg.qr(rng.normal(size=(n, n)))
    values = np.concatenate([rng.uniform(1.0, 5.0, k), np.full(n - k, 0.02)])
    return (basis * values) @ basis.T


def test_low_rank_preconditioning_is_exact_when_the_factors_tail_is_flat():
    """With rank k and factors whose n - k smallest eigenvalues are equal, the low-rank form is
    the exact damped inverse: the preconditioned gradient equals the explicit Kronecker solve."""
    rng = np.random.default_rng(1)
    k, n_in, n_out, damping = 3, 21, 17, 0.3  # both factors > 4k: both sides low rank
    A, G = low_rank_factor(n_in, k, rng), low_rank_factor(n_out, k, rng)
    grad = rng.normal(size=(n_out, n_in))
    parts = preconditioner(torch.tensor(A, dtype=torch.float32), torch.tensor(G, dtype=torch.float32), damping,
                           "factored", rank=k)
    assert [tuple(p.shape) for p in parts] == [(n_in + 2, k), (n_out + 2, k)]
    ours = precondition(torch.tensor(grad, dtype=torch.float32), parts, damping, "factored").numpy()
    pi = math.sqrt((np.trace(A) / n_in) / (np.trace(G) / n_out))
    root = math.sqrt(damping)
    explicit = np.linalg.solve(np.kron(A + pi * root * np.eye(n_in), G + root / pi * np.eye(n_out)),
                               grad.flatten(order="F"))
    np.testing.assert_allclose(ours, explicit.reshape((n_out, n_in), order="F"), rtol=2e-4, atol=1e-6)


def test_low_rank_inverse_refined_from_the_previous_basis_matches_a_fresh_one():
    """The refresh's subspace iteration, started from the last eigenbasis, gives the inverse a full
    eigendecomposition of the new factor gives (the factor moved as a running average does)."""
    rng = np.random.default_rng(2)
    n, k, delta = 40, 5, 0.5
    old = low_rank_factor(n, k, rng)
    new = 0.6 * old + 0.4 * (old + 0.05 * spd(n, rng))
    old_t, new_t = torch.tensor(old, dtype=torch.float32), torch.tensor(new, dtype=torch.float32)
    refined = low_rank_inverse(new_t, delta, k, previous=low_rank_inverse(old_t, delta, k))
    fresh = low_rank_inverse(new_t, delta, k)

    def dense(packed):
        U, e, c = packed[:n].double(), packed[n].double(), float(packed[n + 1, 0])
        return c * torch.eye(n, dtype=torch.float64) + U @ torch.diag(e) @ U.T

    exact = torch.linalg.inv(new_t.double() + delta * torch.eye(n, dtype=torch.float64))
    error = lambda M: float(torch.linalg.norm((M - exact) @ new_t.double()) / torch.linalg.norm(exact @ new_t.double()))
    assert error(dense(refined)) == pytest.approx(error(dense(fresh)), abs=1e-3)
    assert error(dense(fresh)) < 0.05  # and both are close to the exact inverse


def test_low_rank_needs_factored_damping_and_a_positive_rank():
    with pytest.raises(ConfigError, match=r"algo\.kfac\.rank.*factored"):
        KFACParams(rank=8, damping_mode="plain").validate("algo.kfac")
    with pytest.raises(ConfigError, match=r"algo\.kfac\.rank.*0"):
        KFACParams(rank=0).validate("algo.kfac")


def test_factors_are_input_and_output_gradient_second_moments():
    x = torch.randn(5, 3)
    g = torch.randn(5, 2)
    A, G = kronecker_factors(x, g)
    a = torch.cat([x, torch.ones(5, 1)], 1)
    torch.testing.assert_close(A, a.T @ a / 5)
    torch.testing.assert_close(G, g.T @ g / 5)


def test_optimizer_preconditions_the_real_gradient_of_a_layer():
    """End to end on one layer: the applied update is -lr * nu * (A (x) G + damping)^-1 grad."""
    torch.manual_seed(0)
    net = mlp(3, [], 2)  # one nn.Linear
    layer = net[0]
    params = KFACParams(lr=0.1, damping=0.01, damping_mode="plain", momentum=0.0, kl_clip=1e9,
                        stat_decay=0.0, factor_every=1, inverse_every=1)
    optimizer = KFAC(net, params)
    before = optimizer.flat.param.clone()
    x, y = torch.randn(16, 3), torch.randn(16, 2)
    loss = (net(x) - y).pow(2).mean()
    gradient = torch.autograd.grad(loss, [layer.weight, layer.bias])
    network_pass = net.train_forward(x)  # K-FAC takes its curvature from the network's own pass
    optimizer.backward_pass(network_pass, 2 * (network_pass.output - y) / y.numel())
    optimizer.step()
    A = optimizer.layers[0].A.double().numpy()
    G = optimizer.layers[0].G.double().numpy()
    grad = torch.cat([gradient[0], gradient[1][:, None]], 1).double().numpy()
    natural = np.linalg.solve(np.kron(A, G) + 0.01 * np.eye(8), grad.flatten(order="F")).reshape((2, 4), order="F")
    step = (optimizer.flat.param - before).double().numpy()
    expected = -0.1 * np.concatenate([natural[:, :3].ravel(), natural[:, 3]])
    np.testing.assert_allclose(step, expected, rtol=1e-3, atol=1e-6)


def ill_conditioned_problem(seed=0):
    rng = np.random.default_rng(seed)
    scales = np.logspace(0, 2, 8)  # feature scales 1 .. 100: condition number ~1e4
    X = torch.tensor(rng.normal(size=(256, 8)) * scales, dtype=torch.float32)
    w = torch.tensor(rng.normal(size=(8, 2)), dtype=torch.float32)
    return X, X @ w + 0.01 * torch.randn(256, 2, generator=torch.Generator().manual_seed(seed))


def train(optimizer_factory, steps=60):
    torch.manual_seed(1)
    X, Y = ill_conditioned_problem()
    net = mlp(8, [], 2)
    optimizer = optimizer_factory(net)
    for _ in range(steps):
        if isinstance(optimizer, KFAC):  # d/d out of 0.5 |out - Y|^2 averaged over rows
            network_pass = net.train_forward(X)
            optimizer.backward_pass(network_pass, (network_pass.output - Y) / len(X))
            optimizer.step()
        else:
            loss = 0.5 * (net(X) - Y).pow(2).sum(1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return float(0.5 * (net(X) - Y).pow(2).sum(1).mean().detach())


def test_kfac_beats_sgd_on_an_ill_conditioned_regression():
    X, _ = ill_conditioned_problem()
    a = torch.cat([X, torch.ones(len(X), 1)], 1)
    lr_max = 1.0 / float(torch.linalg.eigvalsh(a.T @ a / len(X)).max())  # largest stable SGD step
    sgd = min(train(lambda net, lr=lr: torch.optim.SGD(net.parameters(), lr=lr)) for lr in (lr_max, 0.5 * lr_max))
    kfac = train(lambda net: KFAC(net, KFACParams(lr=0.5, damping=1e-3, momentum=0.0, kl_clip=1e3,
                                                   factor_every=1, inverse_every=1, stat_decay=0.0)))
    assert kfac < 0.1 * sgd, (kfac, sgd)


def test_inversions_are_split_across_ranks_by_cost():
    owners = assign_to_ranks([8, 1, 7, 2, 6, 3], 2)
    loads = [sum(c for c, o in zip([8, 1, 7, 2, 6, 3], owners) if o == r) for r in range(2)]
    assert sorted(loads) == [13, 14]
    assert assign_to_ranks([5, 5], 1) == [0, 0]


def test_kfac_rejects_networks_it_cannot_precondition():
    with pytest.raises(ValueError, match="nn.Linear layers only"):
        KFAC(nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2)), KFACParams())


def test_kfac_needs_the_networks_training_pass():
    """Its curvature comes from the hand-written pass; an autograd loss alone cannot give it."""
    net = mlp(3, [4], 2)
    optimizer = KFAC(net, KFACParams())
    with pytest.raises(RuntimeError, match="training pass"):
        optimizer.backward(net(torch.randn(5, 3)).pow(2).mean())
