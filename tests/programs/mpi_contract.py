"""Run under mpirun (or alone): exercise the MPI contract, rank 0 prints one JSON line.

    mpirun -np 2 python tests/programs/mpi_contract.py RUN_DIR [ALGO [RECIPE]]
"""

import json
import sys

import numpy as np
import torch
from torch import nn

import her_mpi.trainer as trainer_module
from her_mpi import mpi, registry
from her_mpi.algos.base import OffPolicyAgent
from her_mpi.config import load_config
from her_mpi.normalizer import Normalizer
from her_mpi.optim import SyncedAdam


def count_allreduces_per_update(agent, batch_size=16) -> list[int]:
    """How many gradient Allreduces each of a few updates starts."""
    counts, original = [], mpi.start_allreduce_mean_
    calls = []
    mpi.start_allreduce_mean_ = lambda array: calls.append(array.size) or original(array)
    try:
        for _ in range(4):
            calls.clear()
            batch = agent.buffer.sample(batch_size, "future", 4, agent.rng)
            agent.update(agent.batch_tensors(batch))
            counts.append(len(calls))
    finally:
        mpi.start_allreduce_mean_ = original
    return counts


def gradient_is_the_mean_over_ranks() -> float:
    """Max |averaged gradient - mean of the ranks' local gradients| for a small network."""
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    optimizer = SyncedAdam(net, lr=1e-3)
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(100 + mpi.rank()))
    loss = net(x).pow(2).mean()
    local = torch.autograd.grad(loss, list(net.parameters()), retain_graph=True)
    local = torch.cat([g.reshape(-1) for g in local]).numpy()
    everyone = np.stack(mpi.allgather_object(local))
    optimizer.backward(loss)
    mpi.finish_allreduce_mean_(optimizer._pending, optimizer.flat.grad.numpy())
    return float(np.abs(optimizer.flat.grad.numpy() - everyone.mean(0)).max())


def normalizer_matches_union() -> float:
    rng = np.random.default_rng(mpi.rank())
    data = rng.normal(mpi.rank() * 3.0, 1.0 + mpi.rank(), (50 + 17 * mpi.rank(), 4))
    norm = Normalizer(4, eps=1e-4)
    norm.observe(data)
    norm.sync()
    union = np.concatenate(mpi.allgather_object(data))
    error = max(np.abs(norm.mean.numpy() - union.mean(0)).max(),
                np.abs(norm.std.numpy() - union.std(0)).max())
    return float(error)


def main(run_dir: str, algo: str = "ddpg", recipe: str | None = None) -> None:
    # e.g. td3+kfac, td3+kfac-false (no split preconditioning), td3+kfac-rank16 (low-rank factors)
    algo, _, optimizer = algo.partition("+")
    kfac = ["algo.optimizer=kfac", "algo.kfac.factor_every=1", "algo.kfac.inverse_every=2"] if optimizer else []
    variant = optimizer.split("-", 1)[1] if optimizer.startswith("kfac-") else None
    if variant and variant.startswith("rank"):
        kfac.append(f"algo.kfac.rank={variant[4:]}")
    elif variant:
        kfac.append(f"algo.kfac.split_preconditioning={variant}")
    # the off-policy schedule's keys only where they are read (on-policy algorithms refuse them)
    off_policy = ["train.n_batches=4", "train.batch_size=64", "train.sync_check_every=1"] \
        if issubclass(registry.algorithm_class(algo), OffPolicyAgent) else []
    config = load_config(recipe, [f"algo={algo}", *kfac, "train.n_epochs=1", "train.n_cycles=3", "train.rollouts_per_rank=2",
                                *off_policy, "train.n_test_episodes=6", "log.tensorboard=false"]
                         + (["replay.prioritized=true"] if algo == "dqn" else []))
    recorded = {}
    evaluate = trainer_module.evaluate

    def recording_evaluate(agent, worker, n):
        episodes = evaluate(agent, worker, n)
        episodes.success[: 1 + mpi.rank()] = 1.0  # ranks report different rates to average
        recorded.update(success=float(episodes.success.mean()), first_goal=episodes.g[0, 0].tolist())
        return episodes

    trainer_module.evaluate = recording_evaluate
    trainer = trainer_module.Trainer(config, run_dir)
    with torch.no_grad():  # make ranks differ so the initial broadcast has something to fix
        for p in trainer.agent.nets.parameters():
            p.add_(float(mpi.rank()))
    row = trainer.run()
    digests = mpi.allgather_object(mpi.digest(trainer.agent.synced_arrays()))
    if hasattr(trainer.agent, "buffer"):
        allreduces = count_allreduces_per_update(trainer.agent)
    else:  # on-policy: one more iteration on fresh episodes
        allreduces = []
        trainer.agent.learn(trainer.worker.generate(lambda o, g: trainer.agent.act(o, g, True),
                                                    config.train.rollouts_per_rank))
    digests_after = mpi.allgather_object(mpi.digest(trainer.agent.synced_arrays()))
    gradient_error = gradient_is_the_mean_over_ranks()
    normalizer_error = normalizer_matches_union()
    per_rank = mpi.allgather_object(recorded)
    if mpi.is_root():
        print("RESULT " + json.dumps({
            "size": mpi.size(),
            "identical_after_training": all(d == digests[0] for d in digests),
            "identical_after_more_updates": all(d == digests_after[0] for d in digests_after),
            "n_synced_arrays": len(digests[0]),
            "allreduces_per_update": allreduces,
            "gradient_error": gradient_error,
            "normalizer_error": normalizer_error,
            "rank_success": [r["success"] for r in per_rank],
            "rank_first_goal": [r["first_goal"] for r in per_rank],
            "logged_test_success": row["test_success_rate"],
            "env_steps": row["env_steps"], "env_steps_per_rank": row["env_steps_per_rank"],
        }), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
