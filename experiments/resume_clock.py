"""Seconds per env step of one run resumed from its checkpoint under different settings, side by side.

    python experiments/resume_clock.py RUN_DIR --epochs 3 --variant recipe= \
        --variant rows8192=algo.critic_batch_size=8192 [--ranks N --name NAME]

A speed lever is best clocked where the long runs spend their time: late in training, from the
same state, one variant after the other on the same otherwise idle machine. Each
``--variant LABEL=SECTION.KEY=VALUE[,...]`` copies RUN_DIR's small files and checkpoints/latest.pt
as park_runs.py does (no replay buffer: on-policy runs) to runs/bench/<name>/<label>, resumes the
copy under mpirun for ``--epochs`` epochs with those ``--set`` values, and reads its new progress
rows: seconds per 1k env steps in all and per phase (rollout, learn, evaluation). Episode lengths
differ between variants as learning does, which is why seconds are per env step. The first resumed
epoch is not counted: a run stopped mid-epoch (SIGTERM) finishes that epoch, and its row carries
the cycles done before the stop, under the run's own settings. RUN_DIR is left as it was. A variant
whose job fails is recorded as failed and the others still run. Results:
experiments/results/<name>.json and .png.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, RESULTS, mpi_env, progress, save, train_command  # noqa: E402
from park_runs import CHECKPOINT, copy_run  # noqa: E402  (a run's small files and its checkpoint, no replay)

PHASES = ("time_rollout_s", "time_learn_s", "time_eval_s")
NAME = re.compile(r"[\w-]+")  # labels and names become directories: no '/' or '..'
OVERRIDE = re.compile(r"\w+(\.\w+)+=.*")


def variant(text: str) -> tuple[str, list[str]]:
    """LABEL=SECTION.KEY=VALUE[,SECTION.KEY=VALUE...]; a comma inside a value (``algo.hidden=[256,256]``) stays."""
    label, sep, sets = text.partition("=")
    items = [item for item in re.split(r",(?=\w+(?:\.\w+)+=)", sets) if item]
    if not sep or not NAME.fullmatch(label) or not all(OVERRIDE.fullmatch(item) for item in items):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected LABEL=SECTION.KEY=VALUE[,...] or LABEL= "
                                         "(LABEL: letters, digits, '_' or '-')")
    return label, items


def resumed_rows(rows: list[dict], done: int, epochs: int) -> tuple[dict, list[dict]]:
    """The row the clock starts from (the first resumed epoch's) and the rows it counts."""
    if len(rows) != done + epochs:
        raise RuntimeError(f"expected {done + epochs} progress rows after training {epochs} epochs on {done}, "
                           f"found {len(rows)}")
    return rows[done], rows[done + 1:]


def summarise(before: dict, new: list[dict]) -> dict:
    """Seconds per 1k env steps over the progress rows ``new`` (epochs trained after the row ``before``)."""
    steps = new[-1]["env_steps"] - before["env_steps"]
    return {"from_env_steps": int(before["env_steps"]), "env_steps": int(steps), "epochs": len(new),
            "s_per_1k_steps": round(1000 * (new[-1]["time_s"] - before["time_s"]) / steps, 3),
            "phase_s_per_1k_steps": {phase: round(1000 * sum(r[phase] for r in new) / steps, 3) for phase in PHASES},
            "test_success_rate": [r["test_success_rate"] for r in new]}


def clock(source: Path, target: Path, sets: list[str], epochs: int, ranks: int) -> dict:
    shutil.rmtree(target, ignore_errors=True)
    copy_run(source, target)
    done = len(progress(target))
    cmd = train_command(ranks, ["--resume", str(target)],
                        [f"train.n_epochs={done + epochs}", "train.max_env_steps=null", "train.stop_success=null", *sets],
                        mpirun_options=["--bind-to", "none"])
    print("$", shlex.join(cmd), flush=True)
    started = time.time()
    job = subprocess.run(cmd, env=mpi_env(), cwd=ROOT)
    result = {"overrides": sets, "mpirun_wall_s": round(time.time() - started, 1)}
    if job.returncode != 0:
        return {**result, "failed": f"mpirun exited {job.returncode}"}
    return {**result, **summarise(*resumed_rows(progress(target), done, epochs))}


def plot(name: str, results: dict) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [label for label in results if "failed" not in results[label]]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory with checkpoints/latest.pt")
    parser.add_argument("--variant", type=variant, action="append", required=True,
                        help="LABEL=SECTION.KEY=VALUE[,SECTION.KEY=VALUE] (LABEL= for the run's own settings)")
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs to train each variant (the first is not counted: at least 2)")
    parser.add_argument("--ranks", type=int, help="mpirun -np (default: the run's own, which keeps its random streams)")
    parser.add_argument("--name", default="resume_clock", help="results file stem in experiments/results/")
    args = parser.parse_args()
    if not (args.run / CHECKPOINT).is_file():
        parser.error(f"{args.run}: no {CHECKPOINT} to resume from")
    labels = [label for label, _ in args.variant]
    if len(set(labels)) != len(labels) or not NAME.fullmatch(args.name):
        parser.error(f"--variant labels {labels}, --name {args.name!r}: expected distinct labels and a name of "
                     "letters, digits, '_' or '-'")
    ranks = args.ranks or int(progress(args.run)[-1]["n_ranks"])
    if args.epochs < 2 or ranks < 1:
        parser.error(f"--epochs {args.epochs}, --ranks {ranks}: expected epochs >= 2 (the first is not counted) "
                     "and ranks >= 1")
    bench = ROOT / "runs" / "bench" / args.name
    if args.run.resolve().is_relative_to(bench.resolve()):
        parser.error(f"{args.run} is inside {bench}, which this clock overwrites: copy it elsewhere first")
    results = {label: clock(args.run, bench / label, sets, args.epochs, ranks) for label, sets in args.variant}
    command = shlex.join(["python", "experiments/resume_clock.py", *sys.argv[1:]])
    save(args.name, {"run": str(args.run), "ranks": ranks, "made_by": command, "variants": results})
    print(f"wrote {plot(args.name, results)}")
    failed = [label for label, result in results.items() if "failed" in result]
    if failed:
        print(f"resume_clock: {', '.join(failed)} failed (see the mpirun output above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
