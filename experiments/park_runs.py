"""Carry long runs from one session to the next through git.

    python experiments/park_runs.py park runs/sweeps/htrpo_push_discrete   # at a session's end, run stopped
    python experiments/park_runs.py unpark                                  # at the next session's start

A 2M-step row takes longer than a session here, and `runs/` (gitignored) may not survive to the next
one. `park` copies every run with a checkpoint under the given sweep directories (its small files and
checkpoints/latest.pt, a few MB for on-policy agents; no replay buffers are parked: park on-policy runs) to
experiments/parked/<path below runs/sweeps>; commit that. `unpark` copies them back where the sweep
expects them unless the run there is as far along already, so running the same `experiments/tables.sh`
or `her_mpi.sweep` command again resumes each run from its parked checkpoint (a run that finished
at an `EPOCHS=N` cap trains on when the command asks for more epochs). Stop the sweep
first (Ctrl-C or SIGTERM to the `her_mpi.sweep` process): it checkpoints before it exits.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collect_sweep import ROOT, copy_small_files  # noqa: E402  (a run's small files: the ones results keep)

sys.path.insert(1, str(ROOT))  # this checkout's her_mpi, installed or not
from her_mpi.checkpoint import replay_dir  # noqa: E402
from her_mpi.logger import read_progress  # noqa: E402

SWEEPS = ROOT / "runs" / "sweeps"
PARKED = ROOT / "experiments" / "parked"
CHECKPOINT = Path("checkpoints") / "latest.pt"


def run_key(run: Path) -> Path:
    """A run's path below runs/sweeps or experiments/parked: the same for a run and its parked copy."""
    for home in (SWEEPS, PARKED):
        if run.is_relative_to(home):
            return run.relative_to(home)
    return run


def epochs_done(run_dir: Path) -> int:
    return len(read_progress(run_dir))


def copy_run(source: Path, target: Path) -> None:
    copy_small_files(source, target)
    (target / CHECKPOINT).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source / CHECKPOINT, target / CHECKPOINT)


def runs_with_checkpoints(directory: Path) -> list[Path]:
    return sorted(p.parent.parent for p in directory.rglob(str(CHECKPOINT)))


def park(sweeps: list[Path]) -> int:
    for sweep in sweeps:
        sweep = sweep.resolve()
        if not sweep.is_relative_to(SWEEPS) or not sweep.is_dir():
            raise SystemExit(f"park_runs: {str(sweep)!r} is not a sweep directory under {SWEEPS}")
        runs = runs_with_checkpoints(sweep)
        if not runs:
            print(f"park_runs: no run with a checkpoint under {sweep}")
        for run in runs:
            target = PARKED / run_key(run)
            shutil.rmtree(target, ignore_errors=True)
            copy_run(run, target)
            print(f"parked {run.relative_to(ROOT)} at epoch {epochs_done(run)} -> {target.relative_to(ROOT)}")
            if replay_dir((run / CHECKPOINT).parent, rank=0).is_dir():  # off-policy: GBs, not for git
                print(f"park_runs: {run.relative_to(ROOT)} has replay buffers, which are not parked: resumed from "
                      f"experiments/parked alone it starts with empty buffers (an inexact resume; her_mpi warns)")
    return 0


def unpark() -> int:
    for parked in runs_with_checkpoints(PARKED):
        target = SWEEPS / run_key(parked)
        # a run killed inside its first epoch has a checkpoint but no progress row: compare checkpoints too
        if (target / CHECKPOINT).is_file() and epochs_done(target) >= epochs_done(parked):
            print(f"kept {target.relative_to(ROOT)} (epoch {epochs_done(target)}; parked: {epochs_done(parked)})")
            continue
        copy_run(parked, target)
        print(f"unparked {target.relative_to(ROOT)} at epoch {epochs_done(parked)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    park_parser = sub.add_parser("park", help="copy runs' latest checkpoints into experiments/parked")
    park_parser.add_argument("sweeps", nargs="+", type=Path, help="sweep directories under runs/sweeps")
    sub.add_parser("unpark", help="copy parked runs back to runs/sweeps")
    epochs_parser = sub.add_parser("epochs", help="print how many epochs a run directory holds (0 before its first)")
    epochs_parser.add_argument("run", type=Path)
    args = parser.parse_args(argv)
    if args.command == "epochs":
        print(epochs_done(args.run))
        return 0
    return park(args.sweeps) if args.command == "park" else unpark()


if __name__ == "__main__":
    sys.exit(main())
