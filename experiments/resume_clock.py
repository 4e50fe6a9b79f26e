"""Seconds per env step of one run resumed from its checkpoint under different settings, side by side.

    python experiments/resume_clock.py RUN_DIR --epochs 3 --variant recipe= \
        --variant rows8192=algo.critic_batch_size=8192 [--ranks 2 --name NAME]

A speed lever is best clocked where the long runs spend their time: late in training, from the
same state, one variant after the other on the same quiet cores. Each ``--variant LABEL=SET[,SET]``
copies RUN_DIR's small files and checkpoints/latest.pt as park_runs.py does (no replay buffer:
on-policy runs) to runs/bench/<name>/<label>, resumes it under mpirun for ``--epochs`` epochs with
those ``--set`` values, and reads the new progress rows: seconds per 1k env steps in all and per
phase (rollout, learn, evaluation). Every variant starts from the same checkpoint and random state,
so the first iteration's batch is the same; learning diverges after it, and so do episode lengths,
which is why seconds are per env step. The first resumed epoch is not counted: a run stopped mid-epoch
(SIGTERM) finishes that epoch, and its row carries the cycles done before the stop, under the run's
own settings. The copy trains, RUN_DIR is left as it was. Results:
experiments/results/<name>.json and .png.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, RESULTS, mpi_env, progress, save  # noqa: E402
from park_runs import CHECKPOINT, copy_run  # noqa: E402  (a run's small files and its checkpoint, no replay)

PHASES = ("time_rollout_s", "time_learn_s", "time_eval_s")


def variant(text: str) -> tuple[str, list[str]]:
    label, sep, sets = text.partition("=")
    items = [item for item in sets.split(",") if item]
    if not sep or not label or any("=" not in item for item in items):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected LABEL=SECTION.KEY=VALUE[,...] or LABEL=")
    return label, items


def clock(source: Path, target: Path, sets: list[str], epochs: int, ranks: int) -> dict:
    shutil.rmtree(target, ignore_errors=True)
    copy_run(source, target)
    done = len(progress(target))
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), sys.executable, "-m",
           "her_mpi.train", "--resume", str(target), "--set", f"train.n_epochs={done + epochs}",
           "--set", "train.max_env_steps=null", *[word for item in sets for word in ("--set", item)]]
    print("$", " ".join(cmd), flush=True)
    started = time.time()
    subprocess.run(cmd, check=True, env=mpi_env(), cwd=ROOT)
    wall = time.time() - started
    rows = progress(target)
    return {"overrides": sets, "mpirun_wall_s": round(wall, 1), **summarise(rows[done], rows[done + 1:])}


def summarise(before: dict, new: list[dict]) -> dict:
    """Seconds per 1k env steps over the progress rows ``new`` (epochs trained after the row ``before``)."""
    steps = new[-1]["env_steps"] - before["env_steps"]
    return {"from_env_steps": int(before["env_steps"]), "env_steps": int(steps), "epochs": len(new),
            "s_per_1k_steps": round(1000 * (new[-1]["time_s"] - before["time_s"]) / steps, 3),
            "phase_s_per_1k_steps": {phase: round(1000 * sum(r[phase] for r in new) / steps, 3) for phase in PHASES},
            "test_success_rate": [r["test_success_rate"] for r in new]}


def plot(name: str, results: dict) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = list(results)
    bottom = [0.0] * len(labels)
    for phase in PHASES:
        heights = [results[label]["phase_s_per_1k_steps"][phase] for label in labels]
        ax.bar(labels, heights, bottom=bottom, label=phase.removeprefix("time_").removesuffix("_s"))
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_ylabel("seconds per 1k env steps")
    ax.set_title(name)
    ax.legend()
    fig.tight_layout()
    png = RESULTS / f"{name}.png"
    fig.savefig(png, dpi=120)
    return png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory with checkpoints/latest.pt")
    parser.add_argument("--variant", type=variant, action="append", required=True,
                        help="LABEL=SECTION.KEY=VALUE[,SECTION.KEY=VALUE] (LABEL= for the run's own settings)")
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs to train each variant (the first is not counted: at least 2)")
    parser.add_argument("--ranks", type=int, default=2, help="mpirun -np")
    parser.add_argument("--name", default="resume_clock", help="results file stem in experiments/results/")
    args = parser.parse_args()
    if not (args.run / CHECKPOINT).is_file():
        parser.error(f"{args.run}: no {CHECKPOINT} to resume from")
    if args.epochs < 2 or args.ranks < 1:
        parser.error(f"--epochs {args.epochs}, --ranks {args.ranks}: expected epochs >= 2 (the first is not "
                     "counted) and ranks >= 1")
    results = {label: clock(args.run, ROOT / "runs" / "bench" / args.name / label, sets, args.epochs, args.ranks)
               for label, sets in args.variant}
    command = "python experiments/resume_clock.py " + " ".join(sys.argv[1:])
    save(args.name, {"run": str(args.run), "made_by": command, "variants": results})
    print(f"wrote {plot(args.name, results)}")


if __name__ == "__main__":
    main()
