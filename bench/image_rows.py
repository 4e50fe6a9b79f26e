"""One HTRPO iteration on goal-conditioned Ms. Pac-Man with the hindsight batch's frames shared
(her_mpi.cnn.FrameRows: each frame convolved once, its features indexed by the rows that use it)
against dense rows (every goal copy of a frame carried and convolved on its own, as before).

The same episodes and agent state in both modes: ``ms_pacman_goal_htrpo``'s per-rank iteration
(6 episodes of <= 26 steps, 16 hindsight goals; MEASURED_RECIPE pins the recipe's settings of the
committed result), one rank. Each mode runs in its own process so
that its peak RSS is its own; the learn() time is the median over ``--repeats`` iterations, each
from the same starting state. Also checks that both modes take the same step (the policies'
parameters after the first iteration agree to float rounding).

    python bench/image_rows.py [--repeats 3] [--episodes 6] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import time

import numpy as np
import torch

from common import measure_in_process, save

# The recipe as it was when bench/results/image_rows.json was measured (hindsight copies only, no entropy
# bonus); the recipe later added the episodes' own goals, which changes the row count. --set overrides these.
MEASURED_RECIPE = ["algo.original_goals=false", "algo.entropy_coef=0", "algo.entropy_weighting=surrogate"]


def measure(mode: str, n_episodes: int, repeats: int, overrides: list[str]) -> dict:
    from her_mpi.cnn import ImageGoalInput
    from her_mpi.config import load_config
    from her_mpi.envs import env_spec, make_env
    from her_mpi.rollout import RolloutWorker
    from her_mpi.trainer import build_agent

    if mode == "dense":  # every row carries its own copy of the frame, as before FrameRows
        ImageGoalInput.rows = lambda self, frames, index, goals: self(frames[index], goals)
    torch.manual_seed(0)
    config = load_config("ms_pacman_goal_htrpo", MEASURED_RECIPE + overrides)
    env = make_env(config.env, seed=0)
    agent = build_agent(config, env_spec(env, config.env.id), env, np.random.SeedSequence(0))
    worker = RolloutWorker(config.env, n_episodes, np.random.SeedSequence(1))
    episodes = worker.generate(lambda o, g: agent.act(o, g, explore=True), n_episodes)
    start, rng_start = copy.deepcopy(agent.state_dict()), copy.deepcopy(agent.rng_state())
    before = torch.cat([p.detach().flatten() for p in agent.policy_net.parameters()]).tolist()
    seconds, metrics, params = [], {}, None
    for _ in range(repeats):
        agent.load_state_dict(copy.deepcopy(start))
        agent.set_rng_state(copy.deepcopy(rng_start))  # hvp_subsample / critic minibatches draw from it
        began = time.perf_counter()
        metrics = agent.learn(episodes)
        seconds.append(time.perf_counter() - began)
        if params is None:
            params = torch.cat([p.detach().flatten() for p in agent.policy_net.parameters()]).tolist()
    return {"mode": mode, "learn_s": seconds, "learn_s_median": statistics.median(seconds),
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rows": metrics.get("rows"), "n_goals": metrics.get("n_goals"),
            "steps": int(episodes.lengths.sum()), "policy_before": before, "policy_after": params}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=6, help="episodes per iteration (the recipe's per rank)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--contended", action="store_true", help="record that other jobs shared the CPU")
    parser.add_argument("--mode", choices=["dense", "shared"], help=argparse.SUPPRESS)  # one measurement
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(measure(args.mode, args.episodes, args.repeats, args.overrides)))
        return
    options = ["--repeats", str(args.repeats), "--episodes", str(args.episodes)]
    options += [f"--set={item}" for item in args.overrides]
    results = {mode: measure_in_process(__file__, mode, options) for mode in ("dense", "shared")}
    dense, shared = (np.array(results[m].pop("policy_after")) for m in ("dense", "shared"))
    before = np.array(results["dense"].pop("policy_before"))
    results["shared"].pop("policy_before")
    save("image_rows", {
        "what": "one HTRPO learn() on ms_pacman_goal_htrpo's per-rank iteration, np=1: dense rows vs shared frames",
        "overrides": args.overrides, "episodes": args.episodes, "repeats": args.repeats, **results,
        "speedup": results["dense"]["learn_s_median"] / results["shared"]["learn_s_median"],
        "policy_max_abs_difference": float(np.abs(dense - shared).max()),
        "policy_max_abs_change": float(np.abs(dense - before).max()),  # step + normalizer rewrite
        "contended": "other training on the machine" if args.contended else "quiet"})


if __name__ == "__main__":
    main()
