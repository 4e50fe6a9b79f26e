"""Measure final policies on episodes they never saw, and keep the numbers.

    python experiments/unseen_eval.py experiments/parked/ms_pacman experiments/parked/htrpo_push_discrete [--episodes 300 --seed 12345]

Every run directory with a checkpoints/latest.pt under the given paths is evaluated with
``python -m her_mpi.evaluate --checkpoint ... --episodes N --seed S`` (the deterministic policy;
test episodes during training use other seeds). The results, with each run's recipe, seed and
env steps trained, go to experiments/results/<name>.json and .md (``--name``, default unseen_eval);
a later call adds to or replaces rows in that file, keyed by the run's path below runs/sweeps or
experiments/parked, so a run measured before and after parking keeps one row.

"Never saw" means the episodes come from a seed stream training did not use (SeedSequence(seed)
here, SeedSequence(run seed, spawn_key=(rank, ...)) in training). Where the env is deterministic
and its goals a finite set (MsPacmanGoal-v0: 162 cells), that is no longer true, and
experiments/ms_pacman_goals.py gives the exact number instead: every goal once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine  # noqa: E402
from park_runs import CHECKPOINT, run_key, runs_with_checkpoints  # noqa: E402  (also puts this checkout's her_mpi first)

from her_mpi.config import ConfigError, load_config  # noqa: E402
from her_mpi.plot import sweep_label  # noqa: E402
from her_mpi.sweep import DESCRIPTION, FINISHED, Run, last_row  # noqa: E402


def run_dirs(paths: list[Path]) -> list[Path]:
    found = []
    for path in paths:
        if not path.is_dir():
            raise SystemExit(f"unseen_eval: {str(path)!r} is not a directory (expected a run or sweep directory)")
        runs = runs_with_checkpoints(path)
        if not runs:
            raise SystemExit(f"unseen_eval: no {CHECKPOINT} under {str(path)!r}")
        found += runs
    return found


def at_recipe_budget(run: Path, recipe: str | None) -> bool:
    """Finished at the recipe's own budget, not at a cap (``EPOCHS=63`` writes finished.json too)."""
    if recipe is None:  # nothing to compare against: trust finished.json
        return (run / FINISHED).is_file()
    try:
        train = load_config(recipe).train
    except ConfigError:  # a recipe no longer in configs/
        return (run / FINISHED).is_file()
    return Run(recipe, recipe, 0, run, train.n_epochs, train.max_env_steps).is_finished()


def run_facts(run: Path) -> dict:
    """What a results row says about the run it measured: path, recipe, seed, how far it trained."""
    sweep = json.loads((run / DESCRIPTION).read_text()) if (run / DESCRIPTION).is_file() else {}
    if not sweep and run.name.removeprefix("seed").isdigit():  # a run trained outside her_mpi.sweep in its layout
        key = run_key(run.resolve())  # TABLE/.../RECIPE/seedN below runs/sweeps or experiments/parked
        table = "/".join(key.parts[:-2]) if not key.is_absolute() else run.parent.parent.name
        sweep = {"recipe": run.parent.name, "seed": int(run.name.removeprefix("seed")),
                 "label": f"{run.parent.name} ({table})"}
    last = last_row(run)
    return {
        "run": str(run.resolve().relative_to(ROOT)) if run.resolve().is_relative_to(ROOT) else str(run),
        "recipe": sweep.get("recipe"), "seed": sweep.get("seed"),
        "label": sweep_label(run) or sweep.get("label"),  # the recipe and its --set values
        "env_steps_trained": int(float(last.get("env_steps", 0))),
        "last_test_success": float(last["test_success_rate"]) if last else None,
        "finished": at_recipe_budget(run, sweep.get("recipe")),
    }


def merge_rows(path: Path, rows: list[dict], sort_key) -> list[dict]:
    """Add ``rows`` to the results file at ``path`` (replacing rows of the same run); all rows, sorted."""
    kept = {run_key(ROOT / r["run"]): r for r in json.loads(path.read_text())["runs"]} if path.is_file() else {}
    kept.update((run_key(ROOT / r["run"]), r) for r in rows)
    merged = sorted(kept.values(), key=sort_key)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(), "runs": merged}, indent=2))
    return merged


def evaluate(run: Path, episodes: int, seed: int) -> dict:
    cmd = [sys.executable, "-m", "her_mpi.evaluate", "--checkpoint", str(run / CHECKPOINT),
           "--episodes", str(episodes), "--seed", str(seed)]
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    result = json.loads(out.strip().splitlines()[-1])
    return {
        **run_facts(run), "env_id": result["env_id"], "episodes": episodes, "eval_seed": seed,
        "success_rate": result["success_rate"], "reached_rate": result["reached_rate"],
        "mean_return": result["mean_return"],
        "mean_length": result["mean_length"],
        "command": f"python -m her_mpi.evaluate --checkpoint {run / CHECKPOINT} --episodes {episodes} --seed {seed}",
    }


def reached(row: dict) -> str:  # rows kept before reached_rate was recorded have none
    return f"{row['reached_rate']:.3f}" if row.get("reached_rate") is not None else "n/a"


def table(rows: list[dict]) -> str:
    lines = ["| recipe | seed | env | env steps trained | finished | last test (100 ep.) | unseen success | goal reached at any step | episodes, eval seed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.get('label') or r['recipe']} | {r['seed']} | {r['env_id']} | {r['env_steps_trained']:,} | "
                     f"{'yes' if r['finished'] else 'no'} | {r['last_test_success']} | **{r['success_rate']:.3f}** | "
                     f"{reached(r)} | "
                     f"{r['episodes']}, {r['eval_seed']} |")
    return "\n".join(lines)


def write_markdown(path: Path, rows: list[dict]) -> None:
    md = ["# Final policies on episodes they never saw", "",
          "`python experiments/unseen_eval.py <run or sweep dirs>`: the deterministic policy of each run's latest",
          "checkpoint, `python -m her_mpi.evaluate` with the episodes and seed shown; \"last test\" is the run's",
          "last evaluation during training (the recipe's test episodes, other seeds). MsPacmanGoal-v0 is deterministic with",
          "162 goals, so its episodes here are goals training drew too: `ms_pacman_goals.md` has its exact numbers.",
          "\"finished\" means trained to the recipe's budget; a run stopped at a cap (`EPOCHS=N`) says no.",
          "", table(rows), ""]
    path.write_text("\n".join(md))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run or sweep directories holding checkpoints/latest.pt")
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--name", default="unseen_eval", help="results file name in experiments/results")
    args = parser.parse_args()
    if args.episodes < 1:
        raise SystemExit(f"unseen_eval: --episodes must be >= 1, got {args.episodes}")
    runs = run_dirs(args.paths)
    path = RESULTS / f"{args.name}.json"
    measured = []
    for run in runs:
        row = evaluate(run, args.episodes, args.seed)
        measured.append(row)
        print(f"  {row['recipe']} seed {row['seed']}: {row['success_rate']:.3f} on {args.episodes} unseen episodes",
              flush=True)
    rows = merge_rows(path, measured, lambda r: (r["env_id"], str(r.get("label") or r["recipe"]), r["seed"] or 0))
    write_markdown(path.with_suffix(".md"), rows)
    print(table(rows))
    print(f"saved {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
