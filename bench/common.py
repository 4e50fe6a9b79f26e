"""Helpers for the benchmark scripts: run training under mpirun, save JSON results."""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import time
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


def train(run_dir: Path, config: str, n_ranks: int, overrides: list[str]) -> list[dict]:
    """Run `python -m her_mpi.train` under mpirun and return its progress rows."""
    cmd = ["mpirun", "--oversubscribe", "-np", str(n_ranks), sys.executable, "-m", "her_mpi.train",
           "--config", config, "--run-dir", str(run_dir)]
    for item in overrides:
        cmd += ["--set", item]
    print("$", " ".join(cmd), flush=True)
    started = time.time()
    subprocess.run(cmd, check=True, env=mpi_env(), cwd=ROOT)
    print(f"  finished in {time.time() - started:.0f}s", flush=True)
    return progress(run_dir)


def machine() -> dict:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "date": time.strftime("%Y-%m-%d %H:%M")}


def save(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **result}, indent=2))
    print(json.dumps(result, indent=2))
    print(f"saved {path}")
    return path


def run_variants(name: str, variants: dict[str, tuple[str, list[str]]], epochs: int, ranks: int = 2,
                 title: str | None = None) -> dict:
    """Train each variant {label: (recipe, overrides)} for ``epochs``; save JSON + a success plot."""
    runs_root = ROOT / "runs" / "bench" / name
    for label, (recipe, overrides) in variants.items():
        run_dir = runs_root / label
        if run_dir.exists():
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        train(run_dir, recipe, ranks, [f"train.n_epochs={epochs}", "log.tensorboard=false", *overrides])
    return collect(name, {label: recipe for label, (recipe, _) in variants.items()},
                   {label: overrides for label, (_, overrides) in variants.items()}, title)


def collect(name: str, recipes: dict[str, str], overrides: dict[str, list[str]] | None = None,
            title: str | None = None) -> dict:
    """Summarise the runs in runs/bench/<name>/<label> (finished or not) into JSON + a plot."""
    runs_root = ROOT / "runs" / "bench" / name
    curves, ranks = {}, None
    for label, recipe in recipes.items():
        rows = progress(runs_root / label)
        ranks = int(rows[0]["n_ranks"])
        times = [rows[0]["time_s"]] + [b["time_s"] - a["time_s"] for a, b in zip(rows, rows[1:])]
        success = [r["test_success_rate"] for r in rows]
        curves[label] = {
            "recipe": recipe, "overrides": (overrides or {}).get(label, []),
            "env_steps": [int(r["env_steps"]) for r in rows], "test_success_rate": success,
            "train_success_rate": [r["train_success_rate"] for r in rows],
            "epoch_s": [round(t, 2) for t in times], "mean_epoch_s": round(sum(times) / len(times), 2),
            "final_success": success[-1], "best_success": max(success),
            "steps_to_0.9": next((int(r["env_steps"]) for r in rows if r["test_success_rate"] >= 0.9), None),
        }
    png = RESULTS / f"{name}.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "her_mpi.plot", *[str(runs_root / label) for label in recipes],
                    "--output", str(png), "--title", title or f"{name} (np={ranks})"], check=True, cwd=ROOT)
    result = {"ranks": ranks, "epochs": max(len(c["env_steps"]) for c in curves.values()), "curves": curves,
              "plot": str(png.relative_to(ROOT))}
    save(name, result)
    return result
