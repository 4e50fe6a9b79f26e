"""Wall time of one FetchPush epoch of the baselines schedule at np=2, and what its learn phase
loses around the updates.

50 cycles x (2 rollouts x 50 steps per rank + 40 updates of batch 256) + 10 test rollouts per
rank. Reports the epoch time, its split into rollouts / updates / evaluation, ms per update and
env steps per second, and for the learn phase:

* ``learn_overhead``: learn time / (updates x the standalone update time), in wall time, and
  ``learn_overhead_cpu`` the same in thread CPU time (the agent logs its learn phase's,
  ``learn_cpu_ms``): on a loaded machine wall time also counts the time the ranks are descheduled
  and wait for each other, CPU time what is actually spent around the updates. The standalone
  time is ``agent.update`` alone (bench/update_floor.py --standalone: no sampling, no MPI),
  measured by as many concurrent processes as the training has ranks, right after it, so each
  gets the same share of the machine as a rank did. Target: <= 1.1.
* the split the agent logs (progress.csv ``learn_*_ms``, per update): sampling and relabelling, the
  update (its wait for the other rank's gradients included) and the wait on its own, and the rest
  (storing, normalizers, target networks, sync checks).

    python bench/epoch_time.py [--config fetch_push_ddpg] [--epochs 2] [--ranks 2] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, save, train


def standalone_update_ms(config: str, overrides: list[str], processes: int) -> dict:
    """Median over ``processes`` concurrent standalone timings of the recipe's update."""
    command = [sys.executable, str(ROOT / "bench" / "update_floor.py"), "--standalone", config]
    for item in overrides:
        command += ["--set", item]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(processes)]
    results = []
    for run in runs:
        out, _ = run.communicate()
        if run.returncode:
            raise SystemExit(f"standalone timing failed: {' '.join(command)}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return {"wall_ms": statistics.median(r["wall_ms"] for r in results),
            "cpu_ms": statistics.median(r["cpu_ms"] for r in results), "processes": processes}


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
    # algorithm settings and the batch size matter to the update; the schedule (epochs, cycles) does not
    shapes = [o for o in args.overrides if o.startswith(("algo.", "train.batch_size="))]
    standalone = standalone_update_ms(args.config, shapes, args.ranks)
    epochs = []
    for i, row in enumerate(rows):
        epoch_s = row["time_s"] - (rows[i - 1]["time_s"] if i else 0.0)
        updates = row["updates"] - (rows[i - 1]["updates"] if i else 0)
        steps_per_rank = row["env_steps_per_rank"] / (row["epoch"] + 1)
        learn_ms = 1000 * row["time_learn_s"] / updates
        epochs.append({
            "epoch": int(row["epoch"]), "epoch_s": round(epoch_s, 2),
            "rollout_s": round(row["time_rollout_s"], 2), "learn_s": round(row["time_learn_s"], 2),
            "eval_s": round(row["time_eval_s"], 2), "updates": int(updates),
            "ms_per_update": round(learn_ms, 2),
            "learn_overhead": round(learn_ms / standalone["wall_ms"], 3),
            # CPU time (the learn phase as the agent logs it, against the standalone update's):
            # what is spent around the updates, without the time a loaded machine deschedules us
            "learn_overhead_cpu": round(row["learn_cpu_ms"] / standalone["cpu_ms"], 3) if row.get("learn_cpu_ms") else None,
            "learn_split_ms_per_update": {part: round(row[f"learn_{part}_ms"], 3)
                                          for part in ("sample", "update", "wait", "other", "cpu")
                                          if row.get(f"learn_{part}_ms") is not None},
            "env_steps_per_s_per_rank": round(steps_per_rank / row["time_rollout_s"], 1),
            "env_steps_per_s_total": round(row["steps_per_s"], 1),
            "max_rss_mb_per_rank": round(row["max_rss_mb"], 1),
        })
    best = min(epochs, key=lambda e: e["epoch_s"])
    name = args.name or "epoch_time_" + Path(args.config).stem
    save(name, {"config": args.config, "ranks": args.ranks, "overrides": args.overrides,
                "target_epoch_s": 25.0, "target_learn_overhead": 1.1,
                "standalone_update_ms": {k: round(v, 3) for k, v in standalone.items()},
                "epochs": epochs, "best_epoch_s": best["epoch_s"],
                "median_epoch_s": sorted(e["epoch_s"] for e in epochs)[len(epochs) // 2]})
    for e in epochs:
        split = ", ".join(f"{k} {v:.2f}" for k, v in e["learn_split_ms_per_update"].items())
        print(f"epoch {e['epoch']}: {e['epoch_s']} s (rollout {e['rollout_s']}, learn {e['learn_s']}, eval "
              f"{e['eval_s']}); learn {e['ms_per_update']} ms/update = {e['learn_overhead']}x the standalone "
              f"{standalone['wall_ms']:.2f} ms; CPU time {e['learn_overhead_cpu']}x the standalone "
              f"{standalone['cpu_ms']:.2f} ms ({split} ms/update)")


if __name__ == "__main__":
    main()
