"""Whether HTRPO's clip of the per-decision log importance ratios changes the weights, on trained checkpoints.

    python experiments/log_ratio_clip.py RUN_DIR [RUN_DIR ...] [--episodes 64 --batches 1 --caps 5 2 1 --name NAME]

HTRPO weights a hindsight copy's step t by rho_t = prod_{k<=t} pi(a_k|s_k,g')/pi(a_k|s_k,g); the code
clips log rho_t to +-algo.max_log_ratio (20: against overflow; the authors' code does not). For each run this
collects exploration episodes with checkpoints/latest.pt (one process), builds the hindsight batch
as training does, and reports how many live hindsight rows sit beyond the clip on either side, the
cumulative log-ratio's quantiles, and the hindsight weights with and without the clip: their
effective sample size and the relative L1 change; with --caps, the effective sample size the
weights would have at smaller clips (truncated importance weights). Results: experiments/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS  # noqa: E402
from htrpo_batches import htrpo_from_checkpoint  # noqa: E402
from unseen_eval import run_dirs  # noqa: E402  (also puts this checkout's her_mpi first)


def effective_sample_size(h: np.ndarray) -> float:
    return float(h.sum() ** 2 / max(float((h.astype(np.float64) ** 2).sum()), 1e-300))


def batch_measures(weights, params, data, copy, t, log_ratio, n_original, n_goals,
                   caps=()) -> tuple[np.ndarray, dict]:
    """The clipped weights training uses, how they differ from unclipped ones, and their ESS at other caps."""
    limit = params.max_log_ratio

    def weights_at(cap: float) -> np.ndarray:  # the weights at another clip; the run's own restored after
        params.max_log_ratio = cap
        try:
            return weights(data, copy, t, log_ratio, n_original, n_goals)
        finally:
            params.max_log_ratio = limit

    clipped = weights(data, copy, t, log_ratio, n_original, n_goals)
    unclipped = weights_at(np.inf)
    hindsight = copy >= n_original
    grid = np.zeros(data.mask.shape)
    grid[copy, t] = log_ratio
    cumulative = np.cumsum(grid[n_original:], axis=1)[data.mask[n_original:].astype(bool)]
    return clipped, {
        "rows": int(cumulative.size), "above_clip": float((cumulative > limit).mean()),
        "below_clip": float((cumulative < -limit).mean()),
        "log_ratio_quantiles": {q: float(np.percentile(cumulative, q)) for q in (1, 50, 99)},
        "log_ratio_max": float(cumulative.max()), "step_log_ratio_abs_mean": float(np.abs(log_ratio[hindsight]).mean()),
        "ess_clipped": effective_sample_size(clipped[hindsight]),
        "ess_unclipped": effective_sample_size(unclipped[hindsight]),
        "ess_at_cap": {str(cap): effective_sample_size(weights_at(cap)[hindsight]) for cap in caps},
        "weights_l1_change": float(np.abs(clipped[hindsight] - unclipped[hindsight]).sum()
                                   / max(float(unclipped[hindsight].sum()), 1e-300))}


def measure(run: Path, n_episodes: int, n_batches: int, caps=()) -> dict:
    batches = []
    with htrpo_from_checkpoint(run, n_episodes, "log_ratio_clip.py") as (state, config, agent, learn):
        weights = agent.importance_weights

        def recorded(*args, **kwargs):
            clipped, measures = batch_measures(weights, agent.params, *args, **kwargs, caps=caps)
            batches.append(measures)
            return clipped

        agent.importance_weights = recorded
        agent.policy_step = lambda batch: {}  # measure the batch, take no step
        for _ in range(n_batches):
            learn()
    return {"run": str(run), "env_steps": int(state.get("env_steps", 0) or 0), "episodes": n_episodes,
            "max_log_ratio": agent.params.max_log_ratio, "batches": batches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run or sweep directories with checkpoints/latest.pt")
    parser.add_argument("--episodes", type=int, default=64, help="episodes per batch (one 3,200-step iteration: 64)")
    parser.add_argument("--batches", type=int, default=1, help="batches measured per run")
    parser.add_argument("--caps", type=float, nargs="*", default=[],
                        help="also report the hindsight weights' effective sample size at these clips of log rho_t")
    parser.add_argument("--name", default="htrpo_log_ratio_clip", help="results file stem in experiments/results/")
    args = parser.parse_args()
    if args.episodes < 1 or args.batches < 1:
        parser.error(f"--episodes {args.episodes} and --batches {args.batches}: expected integers >= 1")
    if any(cap <= 0 for cap in args.caps):
        parser.error(f"--caps {args.caps}: expected numbers > 0")
    rows = [measure(run, args.episodes, args.batches, tuple(args.caps)) for run in run_dirs(args.runs)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| run | env steps | live hindsight rows | beyond +clip | beyond -clip | log rho 1% / 50% / 99% / max |"
             " mean abs log ratio per step | ESS clipped / unclipped | weights' relative L1 change |"
             + "".join(f" ESS at ±{cap:g} |" for cap in args.caps),
             "|---|---|---|---|---|---|---|---|---|" + "---|" * len(args.caps)]
    for row in rows:
        for b in row["batches"]:
            q = b["log_ratio_quantiles"]
            lines.append(f"| {row['run']} | {row['env_steps']:,} | {b['rows']:,} | {b['above_clip']:.2%} | "
                         f"{b['below_clip']:.2%} | {q[1]:.1f} / {q[50]:.1f} / {q[99]:.1f} / {b['log_ratio_max']:.1f} | "
                         f"{b['step_log_ratio_abs_mean']:.2f} | {b['ess_clipped']:,.0f} / {b['ess_unclipped']:,.0f} | "
                         f"{b['weights_l1_change']:.1e} |"
                         + "".join(f" {b['ess_at_cap'][str(cap)]:,.0f} |" for cap in args.caps))
    text = f"`python experiments/log_ratio_clip.py {' '.join(sys.argv[1:])}`\n\n" + "\n".join(lines) + "\n"
    (RESULTS / f"{args.name}.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
