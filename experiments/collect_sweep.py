"""Keep a sweep's raw results in the repository and aggregate them.

    python experiments/collect_sweep.py runs/sweeps/push300k --name fetch_push_300k [--title ...] [--at 300k] [--spans 100k,200k]
        [--recipe NAME] [--seed S]

Copies every run's progress.csv, config.yaml, provenance.yaml, sweep.json and finished.json (small files; no checkpoints)
from the sweep directory to experiments/results/runs/<name>/<recipe>/seed<s>/, then writes the
aggregate curves and table with ``python -m her_mpi.plot``: experiments/results/<name>.png, .md and
.json, the md and json ending with the command that made them (so a results file says how to re-make
it). Runs still going are included with the epochs they have; run it again as they finish.
A run stored earlier whose run directory is gone from the sweep (runs/ did not survive a session, or
the run was parked) is kept as stored, and said so (unfinished ones only without ``--finished-only``);
``--drop-missing`` removes it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(ROOT))  # this checkout's her_mpi, installed or not (the aggregation runs it with -m too)
from her_mpi.plot import parse_span_edges  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
KEPT = ("progress.csv", "config.yaml", "provenance.yaml", "finished.json", "resumes.yaml", "sweep.json")


def selected(run: Path, recipes: set[str] | None, seeds: set[int] | None) -> bool:
    """Whether a run at <recipe>/seed<s> (relative to its sweep) is among the recipes and seeds asked for."""
    recipe, seed_dir = run.parts[0], run.parts[-1]
    if recipes and recipe not in recipes:
        return False
    return not seeds or (seed_dir.startswith("seed") and seed_dir[4:].isdigit() and int(seed_dir[4:]) in seeds)


def copy_small_files(run: Path, target: Path) -> None:
    """Copy a run's KEPT files (those it has) to target, creating it."""
    target.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        if (run / name).is_file():
            shutil.copy2(run / name, target / name)


def copy_runs(sweep: Path, destination: Path, finished_only: bool = False, recipes: set[str] | None = None,
              seeds: set[int] | None = None) -> int:
    copied = 0
    for progress in sorted(sweep.rglob("progress.csv")):
        run = progress.parent
        if finished_only and not (run / "finished.json").is_file():
            continue
        if not selected(run.relative_to(sweep), recipes, seeds):
            continue
        copy_small_files(run, destination / run.relative_to(sweep))
        copied += 1
    return copied


def refresh(destination: Path, sweeps: list[Path], finished_only: bool, drop_missing: bool = False,
            recipes: set[str] | None = None, seeds: set[int] | None = None) -> int:
    """Replace destination's stored runs with the sweeps' runs, keeping those whose source is gone.

    A stored run whose directory is gone (runs/ lost with a session, or the run parked) is kept as
    stored: finished ones always, unfinished ones unless finished_only.

    The new tree is written beside the old one and swapped in at the end, so a collect stopped part-way
    leaves the stored runs as they were.
    """
    staging, retired = (destination.with_name(f".{destination.name}.{part}") for part in ("new", "old"))
    if retired.is_dir() and not destination.exists():  # a collect stopped between the two renames below
        retired.rename(destination)
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(retired, ignore_errors=True)
    copied = sum(copy_runs(sweep, staging / sweep.name, finished_only, recipes, seeds) for sweep in sweeps)
    kept = 0
    if not drop_missing and destination.is_dir():
        by_sweep = {sweep.name: sweep for sweep in sweeps}
        for progress in sorted(destination.rglob("progress.csv")):
            stored = progress.parent.relative_to(destination)
            sweep = by_sweep.get(stored.parts[0])
            finished = (progress.parent / "finished.json").is_file()
            if (finished_only and not finished) or not selected(Path(*stored.parts[1:]), recipes, seeds):
                continue
            if sweep is not None and not (sweep / Path(*stored.parts[1:]) / "progress.csv").is_file():
                copy_small_files(progress.parent, staging / stored)
                kept += 1
                state = "finished" if finished else "unfinished (parked?)"
                print(f"kept {stored}: {state}, stored earlier, no longer under its sweep directory (--drop-missing removes it)")
        unnamed = sorted(child.name for child in destination.iterdir() if child.is_dir() and child.name not in by_sweep)
        for name in unnamed:  # a table gathered from several sweep directories loses the ones not named again
            print(f"dropped {name}/: stored earlier from a sweep directory not named this time (name it to keep its runs)")
    staging.mkdir(parents=True, exist_ok=True)
    if destination.exists():  # runs left out this time must not linger: the old tree goes whole
        destination.rename(retired)
    staging.rename(destination)
    shutil.rmtree(retired, ignore_errors=True)
    return copied + kept


