"""Success curve of one or more recipes at np=2, plotted together with her_mpi.plot.

    python bench/learning_curve.py configs/fetch_push_ddpg.yaml [more recipes] --epochs 30 --name push_30

Writes bench/results/<name>.json (success per epoch, time per epoch) and <name>.png.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from common import RESULTS, ROOT, save, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--name", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()

    runs_root = ROOT / "runs" / "bench" / args.name
    curves = {}
    for config in args.configs:
        run_dir = runs_root / Path(config).stem
        if (run_dir / "checkpoints" / "latest.pt").exists():
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        rows = train(run_dir, config, args.ranks,
                     [f"train.n_epochs={args.epochs}", "log.tensorboard=false", *args.overrides])
        times = [rows[0]["time_s"]] + [b["time_s"] - a["time_s"] for a, b in zip(rows, rows[1:])]
        curves[Path(config).stem] = {
            "env_steps": [int(r["env_steps"]) for r in rows],
            "test_success_rate": [r["test_success_rate"] for r in rows],
            "epoch_s": [round(t, 2) for t in times],
            "mean_epoch_s": round(sum(times) / len(times), 2),
            "final_success": rows[-1]["test_success_rate"],
            "best_success": max(r["test_success_rate"] for r in rows),
            "run_dir": str(run_dir.relative_to(ROOT)),
        }
    png = RESULTS / f"{args.name}.png"
    subprocess.run([sys.executable, "-m", "her_mpi.plot", *[str(runs_root / Path(c).stem) for c in args.configs],
                    "--output", str(png), "--title", f"{args.name} (np={args.ranks})"], check=True, cwd=ROOT)
    save(args.name, {"ranks": args.ranks, "epochs": args.epochs, "overrides": args.overrides,
                     "curves": curves, "plot": str(png.relative_to(ROOT))})


if __name__ == "__main__":
    main()
