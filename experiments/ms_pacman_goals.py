"""MsPacmanGoal policies on every goal once: their exact success rate, and where they fail.

    python experiments/ms_pacman_goals.py experiments/parked/ms_pacman [--repeat 2 --name ms_pacman_goals]

MsPacmanGoal-v0's emulator is deterministic (no sticky actions, the same maze after every reset)
and its desired goal is drawn uniformly from a finite set (the 162 reachable cells other than
the start cell), so a deterministic policy's episode is a function of its goal alone. A sampled
evaluation (100 test episodes in training, ``experiments/unseen_eval.py``'s 300) therefore estimates,
with sampling noise, a number this script computes exactly: the mean success over all goals. It
also means no goal is "unseen" after training: training draws from the same 162.

Each run's checkpoints/latest.pt (under the given run or sweep directories) plays one episode per
goal (``goal_cells=[cell]``), ``--repeat`` times with different env seeds to check the outcome
does not vary. Results: experiments/results/<name>.json and .md (rows keyed by run path, later calls
add) and .png (each policy's per-goal outcome on the maze's 14x19 grid).
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS  # noqa: E402
from park_runs import CHECKPOINT  # noqa: E402
from unseen_eval import merge_rows, run_dirs, run_facts  # noqa: E402  (also puts this checkout's her_mpi first)

from her_mpi.envs.ms_pacman import GRID, REACHABLE, cell_distances  # noqa: E402
from her_mpi.evaluate import env_config_from_training, load_policy  # noqa: E402
from her_mpi.rollout import RolloutWorker  # noqa: E402
from her_mpi.settings import EnvConfig  # noqa: E402

ENV_ID = "MsPacmanGoal-v0"
DISTANCE_BANDS = ((1, 5), (6, 10), (11, 15), (16, 21))  # fewest steps to the goal (horizon 26)


def start_cell(cfg: EnvConfig) -> tuple[int, int]:
    worker = RolloutWorker(cfg, 1, np.random.SeedSequence(0))
    try:
        observation, _ = worker.envs[0].reset()
    finally:
        worker.close()
    row, col = observation["achieved_goal"]
    return int(row), int(col)


def by_distance(outcome: np.ndarray, distance: np.ndarray) -> list[dict]:
    """Success over the goals whose ghost-free shortest path takes each band's number of steps."""
    bands = []
    for low, high in DISTANCE_BANDS:
        cells = ~np.isnan(outcome) & (distance >= low) & (distance <= high)
        bands.append({"steps": f"{low}-{high}", "goals": int(cells.sum()),
                      "success_rate": float(outcome[cells].mean()) if cells.any() else None})
    return bands


def outcome_grid(per_goal: list[list]) -> np.ndarray:
    """A results row's per-goal outcomes (JSON: None off the goal cells) as a float grid with NaN there."""
    return np.array([[np.nan if v is None else v for v in row] for row in per_goal], float)


def by_region(per_goal: list[list]) -> list[tuple[str, float, int]]:
    """(region, success, goals) for the maze's halves, its top rows and its outer columns: where a policy fails."""
    outcome = outcome_grid(per_goal)
    rows, cols = np.indices(outcome.shape)
    centre = outcome.shape[1] // 2
    regions = {"left half": cols < centre, "right half": cols > centre, "top 5 rows": rows < 5,
               "outer 2 columns": (cols < 2) | (cols >= outcome.shape[1] - 2)}
    result = []
    for name, mask in regions.items():
        cells = mask & ~np.isnan(outcome)
        result.append((name, float(outcome[cells].mean()), int(cells.sum())))
    return result


