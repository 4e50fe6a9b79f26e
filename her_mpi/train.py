"""Command line: ``mpirun -np 8 python -m her_mpi.train [--config FILE] [--set k=v ...]``.

Every rank runs this same program. Configs, env ids and checkpoints are validated on every rank
before the first collective; if any rank finds a problem, all ranks exit with status 2 and
rank 0 prints what is wrong. After that an exception on any rank aborts the whole job.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from her_mpi import mpi
from her_mpi.checkpoint import load_checkpoint
from her_mpi.config import RECIPES_DIR, Config, ConfigError, load_config, recipe_names


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m her_mpi.train",
        description="Train a goal-conditioned policy with hindsight experience replay. Run under "
                    "mpirun for several synchronized workers: mpirun -np 8 python -m her_mpi.train")
    parser.add_argument("--config", help="a packaged recipe's name (e.g. fetch_push_td3) or a YAML path "
                                         "(default: the default recipe, FetchReach DDPG+HER)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value, e.g. --set train.n_epochs=20 (repeatable)")
    parser.add_argument("--run-dir", help="output directory (default: runs/<env>-<algo>-<time>)")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue a run from RUN_DIR/checkpoints/latest.pt at its next epoch")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--list-recipes", action="store_true", help="list the packaged recipes and exit")
    return parser.parse_args(argv)


def list_recipes() -> str:
    """One line per packaged recipe: its name, env and algorithm, and its first comment line."""
    lines = []
    for name in recipe_names():
        config = load_config(name)
        algo = config.algo_name + ("+kfac" if getattr(config.algo, "optimizer", "adam") == "kfac" else "")
        comment = next((l.lstrip("# ").strip() for l in (RECIPES_DIR / f"{name}.yaml").read_text().splitlines()
                        if l.startswith("#")), "")
        lines.append(f"{name:34s} {config.env.id:22s} {algo:10s} {comment}")
    return "\n".join(lines)


def resolve(args: argparse.Namespace) -> tuple[Config, Path, dict | None]:
    """Config, run directory and checkpoint to resume from; raises ConfigError on bad input."""
    resume = None
    if args.resume:
        resume = load_checkpoint(args.resume)
        recipe = args.config or Path(args.resume) / "config.yaml"
        if args.run_dir and Path(args.run_dir).resolve() != Path(args.resume).resolve():
            raise ConfigError("--run-dir and --resume name different directories; a resumed run "
                              "continues in its own directory")
        return load_config(recipe, args.overrides), Path(args.resume), resume
    config = load_config(args.config, args.overrides)
    if args.run_dir:
        run_dir = Path(args.run_dir)
        if (run_dir / "checkpoints" / "latest.pt").exists():
            raise ConfigError(f"--run-dir {str(run_dir)!r} already holds a run; use --resume "
                              f"{run_dir} to continue it or choose another directory")
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path("runs") / f"{config.env.id}-{config.algo_name}-{stamp}"
    return config, run_dir, resume


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list_recipes:  # no MPI work: every rank would print the same list
        if mpi.is_root():
            print(list_recipes())
        return 0
    return mpi.run_guarded(lambda: _main(args))


def _main(args: argparse.Namespace) -> int:
    trainer, error, run_dir, config = None, None, None, None
    try:
        config, run_dir, resume = resolve(args)
        if args.print_config:
            if mpi.is_root():
                print(config.to_yaml(), end="")
            return 0
        from her_mpi.trainer import Trainer  # heavy imports only once the input is known good

        trainer = Trainer(config, run_dir, resume)
    except ConfigError as exc:
        error = str(exc)
    # All ranks meet here, whatever happened, so no rank is left waiting in a later collective.
    reports = mpi.allgather_object((error, str(run_dir) if run_dir else None))
    failures = [(r, e) for r, (e, _) in enumerate(reports) if e]
    if failures:
        if mpi.is_root():
            rank, message = failures[0]
            where = f" (on rank {rank})" if mpi.size() > 1 and any(e != message for _, e in failures) else ""
            print(f"her_mpi.train: error{where}: {message}", file=sys.stderr, flush=True)
        return 2
    trainer.run_dir = Path(reports[0][1])  # rank 0's choice (the default name holds a timestamp)
    if mpi.is_root():
        trainer.run_dir.mkdir(parents=True, exist_ok=True)
        (trainer.run_dir / "config.yaml").write_text(config.to_yaml())
        print(f"her_mpi: {config.env.id} with {trainer.algo} on {mpi.size()} rank(s); "
              f"writing to {trainer.run_dir}", flush=True)
    trainer.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
