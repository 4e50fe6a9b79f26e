"""Interleaved A/B timing of ``agent.update`` across code trees (e.g. a commit before and after a
change), robust to a shared, loaded machine.

One worker process per tree (``PYTHONPATH=<tree>``), each building the same recipe's agent and
batches as bench/update_floor.py. The parent hands a token round-robin (rotating which tree goes
first), so exactly one worker runs a block of updates at a time and every tree sees the same
background load over the run. Per block the worker reports thread CPU time and wall time of the
block's updates and of its floor (the matrix multiplies of two of its updates replayed as plain
``torch.mm``, as bench/update_floor.py does), so update/floor ratios of several trees come from one
run; the medians over blocks are compared.

    python bench/update_ab.py --trees /tmp/base /work/wt16 --algo ddpg [--blocks 40] [--updates 10]
    (make a tree of a commit with: git worktree add /tmp/base <commit>, or git archive)

A tree may carry its own config overrides, ``TREE@key=value,key=value`` (the same code with
different settings, e.g. ``. .@algo.kfac.factor_every=20``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1] + "/bench")
import torch
torch.set_num_threads(1)
torch.set_flush_denormal(True)
import update_floor as uf
recipe, updates, overrides = sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
agent, batches = uf.make_agent(recipe, overrides)
run = uf.Updates(agent, batches)
block = agent.params.kfac.inverse_every if hasattr(agent.params, "kfac") and getattr(agent.params, "optimizer", "") == "kfac" else updates
run(max(20, block) + (max(20, block) % 2))
recorder = uf.MatmulRecorder()  # the floor: this tree's multiplies over two updates (TD3's period)
with recorder:
    run(2)
calls = uf.floor_calls(recorder.operands)
print("ready", flush=True)
for line in sys.stdin:
    cpu, wall = uf.timed(run, block)
    floor_cpu, floor_wall = uf.timed(uf.run_floor, calls)
    print(json.dumps({"cpu_ms": 1e3 * cpu / block, "wall_ms": 1e3 * wall / block,
                      "floor_cpu_ms": 1e3 * floor_cpu / 2, "floor_wall_ms": 1e3 * floor_wall / 2}), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", required=True, help="code trees (the first is the baseline)")
    parser.add_argument("--algo", default="ddpg", help="an update_floor RECIPES key or a recipe name")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--updates", type=int, default=10, help="updates per block (K-FAC: inverse_every)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    workers = []
    for spec in args.trees:
        tree, _, own = spec.partition("@")
        tree = str(Path(tree).resolve())
        overrides = args.overrides + [o for o in own.split(",") if o]
        env = dict(os.environ, PYTHONPATH=f"{tree}:{tree}/export")
        workers.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, tree, args.algo, str(args.updates), json.dumps(overrides)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tree))
    for worker in workers:
        while worker.stdout.readline().strip() != "ready":
            if worker.poll() is not None:
                raise SystemExit("a worker failed")
    times = [[] for _ in workers]
    for b in range(args.blocks):
        order = list(range(len(workers)))
        order = order[b % len(order):] + order[:b % len(order)]
        for i in order:
            workers[i].stdin.write("go\n")
            workers[i].stdin.flush()
            times[i].append(json.loads(workers[i].stdout.readline()))
    for worker in workers:
        worker.stdin.close()
        worker.wait()
    base = statistics.median(t["cpu_ms"] for t in times[0])
    rows = []
    for tree, t in zip(args.trees, times):
        cpu = statistics.median(x["cpu_ms"] for x in t)
        wall = statistics.median(x["wall_ms"] for x in t)
        # per round, this tree's block over the first tree's block of the same round: the load
        # changes over minutes, a round takes seconds
        paired = sorted(x["cpu_ms"] / y["cpu_ms"] for x, y in zip(t, times[0]))
        q1, q3 = paired[len(paired) // 4], paired[(3 * len(paired)) // 4]
        floor = statistics.median(x["floor_cpu_ms"] for x in t)
        rows.append({"tree": tree, "cpu_ms": round(cpu, 3), "wall_ms": round(wall, 3), "cpu_vs_first": round(cpu / base, 3),
                     "paired_cpu_ratio_median": round(statistics.median(paired), 3),
                     "paired_cpu_ratio_iqr": [round(q1, 3), round(q3, 3)],
                     "floor_cpu_ms": round(floor, 3), "update_over_floor_cpu": round(cpu / floor, 3)})
        print(f"{args.algo:10} {tree:30} cpu {cpu:8.3f} ms/update  wall {wall:8.3f}  cpu/first {cpu / base:.3f}  "
              f"paired {statistics.median(paired):.3f} [{q1:.3f}, {q3:.3f}]  floor {floor:.3f}  update/floor {cpu / floor:.3f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