def play_every_goal(run: Path, repeat: int, distance: np.ndarray) -> dict:
    act, training_config, description, _ = load_policy(
        types.SimpleNamespace(policy=None, checkpoint=str(run / CHECKPOINT)))
    cfg = env_config_from_training(training_config)
    if cfg.id != ENV_ID:
        raise SystemExit(f"ms_pacman_goals: {run} was trained on {cfg.id!r}, expected {ENV_ID}")
    start = start_cell(cfg)
    goals = [(int(r), int(c)) for r, c in np.argwhere(REACHABLE) if (r, c) != start]
    outcome = np.full(GRID, np.nan)  # per-goal success (NaN: not a goal)
    lengths, varied = [], []
    for row, col in goals:
        results = []
        for trial in range(repeat):
            worker = RolloutWorker(env_config_from_training(training_config, goal_cells=[[row, col]]), 1,
                                   np.random.SeedSequence([row, col, trial]))
            try:
                episode = worker.generate(act, 1, env_units=True)
            finally:
                worker.close()
            results.append(float(episode.success[0]))
            lengths.append(int(episode.lengths[0]))
        outcome[row, col] = results[0]
        if len(set(results)) > 1:
            varied.append([row, col])
    solved = [g for g in goals if outcome[g] == 1.0]
    print(f"  {description}: {len(solved)} of {len(goals)} goals ({len(solved) / len(goals):.3f}); "
          f"outcome varied on {len(varied)}", flush=True)
    return {
        **run_facts(run), "goals": len(goals), "solved": len(solved), "success_rate": len(solved) / len(goals),
        "repeat": repeat, "goals_with_varying_outcome": varied, "mean_length": float(np.mean(lengths)),
        "by_distance": by_distance(outcome, distance),
        "start_cell": list(start), "per_goal": [[None if np.isnan(v) else v for v in row] for row in outcome],
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.6), squeeze=False)
    colours = ListedColormap(["#d62728", "#2ca02c"])
    for ax, row in zip(axes[0], rows):
        grid = outcome_grid(row["per_goal"])
        ax.set_facecolor("#444444")  # walls and unreachable cells
        ax.imshow(np.ma.masked_invalid(grid), cmap=colours, vmin=0, vmax=1)
        ax.plot(row["start_cell"][1], row["start_cell"][0], "w*", markersize=10)
        ax.set_title(f"{row.get('label') or row['recipe']} seed {row['seed']}\n{row['solved']}/{row['goals']} goals "
                     f"({row['success_rate']:.3f})", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("MsPacmanGoal: each goal cell once (green solved, red not, star: start)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep directories holding checkpoints/latest.pt")
    parser.add_argument("--repeat", type=int, default=2, help="episodes per goal, different env seeds (default 2)")
    parser.add_argument("--name", default="ms_pacman_goals", help="results file name in experiments/results")
    args = parser.parse_args()
    if args.repeat < 1:
        raise SystemExit(f"ms_pacman_goals: --repeat must be >= 1, got {args.repeat}")
    path = RESULTS / f"{args.name}.json"
    distance = cell_distances()
    played = [play_every_goal(run, args.repeat, distance) for run in run_dirs(args.paths)]
    rows = merge_rows(path, played, lambda r: (str(r.get("label") or r["recipe"]), r["seed"] or 0))
    lines = ["# MsPacmanGoal: every goal once", "",
             "`python experiments/ms_pacman_goals.py <run or sweep dirs>`: each run's latest checkpoint, deterministic,",
             "one episode per goal cell (repeated with other env seeds to check the outcome does not vary).",
             "This is the exact success over the env's uniform goal distribution; sampled evaluations estimate it.", "",
             "Success by the goal's distance: the fewest steps a ghost-free path takes (`cell_distances()`; horizon 26).", "",
             "| recipe | seed | env steps trained | last test (100 sampled ep.) | goals solved | success | "
             + " | ".join(f"{low}-{high} steps" for low, high in DISTANCE_BANDS) + " | varied |",
             "|---|---|---|---|---|---|" + "---|" * len(DISTANCE_BANDS) + "---|"]
    for r in rows:
        bands = " | ".join(f"{b['success_rate']:.2f} ({b['goals']})" for b in r["by_distance"])
        lines.append(f"| {r.get('label') or r['recipe']} | {r['seed']} | {r['env_steps_trained']:,} | {r['last_test_success']} | "
                     f"{r['solved']} / {r['goals']} | **{r['success_rate']:.3f}** | {bands} | "
                     f"{len(r['goals_with_varying_outcome'])} of {r['goals']} ({r['repeat']} runs each) |")
    regions = [by_region(r["per_goal"]) for r in rows]
    names = [name for name, _, _ in regions[0]]
    lines += ["", "Success by region of the maze (goals in brackets; the halves leave out the centre column).", "",
              "| recipe | seed | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for r, row_regions in zip(rows, regions):
        cells = " | ".join(f"{rate:.2f} ({n})" for _, rate, n in row_regions)
        lines.append(f"| {r.get('label') or r['recipe']} | {r['seed']} | {cells} |")
    path.with_suffix(".md").write_text("\n".join(lines + [""]))
    plot(rows, path.with_suffix(".png"))
    print("\n".join(lines[6:]))
    print(f"saved {path}, .md and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
