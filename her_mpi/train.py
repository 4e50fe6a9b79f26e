"""Command line: ``mpirun -np 8 python -m her_mpi.train [--config FILE] [--set k=v ...]``.

Every rank runs this same program. Configs, env ids and checkpoints are validated on every rank
before the first collective; if any rank finds a problem, all ranks exit with status 2 and
rank 0 prints what is wrong. After that an exception on any rank aborts the whole job.

Exit statuses (every rank exits with the same one, and so does mpirun while every host answers):

* 0  trained to its budget;
* 1  a rank crashed (its traceback is printed) or was killed; the job was aborted. The last
     complete checkpoint is on disk: ``--resume`` continues from it;
* 2  bad input (config, env, checkpoint, run directory), reported before any training;
* 3  a non-finite loss, gradient or parameter; stopped without writing a checkpoint from it;
* 4  a checkpoint, replay or log file could not be written (disk full, read-only directory);
     the previous checkpoint is intact;
* 5  a rank waited on its peers longer than ``train.hang_timeout_s`` (a frozen host, a network
     partition); the message names the ranks that did not answer; the last checkpoint is intact;
* 75 stopped by SIGTERM, SIGINT or SIGUSR1 (on any rank) after finishing the current cycle and
     writing a checkpoint; ``--resume RUN_DIR`` continues exactly (``EX_TEMPFAIL``: try again).

The run directory's ``status.json`` (:mod:`her_mpi.run_status`) says the same, and is the word to
trust when a host is lost: mpirun's own exit status may then be 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import yaml

from her_mpi import mpi, run_status
from her_mpi.checkpoint import CheckpointWriteError, atomic_write, load_checkpoint
from her_mpi.config import (RECIPES_DIR, SECTIONS, Config, ConfigError, apply_override, check_unused,
                            config_from_dict, list_keys, load_config, overrides_tree, recipe_names)
from her_mpi.provenance import provenance
from her_mpi.run_status import (EXIT_BAD_INPUT, EXIT_CRASHED, EXIT_HUNG, EXIT_NON_FINITE, EXIT_OK,  # noqa: F401
                                EXIT_PREEMPTED, EXIT_WRITE_FAILED)
from her_mpi.stop_signals import StopSignals


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
                        help="continue a run exactly where RUN_DIR/checkpoints/latest.pt left it, with the "
                             "config it was saved with (plus any --set); --config replaces that config")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--list-recipes", action="store_true", help="list the packaged recipes and exit")
    parser.add_argument("--list-keys", nargs="?", const="all", metavar="SECTION",
                        help="list every config key (or those of SECTION: " + ", ".join(SECTIONS) + ") with its "
                             "type, default and description, and exit; the algo keys are those of the algorithm "
                             "--config (and --set) choose, else of every algorithm")
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


def keys_text(args: argparse.Namespace) -> str:
    """--list-keys: the algorithm is the one --config and --set choose, if they are given."""
    algo = load_config(args.config, args.overrides).algo_name if args.config or args.overrides else None
    return list_keys(None if args.list_keys == "all" else args.list_keys, algo)


def resolve(args: argparse.Namespace, stamp: str | None = None) -> tuple[Config, Path, dict | None]:
    """Config, run directory and checkpoint to resume from; raises ConfigError on bad input.

    ``stamp`` names a new default run directory (``runs/<env>-<algo>-<stamp>``); every rank must
    pass the same one (rank 0's: ranks that name it from their own clocks scatter over several)."""
    resume = None
    if args.resume:
        resume = load_checkpoint(args.resume)
        if args.run_dir and Path(args.run_dir).resolve() != Path(args.resume).resolve():
            raise ConfigError("--run-dir and --resume name different directories; a resumed run "
                              "continues in its own directory")
        if args.config:
            config = load_config(args.config, args.overrides)
        else:  # the config in effect at the checkpoint (earlier resumes' overrides included),
            # rewritten with the current key names so that --set may use them
            raw = config_from_dict(resume["config"]).to_dict()
            for item in args.overrides:
                apply_override(raw, item)
            config = config_from_dict(raw)
            # only what this command sets: the saved config has every key, with its time's defaults
            check_unused(config, overrides_tree(args.overrides))
        return config, run_dir_of(Path(args.resume), resume), resume
    config = load_config(args.config, args.overrides)
    if args.run_dir:
        run_dir = Path(args.run_dir)
        if run_dir.exists() and not run_dir.is_dir():
            raise ConfigError(f"--run-dir {str(run_dir)!r} is a file: expected a directory")
        if (run_dir / "checkpoints" / "latest.pt").exists():
            raise ConfigError(f"--run-dir {str(run_dir)!r} already holds a run; use --resume "
                              f"{run_dir} to continue it or choose another directory")
    else:
        run_dir = Path("runs") / f"{config.env.id}-{config.algo_name}-{stamp or time.strftime('%Y%m%d-%H%M%S')}"
    return config, run_dir, resume


def run_dir_of(path: Path, checkpoint: dict) -> Path:
    """The run directory of ``--resume PATH`` (a run directory or a checkpoint file in one)."""
    checkpoint_path = Path(checkpoint["path"])
    if checkpoint_path.parent.name == "checkpoints" and not path.is_dir():
        return checkpoint_path.parent.parent
    return path


def flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key != "kwargs":
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def record_run_start(args: argparse.Namespace, config: Config, run_dir: Path, resume: dict | None) -> None:
    """Rank 0, before training: a new run writes config.yaml and provenance.yaml (commit, package
    versions, Python, CPU); a resume keeps them and appends what it changed to resumes.yaml (time, command
    line, n_ranks, the checkpoint it starts from, its own provenance)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.yaml"
    if resume is None or not config_path.is_file():
        atomic_write(config_path, lambda f: f.write(config.to_yaml()), mode="w")
    if resume is None:  # provenance.yaml describes where the run started; a resume's goes into its entry
        atomic_write(run_dir / "provenance.yaml", lambda f: f.write(yaml.safe_dump(provenance(), sort_keys=False)),
                     mode="w")
        return
    before, after = flatten(resume["config"]), flatten(config.to_dict())
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "n_ranks": mpi.size(),
        "from_checkpoint": {"epoch": resume["epoch"] + 1, "cycle": resume["cycle"],
                            "env_steps": resume["env_steps"], "n_ranks": resume["n_ranks"]},
        "config": str(args.config) if args.config else None,
        "overrides": list(args.overrides),
        "changed": {key: {"before": before.get(key), "after": after.get(key)}
                    for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)},
        "command": " ".join(sys.argv),
        "provenance": provenance(),
    }
    resumes_path = run_dir / "resumes.yaml"
    history = []
    if resumes_path.is_file():
        history = yaml.safe_load(resumes_path.read_text()) or []
    history.append(entry)
    atomic_write(resumes_path, lambda f: f.write(yaml.safe_dump(history, sort_keys=False)), mode="w")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list_recipes or args.list_keys:  # no MPI work: every rank would print the same list
        try:
            text = list_recipes() if args.list_recipes else keys_text(args)
        except ConfigError as exc:
            print(f"her_mpi.train: error: {exc}", file=sys.stderr, flush=True)
            return EXIT_BAD_INPUT
        if mpi.is_root():
            print(text)
        return 0
    mpi.die_with_launcher()
    run = RunRecord()
    # Caught from here: a stop request during start-up (imports, envs, a replay buffer's load) stops
    # the run after its first cycle, with a checkpoint, instead of killing the rank.
    with StopSignals() as signals:
        return mpi.run_guarded(lambda: _main(args, signals, run), on_crash=run.crashed)


class RunRecord:
    """This job's entries in the run record (:mod:`her_mpi.run_status`), once the run directory is known.

    Rank 0 writes them, except for a crash or a hang, which the rank that saw it records."""

    def __init__(self):
        self.run_dir: Path | None = None
        self.started_at = time.time()

    def write(self, state: str, message: str = "", everyone: bool = False, **details) -> None:
        if self.run_dir is None or not (everyone or mpi.is_root()):
            return
        judged = run_status.judged_by_launcher(self.run_dir, self.started_at)
        if judged is not None:
            print(f"her_mpi.train: rank {mpi.rank()}: the launcher has already recorded this job as "
                  f"{judged['state']}; not replacing it with {state} ({message})", file=sys.stderr, flush=True)
            return
        run_status.write(self.run_dir, state, message, n_ranks=mpi.size(), **details)

    def crashed(self, traceback_text: str) -> None:
        last = traceback_text.strip().splitlines()[-1] if traceback_text.strip() else "an exception"
        self.write("crashed", f"rank {mpi.rank()} raised {last}", everyone=True, rank=mpi.rank())


def _main(args: argparse.Namespace, signals: StopSignals, run: RunRecord) -> int:
    trainer, error, config = None, None, None
    # rank 0's clock names a new run's directory, for every rank
    stamp = mpi.broadcast_object(time.strftime("%Y%m%d-%H%M%S"))
    try:  # the envs are closed however the run ends
        try:
            config, run_dir, resume = resolve(args, stamp)
            if args.print_config:
                if mpi.is_root():
                    print(config.to_yaml(), end="")
                return 0
            from her_mpi.trainer import Trainer  # heavy imports only once the input is known good

            trainer = Trainer(config, run_dir, resume)
        except ConfigError as exc:
            error = str(exc)
        # All ranks meet here, whatever happened, so no rank is left waiting in a later collective.
        reports = mpi.allgather_object(error)
        failures = [(r, e) for r, e in enumerate(reports) if e]
        if failures:
            rank, message = failures[0]
            if mpi.is_root():
                where = f" (on rank {rank})" if mpi.size() > 1 and any(e != message for _, e in failures) else ""
                print(f"her_mpi.train: error{where}: {message}", file=sys.stderr, flush=True)
            return EXIT_BAD_INPUT
        error = None
        if mpi.is_root():
            try:
                record_run_start(args, config, trainer.run_dir, resume)
                run_status.write(trainer.run_dir, "running", "training", n_ranks=mpi.size())
            except (CheckpointWriteError, OSError) as exc:
                error = str(exc)
        error = mpi.broadcast_object(error)
        if error is not None:
            if mpi.is_root():
                print(f"her_mpi.train: error: {error}", file=sys.stderr, flush=True)
            return EXIT_WRITE_FAILED
        run.run_dir = trainer.run_dir
        if mpi.is_root():
            print(f"her_mpi: {config.env.id} with {trainer.algo} on {mpi.size()} rank(s) "
                  f"({describe_hosts(mpi.processor_names())}); writing to {trainer.run_dir}", flush=True)
        else:
            mpi.processor_names()
        watchdog = mpi.Watchdog(config.train.hang_timeout_s, lambda report: hung(report, trainer, run)).start()
        status = train_until_done(trainer, signals, run)
        watchdog.stop()
        return status
    finally:
        if trainer is not None:
            trainer.close()


def describe_hosts(names: list[str]) -> str:
    """``2 hosts: node-a x4, node-b x4`` (ranks per host, in rank order)."""
    counts = {name: names.count(name) for name in dict.fromkeys(names)}
    return f"{len(counts)} host{'s' if len(counts) > 1 else ''}: " + ", ".join(f"{h} x{n}" for h, n in counts.items())


def train_until_done(trainer, signals: StopSignals, run: RunRecord) -> int:
    """Run the trainer; a halt that every rank reached alike becomes its documented status, and the
    run record says how the run ended. "finished" only once every rank has come back from training."""
    from her_mpi.trainer import CheckpointFailed, NonFiniteError, Preempted

    details = {}
    try:
        row = trainer.run(signals)
        mpi.barrier()  # every rank is done: only now may the record say so
        run.write("finished", "reached its budget", epoch=int(row.get("epoch", -1)) + 1,
                  env_steps=int(row.get("env_steps", 0)), test_success_rate=row.get("test_success_rate"))
        return EXIT_OK
    except Preempted as exc:
        message, status, state = f"her_mpi.train: {exc}", EXIT_PREEMPTED, "stopped"
        details = {"signals": list(exc.signals)}
    except NonFiniteError as exc:
        message, status, state = f"her_mpi.train: error: {exc}", EXIT_NON_FINITE, "non_finite"
    except CheckpointFailed as exc:
        message, status, state = f"her_mpi.train: error: {exc}", EXIT_WRITE_FAILED, "write_failed"
    if mpi.is_root():
        print(message, file=sys.stderr, flush=True)
        run.write(state, str(message).split(": ", 1)[-1].removeprefix("error: "), **details)
    mpi.barrier()  # nobody exits (mpirun then stops the others) before every rank is done
    return status


def hung(report: mpi.HangReport, trainer, run: RunRecord) -> None:
    """The watchdog's verdict (on its own thread): say who did not answer, record it, end this rank.

    Every waiting rank gets here; the lowest of them reports for all, the others leave it time to."""
    me = report.me["rank"]
    if me == report.reporter:
        message = (f"{report.describe()}. Stopped after train.hang_timeout_s = {trainer.config.train.hang_timeout_s:g} s "
                   f"(exit {EXIT_HUNG}); {trainer.last_checkpoint_text()}")
        print(f"her_mpi.train: error: {message}", file=sys.stderr, flush=True)
        try:
            run.write("hung", message, everyone=True, rank=me, silent_ranks=report.silent)
        except Exception:  # noqa: BLE001 - the exit below must happen whatever the record does
            pass
    else:
        print(f"her_mpi.train: rank {me}: waited {report.me['waiting_s']:.0f} s for its peers; stopping "
              f"(rank {report.reporter} reports)", file=sys.stderr, flush=True)
        time.sleep(report.reply_window_s + 5.0)  # the reporter writes the record before mpirun ends the job
    sys.stderr.flush()
    os._exit(EXIT_HUNG)


if __name__ == "__main__":
    sys.exit(main())
