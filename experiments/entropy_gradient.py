"""How large an entropy bonus has to be to matter to an HTRPO step, measured on trained checkpoints.

    python experiments/entropy_gradient.py RUN_DIR [RUN_DIR ...] [--episodes 12 --batches 3 --name NAME]

HTRPO's step is the natural gradient F^-1 g of its objective, scaled to the trust region. With an
entropy bonus c * H the gradient is g_s + c * g_e (surrogate, entropy), so the bonus's share of
the step is set by the two gradients' sizes in the Fisher metric, |g|_F = sqrt(g . F^-1 g). This
script collects exploration episodes with each run's checkpoints/latest.pt (one process), builds
the hindsight batch as training does (the run's own settings: goals, weights, advantages), and
prints |g_s|_F, |g_e|_F (the entropy term with coefficient 1, weighted as ``--weighting`` says:
uniform, the plain mean the levers' bonus uses, by default), their ratio and their Fisher cosine;
c = |g_s|_F / |g_e|_F is the bonus at which the entropy's push equals the objective's. F is the
trust region's Fisher on the whole batch (training may estimate it on a subsample,
algo.hvp_subsample), damped as training damps it. Every batch starts from the checkpoint (learn()
would refit a critic). Results: experiments/results/<name>.json and .md.
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


def measure(run: Path, n_episodes: int, n_batches: int, weighting: str) -> dict:
    batches = []
    with htrpo_from_checkpoint(run, n_episodes, "entropy_gradient.py") as (state, config, agent, learn):
        # learn() builds the batch exactly as training does, then "steps": measures instead
        agent.policy_step = lambda batch: batches.append(agent.gradient_measures(batch, weighting)) or {}
        for _ in range(n_batches):
            learn()
    mean = {k: float(np.mean([b[k] for b in batches])) for k in batches[0]}
    ratios = [b["fisher_norm_surrogate"] / b["fisher_norm_entropy"] for b in batches]
    return {"run": str(run), "env_steps": int(state.get("env_steps", 0) or 0), "batches": n_batches,
            "episodes": n_episodes, "entropy_weighting": weighting,
            "entropy_coef": config.algo.entropy_coef, **mean,
            "balancing_coef": float(np.median(ratios)), "balancing_coef_range": [min(ratios), max(ratios)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run or sweep directories with checkpoints/latest.pt")
    parser.add_argument("--episodes", type=int, default=12, help="episodes per batch (training at np=2: 12)")
    parser.add_argument("--batches", type=int, default=3, help="batches measured per run (median ratio)")
    parser.add_argument("--weighting", choices=("uniform", "surrogate"), default="uniform",
                        help="the entropy term's row weights (algo.entropy_weighting's meanings)")
    parser.add_argument("--name", default="entropy_gradient", help="results file stem in experiments/results/")
    args = parser.parse_args()
    if args.episodes < 1 or args.batches < 1:
        parser.error(f"--episodes {args.episodes} and --batches {args.batches}: expected integers >= 1")
    rows = []
    for run in run_dirs(args.runs):
        row = measure(run, args.episodes, args.batches, args.weighting)
        print(f"{row['run']}: entropy {row['entropy']:.3f}, |g_s|_F {row['fisher_norm_surrogate']:.3g}, "
              f"|g_e|_F {row['fisher_norm_entropy']:.3g}, cosine {row['fisher_cosine']:+.2f}, "
              f"balancing coef {row['balancing_coef']:.3g} (range {row['balancing_coef_range'][0]:.3g}-"
              f"{row['balancing_coef_range'][1]:.3g})", flush=True)
        rows.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [f"Entropy term weighted `{args.weighting}`, coefficient 1.", "",
             "| run | env steps | entropy | Fisher norm surrogate | Fisher norm entropy (coef 1) | Fisher cosine |"
             " balancing coef (median, range) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['run']} | {r['env_steps']:,} | {r['entropy']:.3f} | {r['fisher_norm_surrogate']:.3g} | "
              f"{r['fisher_norm_entropy']:.3g} | {r['fisher_cosine']:+.2f} | {r['balancing_coef']:.3g} "
              f"({r['balancing_coef_range'][0]:.3g}-{r['balancing_coef_range'][1]:.3g}) |" for r in rows]
    (RESULTS / f"{args.name}.md").write_text(
        f"`python experiments/entropy_gradient.py {' '.join(sys.argv[1:])}`\n\n"
        + "\n".join(lines) + "\n")
    print(f"wrote {RESULTS / args.name}.json and .md")


if __name__ == "__main__":
    main()
