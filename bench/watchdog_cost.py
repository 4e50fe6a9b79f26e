"""What the hung-peer watchdog costs a gradient update: the per-update collective with and without it.

    mpirun -np 2 python bench/watchdog_cost.py [--reps 20] [--calls 200]

Every update averages one flat gradient over the ranks (``mpi.start_allreduce_mean_`` then
``mpi.finish_allreduce_mean_``). With ``train.hang_timeout_s`` > 0 the wait is bracketed by the
bookkeeping the watchdog reads, and the watchdog thread polls (every second at the default
timeout). Compared here, alternating in one job so that a background load slows both alike:

* **bare**: ``COMM.Iallreduce`` + ``Wait`` on the gradient buffer, as before the watchdog;
* **watched**: the same through ``her_mpi.mpi`` with a watchdog running.

The buffer holds DDPG's FetchPush gradient (actor and critic, 3x256: 207,364 floats). Writes
``bench/results/watchdog_cost.json`` (rank 0).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

from common import save

from her_mpi import mpi

GRADIENT_FLOATS = 207_364


def bare(buffer: np.ndarray) -> None:
    request = mpi.COMM.Iallreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
    request.Wait()
    buffer /= mpi.size()


def watched(buffer: np.ndarray) -> None:
    mpi.finish_allreduce_mean_(mpi.start_allreduce_mean_(buffer), buffer)


def per_call_us(fn, buffer: np.ndarray, calls: int) -> float:
    mpi.barrier()
    started = time.perf_counter()
    for _ in range(calls):
        fn(buffer)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    buffer = np.ones(GRADIENT_FLOATS, np.float32)
    watchdog = mpi.Watchdog(600, on_hang=lambda report: None)
    times: dict[str, list[float]] = {"bare": [], "watched": []}
    for _ in range(args.reps):
        times["bare"].append(per_call_us(bare, buffer, args.calls))
        watchdog.start()
        times["watched"].append(per_call_us(watched, buffer, args.calls))
        watchdog.stop()
    if mpi.is_root():
        medians = {k: statistics.median(v) for k, v in times.items()}
        save("watchdog_cost", {
            "n_ranks": mpi.size(), "gradient_floats": GRADIENT_FLOATS, "reps": args.reps, "calls_per_rep": args.calls,
            "median_us_per_update_collective": medians,
            "watched_over_bare": medians["watched"] / medians["bare"],
            "added_us_per_update": medians["watched"] - medians["bare"],
            "per_rep_us": times})


if __name__ == "__main__":
    main()
