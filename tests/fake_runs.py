"""Run directories with a made-up learning curve, for the sweep's and the results tools' aggregation tests."""

from __future__ import annotations

import csv
from pathlib import Path

from her_mpi.config import load_config


def fake_run(directory: Path, seed: int, success: list[float], lr: float = 1e-3, n_ranks: int = 2) -> None:
    """A fetch_push_td3 run directory whose epoch ``i`` logged ``success[i]`` at ``10_000 * (i + 1)`` env steps."""
    directory.mkdir(parents=True)
    config = load_config("fetch_push_td3", [f"train.seed={seed}", f"algo.lr_actor={lr}"])
    (directory / "config.yaml").write_text(config.to_yaml())
    with open(directory / "progress.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", "env_steps", "env_steps_per_rank", "n_ranks", "test_success_rate",
                         "train_success_rate", "time_s", "test_episodes"])
        for epoch, value in enumerate(success):
            steps = 10_000 * (epoch + 1)
            writer.writerow([epoch, steps, steps // n_ranks, n_ranks, value, 0, 30.0 * (epoch + 1), 50])
