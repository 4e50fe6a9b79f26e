"""The only module that touches mpi4py.

Every rank runs the same program on its own environments and replay buffer. Ranks meet in a few
collectives: broadcast of rank 0's parameters at start, an allreduce-mean of each network's flat
gradient every update, an allreduce of normalizer statistics every cycle, and averages of logged
metrics. Without ``mpirun`` everything works with a world of size 1.

A rank that raises must not leave the others waiting forever in a collective:
:func:`run_guarded` prints the rank's traceback and aborts the whole job.
"""

from __future__ import annotations

import hashlib
import os
import sys
import traceback
from typing import Callable

import numpy as np
from mpi4py import MPI

COMM = MPI.COMM_WORLD


def rank() -> int:
    return COMM.Get_rank()


def size() -> int:
    return COMM.Get_size()


def is_root() -> bool:
    return COMM.Get_rank() == 0


def allreduce_mean_(array: np.ndarray) -> np.ndarray:
    """Average a contiguous array over ranks, in place (the array may be a view of a tensor)."""
    if COMM.Get_size() > 1:
        COMM.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
        array /= COMM.Get_size()
    return array


def start_allreduce_mean_(array: np.ndarray):
    """Begin averaging ``array`` over ranks in place; finish with :func:`finish_allreduce_mean_`.

    Lets a rank compute its next gradient while it waits for the slowest rank."""
    if COMM.Get_size() == 1:
        return None
    return COMM.Iallreduce(MPI.IN_PLACE, array, op=MPI.SUM)


def finish_allreduce_mean_(request, array: np.ndarray) -> np.ndarray:
    if request is not None:
        request.Wait()
        array /= COMM.Get_size()
    return array


def allreduce_sum_(array: np.ndarray) -> np.ndarray:
    if COMM.Get_size() > 1:
        COMM.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)
    return array


def broadcast_(array: np.ndarray, root: int = 0) -> np.ndarray:
    if COMM.Get_size() > 1:
        COMM.Bcast(array, root=root)
    return array


def oversubscribed() -> bool:
    """Whether any node runs more ranks than it has cores (collective): then ranks take turns on
    the cores and every collective also waits for a descheduled rank."""
    if COMM.Get_size() == 1:
        return False
    node = COMM.Split_type(MPI.COMM_TYPE_SHARED)
    crowded = node.Get_size() > (os.cpu_count() or 1)
    node.Free()
    return bool(COMM.allreduce(int(crowded), op=MPI.MAX))


def barrier() -> None:
    if COMM.Get_size() > 1:
        COMM.Barrier()


def broadcast_object(obj, root: int = 0):
    return COMM.bcast(obj, root=root) if COMM.Get_size() > 1 else obj


def gather_object(obj, root: int = 0) -> list | None:
    return COMM.gather(obj, root=root) if COMM.Get_size() > 1 else [obj]


def allgather_object(obj) -> list:
    return COMM.allgather(obj) if COMM.Get_size() > 1 else [obj]


def mean_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Average a dict of scalars over ranks (every rank must pass the same keys).

    The keys travel with the values (a sorted tuple, allgathered once per call: this runs once
    per epoch), so a rank with another set of keys is a clear error on every rank, not a silent
    average of mismatched entries."""
    keys = sorted(values)
    if COMM.Get_size() > 1:
        everyone = COMM.allgather(tuple(keys))
        if any(k != everyone[0] for k in everyone):
            raise ValueError("mean_over_ranks: ranks passed different keys: "
                             + describe_key_differences([set(k) for k in everyone]))
    vector = np.array([float(values[k]) for k in keys], dtype=np.float64)
    allreduce_mean_(vector)
    return dict(zip(keys, vector.tolist()))


def describe_key_differences(key_sets: list[set]) -> str:
    """E.g. "rank 1 lacks 'test_return'; rank 1 has extra 'q_max'" (relative to all ranks' union)."""
    union, common = set().union(*key_sets), set.intersection(*key_sets)
    parts = []
    for r, keys in enumerate(key_sets):
        missing, extra = sorted(union - keys), sorted(keys - common)
        if missing:
            parts.append(f"rank {r} lacks {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"rank {r} has {', '.join(map(repr, extra))}, which not every rank has")
    return "; ".join(parts)


def digest(arrays: dict[str, np.ndarray]) -> dict[str, str]:
    return {name: hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()
            for name, a in arrays.items()}


def assert_identical_across_ranks(arrays: dict[str, np.ndarray]) -> None:
    """Raise if any named array differs bit-wise between ranks (a cheap digest exchange)."""
    if COMM.Get_size() == 1:
        return
    mine = digest(arrays)
    everyone = COMM.allgather(mine)
    differing = sorted({name for d in everyone for name in d if d[name] != mine.get(name)})
    if differing:
        raise RuntimeError(f"ranks diverged: {', '.join(differing)} differ between ranks "
                           f"(rank {rank()} sees {len(everyone)} digests)")


def run_guarded(main: Callable[[], int | None]) -> int:
    """Run ``main``; on an uncaught exception print this rank's traceback and abort every rank.

    Without this, a rank that dies while the others sit in an Allreduce hangs the job until the
    wall-clock limit. ``SystemExit`` passes through so user errors exit cleanly with their code.
    """
    try:
        return main() or 0
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - anything, including KeyboardInterrupt, must abort
        text = traceback.format_exc()
        prefix = f"[her_mpi rank {rank()}/{size()}] "
        sys.stderr.write("".join(prefix + line + "\n" for line in text.rstrip().splitlines()))
        sys.stderr.flush()
        if COMM.Get_size() > 1:
            COMM.Abort(1)
        os._exit(1)
