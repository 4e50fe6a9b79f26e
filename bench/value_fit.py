"""One HTRPO iteration with its full-batch value fit taken whole against in pieces of
``her_mpi.algos.on_policy.VALUE_FIT_PIECE`` rows (the gradient summed over the pieces).

Whole, every layer's activations for all rows (tens of MB each on a Fetch batch) are allocated on
every pass above glibc's mmap threshold, so each pass maps fresh pages and faults them in: system
time. The same episodes and agent state in both modes: a recipe's per-rank iteration (by default
``fetch_slide_discrete_htrpo``'s 16 episodes, more with ``--episodes`` for a trained run's row
count), one rank; with ``--checkpoint`` a trained run's agent instead of a fresh one. Each mode runs
in its own process; the learn() and value-fit times are medians over ``--repeats`` iterations, each
from the same starting state, with the fit's user and system CPU seconds. Also checks that both
modes take the same step (the value networks' parameters after the first iteration agree to float
rounding).

    python bench/value_fit.py [--config fetch_slide_discrete_htrpo] [--episodes 16] [--repeats 3]
                              [--checkpoint RUN/checkpoints/latest.pt]
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import sys
import time

import numpy as np
import torch

from common import RESULTS, measure_in_process, save


def measure(mode: str, config_name: str, checkpoint: str | None, n_episodes: int, repeats: int) -> dict:
    import her_mpi.algos.on_policy as on_policy
    from her_mpi.checkpoint import load_checkpoint
    from her_mpi.config import config_from_dict, load_config
    from her_mpi.rollout import RolloutWorker
    from her_mpi.trainer import build_agent

    torch.set_num_threads(1)  # one rank's share of a 2-rank run on 2 CPUs
    if mode == "whole":
        on_policy.VALUE_FIT_PIECE = sys.maxsize
    state = load_checkpoint(checkpoint) if checkpoint else None
    config = config_from_dict(state["config"]) if state else load_config(config_name, [])
    worker = RolloutWorker(config.env, n_episodes, np.random.SeedSequence(12345))
    agent = build_agent(config, worker.spec, worker.envs[0], np.random.SeedSequence(1))
    if state:
        agent.load_state_dict(state["agent"])
    episodes = worker.generate(lambda o, g: agent.act(o, g, explore=True), n_episodes)
    start, rng_start = copy.deepcopy(agent.state_dict()), copy.deepcopy(agent.rng_state())

    fits = []
    fit = agent.fit_value

    def timed_fit(*args, **kwargs):
        before, began = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        loss = fit(*args, **kwargs)
        after = resource.getrusage(resource.RUSAGE_SELF)
        fits.append({"s": time.perf_counter() - began, "user_s": after.ru_utime - before.ru_utime,
                     "sys_s": after.ru_stime - before.ru_stime, "rows": len(args[0])})
        return loss

    agent.fit_value = timed_fit
    seconds, params, metrics = [], None, {}
    for _ in range(repeats):
        agent.load_state_dict(copy.deepcopy(start))
        agent.set_rng_state(copy.deepcopy(rng_start))
        began = time.perf_counter()
        metrics = agent.learn(episodes)
        seconds.append(time.perf_counter() - began)
        if params is None:
            params = torch.cat([p.detach().flatten() for p in agent.value_net.parameters()]).tolist()
    median = {key: statistics.median(f[key] for f in fits) for key in ("s", "user_s", "sys_s")}
    return {"mode": mode, "learn_s": seconds, "learn_s_median": statistics.median(seconds),
            "fit_s_median": median["s"], "fit_user_s_median": median["user_s"], "fit_sys_s_median": median["sys_s"],
            "fit_rows": fits[0]["rows"], "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "n_goals": metrics.get("n_goals"), "steps": int(episodes.lengths.sum()), "value_after": params}


def plot(result: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = ("whole", "pieces")
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    user = [result[m]["fit_user_s_median"] for m in modes]
    system = [result[m]["fit_sys_s_median"] for m in modes]
    ax.barh(modes, user, label="user")
    ax.barh(modes, system, left=user, label="system")
    ax.set_xlabel("CPU seconds per value fit (median)")
    source = f"{result['config']}'s" if not result["checkpoint"] else "a trained run's"
    ax.set_title(f"value fit of {source} iteration: {result['whole']['fit_rows']:,} rows, one rank", fontsize=10)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="fetch_slide_discrete_htrpo", help="an HTRPO or HPG recipe")
    parser.add_argument("--checkpoint", help="a trained run's checkpoint (its config and agent) instead")
    parser.add_argument("--episodes", type=int, default=16, help="episodes per iteration (the recipe's per rank)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="value_fit")
    parser.add_argument("--contended", action="store_true", help="record that other jobs shared the CPU")
    parser.add_argument("--mode", choices=["whole", "pieces"], help=argparse.SUPPRESS)  # one measurement
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(measure(args.mode, args.config, args.checkpoint, args.episodes, args.repeats)))
        return
    options = ["--config", args.config, "--episodes", str(args.episodes), "--repeats", str(args.repeats)]
    options += ["--checkpoint", args.checkpoint] if args.checkpoint else []
    results = {mode: measure_in_process(__file__, mode, options) for mode in ("whole", "pieces")}
    whole, pieces = (np.array(results[m].pop("value_after")) for m in ("whole", "pieces"))
    result = {"what": "one HTRPO learn() per mode, np=1: the full-batch value fit whole vs in pieces",
              "config": args.config, "checkpoint": args.checkpoint, "episodes": args.episodes,
              "repeats": args.repeats, **results,
              "fit_speedup": results["whole"]["fit_s_median"] / results["pieces"]["fit_s_median"],
              "learn_speedup": results["whole"]["learn_s_median"] / results["pieces"]["learn_s_median"],
              "value_max_abs_difference": float(np.abs(whole - pieces).max()),
              "contended": "other training on the machine" if args.contended else "quiet"}
    path = save(args.name, result)
    plot(result, RESULTS / f"{args.name}.png")
    print(f"{path}: value fit {results['whole']['fit_s_median']:.2f} s whole, {results['pieces']['fit_s_median']:.2f} s "
          f"in pieces ({result['fit_speedup']:.2f}x); learn {result['learn_speedup']:.2f}x; "
          f"value nets differ by {result['value_max_abs_difference']:.1e}")


if __name__ == "__main__":
    main()
