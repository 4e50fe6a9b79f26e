"""Helpers for the research scripts: train variants under mpirun, keep their results in experiments/results.

The benchmark helpers (machine provenance, mpirun environment, training under mpirun) are
bench/common.py's; this module adds what the results tables need and writes to experiments/results.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"

_spec = importlib.util.spec_from_file_location("bench_common", ROOT / "bench" / "common.py")
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
machine, mpi_env, progress, train, train_command = (_bench.machine, _bench.mpi_env, _bench.progress, _bench.train,
                                                    _bench.train_command)


def save(name: str, result: dict) -> Path:
    return _bench.save(name, result, RESULTS)


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
