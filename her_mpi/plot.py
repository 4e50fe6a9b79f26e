"""``python -m her_mpi.plot RUN_DIR [RUN_DIR ...] [--output success.png]``: test success vs env
steps (all ranks) for one or more runs, labelled by env, algorithm and rank count."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import yaml


def read_run(run_dir: Path) -> tuple[str, list[float], list[float], list[float]]:
    progress = run_dir / "progress.csv"
    if not progress.is_file():
        raise SystemExit(f"her_mpi.plot: {str(run_dir)!r} has no progress.csv (not a her_mpi run directory)")
    with open(progress, newline="") as f:
        rows = list(csv.DictReader(f))
    label = run_dir.name
    config_path = run_dir / "config.yaml"
    if config_path.is_file():
        config = yaml.safe_load(config_path.read_text())
        algo = config.get("algo", {})
        name = algo.get("name", "?") + ("+kfac" if algo.get("optimizer") == "kfac" else "")
        ranks = rows[-1]["n_ranks"] if rows else "?"
        label = f"{config['env']['id']} {name} (np={ranks})"
    steps = [float(r["env_steps"]) for r in rows]
    success = [float(r["test_success_rate"]) for r in rows]
    seconds_per_epoch = [float(r["time_s"]) for r in rows]
    return label, steps, success, seconds_per_epoch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m her_mpi.plot", description=__doc__)
    parser.add_argument("runs", nargs="+", help="run directories (each with progress.csv)")
    parser.add_argument("--output", "-o", default="success.png", help="PNG file to write")
    parser.add_argument("--title", default="Test success rate")
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in args.runs:
        label, steps, success, _ = read_run(Path(run))
        ax.plot(steps, success, marker="o", markersize=3, label=label)
    ax.set_xlabel("environment steps (all ranks)")
    ax.set_ylabel("test success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(args.title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
