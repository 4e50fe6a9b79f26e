"""The hand-written training passes (her_mpi/mlp.py) against plain autograd: the same outputs,
gradients and K-FAC curvature, and updates of every off-policy algorithm that end in the same
parameters as the same update written with autograd losses (the code before the hand-written
passes)."""

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import describe, run_python
from her_mpi.config import load_config
from her_mpi.envs import EnvSpec
from her_mpi.mlp import CriticEnsemble, mlp
from her_mpi.nets import FlatParameters
from her_mpi.optim.kfac import KFAC, KFACParams
from her_mpi.trainer import build_agent


def sequential_reference(network: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """The network as the nn.Sequential of Linear and activation modules it is built from."""
    return nn.Sequential.forward(network, x)


@pytest.mark.parametrize("activation", ["relu", "tanh", "elu"])
@pytest.mark.parametrize("output_activation", [None, nn.Tanh, nn.ReLU])
@pytest.mark.parametrize("norms", ["", "layer_norm", "layer_norm+last"])
def test_mlp_passes_match_autograd(activation, output_activation, norms):
    torch.manual_seed(0)
    net = mlp(7, [16, 16], 3, activation, output_activation, layer_norm="layer_norm" in norms, norm_last="last" in norms)
    assert sum(isinstance(m, nn.LayerNorm) for m in net) == {"": 0, "layer_norm": 2, "layer_norm+last": 3}[norms]
    FlatParameters(net)  # the optimizer's flat buffer: gradients are written into its views
    x = torch.randn(11, 7, requires_grad=True)
    output_grad = torch.randn(11, 3)
    params = list(net.parameters())
    reference = sequential_reference(net, x)
    expected = torch.autograd.grad(reference, [x, *params], output_grad)

    torch.testing.assert_close(net(x), reference)  # autograd forward
    with torch.no_grad():
        torch.testing.assert_close(net(x), reference)  # cached-weights forward
    network_pass = net.train_forward(x.detach())
    torch.testing.assert_close(network_pass.output, reference)
    input_grad = network_pass.backward(output_grad, inputs=True)
    torch.testing.assert_close(input_grad, expected[0])
    for p, g in zip(params, expected[1:]):
        torch.testing.assert_close(p.grad, g)
    frozen = net.train_forward(x.detach(), frozen=True)
    torch.testing.assert_close(frozen.input_gradient(output_grad), expected[0])
    with pytest.raises(RuntimeError, match="frozen"):
        frozen.backward(output_grad)


def test_the_public_overloads_stand_in_for_the_private_callables():
    # her_mpi.mlp calls ATen's private ``_op`` callables for speed; where a PyTorch release drops them
    # it falls back to the public overloads, which must compute exactly the same
    from her_mpi import mlp as passes

    class WithoutPrivateCallable:  # an overload of a release without ``_op``
        def __call__(self, *args, **kwargs):
            return "public"

    assert passes.direct_callable(WithoutPrivateCallable())() == "public"
    aten = torch.ops.aten
    g, y = torch.randn(64, 32), torch.randn(64, 32)
    cases = [(aten.threshold_backward.grad_input, (g, y.relu(), 0)), (aten.tanh_backward.grad_input, (g, y.tanh())),
             (aten.elu_backward.grad_input, (g, 1.0, 1, 1.0, True, F.elu(y)))]
    for overload, args in cases:
        fast, public = torch.empty_like(g), torch.empty_like(g)
        passes.direct_callable(overload)(*args, grad_input=fast)
        overload(*args, grad_input=public)
        assert torch.equal(fast, public), overload
    mean, rstd = y.mean(-1, keepdim=True), y.var(-1, keepdim=True, unbiased=False).add(1e-5).rsqrt()
    args = (g, y, y.shape[-1:], mean, rstd, None, None, [True, False, False])
    assert torch.equal(passes.direct_callable(aten.native_layer_norm_backward.default)(*args)[0],
                       aten.native_layer_norm_backward.default(*args)[0])


def test_mlp_autograd_forward_is_twice_differentiable():
    """On-policy algorithms take Hessian-vector products through these networks."""
    torch.manual_seed(0)
    net = mlp(3, [8], 2, activation="tanh", output_activation=nn.Tanh)
    reference = copy.deepcopy(net)
    x = torch.randn(5, 3)
    for network in (net, reference):
        forward = network if network is net else (lambda x: sequential_reference(reference, x))
        grads = torch.autograd.grad(forward(x).pow(2).sum(), list(network.parameters()), create_graph=True)
        hvp = torch.autograd.grad(sum(g.sum() for g in grads), list(network.parameters()))
        if network is net:
            ours = hvp
    for mine, theirs in zip(ours, hvp):
        torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("flat", [True, False], ids=["flat-buffer-views", "separate-tensors"])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_critic_ensemble_passes_match_its_members(flat, layer_norm):
    torch.manual_seed(1)
    critic = CriticEnsemble(9, [16, 16], 2, layer_norm=layer_norm)
    if flat:  # members back to back in one buffer: the stacks are strided views, not copies
        FlatParameters(critic)
    else:
        for p in critic.parameters():
            p.grad = torch.zeros_like(p)
    x = torch.randn(6, 9, requires_grad=True)
    output_grad = torch.randn(2, 6)
    params = list(critic.parameters())
    reference = torch.stack([sequential_reference(m, x).squeeze(-1) for m in critic.members])
    expected = torch.autograd.grad(reference, [x, *params], output_grad)

    torch.testing.assert_close(critic(x), reference)
    with torch.no_grad():
        torch.testing.assert_close(critic(x), reference)
    network_pass = critic.train_forward(x.detach())
    torch.testing.assert_close(network_pass.output.squeeze(-1), reference)
    torch.testing.assert_close(network_pass.backward(output_grad, inputs=True), expected[0])
    for p, g in zip(params, expected[1:]):
        torch.testing.assert_close(p.grad, g)
    stacked_weight = critic.layer_weights()[1][0]
    assert (stacked_weight.data_ptr() == critic.members[0].linears[1].weight.data_ptr()) == flat


def reference_factors(network: nn.Module, x: torch.Tensor, noise: torch.Tensor):
    """K-FAC's A and G by autograd: hooks on every nn.Linear, noise backpropagated from the output."""
    captured = []
    for module in network.modules():  # in place, ReLU would overwrite the captured outputs
        if isinstance(module, nn.ReLU):
            module.inplace = False
    hooks = [m.register_forward_hook(lambda m, i, o: captured.append((i[0].detach(), o)))
             for m in network.modules() if isinstance(m, nn.Linear)]
    if isinstance(network, CriticEnsemble):
        output = torch.stack([sequential_reference(m, x) for m in network.members])
    else:
        output = sequential_reference(network, x)
    for h in hooks:
        h.remove()
    grads = torch.autograd.grad(output, [o for _, o in captured], grad_outputs=noise.reshape(output.shape))
    factors = []
    for (a, _), g in zip(captured, grads):
        a = torch.cat([a, torch.ones(len(a), 1)], 1)
        factors.append((a.T @ a / len(a), g.T @ g / len(g)))
    return factors


@pytest.mark.parametrize("kind", ["actor", "critics"])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_kfac_factors_match_an_autograd_sampled_pass(kind, layer_norm):
    torch.manual_seed(2)
    network = mlp(6, [12, 12], 3, output_activation=nn.Tanh, layer_norm=layer_norm) if kind == "actor" \
        else CriticEnsemble(6, [12, 12], 2, layer_norm=layer_norm)
    params = KFACParams(stat_decay=0.0, factor_every=1, inverse_every=1)
    optimizer = KFAC(network, params, generator=torch.Generator().manual_seed(5))
    x = torch.randn(10, 6)
    noise = torch.randn((10, 3) if kind == "actor" else (2, 10, 1), generator=torch.Generator().manual_seed(5))
    expected = reference_factors(copy.deepcopy(network), x, noise)
    network_pass = network.train_forward(x)
    optimizer.backward_pass(network_pass, 2 * network_pass.output / network_pass.output.numel())
    optimizer.step()
    for layer, (A, G) in zip(optimizer.layers, expected):
        torch.testing.assert_close(layer.A, A)
        torch.testing.assert_close(layer.G, G)


# -- whole updates, against the same updates with autograd losses --------------------------------

SPECS = {
    "continuous": EnvSpec("FetchPush-v4", 25, 3, False, 4, 0, (-1.0,) * 4, (1.0,) * 4, 50, 0.04),
    "discrete": EnvSpec("BitFlipping-v0", 10, 10, True, 1, 10, (), (), 10, 0.0),
}


def small_agent(algo: str, hidden="[32,32]", *overrides):
    config = load_config(None, [f"algo={algo}", f"algo.hidden={hidden}", "train.batch_size=16", "replay.size=1000",
                                *overrides])
    spec = SPECS["discrete" if algo == "dqn" else "continuous"]
    return build_agent(config, spec, seed_sequence=np.random.SeedSequence(4)), spec


def synthetic_batch(spec, n, seed):
    rng = np.random.default_rng(seed)
    f = lambda *shape: torch.from_numpy(rng.normal(size=shape).astype(np.float32))
    actions = (torch.from_numpy(rng.integers(0, spec.n_actions, (n, 1))) if spec.discrete
               else torch.from_numpy(rng.uniform(-1, 1, (n, spec.action_dim)).astype(np.float32)))
    g = f(n, spec.goal_dim)
    batch = {"obs": f(n, spec.obs_dim), "obs_next": f(n, spec.obs_dim), "g": g, "g_next": g, "actions": actions,
             "rewards": -torch.from_numpy((rng.random(n) < 0.7).astype(np.float32)), "terminals": torch.zeros(n)}
    if spec.discrete:  # DQN with prioritized replay's importance weights
        batch["weights"] = torch.from_numpy(rng.uniform(0.2, 1.0, n).astype(np.float32))
    return batch


@pytest.mark.parametrize("algo, overrides", [("ddpg", ()), ("td3", ()), ("sac", ()), ("dqn", ()),
                                             ("ddpg", ("algo.layer_norm=true",)), ("td3", ("algo.layer_norm=true",)),
                                             ("sac", ("algo.layer_norm=true",)), ("dqn", ("algo.loss=mse",)),
                                             ("td3", ("algo.policy_delay=1",))])
def test_updates_end_where_autograd_updates_end(algo, overrides):
    """The default hand-derived updates (fast_updates) against the autograd updates the algorithm
    modules show: the same losses, TD errors and parameters after four updates."""
    ours, spec = small_agent(algo, "[32,32]", *overrides)
    reference, _ = small_agent(algo, "[32,32]", *overrides, "algo.fast_update=false")
    for step in range(4):
        batch = synthetic_batch(spec, 16, step)
        if algo != "dqn" and step % 2:  # prioritized replay's importance weights, for the critics too
            batch["weights"] = torch.linspace(0.2, 1.0, 16)
        our_metrics, our_td = ours.update(batch)
        their_metrics, their_td = reference.update(batch)
        torch.testing.assert_close(our_td, their_td, rtol=1e-4, atol=1e-5)
        for key in their_metrics:
            torch.testing.assert_close(our_metrics[key], their_metrics[key], rtol=1e-4, atol=1e-5, msg=key)
    theirs = reference.nets.state_dict()
    changed = 0
    for name, tensor in ours.nets.state_dict().items():
        if isinstance(tensor, torch.Tensor):
            torch.testing.assert_close(tensor, theirs[name], rtol=1e-4, atol=1e-5, msg=name)
    for name, module in ours.nets.items():
        fresh = small_agent(algo, "[32,32]", *overrides)[0].nets[name].state_dict()
        changed += any(isinstance(t, torch.Tensor) and not torch.equal(t, fresh[k]) for k, t in module.state_dict().items())
    assert changed >= (1 if algo == "dqn" else 2)  # the updates did move the trained networks


class MatmulCount(TorchDispatchMode):
    """Matrix multiplies dispatched (a batched one counts once per batch entry)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            self.count += 1
        elif func.overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.baddbmm):
            self.count += out.shape[0]
        return out


@pytest.mark.parametrize("algo, updates, expected", [("ddpg", 1, 28), ("td3", 2, 64)])
def test_updates_run_only_the_multiplies_they_need(algo, updates, expected):
    """L = 3 layers per network. DDPG: targets 2L, critic L forward + L weight + L-1 input
    gradients, actor L + critic L forward, critic L + actor L-1 input and actor L weight gradients:
    10L - 2. TD3 over two updates (actor once, two critics): 23L - 5."""
    agent, spec = small_agent(algo)
    counter = MatmulCount()
    with counter:
        for step in range(updates):
            agent.update(synthetic_batch(spec, 16, step))
    assert counter.count == expected


def test_synced_adam_steps_exactly_like_torch_adam():
    """SyncedAdam calls the fused Adam kernel itself after the first step; same bits as Adam.step."""
    from her_mpi.optim import SyncedAdam

    torch.manual_seed(3)
    ours, theirs = mlp(5, [8], 3), mlp(5, [8], 3)
    theirs.load_state_dict(ours.state_dict())
    synced = SyncedAdam(ours, lr=1e-3)
    reference = torch.optim.Adam(theirs.parameters(), lr=1e-3, fused=True)
    for step in range(5):
        x = torch.randn(7, 5, generator=torch.Generator().manual_seed(step))
        synced.minimize(ours(x).pow(2).mean())
        reference.zero_grad()
        theirs(x).pow(2).mean().backward()
        reference.step()
        for a, b in zip(ours.parameters(), theirs.parameters()):
            assert torch.equal(a, b), step
    state = synced.optimizer.state[synced.flat.param]
    assert float(state["step"]) == 5


@pytest.mark.parametrize("mode, momentum, rank", [("factored", 0.8, None), ("plain", 0.0, None), ("factored", 0.8, 1)])
def test_kfac_step_matches_the_explicit_natural_gradient_with_sgd_momentum(mode, momentum, rank):
    """K-FAC's step: the natural gradient from the Kronecker factors (via ``precondition``, checked
    against explicit Kronecker algebra in test_kfac.py), scaled by the KL clip, then torch SGD."""
    torch.manual_seed(4)
    net = mlp(5, [8], 3, output_activation=nn.Tanh)
    params = KFACParams(lr=0.05, damping=0.1, damping_mode=mode, momentum=momentum, kl_clip=1e-3,
                        factor_every=1, inverse_every=2, rank=rank)  # rank 1: low rank on factors of dim > 4
    optimizer = KFAC(net, params, generator=torch.Generator().manual_seed(0))
    reference_param = optimizer.flat.param.clone().requires_grad_()
    reference_sgd = torch.optim.SGD([reference_param], lr=params.lr, momentum=momentum)
    from her_mpi.optim.kfac import precondition
    for step in range(4):
        x = torch.randn(9, 5, generator=torch.Generator().manual_seed(step))
        network_pass = net.train_forward(x)
        optimizer.backward_pass(network_pass, network_pass.output / 9)
        gradient = optimizer.flat.grad.clone()
        optimizer.step()
        natural = []
        for layer in optimizer.layers:  # the preconditioners this step used
            w, b = layer.module.weight, layer.module.bias
            g = torch.cat([gradient[w.storage_offset(): w.storage_offset() + w.numel()].view_as(w),
                           gradient[b.storage_offset(): b.storage_offset() + b.numel()][:, None]], 1)
            v = precondition(g, layer.preconditioner, params.damping, mode)
            natural += [v[:, :-1].reshape(-1), v[:, -1]]
        natural = torch.cat(natural)
        nu = min(1.0, (params.kl_clip / abs(float(natural @ gradient) * params.lr ** 2)) ** 0.5)
        assert optimizer.last_nu == pytest.approx(nu, rel=1e-5)
        reference_param.grad = natural * nu
        reference_sgd.step()
        torch.testing.assert_close(optimizer.flat.param, reference_param.detach(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("terminal, timeout_reward", [(False, 0.0), (True, 0.0), (True, -1.0)])
def test_one_step_returns_equal_the_general_n_step_code_for_one_step(terminal, timeout_reward):
    """The one-step fast path of replay sampling gives exactly what the n-step code gives for n = 1:
    moving goals, relabelled and own goals, terminal steps, time-outs and short episodes."""
    from her_mpi.replay.buffer import EpisodeStore
    from her_mpi.rollout import Episodes

    rng = np.random.default_rng(0)
    n, T = 12, 6
    lengths = rng.integers(2, T + 1, n)
    lengths[:4] = T  # some episodes run out of time
    ag = rng.integers(0, 3, (n, T + 1, 2)).astype(np.float32)
    g = rng.integers(0, 3, (n, T + 1, 2)).astype(np.float32)  # goals that move
    episodes = Episodes(obs=rng.normal(size=(n, T + 1, 4)).astype(np.float32), ag=ag, g=g,
                        actions=rng.normal(size=(n, T, 2)).astype(np.float32), rewards=np.zeros((n, T), np.float32),
                        lengths=lengths, success=np.zeros(n))
    reached = lambda a, b: np.all(a == b, axis=-1)
    store = EpisodeStore.from_episodes(episodes, lambda a, b: reached(a, b).astype(np.float32) - 1.0,
                                       reached if terminal else None, timeout_reward=timeout_reward)
    episode, t = store.sample_indices(400, rng)
    goals, relabelled = store.hindsight_goals(episode, t, "future", 4, rng)
    assert 0 < relabelled.sum() < len(t)
    for mask in (relabelled, None):
        fast = store.returns(episode, t, goals, mask, 1, 0.9)
        general = store.n_step_returns(episode, t, goals, mask, 1, 0.9)
        assert fast.keys() == general.keys()
        for key in fast:
            assert fast[key].dtype == general[key].dtype and np.array_equal(fast[key], general[key]), key
    if terminal:
        assert general["terminals"].any()
    if timeout_reward:
        assert (general["rewards"] < -1).any()  # a time-out step paid the env's time-out reward


def test_large_tensors_are_reused_without_page_faults_once_the_trainer_tunes_malloc():
    """reuse_large_allocations (called by the Trainer): an update's large tensors, freed together,
    are handed back for the next update instead of being trimmed off the heap and faulted in again.
    Ten rounds of four 20 MB tensors: glibc's defaults usually re-fault every round (~204,000 minor
    faults; its dynamic mmap threshold already moves lone 20 MB blocks onto the heap, but it trims a
    free top of more than twice that); tuned, only the heap's first growth faults (0-2 blocks' worth,
    5,120 pages each, depending on the address-space layout)."""
    program = """
import json, resource, torch
from her_mpi.process_tuning import reuse_large_allocations
def faults_of_reallocating():
    [torch.ones(5 << 20) for _ in range(4)]  # four 20 MB float32 tensors alive at once, then freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        [torch.ones(5 << 20) for _ in range(4)]
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
untuned = faults_of_reallocating()
reuse_large_allocations()
print(json.dumps([untuned, faults_of_reallocating()]))
"""
    result = run_python(["-c", program])
    assert result.returncode == 0, describe(result)
    untuned, tuned = json.loads(result.stdout.strip().splitlines()[-1])
    # Without reuse, 10 rounds fault 204,800 pages; glibc's defaults usually come close (204,434) but
    # keep the blocks when something else lands above them on the heap (25,522 seen in a full run),
    # so only the tuned side is asserted: no more than the heap's first growth, one round's blocks.
    assert tuned <= 4 * 5120, (untuned, tuned)
