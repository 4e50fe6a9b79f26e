"""Rank 0's outputs: progress.csv, TensorBoard events and one progress line per epoch."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

from her_mpi.checkpoint import atomic_write

# The contract other tools rely on; metrics (losses, mean Q, ...) follow in sorted order.
LEADING_COLUMNS = ["epoch", "env_steps", "env_steps_per_rank", "n_ranks", "test_success_rate",
                   "train_success_rate", "time_s"]


def read_progress(run_dir: Path) -> list[dict]:
    """A run's progress.csv rows as dicts of strings (none before its first epoch)."""
    path = Path(run_dir) / "progress.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class RunLogger:
    """Appends one row per epoch to progress.csv (and TensorBoard).

    A resumed run passes ``after_epoch`` (its checkpoint's epoch): rows logged after that
    checkpoint by the interrupted job are dropped, since the resumed job trains those epochs
    again. A column that first appears after a resume widens the header (older rows get blanks)."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, after_epoch: int | None = None):
        self.run_dir = Path(run_dir)
        self.csv_path = self.run_dir / "progress.csv"
        self.columns: list[str] | None = None
        if self.csv_path.is_file():  # resuming: keep appending under the existing header
            with open(self.csv_path, newline="") as f:
                reader = csv.DictReader(f)
                rows = list(reader)
                self.columns = list(reader.fieldnames or []) or None
            if after_epoch is not None and any(int(r["epoch"]) > after_epoch for r in rows):
                self._rewrite([r for r in rows if int(r["epoch"]) <= after_epoch])
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
            self._rewrite([])
        new_columns = sorted(k for k in row if k not in self.columns)
        if new_columns:
            with open(self.csv_path, newline="") as f:
                rows = list(csv.DictReader(f))
            self.columns = self.columns + new_columns
            self._rewrite(rows)
        with open(self.csv_path, "a", newline="") as f:
            csv.writer(f).writerow([format_value(row.get(c, "")) for c in self.columns])
        if self.writer is not None:
            for key, value in row.items():
                if key not in ("epoch", "env_steps") and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, global_step=int(row["env_steps"]))
            self.writer.flush()

    def _rewrite(self, rows: list[dict]) -> None:
        """Replace progress.csv by the header and ``rows`` (atomically: a kill keeps the old file)."""
        def write(f):
            writer = csv.DictWriter(f, fieldnames=self.columns, restval="")
            writer.writeheader()
            writer.writerows(rows)

        atomic_write(self.csv_path, write, mode="w")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def progress_line(row: dict, n_epochs: int, epoch_seconds: float, eta_seconds: float,
                  max_env_steps: int | None = None) -> str:
    """One line per epoch; with a budget in env steps the epoch count is only a cap, so the
    steps show against that budget instead."""
    epoch = f"epoch {row['epoch'] + 1}" if max_env_steps else f"epoch {row['epoch'] + 1}/{n_epochs}"
    budget = f"/{max_env_steps:,}" if max_env_steps else ""
    return (f"{epoch} | test success {row['test_success_rate']:.3f} | "
            f"train success {row['train_success_rate']:.3f} | env steps {row['env_steps']:,}{budget} total, "
            f"{row['env_steps_per_rank']:,}/rank x {row['n_ranks']} ranks | "
            f"{row['steps_per_s']:,.0f} steps/s | epoch {epoch_seconds:.1f}s | ETA {format_duration(eta_seconds)}")


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
