"""Does another version of the code learn the same? The learn phase of two code trees, side by side.

Both trees build the same off-policy agent from the same seeds (each rank its own), and learn()
from the same random-policy episodes of the real env (each rank its own slice, one cycle's worth
per call), under mpirun; then the per-cycle metrics and the final parameters are compared. Equal
code gives equal numbers; a change that only reorders floating-point sums agrees to ~4 digits for
the first cycles and drifts slowly after; a change in what is learnt differs from the first cycle.
It covers storing, relabelling, sampling, normalizers, the update and its gradient averaging; not
the rollouts (the episodes are fixed) nor evaluation.

    python bench/learn_ab.py --trees OLD_TREE NEW_TREE [--config fetch_push_td3] [--cycles 8] [--np 2]

A tree is a checkout or ``git archive`` of the project (e.g. ``git worktree add /tmp/old <commit>``);
a recipe name is looked up as ``configs/<name>.yaml`` in each tree, so older trees that only take
paths work too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import mpi_env

EPISODES_PER_CYCLE = 2  # per rank: the baselines schedule's rollouts_per_rank

# Runs inside each tree (its her_mpi on PYTHONPATH): argv = recipe episodes.npz out.npz cycles
WORKER = r'''
import json, sys
import numpy as np, torch
from her_mpi import mpi
from her_mpi.config import load_config
from her_mpi.rollout import RolloutWorker
from her_mpi.trainer import build_agent
try:
    from her_mpi.episodes import Episodes
except ImportError:  # older trees
    from her_mpi.rollout import Episodes
recipe, episodes_path, out, cycles = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(1)
torch.set_flush_denormal(True)
config = load_config(recipe, [f"train.rollouts_per_rank={EPISODES}"])
rank, size = mpi.rank(), mpi.size()
worker = RolloutWorker(config.env, 1, np.random.SeedSequence(123))
agent = build_agent(config, worker.spec, worker.envs[0], np.random.SeedSequence([7, rank]))
agent.broadcast_parameters()
data = np.load(episodes_path)
rows = []
for cycle in range(cycles):
    first = (cycle * size + rank) * EPISODES
    part = Episodes(*(data[f][first:first + EPISODES] for f in Episodes.__dataclass_fields__))
    rows.append({k: v for k, v in agent.learn(part).items() if not k.startswith("learn_")})
if rank == 0:
    np.savez(out, **{k: v.detach().numpy() for k, v in agent.nets.state_dict().items() if isinstance(v, torch.Tensor)})
    with open(out + ".json", "w") as f:
        json.dump(rows, f)
'''.replace("EPISODES", str(EPISODES_PER_CYCLE))


def recipe_in(tree: Path, recipe: str) -> str:
    path = tree / "configs" / f"{recipe}.yaml"
    return str(path) if path.exists() else recipe


def make_episodes(tree: Path, recipe: str, n: int, path: Path) -> None:
    """n random-policy episodes of the recipe's env, made with ``tree``'s rollout code."""
    code = f'''
import numpy as np
from her_mpi.config import load_config
from her_mpi.rollout import RolloutWorker
config = load_config({recipe_in(tree, recipe)!r})
worker = RolloutWorker(config.env, {EPISODES_PER_CYCLE}, np.random.SeedSequence(5))
rng = np.random.default_rng(0)
spec = worker.spec
act = lambda o, g: rng.uniform(-1, 1, (len(o), spec.action_dim)).astype(np.float32)
parts = [worker.generate(act) for _ in range({n // EPISODES_PER_CYCLE})]
fields = type(parts[0]).__dataclass_fields__
np.savez({str(path)!r}, **{{f: np.concatenate([getattr(p, f) for p in parts]) for f in fields}})
'''
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tree, env={**mpi_env(), "PYTHONPATH": str(tree)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs=2, type=Path, required=True, metavar=("A", "B"))
    parser.add_argument("--config", default="fetch_push_td3", help="a continuous off-policy recipe")
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--np", type=int, default=2, dest="n_ranks")
    args = parser.parse_args()
    args.trees = [tree.resolve() for tree in args.trees]
    for tree in args.trees:
        if not (tree / "her_mpi").is_dir():
            parser.error(f"--trees: {tree} has no her_mpi package; expected a checkout of this project")
    if args.cycles < 1 or args.n_ranks < 1:
        parser.error(f"--cycles {args.cycles} and --np {args.n_ranks}: expected integers >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_episodes(args.trees[0], args.config, args.cycles * args.n_ranks * EPISODES_PER_CYCLE, tmp / "episodes.npz")
        (tmp / "worker.py").write_text(WORKER)
        results = []
        for k, tree in enumerate(args.trees):
            out = str(tmp / f"tree{k}.npz")
            cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(args.n_ranks), "-x", f"PYTHONPATH={tree}",
                   sys.executable, str(tmp / "worker.py"), recipe_in(tree, args.config), str(tmp / "episodes.npz"),
                   out, str(args.cycles)]
            subprocess.run(cmd, check=True, cwd=tree, env=mpi_env())
            results.append((json.loads(Path(out + ".json").read_text()), dict(np.load(out))))
    (rows_a, params_a), (rows_b, params_b) = results
    print(f"{args.config}, {args.n_ranks} rank(s), {args.cycles} cycles; A = {args.trees[0]}, B = {args.trees[1]}")
    for cycle, (a, b) in enumerate(zip(rows_a, rows_b)):
        worst = max(abs(a[k] - b[k]) / max(abs(a[k]), 1e-8) for k in a if k in b)
        print(f"cycle {cycle}: " + ", ".join(f"{k} {a[k]:.5g} | {b[k]:.5g}" for k in a if k in b)
              + f"  (largest relative difference {worst:.1e})")
    common = [k for k in params_a if k in params_b and params_a[k].shape == params_b[k].shape]
    difference = max(float(np.abs(params_a[k] - params_b[k]).max()) for k in common)
    print(f"parameters: {len(common)} tensors in both, largest absolute difference {difference:.2e}")


if __name__ == "__main__":
    main()
