"""Rank 0's outputs: progress.csv, TensorBoard events and one progress line per epoch."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

# The contract other tools rely on; metrics (losses, mean Q, ...) follow in sorted order.
LEADING_COLUMNS = ["epoch", "env_steps", "env_steps_per_rank", "n_ranks", "test_success_rate",
                   "train_success_rate", "time_s"]


class RunLogger:
    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.csv_path = self.run_dir / "progress.csv"
        self.columns: list[str] | None = None
        if self.csv_path.is_file():  # resuming: keep appending under the existing header
            with open(self.csv_path, newline="") as f:
                self.columns = next(csv.reader(f), None)
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                print("her_mpi: tensorboard is not installed; writing progress.csv only", file=sys.stderr)
            else:
                self.writer = SummaryWriter(log_dir=str(self.run_dir / "tb"))

    def log(self, row: dict) -> None:
        if self.columns is None:
            self.columns = LEADING_COLUMNS + sorted(k for k in row if k not in LEADING_COLUMNS)
            with open(self.csv_path, "w", newline="") as f:
                csv.writer(f).writerow(self.columns)
        with open(self.csv_path, "a", newline="") as f:
            csv.writer(f).writerow([format_value(row.get(c, "")) for c in self.columns])
        if self.writer is not None:
            for key, value in row.items():
                if key not in ("epoch", "env_steps") and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, global_step=int(row["env_steps"]))
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def progress_line(row: dict, n_epochs: int, epoch_seconds: float, eta_seconds: float) -> str:
    return (f"epoch {row['epoch'] + 1}/{n_epochs} | test success {row['test_success_rate']:.3f} | "
            f"train success {row['train_success_rate']:.3f} | env steps {row['env_steps']:,} total, "
            f"{row['env_steps_per_rank']:,}/rank x {row['n_ranks']} ranks | "
            f"{row['steps_per_s']:,.0f} steps/s | epoch {epoch_seconds:.1f}s | ETA {format_duration(eta_seconds)}")


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