def this_command(argv: list[str]) -> str:
    """The collect command as typed from the project root: paths inside the checkout made relative to it."""
    def relative(word: str) -> str:
        path = Path(word)
        if path.is_absolute() and path.resolve().is_relative_to(ROOT):
            return str(path.resolve().relative_to(ROOT))
        return word
    return shlex.join(["python", "experiments/collect_sweep.py", *map(relative, argv)])


def record_command(name: str, command: str) -> None:
    """Note ``command`` in results/<name>.json (``made_by``) and as the last line of results/<name>.md."""
    data = RESULTS / f"{name}.json"
    table = json.loads(data.read_text())
    table["made_by"] = command
    data.write_text(json.dumps(table, indent=1))
    markdown = RESULTS / f"{name}.md"
    markdown.write_text(markdown.read_text().rstrip("\n") + f"\n\nMade by `{command}`.\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep directories (python -m her_mpi.sweep --out)")
    parser.add_argument("--name", required=True, help="results name: experiments/results/<name>.{png,md,json}")
    parser.add_argument("--title", default=None)
    parser.add_argument("--finished-only", action="store_true",
                        help="only runs that reached their budget (a run still at 20k would cut its recipe's curve there)")
    parser.add_argument("--at", action="append", default=[], metavar="STEPS",
                        help="also report the IQM at this many env steps (python -m her_mpi.plot --at; repeatable)")
    parser.add_argument("--spans", metavar="EDGES", type=parse_span_edges, default=(),
                        help="also report each seed's success averaged over spans split at these env steps "
                             "(python -m her_mpi.plot --spans, e.g. 250k,500k,1M)")
    parser.add_argument("--drop-missing", action="store_true",
                        help="also drop finished runs stored earlier whose run directory is gone from the sweep")
    parser.add_argument("--recipe", action="append", default=[], metavar="NAME",
                        help="only these recipes' runs (the directory below the sweep: a sweep shared by several "
                             "tables; repeatable)")
    parser.add_argument("--seed", action="append", default=[], type=int, metavar="S",
                        help="only these seeds' runs (e.g. the held-out seeds, leaving out the one a recipe was "
                             "screened on; repeatable)")
    args = parser.parse_args()
    destination = RESULTS / "runs" / args.name
    for sweep in (sweep for sweep in args.sweeps if not sweep.is_dir()):
        if not (destination / sweep.name).is_dir():
            parser.error(f"{str(sweep)!r}: expected a sweep directory (python -m her_mpi.sweep --out), or one whose "
                         f"runs are stored in {(destination / sweep.name).relative_to(ROOT)}")
        print(f"{sweep} is gone: keeping the runs stored from it")  # runs/ did not survive a session
    recipes = set(args.recipe)
    present = {run.parent.relative_to(sweep).parts[0] for sweep in args.sweeps for run in sweep.rglob("progress.csv")}
    if recipes - present:
        parser.error(f"--recipe {sorted(recipes - present)}: no such runs under the sweeps; they hold {sorted(present)}")
    seeds = set(args.seed)
    present_seeds = {run.parent.name for sweep in args.sweeps for run in sweep.rglob("progress.csv")}
    if {f"seed{s}" for s in seeds} - present_seeds:
        parser.error(f"--seed {sorted(s for s in seeds if f'seed{s}' not in present_seeds)}: no such runs under the "
                     f"sweeps; they hold {sorted(present_seeds)}")
    copied = refresh(destination, args.sweeps, args.finished_only, args.drop_missing, recipes or None, seeds or None)
    print(f"{copied} run(s) in {destination.relative_to(ROOT)}")
    status = subprocess.call([sys.executable, "-m", "her_mpi.plot", str(destination), "-o",
                              str(RESULTS / f"{args.name}.png"), "--table", str(RESULTS / args.name),
                              "--title", args.title or args.name, *[f"--at={a}" for a in args.at],
                              *([f"--spans={','.join(map(str, args.spans))}"] if args.spans else [])], cwd=ROOT)
    if status == 0:
        record_command(args.name, this_command(sys.argv[1:]))
    return status


if __name__ == "__main__":
    sys.exit(main())
