"""Helpers for the benchmark scripts: run training under mpirun, save JSON results."""

from __future__ import annotations

import csv
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def mpi_env() -> dict:
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONUNBUFFERED="1")
    return env


def progress(run_dir: Path) -> list[dict]:
    with open(Path(run_dir) / "progress.csv", newline="") as f:
        return [{k: float(v) if v not in ("", None) else None for k, v in r.items()} for r in csv.DictReader(f)]


def train_command(n_ranks: int, train_args: Sequence[str], overrides: Sequence[str] = (),
                  mpirun_options: Sequence[str] = ()) -> list[str]:
    """``mpirun [options] -np N python -m her_mpi.train ARGS --set OVERRIDE ...``, as the scripts start training."""
    return ["mpirun", "--oversubscribe", *mpirun_options, "-np", str(n_ranks), sys.executable, "-m", "her_mpi.train",
            *train_args, *[word for item in overrides for word in ("--set", item)]]


def train(run_dir: Path, config: str, n_ranks: int, overrides: Sequence[str]) -> list[dict]:
    """Run `python -m her_mpi.train` under mpirun and return its progress rows."""
    cmd = train_command(n_ranks, ["--config", config, "--run-dir", str(run_dir)], overrides)
    print("$", shlex.join(cmd), flush=True)
    started = time.time()
    subprocess.run(cmd, check=True, env=mpi_env(), cwd=ROOT)
    print(f"  finished in {time.time() - started:.0f}s", flush=True)
    return progress(run_dir)


def measure_in_process(script: str, mode: str, args: Sequence[str]) -> dict:
    """``python SCRIPT --mode MODE ARGS`` in a fresh process (its own allocator and caches, so one mode's memory
    cannot speed or slow the other's): the JSON object it prints last."""
    command = [sys.executable, script, "--mode", mode, *args]
    result = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(result.stdout.splitlines()[-1])


def machine() -> dict:
    """Where a result was measured: timings and bit-level results compare only within one CPU model."""
    from her_mpi.provenance import cpu_kernels, cpu_model

    return {"cpus": os.cpu_count(), "cpu": cpu_model(), "cpu_kernels": cpu_kernels(),
            "python": platform.python_version(), "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d %H:%M")}


def save(name: str, result: dict, directory: Path = RESULTS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **result}, indent=2))
    print(json.dumps(result, indent=2))
    print(f"saved {path}")
    return path
