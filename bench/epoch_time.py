"""Wall time of one FetchPush epoch of the baselines schedule at np=2.

50 cycles x (2 rollouts x 50 steps per rank + 40 updates of batch 256) + 10 test rollouts per
rank. Target on the 2-core reference machine: <= 25 s. Reports the epoch time, its split into
rollouts / updates / evaluation, ms per update and env steps per second.

    python bench/epoch_time.py [--algo ddpg] [--epochs 2] [--ranks 2] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import save, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/fetch_push_ddpg.yaml")
    parser.add_argument("--epochs", type=int, default=2, help="the first epoch includes warm-up")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--name", default=None, help="result file name (default from the config)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        rows = train(Path(tmp) / "run", args.config, args.ranks,
                     [f"train.n_epochs={args.epochs}", "log.tensorboard=false", *args.overrides])
    epochs = []
    for row in rows:
        previous = rows[rows.index(row) - 1]["time_s"] if rows.index(row) else 0.0
        epoch_s = row["time_s"] - previous
        updates = 50 * 40 if row is rows[0] else row["updates"] - rows[rows.index(row) - 1]["updates"]
        steps_per_rank = row["env_steps_per_rank"] / (row["epoch"] + 1)
        epochs.append({
            "epoch": int(row["epoch"]), "epoch_s": round(epoch_s, 2),
            "rollout_s": round(row["time_rollout_s"], 2), "learn_s": round(row["time_learn_s"], 2),
            "eval_s": round(row["time_eval_s"], 2),
            "ms_per_update": round(1000 * row["time_learn_s"] / updates, 2),
            "env_steps_per_s_per_rank": round(steps_per_rank / row["time_rollout_s"], 1),
            "env_steps_per_s_total": round(row["steps_per_s"], 1),
            "max_rss_mb_per_rank": round(row["max_rss_mb"], 1),
        })
    best = min(epochs, key=lambda e: e["epoch_s"])
    name = args.name or "epoch_time_" + Path(args.config).stem
    save(name, {"config": args.config, "ranks": args.ranks, "overrides": args.overrides,
                "target_epoch_s": 25.0, "epochs": epochs, "best_epoch_s": best["epoch_s"],
                "median_epoch_s": sorted(e["epoch_s"] for e in epochs)[len(epochs) // 2]})


if __name__ == "__main__":
    main()
