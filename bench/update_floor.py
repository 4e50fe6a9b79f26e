"""How close each off-policy update runs to the speed of its own matrix multiplies.

For every algorithm at its recipe's shapes (FetchPush: obs 25, goal 3, action 4, 3x256 ReLU,
batch 256; DQN: 10-bit flipping, one 256 layer, batch 128), one process, one torch thread:

* **update**: ``agent.update(batch)`` on batches sampled from a real replay buffer (random-policy
  episodes of the real env), exactly as ``learn()`` calls it;
* **floor**: exactly the matrix multiplies that update dispatched (every ``mm``/``addmm``/``bmm``/
  ``baddbmm``, recorded with a dispatch mode, forward and backward), replayed back to back as plain
  ``torch.mm`` on operands with the same shapes, strides and aliasing (a weight read by the forward
  and the backward is one tensor in the replay too, so the floor sees the same cache reuse);
* **ratio** update / floor. Target: <= 1.15 for every Adam update.

K-FAC rows compare the K-FAC update with the Adam update of the same algorithm, both averaged over
whole blocks of ``kfac.inverse_every`` updates (factors every ``factor_every``, inverses every
``inverse_every`` are part of its cost). Target: <= 1.2. In one process all inverses run on this
rank; under MPI they are split across ranks.

The two timings of a pair alternate in one process and the medians over many repetitions are
compared, so a background load slows both alike. Times are reported twice: thread CPU time (what
the update costs; robust to being descheduled on a shared machine) and wall time.

    python bench/update_floor.py [--algos ddpg td3 sac dqn ddpg+kfac td3+kfac] [--reps 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common import save

from her_mpi.config import load_config
from her_mpi.rollout import RolloutWorker
from her_mpi.trainer import build_agent

RECIPES = {"ddpg": "fetch_push_ddpg", "td3": "fetch_push_td3", "sac": "fetch_push_sac",
           "dqn": "bitflip_10_dqn", "ddpg+kfac": "fetch_push_ddpg_kfac", "td3+kfac": "fetch_push_td3_kfac"}

# aten matrix multiplies (any overload, e.g. ``out=``) and the positions of their two matrix operands
MATMULS = {torch.ops.aten.mm: (0, 1), torch.ops.aten.addmm: (1, 2),
           torch.ops.aten.bmm: (0, 1), torch.ops.aten.baddbmm: (1, 2)}


class MatmulRecorder(TorchDispatchMode):
    """Records (storage, shape, stride, offset) of both operands of every matrix multiply."""

    def __init__(self):
        super().__init__()
        self.operands: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in MATMULS:
            self.operands.append(tuple(_describe(args[i]) for i in MATMULS[func.overloadpacket]))
        return func(*args, **(kwargs or {}))


def _describe(tensor: torch.Tensor) -> tuple:
    storage = tensor.untyped_storage()
    return (storage.data_ptr(), storage.nbytes(), tuple(tensor.shape), tensor.stride(),
            tensor.storage_offset())


def floor_calls(operands: list[tuple]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The recorded multiplies as (A, B) pairs for ``torch.mm``; a batched one becomes one mm per
    batch entry. Operands that shared a storage share one here too."""
    storages, calls = {}, []
    generator = torch.Generator().manual_seed(0)
    for pair in operands:
        views = []
        for pointer, nbytes, shape, stride, offset in pair:
            if (pointer, nbytes) not in storages:
                storages[(pointer, nbytes)] = 0.1 * torch.randn(max(1, nbytes // 4), generator=generator)
            views.append(storages[(pointer, nbytes)].as_strided(shape, stride, offset))
        a, b = views
        calls += list(zip(a.unbind(0), b.unbind(0))) if a.dim() == 3 else [(a, b)]
    return calls


def run_floor(calls) -> None:
    mm = torch.mm
    for a, b in calls:
        mm(a, b)


def make_agent(algo_or_recipe: str, overrides: list[str] = ()):
    """The agent of a recipe (or of ``algo``'s recipe) and batches sampled from its replay buffer
    filled with random-policy episodes of the real env."""
    config = load_config(RECIPES.get(algo_or_recipe, algo_or_recipe), ["train.seed=0", *overrides])
    worker = RolloutWorker(config.env, 2, np.random.SeedSequence(1))
    agent = build_agent(config, worker.spec, worker.envs[0], np.random.SeedSequence(2))
    rng = np.random.default_rng(3)
    if worker.spec.discrete:
        policy = lambda obs, g: rng.integers(0, worker.spec.n_actions, (len(obs), 1))
    else:
        policy = lambda obs, g: rng.uniform(-1, 1, (len(obs), worker.spec.action_dim)).astype(np.float32)
    episodes = worker.generate(policy, 20)
    agent.buffer.store(episodes)
    agent.update_normalizers(episodes)
    batches = [agent.batch_tensors(agent.sample_batch()) for _ in range(16)]  # as learn() makes them
    return agent, batches


class Updates:
    """Calls ``agent.update`` on a cycle of pre-sampled batches, counting like ``learn()``."""

    def __init__(self, agent, batches):
        self.agent, self.batches, self.i = agent, batches, 0

    def __call__(self, n: int) -> None:
        for _ in range(n):
            self.agent.update(self.batches[self.i % len(self.batches)])
            self.agent.n_updates += 1
            self.i += 1


def timed(fn, *args) -> tuple[float, float]:
    """(thread CPU seconds, wall seconds) of one call."""
    cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
    fn(*args)
    return (time.thread_time_ns() - cpu) * 1e-9, (time.perf_counter_ns() - wall) * 1e-9


def measure_floor(algo: str, reps: int) -> dict:
    agent, batches = make_agent(algo)
    updates = Updates(agent, batches)
    block = 2  # TD3 updates its actor every second update: a block holds both kinds
    updates(20)  # warm-up (allocator, Adam state, first inverses)
    if updates.i % block:
        updates(1)
    recorder = MatmulRecorder()
    with recorder:
        updates(block)
    calls = floor_calls(recorder.operands)
    flops = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in calls) / block
    update_t, floor_t = [], []
    for _ in range(reps):
        update_t.append(timed(updates, block))
        floor_t.append(timed(run_floor, calls))
    row = {"matmuls_per_update": len(calls) / block, "mflop_per_update": round(flops / 1e6, 2)}
    for k, clock in enumerate(("cpu", "wall")):
        u = statistics.median(t[k] for t in update_t) / block * 1e3
        f = statistics.median(t[k] for t in floor_t) / block * 1e3
        row.update({f"update_ms_{clock}": round(u, 3), f"floor_ms_{clock}": round(f, 3),
                    f"ratio_{clock}": round(u / f, 3)})
    return row


def measure_kfac(algo: str, reps: int, overrides: list[str] = ()) -> dict:
    kfac, kfac_batches = make_agent(algo, overrides)  # e.g. algo.kfac.rank=32
    adam, adam_batches = make_agent(algo, ["algo.optimizer=adam"])
    block = kfac.params.kfac.inverse_every
    kfac_updates, adam_updates = Updates(kfac, kfac_batches), Updates(adam, adam_batches)
    kfac_updates(block)  # warm-up, and block-aligned: each block pays one inverse refresh
    adam_updates(block)
    # Both floors over a whole block: K-FAC's own multiplies (preconditioning, factors) bound
    # how close to Adam it can get.
    floors = []
    for updates in (kfac_updates, adam_updates):
        recorder = MatmulRecorder()
        with recorder:
            updates(block)
        floors.append(floor_calls(recorder.operands))
    kfac_t, adam_t, floor_t = [], [], []
    for _ in range(reps):
        kfac_t.append(timed(kfac_updates, block))
        adam_t.append(timed(adam_updates, block))
        floor_t.append((timed(run_floor, floors[0]), timed(run_floor, floors[1])))
    row = {"block_updates": block, "kfac_matmuls_per_update": len(floors[0]) / block,
           "adam_matmuls_per_update": len(floors[1]) / block}
    for k, clock in enumerate(("cpu", "wall")):
        u = statistics.median(t[k] for t in kfac_t) / block * 1e3
        a = statistics.median(t[k] for t in adam_t) / block * 1e3
        kf = statistics.median(t[0][k] for t in floor_t) / block * 1e3
        af = statistics.median(t[1][k] for t in floor_t) / block * 1e3
        row.update({f"kfac_ms_{clock}": round(u, 3), f"adam_ms_{clock}": round(a, 3),
                    f"ratio_{clock}": round(u / a, 3), f"kfac_floor_ms_{clock}": round(kf, 3),
                    f"adam_floor_ms_{clock}": round(af, 3), f"floor_ratio_{clock}": round(kf / af, 3)})
    return row


def standalone_update_ms(recipe: str, overrides: list[str], updates: int) -> dict:
    """Mean ms per update of ``updates`` consecutive updates (whole target/actor periods),
    alone in this process (no MPI, no sampling): what the learn phase is compared with."""
    agent, batches = make_agent(recipe, overrides)
    run = Updates(agent, batches)
    period = max(2, getattr(agent.params, "target_update_every", 0) or 1)
    run(period * 10)  # warm-up
    cpu, wall = timed(run, updates - updates % period)
    n = updates - updates % period
    return {"cpu_ms": 1e3 * cpu / n, "wall_ms": 1e3 * wall / n, "updates": n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--reps", type=int, default=60, help="timed pairs per algorithm (K-FAC: blocks)")
    parser.add_argument("--kfac-reps", type=int, default=5)
    parser.add_argument("--name", default="update_floor")
    parser.add_argument("--standalone", metavar="RECIPE", help="only print the standalone update time of RECIPE "
                        "as JSON (bench/epoch_time.py runs this beside its training)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="config override for --standalone and the K-FAC rows (e.g. algo.kfac.rank=32)")
    parser.add_argument("--updates", type=int, default=400, help="with --standalone")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the trainer: one thread per rank
    torch.set_flush_denormal(True)
    if args.standalone:
        print(json.dumps(standalone_update_ms(args.standalone, args.overrides, args.updates)))
        return

    floors, kfac = {}, {}
    for algo in args.algos:
        if "+kfac" in algo:
            kfac[algo] = measure_kfac(algo, args.kfac_reps, args.overrides)
        else:
            floors[algo] = measure_floor(algo, args.reps)
        print(algo, floors.get(algo) or kfac.get(algo), flush=True)

    print(f"\n{'update':10} {'update ms':>10} {'floor ms':>9} {'ratio':>6}   (thread CPU time; wall ratio)")
    for algo, r in floors.items():
        print(f"{algo:10} {r['update_ms_cpu']:10.2f} {r['floor_ms_cpu']:9.2f} {r['ratio_cpu']:6.2f}   "
              f"({r['ratio_wall']:.2f})")
    if kfac:
        print(f"\n{'K-FAC':10} {'update ms':>10} {'Adam ms':>9} {'ratio':>6}   (wall ratio)   floors: K-FAC/Adam")
    for algo, r in kfac.items():
        print(f"{algo:10} {r['kfac_ms_cpu']:10.2f} {r['adam_ms_cpu']:9.2f} {r['ratio_cpu']:6.2f}   "
              f"({r['ratio_wall']:.2f})          {r['kfac_floor_ms_cpu']:.2f}/{r['adam_floor_ms_cpu']:.2f} "
              f"= {r['floor_ratio_cpu']:.2f}")
    save(args.name, {"torch_threads": 1, "reps": args.reps, "overrides": args.overrides, "kfac_reps": args.kfac_reps,
                     "target_ratio": 1.15, "target_kfac_ratio": 1.2, "floor": floors, "kfac": kfac})


if __name__ == "__main__":
    main()
