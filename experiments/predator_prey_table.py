"""The predator-prey table of *Hindsight Experience Replay Accelerates Proximal Policy Optimization*:
PPO-HER against PPO (and SAC, SAC+HER where run) on the 12 conditions (interception distance x
arena size x dimensions), at equal env steps.

    experiments/tables.sh predator_prey            # the PPO rows (experiments/tables.sh predator_prey_sac: SAC rows)
    python experiments/predator_prey_table.py runs/sweeps/predator_prey

Copies the finished runs' small files to experiments/results/runs/predator_prey_12/ (keeping the runs
already there that the sweep directory does not have: the table is made over several sessions) and writes
experiments/results/predator_prey_12.{md,json,png}: per condition and algorithm, the median over seeds
of the final test success rate (the last evaluation, at the recipe's budget; in bold where best), every
seed's value, the median over seeds of the best evaluation on the way (peak: the max of ~20 evaluations of 100
episodes each, so biased up by ~2 binomial standard deviations, ~0.05 near 0.9),
the median wall-clock of a run, and which algorithm has the best median. The paper reports median
reward; here every episode ends with +1 (caught) or -1 (time-out), so mean reward = 2 x success - 1
and the ranking is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collect_sweep import RESULTS, copy_runs  # noqa: E402
from common import machine  # noqa: E402

from her_mpi.plot import find_runs  # noqa: E402

SHIFTED = "PPO-HER shifted goals"  # algo.shift_goals: hindsight copies that keep the prey's motion
CLIPPED = "PPO-HER shifted, clipped"  # ... and algo.clip_shifted_goals: those goals held inside the arena
ALGORITHMS = {"predator_prey_ppo_her": "PPO-HER", "predator_prey_ppo_her_shift": SHIFTED, "predator_prey_ppo": "PPO",
              "predator_prey_sac_her": "SAC+HER", "predator_prey_sac": "SAC"}
LABELS = ["PPO-HER", SHIFTED, CLIPPED, "PPO", "SAC+HER", "SAC"]  # the table's column order


def label(run) -> str | None:
    algo = ALGORITHMS.get((run.name or "").split(" ")[0])
    if algo in ("PPO-HER", SHIFTED) and run.config["algo"].get("shift_goals"):
        return CLIPPED if run.config["algo"].get("clip_shifted_goals") else SHIFTED
    return algo


def condition(config: dict) -> tuple[float, int, float]:
    kwargs = config["env"]["kwargs"]
    return float(kwargs["interception_distance"]), int(float(kwargs["arena_size"])), int(kwargs["dims"])


def summarise(runs) -> dict:
    cells: dict[tuple, dict[str, list]] = {}
    for run in runs:
        algo = label(run)
        if algo is None:
            continue
        cells.setdefault(condition(run.config), {}).setdefault(algo, []).append(run)
    rows = []
    for key in sorted(cells, key=lambda c: (-c[0], c[1], c[2])):  # easy to hard
        radius, size, dims = key
        row = {"interception_distance": radius, "arena_size": size, "dims": dims, "algorithms": {}}
        for algo, algo_runs in cells[key].items():
            finals = [float(r.column("test_success_rate")[-1]) for r in algo_runs]
            peaks = [float(np.max(r.column("test_success_rate"))) for r in algo_runs]
            row["algorithms"][algo] = {
                "median_final_success": float(np.median(finals)),
                # the best evaluation on the way: a policy that peaks early and declines shows here
                "median_peak_success": float(np.median(peaks)),
                "per_seed": {str(r.seed): f for r, f in zip(algo_runs, finals)},
                "env_steps": int(np.median([r.column("env_steps")[-1] for r in algo_runs])),
                "median_wall_clock_s": float(np.median([r.column("time_s")[-1] for r in algo_runs])),
                "runs": [os.path.relpath(r.path.resolve(), RESULTS.parent.parent) for r in algo_runs],
            }
        medians = {a: v["median_final_success"] for a, v in row["algorithms"].items()}
        best = max(medians.values())
        row["best"] = sorted(a for a, m in medians.items() if m == best)
        rows.append(row)
    return {"conditions": rows}


def markdown(summary: dict, algorithms: list[str]) -> str:
    head = "| interception distance | arena size | dims | " + " | ".join(
        f"{a}: median final success (seeds) | {a}: wall-clock" for a in algorithms) + " | best |"
    lines = [head, "|" + "---|" * (4 + 2 * len(algorithms))]
    for row in summary["conditions"]:
        cells = []
        for a in algorithms:
            v = row["algorithms"].get(a)
            if v is None:
                cells += ["not run", ""]
                continue
            seeds = ", ".join(f"{s}" for s in v["per_seed"].values())
            median = f"{v['median_final_success']:.2f}"
            if a in row["best"]:
                median = f"**{median}**"
            cells += [f"{median} ({seeds}); peak {v['median_peak_success']:.2f}",
                      f"{v['median_wall_clock_s'] / 60:.1f} min"]
        lines.append(f"| {row['interception_distance']} | {row['arena_size']} | {row['dims']} | "
                     + " | ".join(cells) + f" | {', '.join(row['best'])} |")
    wins = {a: sum(a in row["best"] and len(row["best"]) == 1 for row in summary["conditions"]) for a in algorithms}
    lines.append("")
    partial = sum(len(row["algorithms"]) < len(algorithms) for row in summary["conditions"])
    lines.append("Conditions with a sole best median: " + ", ".join(f"{a} {n}" for a, n in wins.items())
                 + f" (of {len(summary['conditions'])}; ties: "
                 + f"{sum(len(r['best']) > 1 for r in summary['conditions'])}"
                 + (f"; in {partial} the best is among the algorithms run there" if partial else "") + ").")
    return "\n".join(lines) + "\n"


def plot(summary: dict, algorithms: list[str], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["conditions"]
    x = np.arange(len(rows))
    width = 0.8 / max(len(algorithms), 1)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for i, algo in enumerate(algorithms):
        medians = [r["algorithms"].get(algo, {}).get("median_final_success", np.nan) for r in rows]
        ax.bar(x + (i - (len(algorithms) - 1) / 2) * width, medians, width, label=algo)
        for j, r in enumerate(rows):  # every seed as a dot over its bar
            seeds = list(r["algorithms"].get(algo, {}).get("per_seed", {}).values())
            ax.plot([x[j] + (i - (len(algorithms) - 1) / 2) * width] * len(seeds), seeds, "k.", markersize=3)
    ax.set_xticks(x, [f"R{r['interception_distance']}\nS{r['arena_size']}\nD{r['dims']}" for r in rows], fontsize=7)
    ax.set_ylabel("final test success (median over seeds; dots: seeds)")
    ax.set_ylim(0, 1.02)
    ax.set_title("Predator-prey, 12 conditions (R interception distance, S arena size, D dims), equal env steps")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="the sweep directory (experiments/tables.sh predator_prey writes "
                                                 "runs/sweeps/predator_prey)")
    parser.add_argument("--name", default="predator_prey_12", help="experiments/results/<name>.{md,json,png}")
    parser.add_argument("--with", dest="beside", type=Path, action="append", default=[],
                        help="also tabulate the runs kept in this directory (e.g. experiments/results/runs/predator_prey_12)")
    args = parser.parse_args()
    if not args.sweep.is_dir():
        parser.error(f"sweep directory {str(args.sweep)!r} does not exist")
    destination = RESULTS / "runs" / args.name
    # Runs of earlier sessions stay (runs/ may not survive a session; the table grows over several):
    # a run in the sweep directory replaces its copy, others are kept.
    copied = copy_runs(args.sweep, destination, finished_only=True)
    if not copied and not destination.is_dir():
        parser.error(f"no finished runs under {str(args.sweep)!r}")
    for directory in args.beside:
        if not directory.is_dir():
            parser.error(f"--with directory {str(directory)!r} does not exist")
    try:
        summary = summarise(find_runs([destination, *args.beside]))
    except ValueError as exc:  # a --with directory that holds no runs
        parser.error(str(exc))
    algorithms = [a for a in LABELS if any(a in r["algorithms"] for r in summary["conditions"])]
    table = markdown(summary, algorithms)
    print(table, end="")
    (RESULTS / f"{args.name}.md").write_text(table)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"machine": machine(), "ranks": 2, **summary}, indent=1))
    plot(summary, algorithms, RESULTS / f"{args.name}.png")
    print(f"copied {copied} finished run(s) to {destination}; wrote experiments/results/{args.name}.{{md,json,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
